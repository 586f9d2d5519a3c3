"""The core: shapes, roles, observation, depth, attention, parametrize, export.

Internal: users call these through `mutransfer` (`mt.parametrize`, `mt.export`, ...).
"""
