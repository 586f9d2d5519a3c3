"""Deprecated: `mutransfer.limits.gaussian` is internal since issue 28 and goes away in the next release.
Importing it warns; its names are read from the internal modules that hold them now."""

from ._deprecated import old_module, old_names

__all__ = old_names("gaussian")
__getattr__ = old_module("gaussian")
