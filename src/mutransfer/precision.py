"""Low-precision training, simulated: `fp8_simulation` (FP8 matmuls: E4M3 operands in the forward,
E5M2 gradients in the backward, plain saturating casts, straight-through) and `fp8_underflow` (how
much of the hidden matmuls' operands falls below E4M3's smallest normal, 2^-6).

A simulation of the numerics on any device, the CPU included, not a speed-up: the rounded values
are multiplied in the tensors' own dtype. See docs/u-mup.md ("FP8 simulation") for what it casts,
the two traps it avoids (gradients through a forward cast; casting while `parametrize` measures the
model) and the measured numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ._core.fp8 import E4M3, E5M2, FORMATS, SDPA, SMALLEST_NORMAL_E4M3, FP8Simulation, cast_fp8, fp8_simulation

__all__ = [
    "E4M3",
    "E5M2",
    "FORMATS",
    "SMALLEST_NORMAL_E4M3",
    "FP8Simulation",
    "UnderflowReport",
    "cast_fp8",
    "fp8_simulation",
    "fp8_underflow",
]


@dataclass
class UnderflowReport:
    """How much of the hidden matmuls' operands FP8 (E4M3) holds below its smallest normal.

    Attributes:
        fraction: elements with 0 < |x| < `threshold` over all hidden-matmul operand elements (weights
            and activations together). Exact zeros are not counted: FP8 holds them exactly (a ReLU's
            output is half zeros); they are `zeros`.
        weights: the same over the hidden weights alone.
        activations: the same over the activations entering those matmuls (and the attention's q, k, v).
        zeros: the fraction that is exactly zero (held exactly by FP8: not lost precision).
        threshold: the bound, E4M3's smallest normal 2^-6 by default.
        by_layer: operand name (``"blocks.0.fc.weight"``, ``"blocks.0.fc:input"``,
            ``"blocks.0.attn:query"``) → its fraction.
        elements: operand elements counted.
        mass: the share of the operands' squared norm that those elements hold, Σ_{|x|<t} x² / Σ x²
            (each operand's share, averaged over the operands with equal weight). The count says how
            many elements FP8 holds with fewer bits; the mass says how much of what the matmul sums
            they carry — flushing them all to zero moves an operand by at most √mass of its norm. A
            sparse operand (a trained GELU's output, most of it in the flat negative tail) has a large
            count and a negligible mass.
        mass_by_layer: operand name → its mass.
    """

    fraction: float
    weights: float
    activations: float
    zeros: float
    threshold: float
    by_layer: dict[str, float]
    elements: int
    mass: float
    mass_by_layer: dict[str, float]

    def __str__(self) -> str:
        return (
            f"{100 * self.fraction:.1f}% of hidden matmul operands below {self.threshold:g} "
            f"(weights {100 * self.weights:.1f}%, activations {100 * self.activations:.1f}%, "
            f"exact zeros {100 * self.zeros:.1f}%; {self.elements:,} elements), holding "
            f"{100 * self.mass:.3g}% of their squared norm"
        )


class _Counter:
    def __init__(self, threshold: float):
        self.threshold = threshold
        # name → [below, zeros, total, is_weight, squared norm below, squared norm]
        self.rows: dict[str, list[float]] = {}

    def add(self, name: str, x: torch.Tensor, weight: bool) -> None:
        x = x.detach().double()
        a = x.abs()
        small = (a < self.threshold) & (a > 0)
        row = self.rows.setdefault(name, [0, 0, 0, int(weight), 0.0, 0.0])
        row[0] += int(small.sum())
        row[1] += int((x == 0).sum())
        row[2] += x.numel()
        row[4] += float((x * x)[small].sum())
        row[5] += float((x * x).sum())

    def report(self) -> UnderflowReport:
        def frac(rows: list[list[float]], col: int = 0) -> float:
            total = sum(r[2] for r in rows)
            return sum(r[col] for r in rows) / total if total else float("nan")

        rows = list(self.rows.values())
        masses = {name: r[4] / r[5] if r[5] > 0 else 0.0 for name, r in self.rows.items() if r[2]}
        if not rows:
            raise ValueError(
                "fp8_underflow: the forward ran no hidden matmul (no linear of a hidden weight, no attention); "
                "pass hidden= the names of the model's hidden weights"
            )
        return UnderflowReport(
            fraction=frac(rows),
            weights=frac([r for r in rows if r[3]]),
            activations=frac([r for r in rows if not r[3]]),
            zeros=frac(rows, 1),
            threshold=self.threshold,
            by_layer={name: r[0] / r[2] for name, r in self.rows.items() if r[2]},
            elements=int(sum(r[2] for r in rows)),
            mass=sum(masses.values()) / len(masses) if masses else float("nan"),
            mass_by_layer=masses,
        )


class _UnderflowMode(TorchFunctionMode):
    def __init__(self, counter: _Counter, hidden: dict[int, str]):
        super().__init__()
        self.counter = counter
        self.hidden = hidden
        self.module: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x = args[0] if args else kwargs.get("input")
            w = args[1] if len(args) > 1 else kwargs.get("weight")
            name = self.hidden.get(id(w))
            if name is not None and isinstance(x, torch.Tensor):
                self.counter.add(name, w, weight=True)
                self.counter.add(name.rsplit(".", 1)[0] + ":input", x, weight=False)
        elif func is SDPA:
            where = self.module[-1] if self.module else "attention"
            for i, part in enumerate(("query", "key", "value")):
                t = args[i] if i < len(args) else kwargs.get(part)
                if isinstance(t, torch.Tensor):
                    self.counter.add(f"{where}:{part}", t, weight=False)
        return func(*args, **kwargs)


@contextmanager
def _module_names(model: nn.Module, mode: _UnderflowMode) -> Iterator[None]:
    def enter(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            mode.module.append(name)

        return hook

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        if mode.module:
            mode.module.pop()

    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(module.register_forward_hook(leave, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def fp8_underflow(
    model: nn.Module,
    inputs: Any,
    *,
    hidden: Iterable[str] | None = None,
    threshold: float = SMALLEST_NORMAL_E4M3,
) -> UnderflowReport:
    """The fraction of the hidden matmuls' operand elements below E4M3's smallest normal (2^-6), on
    one forward of `model` on `inputs` (run without gradients, in full precision).

    Counted: every ``F.linear`` (``nn.Linear``) whose weight is a hidden weight — both the weight's
    and the input's elements — and the query, key and value of every
    ``F.scaled_dot_product_attention``. Input and output layers are left out (their fan-in or fan-out
    is finite: not what width scaling moves).

    Args:
        model: a model; its hidden weights are read from `mutransfer.parametrize`'s roles, or given by `hidden`.
        inputs: the forward's input: a tensor, a tuple of positional arguments or a dict of keyword arguments.
        hidden: names of the hidden weights (``"blocks.0.fc.weight"``), for a model not parametrized.
        threshold: the bound (default E4M3's smallest normal, 2^-6).

    Returns:
        The `UnderflowReport`.

    Raises:
        ValueError: the model is not parametrized and `hidden` is not given, a `hidden` name is not a
            parameter of it, or the forward ran no hidden matmul.
    """
    from ._core.naming import canonical_name
    from ._core.spec import find_spec

    params = dict(model.named_parameters(remove_duplicate=False))
    if hidden is not None:
        names = [hidden] if isinstance(hidden, str) else list(hidden)
        unknown = [n for n in names if n not in params]
        if unknown:
            raise ValueError(f"fp8_underflow: hidden names no parameter of the model: {', '.join(unknown)}")
        chosen = {id(params[n]): n for n in names}
    else:
        spec = find_spec(model)
        if spec is None:
            raise ValueError(
                "fp8_underflow: the model is not parametrized, so its hidden weights are unknown; call "
                "mt.parametrize(model, base=...) first, or pass hidden=[names of its hidden weights]"
            )
        chosen = {}
        for n, p in params.items():
            info = spec.params.get(canonical_name(n))
            if info is not None and info.role == "hidden":
                chosen.setdefault(id(p), n)
    counter = _Counter(threshold)
    mode = _UnderflowMode(counter, chosen)
    args, kwargs = (
        ((), inputs) if isinstance(inputs, dict) else ((inputs if isinstance(inputs, tuple) else (inputs,)), {})
    )
    with torch.no_grad(), _module_names(model, mode), mode:
        model(*args, **kwargs)
    return counter.report()
