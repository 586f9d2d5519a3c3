"""Where training runs: a device chosen by name, and the precision it trains in.

One home for the words every entry point takes (`mt.coord_check(device=)`, the sweep's
``devices``/``precision``, ``mutransfer demo|transfer|coord-check --device``):

- device ``"auto"``: CUDA when this process sees a GPU (``cuda``, i.e. ``cuda:0`` of the visible
  ones), else the CPU; ``"cpu"``; ``"cuda"``/``"cuda:N"``; any ``torch.device``. Asking for CUDA
  where there is none, or for a GPU index that is not visible, is a `ValueError` naming the
  parameter.
- precision ``"fp32"`` (the default: no autocast) or ``"bf16"``: forward passes under
  ``torch.autocast(device.type, dtype=torch.bfloat16)``, the parameters and optimizer state kept
  in float32 (mixed precision, as large runs train). CPU autocast supports bf16 too, so bf16 runs
  and is tested without a GPU; a CUDA device without bf16 (before Ampere) is refused.
- precision ``"fp8"``: a simulation of FP8 matmuls (`mutransfer.precision.fp8_simulation`: operands
  rounded to E4M3 in the forward, gradients to E5M2 in the backward), on any device; the numerics
  of FP8 training, not its speed.

Resolving ``"auto"`` asks ``torch.cuda.is_available()``, which does not create a CUDA context:
a process that only resolves devices can still start CUDA workers safely.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..errors import DeviceError
from .naming import canonical_name

__all__ = [
    "AUTO",
    "PRECISIONS",
    "DeviceLike",
    "check_precision",
    "known_precision",
    "map_tensors",
    "meta_parameters",
    "module_device",
    "move",
    "resolve_device",
    "same_device",
]

AUTO = "auto"
PRECISIONS = ("fp32", "bf16", "fp8")
DeviceLike = str | torch.device


def resolve_device(device: DeviceLike = AUTO, what: str = "device") -> torch.device:
    """`device` as a `torch.device`; ``"auto"`` picks CUDA when available, else the CPU.

    `what` names the parameter in errors (e.g. ``"--device"``)."""
    if isinstance(device, torch.device):
        resolved = device
    elif isinstance(device, str):
        if device == AUTO:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            resolved = torch.device(device)
        except RuntimeError:
            raise DeviceError(f"{what} must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    else:
        raise TypeError(
            f"{what} must be 'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device, got {type(device).__name__}"
        )
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"{what} {str(resolved)!r}: CUDA is not available in this process "
                "(no GPU, a CPU build of torch, or CUDA_VISIBLE_DEVICES hides them); "
                f"use {what} 'auto' or 'cpu'"
            )
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise DeviceError(
                f"{what} {str(resolved)!r}: this process sees {count} GPU(s) (cuda:0 to "
                f"cuda:{count - 1}); pick one of those"
            )
    elif resolved.type not in ("cpu", "meta", "mps", "xpu"):
        raise DeviceError(
            f"{what} {str(resolved)!r}: not a device mutransfer trains on; use 'auto', 'cpu' or 'cuda[:N]'"
        )
    return resolved


def check_precision(precision: str, device: torch.device, what: str = "precision") -> str:
    """`precision` if `device` can train in it; a `ValueError` naming `what` and the fix otherwise.

    On CUDA this asks the device whether it has bf16, which initialises CUDA in this process."""
    known_precision(precision, what)
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(device)
        raise DeviceError(f"{what} 'bf16': {device} ({name}) has no bfloat16 support; use {what} 'fp32'")
    return precision


def known_precision(precision: str, what: str = "precision") -> str:
    """`precision` when it is one of `PRECISIONS`; a ValueError naming `what` otherwise."""
    if precision not in PRECISIONS:
        raise DeviceError(f"{what} must be one of {', '.join(repr(p) for p in PRECISIONS)}, got {precision!r}")
    return precision


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`obj` with `fn` applied to every tensor in it: a tensor, or tuples (named ones too), lists and
    dicts of them, nested; anything else is returned as it is."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(map_tensors(v, fn) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    return obj


def move(obj: Any, device: torch.device) -> Any:
    """`obj` with every tensor in it on `device` (see `map_tensors`). Tensors already there are not copied."""
    return map_tensors(obj, lambda t: t.to(device))


def meta_parameters(module: nn.Module) -> list[str]:
    """The canonical names of `module`'s parameters that are on the meta device (no values)."""
    return [canonical_name(n) for n, p in module.named_parameters() if p.is_meta]


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether `a` and `b` are one device; an index left out (``cuda``) stands for the current one."""
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        current = torch.cuda.current_device() if a.type == "cuda" else 0
        return (current if a.index is None else a.index) == (current if b.index is None else b.index)
    return a.index == b.index


def module_device(module: nn.Module) -> torch.device:
    """Where `module` lives: the device of its first parameter (else buffer); the CPU when it has neither."""
    for p in module.parameters():
        return p.device
    for b in module.buffers():
        return b.device
    return torch.device("cpu")
