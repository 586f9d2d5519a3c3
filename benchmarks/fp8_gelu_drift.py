"""Why a GELU MLP's operands drift below FP8's range under u-µP, and what it costs.

`benchmarks/fp8_underflow.py` finds that after training a GPT's (GELU MLP) hidden-matmul operands
under u-µP sit above the ≤ 5 % below 2^-6 that a Llama's (SwiGLU) keep, all of it in the MLP's
down-projection input. This script follows that operand over a longer run of the same setup (the
same model, data, AdamW, its `train`): at steps 150·2^k it prints, per block, the RMS of the GELU's
input, the share of it past −t (t where unit-scaled GELU's magnitude falls below 2^-6), and
the down-projection input's count and mass below 2^-6 (`mt.precision.fp8_underflow`), for u-µP's
default α_ffn_act = 1, 0.5, and 1/1.702 (GELU's curve on SiLU's scale: gelu(x) ≈ x·σ(1.702·x), so
this α gives GELU the shape α = 1 gives SiLU, u-µP's paper's nonlinearity). Then, at the default,
the FP8 loss gap of the whole run three ways: every matmul cast, the forward casts only, and every
matmul but the two down-projections (`exclude=`) — what the GELU's underflow itself costs.

    python benchmarks/fp8_gelu_drift.py [--width 256] [--steps 1200] [--lr 0.125] [--threads 1] [--quick]

The lr is the width-64 scan's optimum that `fp8_underflow.py` finds for u-µP (2^-3). A simulation of
FP8's numerics on the CPU: the times are not FP8's.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from fp8_underflow import batches, share, train  # this directory's FP8 benchmark: one setup for both

from mutransfer._core.unit_ops import activation_scale
from mutransfer.precision import SMALLEST_NORMAL_E4M3, fp8_underflow


def tail_threshold(alpha: float) -> float:
    """t: for a GELU input u below −t, u-µP's unit-scaled output gelu(u)/(α·σ_α) has magnitude under 2^-6
    (u is what the GELU sees: α is folded onto the output of the layer before it)."""
    sigma = activation_scale("gelu", alpha)
    u = torch.linspace(-12.0, -0.25, 200_001, dtype=torch.float64)
    y = (F.gelu(u) / (alpha * sigma)).abs()
    return -float(u[y >= SMALLEST_NORMAL_E4M3].min())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--lr", type=float, default=2.0**-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="width 64, 40 steps (a smoke run)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    width, steps = (64, 40) if args.quick else (args.width, args.steps)
    marks = [150 * 2**k for k in range(8) if 150 * 2**k < steps] + [steps]
    if args.quick:
        marks = [20, 40]
    probe = batches(1, seed=99)[0][0]
    start = time.perf_counter()
    print(f"GPT width {width}, u-µP, AdamW lr {args.lr:g}, {steps} steps; per block: GELU input RMS, its share past −t")
    print("(t: unit-scaled GELU under 2^-6 below −t), the down-projection input's count and mass below 2^-6\n")
    print(
        "| α_ffn_act | t | step | GELU input RMS | past −t | fc_out input below 2^-6 | its mass | all operands | loss |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, alpha in (("1 (default)", 1.0), ("0.5", 0.5), ("1/1.702", 1 / 1.702)):
        t = tail_threshold(alpha)
        rows: dict[int, str] = {}

        def measure(step: int, model: torch.nn.Module, t: float = t, rows: dict[int, str] = rows) -> None:
            if step not in marks:
                return
            seen: dict[int, torch.Tensor] = {}
            hooks = [
                b.fc.register_forward_hook(lambda m, i, o, k=k: seen.__setitem__(k, o.detach()))
                for k, b in enumerate(model.blocks)
            ]
            with torch.no_grad():
                model(probe)
            for h in hooks:
                h.remove()
            rms = " / ".join(f"{float(v.pow(2).mean().sqrt()):.2f}" for v in seen.values())
            past = " / ".join(share(float((v < -t).double().mean())) for v in seen.values())
            r = fp8_underflow(model, probe)
            down = [n for n in r.by_layer if n.endswith("fc_out:input")]
            count = " / ".join(share(r.by_layer[n]) for n in down)
            mass = " / ".join(share(r.mass_by_layer[n]) for n in down)
            rows[step] = f"{rms} | {past} | {count} | {mass} | {share(r.fraction)}"

        loss, _ = train(width, "u-mup", args.lr, steps, alphas={"alpha_ffn_act": alpha}, on_step=measure)
        for step, row in rows.items():
            print(
                f"| {label} | {t:.2f} | {step} | {row} | {loss:.4f} |"
                if step == steps
                else f"| {label} | {t:.2f} | {step} | {row} | |"
            )
    down = tuple(f"blocks.{k}.fc_out" for k in range(2))
    fp32, _ = train(width, "u-mup", args.lr, steps, alphas={})
    print(f"\nFP8 over the {steps} steps at the default α's (fp32 {fp32:.4f}):\n")
    print("| fp8 | loss | gap |")
    print("|---|---|---|")
    for label, mode, exclude in (
        ("every matmul (E4M3 forward, E5M2 backward)", "fp8", ()),
        ("the forward casts only", "fp8 fwd", ()),
        ("every matmul but the two down-projections", "fp8", down),
    ):
        loss, _ = train(width, "u-mup", args.lr, steps, mode, alphas={}, exclude=exclude)
        gap = f"{100 * (loss - fp32) / fp32:+.2f}%" if math.isfinite(loss) else "diverged"
        print(f"| {label} | {loss:.4f} | {gap} |", flush=True)
    print(f"\ntotal {time.perf_counter() - start:.0f} s (a CPU simulation of FP8's numerics, not its speed)")


if __name__ == "__main__":
    main()
