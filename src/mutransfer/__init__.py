"""mutransfer: the Maximal Update Parametrization (µP) and µTransfer for PyTorch.

The names users call live here (`mt.parametrize`, `mt.param_groups`, `mt.coord_check`, ...), with
`mt.sweep` (µTransfer sweeps), `mt.limits` (infinite-width limits), `mt.optim` (ready optimizers),
`mt.rules` (µP as data) and `mt.errors`. Everything is imported on first use, so that
`import mutransfer` and `mutransfer --help` do not wait for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._compat import install_module_aliases

__version__ = "0.1.0"

# public name → (module that defines it, attribute; None for the module itself)
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "parametrize": ("._core.parametrize", "parametrize"),
    "param_groups": (".optim", "param_groups"),
    "coord_check": (".coord", "coord_check"),
    "CoordCheckResult": (".coord", "CoordCheckResult"),
    "Monitor": (".monitor", "Monitor"),
    "describe": ("._core.describe", "describe"),
    "export": ("._core.export", "export"),
    "init_weights": ("._core.init_weights", "init_weights"),
    "check": ("._core.init_check", "check"),
    "CheckReport": ("._core.init_check", "CheckReport"),
    "CheckFinding": ("._core.init_check", "CheckFinding"),
    "attn_scale": ("._core.attention", "attn_scale"),
    "attn_logits": ("._core.attention", "attn_logits"),
    "residual_branch": ("._core.depth", "residual_branch"),
    "save_shapes": ("._core.shapes", "save_shapes"),
    "load_shapes": ("._core.shapes", "load_shapes"),
    "WidthShapes": ("._core.shapes", "WidthShapes"),
    "MuSpec": ("._core.spec", "MuSpec"),
    "resolve_device": ("._core.devices", "resolve_device"),
    "Scale": ("._core.scale", "Scale"),
    "transfer_hparams": ("._core.hparam_transfer", "transfer_hparams"),
    "TransferredHParams": ("._core.hparam_transfer", "TransferredHParams"),
    "MeasuredLaw": ("._core.measured_law", "MeasuredLaw"),
    "gradient_noise_scale": ("._core.noise_scale", "gradient_noise_scale"),
    "NoiseScale": ("._core.noise_scale", "NoiseScale"),
    "MuPWarning": (".errors", "MuPWarning"),
    "MuTransferError": (".errors", "MuTransferError"),
    "errors": (".errors", None),
    "rules": (".rules", None),
    "optim": (".optim", None),
    "optimizers": (".optimizers", None),
    "sweep": (".sweep", None),
    "limits": (".limits", None),
    "monitor": (".monitor", None),
    "precision": (".precision", None),
    "fp8_simulation": (".precision", "fp8_simulation"),
}

__all__ = [
    "CheckFinding",
    "CheckReport",
    "CoordCheckResult",
    "MeasuredLaw",
    "Monitor",
    "MuPWarning",
    "MuSpec",
    "MuTransferError",
    "NoiseScale",
    "Scale",
    "TransferredHParams",
    "WidthShapes",
    "__version__",
    "attn_logits",
    "attn_scale",
    "check",
    "coord_check",
    "describe",
    "errors",
    "export",
    "fp8_simulation",
    "gradient_noise_scale",
    "init_weights",
    "limits",
    "load_shapes",
    "monitor",
    "optim",
    "optimizers",
    "param_groups",
    "parametrize",
    "precision",
    "residual_branch",
    "resolve_device",
    "rules",
    "save_shapes",
    "sweep",
    "transfer_hparams",
]

if TYPE_CHECKING:  # what type checkers and the API docs see; at run time `__getattr__` imports on use
    from . import errors, limits, monitor, optim, optimizers, precision, rules, sweep
    from ._core.attention import attn_logits, attn_scale
    from ._core.depth import residual_branch
    from ._core.describe import describe
    from ._core.devices import resolve_device
    from ._core.export import export
    from ._core.hparam_transfer import TransferredHParams, transfer_hparams
    from ._core.init_check import CheckFinding, CheckReport, check
    from ._core.init_weights import init_weights
    from ._core.measured_law import MeasuredLaw
    from ._core.noise_scale import NoiseScale, gradient_noise_scale
    from ._core.parametrize import parametrize
    from ._core.scale import Scale
    from ._core.shapes import WidthShapes, load_shapes, save_shapes
    from ._core.spec import MuSpec
    from .coord import CoordCheckResult, coord_check
    from .errors import MuPWarning, MuTransferError
    from .monitor import Monitor
    from .optim import param_groups
    from .precision import fp8_simulation


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'mutransfer' has no attribute {name!r}") from None
    value = importlib.import_module(module, __name__)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


install_module_aliases()
