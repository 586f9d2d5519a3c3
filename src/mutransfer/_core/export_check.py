"""Checks for `export`: probe inputs, comparing two models' outputs, precision and cache handling.

Every fold `export` makes is kept only when a probe forward agrees with the µP model; this module
holds how those probes are made and compared (`relative_error`, `check_same_outputs`), how zeros are
filled so that a fold cannot pass by multiplying zeros (`fill_zeros`), low precision
(`low_precision`, `cast_floats`, `restore_dtypes`) and Hugging Face's KV cache (`NoCache`).
"""

from __future__ import annotations

import copy
import math
import types
from typing import Any

import torch
from torch import nn

from ..errors import ExportError
from .observe import call_model, example_inputs, to_device

__all__ = [
    "NoCache",
    "cast_floats",
    "check_same_outputs",
    "copied",
    "copy_model",
    "fill_zeros",
    "float_tensors",
    "hf_configs",
    "low_precision",
    "probe_inputs",
    "relative_error",
    "restore_dtypes",
]


def copied(obj: Any) -> Any:
    """A deep copy where one can be made (a module's inputs, a cache object), else the object."""
    try:
        return copy.deepcopy(obj)
    except Exception:
        return obj


def copy_model(model: nn.Module) -> nn.Module:
    """`copy.deepcopy(model)` whose instance-level forwards run the copy, not the original.

    `deepcopy` shares function objects: a forward set on an instance (a closure over the model, a bound
    method of one of its modules) would keep calling the original's layers, and every fold checked on
    the copy would be checked on the original instead. Such forwards are rebound to the copy's modules:
    a closure's cells and a bound method's `__self__` that hold an object the copy replaced get the copy.
    """
    memo: dict[int, Any] = {}
    new = copy.deepcopy(model, memo)
    for module in new.modules():
        forward = module.__dict__.get("forward")
        if forward is not None:
            module.__dict__["forward"] = _rebound(forward, memo)
    return new


def _rebound(fn: Any, memo: dict[int, Any]) -> Any:
    """`fn` with the objects its closure or `__self__` holds replaced by their copies in `memo`."""
    if isinstance(fn, types.MethodType):
        return types.MethodType(_rebound(fn.__func__, memo), memo.get(id(fn.__self__), fn.__self__))
    if isinstance(fn, types.FunctionType) and fn.__closure__:
        cells = tuple(_cell_copy(c, memo) for c in fn.__closure__)
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, cells)
        new.__kwdefaults__ = fn.__kwdefaults__
        return new
    return fn


def _cell_copy(cell: types.CellType, memo: dict[int, Any]) -> types.CellType:
    try:
        value = cell.cell_contents
    except ValueError:  # an empty cell (a name not bound yet)
        return cell
    return types.CellType(memo.get(id(value), value))


def float_tensors(out: Any) -> list[torch.Tensor]:
    """The floating-point tensors of a (nested) model output, in order."""
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, dict):
        return [t for v in out.values() for t in float_tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in float_tensors(v)]
    return []


def relative_error(a: Any, b: Any) -> float:
    """max |a − b| / max |b| over the floating-point tensors of two outputs (inf if they differ in kind)."""
    ta, tb = float_tensors(a), float_tensors(b)
    if len(ta) != len(tb) or not tb or any(x.shape != y.shape for x, y in zip(ta, tb)):
        return math.inf
    worst = 0.0
    for x, y in zip(ta, tb):
        x, y = x.detach().double(), y.detach().double()
        finite = torch.isfinite(y)
        if not torch.equal(finite, torch.isfinite(x)) or not torch.equal(x[~finite], y[~finite]):
            return math.inf  # masks (-inf) must agree exactly
        x, y = x[finite], y[finite]
        scale = float(y.abs().max()) if y.numel() else 0.0
        diff = float((x - y).abs().max()) if y.numel() else 0.0
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def check_same_outputs(plain: nn.Module, reference: nn.Module, inputs: Any, rtol: float, what: str) -> None:
    """Run both models on `inputs` and raise unless their outputs agree within `rtol`.

    Args:
        plain: the exported model.
        reference: the µP model it must reproduce.
        inputs: probe inputs (as `call_model` takes them).
        rtol: largest allowed `relative_error`.
        what: what `plain` is, for the message.

    Raises:
        ExportError: the outputs differ by more than `rtol`.
    """
    err = relative_error(call_model(plain, inputs), call_model(reference, inputs))
    if not err <= rtol:
        raise ExportError(
            f"export: {what} differs from the µP model on the probe forward (relative difference "
            f"{err:.3g} > rtol={rtol:g}); nothing was returned. Report this with the model's class"
        )


def probe_inputs(model: nn.Module, inputs: Any) -> Any:
    """Inputs for export's probe forwards: the user's (checked to run) or the first made ones that run.

    Args:
        model: the model to probe (put in eval mode).
        inputs: the user's `example_inputs`, or None to make them (`example_inputs`).

    Returns:
        Inputs the model's forward accepts, on its device.

    Raises:
        ExportError: the given inputs do not run, or none could be made that run.
    """
    if inputs is not None:
        inputs = to_device(inputs, model)
        try:
            call_model(model.eval(), inputs)
        except Exception as e:
            raise ExportError(
                f"export could not run the model on example_inputs ({type(e).__name__}: {e}); pass "
                "inputs its forward accepts (a tensor, a tuple of arguments or a dict of keyword "
                "arguments)"
            ) from None
        return inputs
    errors = []
    for cand in example_inputs(model):
        try:
            call_model(model.eval(), cand)
            return cand
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
    raise ExportError(
        f"export could not make inputs for a probe forward of {type(model).__name__} "
        f"({'; '.join(errors) or 'no input layer found'}); pass example_inputs="
    )


def low_precision(model: nn.Module) -> torch.dtype | None:
    """float16/bfloat16 if any parameter is stored in it, else None."""
    for p in model.parameters():
        if p.dtype in (torch.float16, torch.bfloat16):
            return p.dtype
    return None


def cast_floats(obj: Any, dtype: torch.dtype) -> Any:
    """Floating-point tensors of (nested) inputs cast to dtype."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, dict):
        return {k: cast_floats(v, dtype) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(cast_floats(v, dtype) for v in obj)
    return obj


def restore_dtypes(plain: nn.Module, original: nn.Module) -> None:
    """Every parameter and buffer of `plain` back to the dtype it has in `original`."""
    params = dict(original.named_parameters(remove_duplicate=False))
    buffers = dict(original.named_buffers(remove_duplicate=False))
    for name, p in plain.named_parameters(remove_duplicate=False):
        p.data = p.data.to(params[name].dtype)
    for name, b in plain.named_buffers(remove_duplicate=False):
        b.data = b.data.to(buffers[name].dtype)


def fill_zeros(model: nn.Module) -> list[str]:
    """Give every all-zero floating-point parameter random values (fixed seed); their names."""
    g = torch.Generator().manual_seed(0)
    filled = []
    for name, p in model.named_parameters():
        if p.is_floating_point() and p.numel() and not p.any():
            fan_in = p.shape[-1] if p.dim() > 1 else p.shape[0]
            # drawn on the CPU (a seeded generator gives the same values on every device), then moved to p's
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p) / math.sqrt(fan_in))
            filled.append(name)
    return filled


def hf_configs(model: nn.Module) -> list:
    """A Hugging Face model's config and its text config (when different); [] for other models."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return []
    out = [cfg]
    text = getattr(cfg, "get_text_config", None)
    if callable(text):
        t = text()
        if t is not cfg:
            out.append(t)
    return out


class NoCache:
    """Hugging Face models: no KV cache during the probes (a cache grows when a module is re-run)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.configs = [c for c in hf_configs(model) if getattr(c, "use_cache", None)]

    def __enter__(self):
        for c in self.configs:
            c.use_cache = False

    def __exit__(self, *exc):
        for c in self.configs:
            c.use_cache = True

    def restore(self, copied: nn.Module) -> None:
        """The same configs of a copy made meanwhile: caching on again."""
        flags = [any(c is x for x in self.configs) for c in hf_configs(self.model)]
        for c, on in zip(hf_configs(copied), flags):
            if on:
                c.use_cache = True
