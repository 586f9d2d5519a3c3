"""Deprecated: `mutransfer.limits.kernels` the *module* is internal since issue 28 and goes away in
the next release (`mt.limits.kernels`, `nngp` and `ntk` the functions stay). Importing it warns;
its names are read from the internal module. Importing a submodule sets the package's attribute of
that name, so this module is callable as the function `mt.limits.kernels` it shadows."""

import sys
import types
from typing import Any

from . import _kernels
from ._deprecated import old_module, old_names

__all__ = old_names("kernels")
__getattr__ = old_module("kernels")


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _kernels.kernels(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
