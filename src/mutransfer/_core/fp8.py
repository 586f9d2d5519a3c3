"""FP8 simulation (public as `mutransfer.precision`): the numerics of FP8 matmuls, on any device (a simulation, not a speed-up).

`fp8_simulation` is a context manager. Inside it every matmul's operands are rounded to
float8_e4m3fn in the forward (``nn.Linear``/``F.linear``, ``matmul``/``@``, ``mm``, ``bmm``,
``addmm``/``baddbmm`` (their two factors), ``einsum``, and the query, key and value of
``F.scaled_dot_product_attention``), with a **straight-through** backward (the rounding passes
gradients through unchanged), and the gradient arriving at each such op's output is rounded to
float8_e5m2 by its own cast in the backward. The matmul then runs in the tensors' own dtype on the
rounded values: what an FP8 matmul with a higher-precision accumulator computes. These are plain,
saturating casts with no scaling, as the u-µP paper (Blake et al., 2025) trains: a value beyond the
format's largest finite (448 for E4M3, 57344 for E5M2) becomes that largest finite, one below the
smallest subnormal becomes zero. On the CPU it is slower than plain float32; it measures what FP8
would do to a training run, not how fast it would go.

Two traps this design avoids (both measured while building it, issue 50): a plain
``x.to(torch.float8_e4m3fn)`` in the graph also rounds every *gradient* flowing through it to
E4M3 (3 mantissa bits, a smallest normal of 2^-6: most gradients flush to zero), and quantizing
while `mutransfer.parametrize` runs its probe forwards corrupts what it measures. So the forward
cast is straight-through, the backward has its own E5M2 cast, and **nothing is cast while
parametrize runs** (its probe forwards, its measurements of the init): inside the block they run
unquantized, with one `MuPWarning` (a no-op with a warning rather than an error, so that
parametrizing inside a training loop's precision block still gives the full-precision µP model
it would give outside).

Put only the forward (and the loss) inside the block; the optimizer step belongs outside (an
optimizer that multiplies matrices, as Muon does, would otherwise have its own matmuls rounded).
The backward may run inside or outside: its casts are part of the graph.
"""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..errors import MuPWarning
from .devices import known_precision

__all__ = [
    "E4M3",
    "E5M2",
    "FORMATS",
    "SDPA",
    "SMALLEST_NORMAL_E4M3",
    "FP8Simulation",
    "cast_fp8",
    "fp8_simulation",
]

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
FORMATS: dict[str, torch.dtype] = {"e4m3": E4M3, "e5m2": E5M2}
SMALLEST_NORMAL_E4M3 = 2.0**-6  # torch.finfo(torch.float8_e4m3fn).smallest_normal


def _format(value: str | None, what: str) -> torch.dtype | None:
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in FORMATS:
        raise ValueError(f"{what} must be one of {', '.join(repr(k) for k in FORMATS)} or None, got {value!r}")
    return FORMATS[value.lower()]


def cast_fp8(x: torch.Tensor, dtype: torch.dtype = E4M3) -> torch.Tensor:
    """`x` rounded to an FP8 format and back to its own dtype (a saturating cast, no scaling).

    Args:
        x: a floating tensor.
        dtype: ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.

    Returns:
        A tensor of `x`'s dtype, shape and device holding the nearest FP8 values (round to nearest
        even; beyond the largest finite: the largest finite; NaN stays NaN). Not differentiable
        through the rounding: use it on values, or inside `fp8_simulation` for training.
    """
    if dtype not in (E4M3, E5M2):
        raise ValueError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    top = torch.finfo(dtype).max
    return x.clamp(-top, top).to(dtype).to(x.dtype)


class _ForwardCast(torch.autograd.Function):
    """Round to FP8 in the forward; pass the gradient through unchanged (straight-through)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return cast_fp8(x, dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _BackwardCast(torch.autograd.Function):
    """The identity in the forward; round the incoming gradient to FP8 in the backward (× the
    simulation's backward scale before the cast, ÷ it after: a power of two, so exact)."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, dtype: torch.dtype, sim: Any = None) -> torch.Tensor:
        ctx.dtype = dtype
        ctx.sim = sim
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        scale = ctx.sim.backward_scale if ctx.sim is not None else 1.0
        if scale == 1.0:
            return cast_fp8(grad, ctx.dtype), None, None
        return cast_fp8(grad * scale, ctx.dtype) / scale, None, None


# the function torch passes to a TorchFunctionMode for F.scaled_dot_product_attention (mutransfer's µP
# wrapper of F.scaled_dot_product_attention, `_core.sdpa`, calls it too)
SDPA: Callable = torch._C._nn.scaled_dot_product_attention

# op → the positions of its matmul operands (in args); -1: every tensor argument (einsum)
_OPERANDS: dict[Callable, tuple[int, ...]] = {
    F.linear: (0, 1),
    torch.matmul: (0, 1),
    torch.Tensor.matmul: (0, 1),
    torch.Tensor.__matmul__: (0, 1),
    torch.Tensor.__rmatmul__: (0, 1),
    torch.mm: (0, 1),
    torch.Tensor.mm: (0, 1),
    torch.bmm: (0, 1),
    torch.Tensor.bmm: (0, 1),
    torch.addmm: (1, 2),
    torch.Tensor.addmm: (1, 2),
    torch.baddbmm: (1, 2),
    torch.Tensor.baddbmm: (1, 2),
    torch.addbmm: (1, 2),
    torch.Tensor.addbmm: (1, 2),
    SDPA: (0, 1, 2),
    torch.einsum: (-1,),
}
_KWARG_NAMES: dict[Callable, dict[int, str]] = {
    F.linear: {0: "input", 1: "weight"},
    SDPA: {0: "query", 1: "key", 2: "value"},
}


def _in_parametrize() -> bool:
    """Is this op run by `mutransfer.parametrize` (its probe forwards, its measurements of the
    init)? The stack is read (a few µs per matmul: small beside the simulated matmul)."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "parametrize" and code.co_filename.endswith(_PARAMETRIZE_FILE):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


_PARAMETRIZE_FILE = str(Path("mutransfer", "_core", "parametrize.py"))


class _FP8Mode(TorchFunctionMode):
    def __init__(self, sim: FP8Simulation):
        super().__init__()
        self.sim = sim

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        positions = _OPERANDS.get(func)
        if positions is None or self.sim._paused:
            return func(*args, **kwargs)
        if _in_parametrize():
            self.sim._probe_seen()
            return func(*args, **kwargs)
        fwd, bwd = self.sim.forward_dtype, self.sim.backward_dtype
        args, kwargs = list(args), dict(kwargs)
        if positions == (-1,):  # einsum(equation, *operands) or einsum(equation, [operands])
            if len(args) == 2 and isinstance(args[1], (list, tuple)):
                args[1] = type(args[1])(self.sim._cast(t, fwd) for t in args[1])
            else:
                args[1:] = [self.sim._cast(t, fwd) for t in args[1:]]
        else:
            names = _KWARG_NAMES.get(func, {})
            for i in positions:
                if i < len(args):
                    args[i] = self.sim._cast(args[i], fwd)
                elif names.get(i) in kwargs:
                    kwargs[names[i]] = self.sim._cast(kwargs[names[i]], fwd)
        out = func(*args, **kwargs)
        self.sim.matmuls += 1
        if bwd is not None and isinstance(out, torch.Tensor) and out.requires_grad and out.is_floating_point():
            out = _BackwardCast.apply(out, bwd, self.sim)
        return out


@dataclass
class FP8Simulation:
    """The context `fp8_simulation` returns (reusable, not re-entrant).

    Attributes:
        forward_dtype: the format matmul operands are rounded to in the forward (None: not rounded).
        backward_dtype: the format the gradients at matmul outputs are rounded to (None: not rounded).
        exclude: modules of `model` whose forward runs unquantized.
        matmuls: matmuls simulated so far (counted across uses).
        grad_scale: the backward scale asked for: "auto" (u-µP's unit-scaled loss gradient for a
            u-µP model, none otherwise), a number, or None.
        backward_scale: the scale in effect, by which each gradient is multiplied before its E5M2
            cast and divided after (u-µP: set from the readout's output on each forward).
    """

    model: nn.Module | None = None
    forward_dtype: torch.dtype | None = E4M3
    backward_dtype: torch.dtype | None = E5M2
    exclude: tuple[str, ...] = ()
    matmuls: int = 0
    grad_scale: float | str | None = "auto"
    backward_scale: float = 1.0
    _paused: int = field(default=0, repr=False)
    _mode: _FP8Mode | None = field(default=None, repr=False)
    _handles: list = field(default_factory=list, repr=False)
    _warned: bool = field(default=False, repr=False)

    def _cast(self, x: Any, dtype: torch.dtype | None) -> Any:
        if dtype is None or not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return x
        return _ForwardCast.apply(x, dtype)

    def _probe_seen(self) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                "fp8_simulation: mutransfer.parametrize ran inside the block; its matmuls (probe forwards, "
                "measurements of the init) were not rounded to FP8: parametrize measures the model in full "
                "precision. Call parametrize before entering fp8_simulation to silence this",
                MuPWarning,
                stacklevel=4,
            )

    def __enter__(self) -> FP8Simulation:
        if self._mode is not None:
            raise RuntimeError("fp8_simulation: this context is already active; it is not re-entrant")
        if self.model is not None and self.exclude:
            modules = dict(self.model.named_modules())
            for name in self.exclude:
                module = modules[name]
                self._handles.append(module.register_forward_pre_hook(self._pause))
                self._handles.append(module.register_forward_hook(self._resume, always_call=True))
        self.backward_scale = 1.0
        if isinstance(self.grad_scale, (int, float)):
            self.backward_scale = float(self.grad_scale)
        elif self.grad_scale == "auto" and self.model is not None:
            plan, readouts = _umup_readouts(self.model)
            if plan is not None:
                for module in readouts:
                    self._handles.append(module.register_forward_hook(self._unit_loss_scale(plan)))
        self._mode = _FP8Mode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        mode, self._mode = self._mode, None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._paused = 0
        if mode is not None:
            mode.__exit__(kind, value, tb)

    def _unit_loss_scale(self, plan: Any) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            out = output[0] if isinstance(output, tuple) else output
            if isinstance(out, torch.Tensor) and out.dim() >= 1:
                self.backward_scale = plan.loss_grad_scale(out.shape)

        return hook

    def _pause(self, module: nn.Module, args: Any) -> None:
        self._paused += 1

    def _resume(self, module: nn.Module, args: Any, output: Any) -> None:
        self._paused = max(0, self._paused - 1)


def _umup_readouts(model: nn.Module) -> tuple[Any, list[nn.Module]]:
    """(u-µP plan, readout modules) of a u-µP model; (None, []) for any other model."""
    from .naming import canonical_name
    from .spec import find_spec

    spec = find_spec(model)
    plan = getattr(spec, "umup", None) if spec is not None else None
    if plan is None:
        return None, []
    names: set[str] = set()
    for name, row in plan.rows.items():
        info = spec.params[name]  # type: ignore[union-attr]
        if row == "output":
            names.update(m for m, _ in info.usages)
        names.update(info.tied_readouts)
    modules = [m for n, m in model.named_modules() if canonical_name(n) in names]
    return plan, modules


def fp8_simulation(
    model: nn.Module | None = None,
    *,
    forward: str | None = "e4m3",
    backward: str | None = "e5m2",
    exclude: Iterable[str] = (),
    grad_scale: float | str | None = "auto",
) -> FP8Simulation:
    """Simulate FP8 matmuls in the block: operands rounded to E4M3 in the forward (straight-through),
    the gradients at matmul outputs rounded to E5M2 in the backward. A simulation of the numerics on
    any device (the CPU included), not a speed-up. Never casts during `mutransfer.parametrize`'s probe
    forwards (they run unquantized, with a `MuPWarning`).

    ```python
    with mt.fp8_simulation(model):
        loss = criterion(model(x), y)
    loss.backward()
    opt.step()
    ```

    Args:
        model: the model, needed only with `exclude` (the casts apply to every matmul run in the block).
        forward: the format of the forward's matmul operands, "e4m3" (default) or "e5m2"; None: not rounded.
        backward: the format of the gradients at matmul outputs, "e5m2" (default) or "e4m3"; None: not rounded.
        exclude: names of `model`'s modules (as ``named_modules`` gives them, e.g. ``"lm_head"``) whose
            forward runs unquantized, as FP8 recipes often keep the readout in higher precision.
        grad_scale: the backward's scale at the E5M2 casts: each gradient is multiplied by it before
            its cast and divided by it after (a power of two: exact; the parameters' gradients, and so
            the training in full precision, are unchanged). "auto" (default): for a u-µP `model`, u-µP's
            unit-scaled loss gradient (`UMuPPlan.loss_grad_scale`: N·√V, read off the readout's output
            on each forward, for a loss that is a mean cross-entropy over the logits), for any other
            model none; a positive number: that fixed scale (static loss scaling); None: none.

    Returns:
        The context manager (`FP8Simulation`); its ``matmuls`` counts the matmuls it rounded.

    Raises:
        ValueError: an unknown format, or an `exclude` name that is not a module of `model`.
        TypeError: `exclude` without `model`, or a `model` that is not an ``nn.Module``.
    """
    fwd = _format(forward, "forward")
    bwd = _format(backward, "backward")
    if grad_scale is not None and grad_scale != "auto":
        if isinstance(grad_scale, bool) or not isinstance(grad_scale, (int, float)):
            raise TypeError(f"fp8_simulation: grad_scale must be 'auto', a positive number or None, got {grad_scale!r}")
        if not grad_scale > 0 or not math.isfinite(grad_scale):
            raise ValueError(f"fp8_simulation: grad_scale must be a positive finite number, got {grad_scale!r}")
    names = (exclude,) if isinstance(exclude, str) else tuple(exclude)
    if model is not None and not isinstance(model, nn.Module):
        raise TypeError(f"fp8_simulation: model must be an nn.Module, got {type(model).__name__}")
    if names and model is None:
        raise TypeError(
            "fp8_simulation: exclude names modules of a model; pass the model too: fp8_simulation(model, ...)"
        )
    if names and model is not None:
        known = {n for n, _ in model.named_modules() if n}
        unknown = [n for n in names if n not in known]
        if unknown:
            shown = ", ".join(sorted(known)[:12]) + (", ..." if len(known) > 12 else "")
            raise ValueError(
                f"fp8_simulation: exclude names no module of the model: {', '.join(unknown)}; its modules: {shown}"
            )
    return FP8Simulation(model=model, forward_dtype=fwd, backward_dtype=bwd, exclude=names, grad_scale=grad_scale)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[object]:
    """The context a forward pass runs under for `precision`: none for fp32, bfloat16 autocast on
    `device` for bf16, the FP8 simulation (`fp8_simulation`) for fp8. (Here, above `devices`, so
    that the device helpers every probe imports do not import the FP8 simulation and its spec.)"""
    if known_precision(precision, "precision") == "fp32":
        return contextlib.nullcontext()
    if precision == "fp8":
        return fp8_simulation()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
