"""Why mutransfer's step costs what it costs: each piece by which its eager training step differs
from the plain model's (forward constants, attention's scale push/pop, the SDPA wrapper, extra
optimizer param groups), timed in isolation and summed into an expected ratio. Used by
`overhead.py`, which measures the ratio itself in the real step."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import mutransfer as mt
from mutransfer import scaled_forward
from mutransfer._core import attention as mt_attention
from mutransfer._core import sdpa as mt_sdpa

LR = 1e-3  # the base lr of every build's optimizer
NO_HOOKS = "mutransfer, plain classes"  # yardstick for the µP forward's cost inside the real step
# seconds one `sample_us` may spend (after its first 5 batches); overhead.py --quick lowers it
SAMPLE_SECONDS = 5.0


def sample_us(
    fns: dict[str, Callable[[], Any]], calls: int, batches: int = 40, max_s: float | None = None
) -> dict[str, list[float]]:
    """µs per call of each function, one sample per batch of `calls` calls. Within a batch the
    functions run back to back (order rotating), so paired differences cancel machine drift.
    Stops early (after 5 batches) once `max_s` seconds (default `SAMPLE_SECONDS`) are spent."""
    max_s = SAMPLE_SECONDS if max_s is None else max_s
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for fn in fns.values():
        fn()
    start = time.perf_counter()
    for b in range(batches):
        k = b % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            for _ in range(calls):
                fns[name]()
            samples[name].append(1e6 * (time.perf_counter() - t0) / calls)
        if b >= 4 and time.perf_counter() - start > max_s:
            break
    return samples


def extra_us(samples: dict[str, list[float]], name: str, ref: str) -> float:
    """Median over batches of the per-call difference name − ref."""
    return statistics.median(a - b for a, b in zip(samples[name], samples[ref]))


def count_hooks(model: nn.Module) -> dict[str, int]:
    """Modules whose forward mutransfer changed (class switched), and forward hooks (none expected)."""
    swapped = sum(1 for m in model.modules() if "_mutransfer_parent" in type(m).__dict__)
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    return {"µP forward modules": swapped, "forward_hooks": hooks}


def capture_inputs(model: nn.Module, module_names: list[str], x: torch.Tensor) -> dict[str, torch.Tensor]:
    """First positional input of each named module during one forward pass of `model`."""
    seen: dict[str, torch.Tensor] = {}
    handles = [
        model.get_submodule(n).register_forward_pre_hook(lambda m, args, n=n: seen.setdefault(n, args[0].detach()))
        for n in module_names
    ]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return seen


def readout_hook_pieces(model: nn.Module, x: torch.Tensor, calls: int) -> dict[str, dict[str, float]]:
    """Cost of each readout multiplier: the µP forward's x·c and its backward, on the readout's
    real input, against the same call on a plain module."""
    spec = model._mutransfer_spec
    inputs = capture_inputs(model, list(spec.forward_constants), x)
    pieces = {}
    for mname, (_, c) in spec.forward_constants.items():
        act = inputs[mname].clone().requires_grad_(True)
        bare, hooked = nn.Identity(), nn.Identity()
        scaled_forward.install(hooked, input_mult=c)
        us = sample_us(
            {"bare": lambda: bare(act).sum().backward(), "hooked": lambda: hooked(act).sum().backward()}, calls
        )
        pieces[f"{mname} µP forward x·c (fwd+bwd)"] = {
            "us_per_call": extra_us(us, "hooked", "bare"),
            "calls_per_step": 1,
        }
    return pieces


def head_count(module: nn.Module) -> int:
    for attr in mt_attention._HEADS_ATTRS:
        if isinstance(getattr(module, attr, None), int):
            return getattr(module, attr)
    return 1


def attention_pieces(
    model: nn.Module, x: torch.Tensor, calls: int
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Cost of the enter/leave hooks of SDPA attention modules (dispatch, on a trivial module) and
    of the SDPA wrapper, active and passing through, at the model's q/k/v shape."""
    sdpa = [a for a in model._mutransfer_spec.attention if a.how == "sdpa"]
    if not sdpa:
        return {}, {}
    d, correction = sdpa[0].d, sdpa[0].target / sdpa[0].before
    bare, hooked = nn.Identity(), nn.Identity()
    scaled_forward.install(hooked, sdpa=correction)
    t = torch.zeros(1)
    us = sample_us({"bare": lambda: bare(t), "hooked": lambda: hooked(t)}, 20 * calls)
    pieces = {
        "attention µP forward (push/pop scale)": {
            "us_per_call": extra_us(us, "hooked", "bare"),
            "calls_per_step": len(sdpa),
        }
    }

    q = torch.randn(x.shape[0], head_count(model.get_submodule(sdpa[0].module)), x.shape[1], d)
    torch_sdpa, mup_sdpa = mt_sdpa.torch_sdpa, mt_sdpa.mup_sdpa

    def active() -> torch.Tensor:  # as inside a µP attention module (push/pop included)
        with mt_sdpa.correcting(correction):
            return mup_sdpa(q, q, q, is_causal=True)

    us = sample_us(
        {
            "torch": lambda: torch_sdpa(q, q, q, is_causal=True),
            "passthrough": lambda: mup_sdpa(q, q, q, is_causal=True),
            "active": active,
        },
        calls,
    )
    pieces["SDPA wrapper, active (µP module)"] = {
        "us_per_call": extra_us(us, "active", "torch"),
        "calls_per_step": len(sdpa),
    }
    return pieces, {
        "sdpa_wrapper_passthrough_us": extra_us(us, "passthrough", "torch"),
        "sdpa_call_us": statistics.median(us["torch"]),
    }


def group_overhead_us(calls: int, n: int = 8) -> float:
    """Fixed cost of one more param group in torch's Adam.step: `n` tiny parameters stepped
    as one group vs as `n` groups. Tiny tensors leave only the per-group Python work, which is
    what µP's split adds (the arithmetic per parameter is the same either way)."""

    def adam(grouped: bool) -> torch.optim.Optimizer:
        params = [torch.zeros(4, requires_grad=True) for _ in range(n)]
        for p in params:
            p.grad = torch.ones(4)
        return torch.optim.Adam([{"params": [p]} for p in params] if grouped else params, lr=LR)

    us = sample_us({"one group": adam(False).step, f"{n} groups": adam(True).step}, calls)
    return extra_us(us, f"{n} groups", "one group") / (n - 1)


def optimizer_piece(model: nn.Module, calls: int) -> dict[str, dict[str, float]]:
    """Extra param groups of mutransfer's optimizer × the fixed cost of a group."""
    extra_groups = len(mt.param_groups(model, LR, "adam")) - 1
    return {
        f"optimizer: {extra_groups} extra param group(s)": {
            "us_per_call": group_overhead_us(10 * calls),
            "calls_per_step": extra_groups,
        }
    }


def overhead_breakdown(model: nn.Module, x: torch.Tensor, plain_step_ms: float, calls: int) -> dict[str, Any]:
    """Time, in isolation, each piece by which mutransfer's eager step differs from the plain one
    (`model`: parametrized by mutransfer; `x`: a batch of its inputs): forward constants (readout
    multiplier, attention scale), the SDPA wrapper, the optimizer groups."""
    spec = model._mutransfer_spec
    pieces = readout_hook_pieces(model, x, calls)
    attn, extra = attention_pieces(model, x, calls)
    pieces.update(attn)
    pieces.update(optimizer_piece(model, calls))
    total_us = sum(p["us_per_call"] * p["calls_per_step"] for p in pieces.values())
    return {
        "hooks": count_hooks(model),
        "attention": [[a.module, a.how, a.d0, a.d, a.scale] for a in spec.attention],
        "forward_constants": {k: list(v) for k, v in spec.forward_constants.items()},
        "pieces_us": pieces,
        **extra,
        "total_us_per_step": total_us,
        "plain_step_ms": plain_step_ms,
        "expected_ratio": 1.0 + total_us / (1e3 * plain_step_ms),
    }


def print_breakdown(model: str, bd: dict[str, Any]) -> None:
    print(
        f"\nWhat mutransfer changes in the eager {model} step, each piece timed in isolation "
        "(no allocator or cache effects of the real step):"
    )
    print(f"  modules changed: {bd['hooks']}; forward constants: {bd['forward_constants'] or 'none'}")
    for piece, p in bd["pieces_us"].items():
        print(f"  {piece:38s} {p['us_per_call']:8.1f} µs × {p['calls_per_step']} per step")
    if "sdpa_wrapper_passthrough_us" in bd:
        print(
            f"  {'SDPA wrapper, pass-through':38s} {bd['sdpa_wrapper_passthrough_us']:8.1f} µs per SDPA call "
            f"(plain models pay it too; one SDPA call ≈ {bd['sdpa_call_us']:.0f} µs)"
        )
    print(
        f"  total ≈ {bd['total_us_per_step']:.0f} µs per step vs plain step {bd['plain_step_ms']:.2f} ms "
        f"→ expected ratio ≈ {bd['expected_ratio']:.4f}"
    )
    in_situ = bd.get("hooks_in_situ")
    if in_situ:
        print(
            f"  in the real step (round-robin with '{NO_HOOKS}'): mutransfer / plain classes = "
            f"{in_situ['ratio']:.4f} (quartiles {in_situ['ratio_q25']:.3f}–{in_situ['ratio_q75']:.3f}) "
            f"→ µP forward ≈ {1e3 * (in_situ['ratio'] - 1) * bd['plain_step_ms']:.0f} µs per step"
        )
        if bd.get("without_hooks_vs_plain") is not None:
            print(
                f"  yardstick: plain classes / plain = {bd['without_hooks_vs_plain']:.4f}, the same "
                "arithmetic per step: differences of that size are noise (memory placement, allocator)"
            )
