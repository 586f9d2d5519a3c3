"""FP8 under µP and u-µP: how much of the hidden matmuls' operands falls below E4M3's smallest
normal (2^-6), at init and after training, and what simulated FP8 training costs in loss.

The model is one of the recipes' byte-level transformers (`--model`): the GPT (LayerNorm, fused
qkv, GELU MLP; 2 layers, 4 heads, context 32, untied readout) or the Llama (RMSNorm, q/k/v/o,
rotary, SwiGLU: u-µP's paper trains this family), nanoGPT's 0.02 init at the base width 32,
parametrized with µP (`parametrization="mup"`) and u-µP (`"u-mup"`), trained with AdamW (the groups
of `mt.param_groups`) on the demo's text, batch 16, with a 10 % linear warmup. Each
parametrization's lr is the best of a small scan at width 64 in float32 (its optimum transfers
across width). At the target width the same run (same seed, same batches) trains in:

- fp32;
- fp8: `mt.fp8_simulation(model)` (operands E4M3 in the forward, straight-through; gradients at
  matmul outputs E5M2 in the backward; plain saturating casts). For u-µP the backward is
  unit-scaled as u-µP defines it (its loss gradient × N·√V, `grad_scale="auto"`, taken out again
  after each cast: exact, a power of two); for µP nothing is scaled;
- fp8 plain: fp8 with no backward scale at all (`grad_scale=None`; the same as fp8 for µP);
- fp8 fwd: the E4M3 forward casts only (gradients unrounded);
- fp8 ×2^S: fp8 plain with the loss multiplied by 2^S (static loss scaling: AdamW's update does not
  change with the loss's scale, save ε), so that small gradients do not flush in E5M2.

The probe forward of `parametrize` runs at the training length (``example_inputs``): u-µP's
attention-output scale is computed at the probe's sequence length.

Printed: the underflow (`mt.precision.fp8_underflow`: the count of operand elements below 2^-6,
and their mass, the share of the operands' squared norm they hold) at init and after the fp32
run, each run's final loss (the mean of the last tenth of the steps) and the gap to fp32 in %.
`--seeds K` repeats the fp32 run on K seeds (init and batches) for the underflow after training;
`--horizon N` trains N steps in fp32 (the underflow at steps·2^k and at N) and in fp8 (its gap).

    python benchmarks/fp8_underflow.py [--model gpt|llama] [--width 256] [--steps 150]
        [--parametrizations mup,u-mup,u-mup-tuned] [--seeds 1] [--horizon 0] [--lr-scale 1]
        [--loss-scale 12] [--quick] [--threads 1]

A simulation of the numerics on the CPU: the times are not FP8's.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer.precision import UnderflowReport, fp8_simulation, fp8_underflow
from mutransfer.recipes.data import stdlib_text
from mutransfer.recipes.models import GPT, Llama

BASE, CTX, BATCH = 32, 32, 16
SCANS = {"mup": [2.0**e for e in range(-12, -6)], "u-mup": [2.0**e for e in range(-5, 2)]}
MODEL = "gpt"  # --model: "gpt" (LayerNorm, fused qkv, GELU MLP) or "llama" (RMSNorm, q/k/v/o, SwiGLU)
# u-µP with the two α's of a one-at-a-time sweep at width 256 (lr 2^-3, fp32, this script's `train`):
# α_res_attn_ratio 0.25 (2.5699 vs 2.6752 at 1) and α_ffn_act 0.5 (the MLP's GELU outputs stay out of
# GELU's flat negative tail, where they drift below 2^-6 after training); the defaults stay the paper's 1
TUNED = {"alpha_res_attn_ratio": 0.25, "alpha_ffn_act": 0.5}
SCANS["u-mup-tuned"] = SCANS["u-mup"]


def net(width: int) -> torch.nn.Module:
    if MODEL == "llama":
        return Llama(width, n_layers=2, n_heads=4, init_std=0.02)
    return GPT(width, n_layer=2, n_head=4, ctx=CTX, tied=False, init_std=0.02)


def build(width: int, parametrization: str, seed: int = 0, alphas: dict[str, float] | None = None) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = net(width)
    torch.manual_seed(10_000 + seed)
    example = torch.zeros(2, CTX, dtype=torch.long)  # the probe at the training length (u-µP's attention scale)
    if alphas is None:
        alphas = TUNED if parametrization == "u-mup-tuned" else {}
    return mt.parametrize(
        model,
        base=net(BASE),
        delta=net(2 * BASE),
        parametrization="u-mup" if alphas else parametrization,
        example_inputs=example,
        **alphas,
    )


def batches(steps: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    text = torch.frombuffer(bytearray(stdlib_text()), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(1_000 + seed)
    starts = torch.randint(0, len(text) - CTX - 1, (steps, BATCH), generator=g)
    idx = starts[..., None] + torch.arange(CTX)
    return [(text[i], text[i + 1]) for i in idx]


def train(
    width: int,
    parametrization: str,
    lr: float,
    steps: int,
    mode: str = "fp32",
    loss_scale: float = 1.0,
    watch: dict[int, UnderflowReport | None] | None = None,
    seed: int = 0,
    alphas: dict[str, float] | None = None,
    exclude: tuple[str, ...] = (),
    on_step: Callable[[int, torch.nn.Module], None] | None = None,
) -> tuple[float, torch.nn.Module]:
    """The final loss (mean of the last tenth) of one run, and the trained model; `watch`'s keys are
    steps at which `fp8_underflow` is measured on the probe batch (into `watch`); `seed` draws the init
    and the batches; `alphas` replaces u-µP's α's; `exclude` names modules the fp8 modes leave unrounded;
    `on_step(step, model)` runs after each step."""
    model = build(width, parametrization, seed, alphas)
    probe = batches(1, seed=99)[0][0]
    opt = torch.optim.AdamW(mt.param_groups(model, lr=lr, optimizer="adamw"), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    sim = {
        "fp8": lambda: fp8_simulation(model, exclude=exclude),
        "fp8 plain": lambda: fp8_simulation(model, grad_scale=None),
        "fp8 fwd": lambda: fp8_simulation(model, backward=None),
    }
    losses = []
    for x, y in batches(steps, seed):
        if mode == "fp32":
            logits = model(x)
        else:
            with sim[mode]():
                logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        if not torch.isfinite(loss):
            return math.nan, model
        opt.zero_grad(set_to_none=True)
        (loss * loss_scale).backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if watch is not None and len(losses) in watch:
            watch[len(losses)] = fp8_underflow(model, probe)
        if on_step is not None:
            on_step(len(losses), model)
    tail = losses[-warmup:]
    return sum(tail) / len(tail), model


def share(x: float) -> str:
    """A share in %, readable from 100 % down to 10^-6 %."""
    if x == 0:
        return "0%"
    return f"{100 * x:.2g}%" if 100 * x >= 0.01 else f"{100 * x:.1e}%"


def pct(r: UnderflowReport) -> str:
    """The count (weights / activations) and the mass, as the tables print them."""
    return f"{100 * r.fraction:.1f}% ({100 * r.weights:.0f}% / {100 * r.activations:.0f}%), mass {share(r.mass)}"


def main() -> None:
    global MODEL
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["gpt", "llama"], default="gpt")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lr-scale", type=float, default=1.0, help="train at the scanned lr × this")
    ap.add_argument("--loss-scale", type=int, default=12, help="the fp8 ×2^S row's S")
    ap.add_argument("--parametrizations", default="mup,u-mup,u-mup-tuned", help="u-mup-tuned: u-µP with TUNED's α's")
    ap.add_argument(
        "--horizon",
        type=int,
        default=0,
        help="also train this many steps in fp32 (underflow at steps×2^k) and in fp8 (its gap); 0: off",
    )
    ap.add_argument(
        "--seeds", type=int, default=1, help="measure the underflow after fp32 training over this many seeds"
    )
    ap.add_argument("--quick", action="store_true", help="width 64, 20 steps, a 2-point scan (a smoke run)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    MODEL = args.model
    torch.set_num_threads(args.threads)
    width, steps = (64, 20) if args.quick else (args.width, args.steps)
    probe = batches(1, seed=99)[0][0]
    rows = []
    long_rows = []
    start = time.perf_counter()
    for p in args.parametrizations.split(","):
        scan = SCANS[p][2:4] if args.quick else SCANS[p]
        scanned = {lr: train(64, p, lr, steps)[0] for lr in scan}
        finite = {lr: v for lr, v in scanned.items() if math.isfinite(v)}
        lr = min(finite, key=lambda k: finite[k]) * args.lr_scale
        print(
            f"{p}: lr scan at width 64: " + ", ".join(f"2^{math.log2(k):.0f} {v:.3f}" for k, v in scanned.items()),
            file=sys.stderr,
        )
        init = fp8_underflow(build(width, p), probe)
        results = {}
        trained = None
        for mode, scale in (
            ("fp32", 1.0),
            ("fp8", 1.0),
            ("fp8 plain", 1.0),
            ("fp8 fwd", 1.0),
            (f"fp8 ×2^{args.loss_scale}", 2.0**args.loss_scale),
        ):
            loss, model = train(width, p, lr, steps, "fp8 plain" if " ×" in mode else mode, scale)
            results[mode] = loss
            if mode == "fp32":
                trained = model
            print(f"  {p} {mode}: {loss:.4f}", file=sys.stderr, flush=True)
        after = fp8_underflow(trained, probe) if trained is not None else None
        if after is not None:
            worst = sorted(after.by_layer.items(), key=lambda kv: -kv[1])[:3]
            print(
                f"  {p} most below 2^-6 after training: "
                + ", ".join(f"{k} {100 * v:.1f}% (mass {share(after.mass_by_layer[k])})" for k, v in worst),
                file=sys.stderr,
            )
        if args.seeds > 1 and after is not None:
            more = [after] + [fp8_underflow(train(width, p, lr, steps, seed=k)[1], probe) for k in range(1, args.seeds)]
            print(
                f"  {p} after training, seeds 0–{args.seeds - 1}: "
                + " / ".join(f"{100 * r.fraction:.2f}% (mass {share(r.mass)})" for r in more)
            )
        rows.append((p, lr, init, after, results))
        if args.horizon > steps:
            marks = [steps * 2**k for k in range(8) if steps * 2**k < args.horizon] + [args.horizon]
            watch: dict[int, UnderflowReport | None] = dict.fromkeys(marks)
            fp32, _ = train(width, p, lr, args.horizon, watch=watch)
            fp8, _ = train(width, p, lr, args.horizon, "fp8")
            long_rows.append((p, lr, init, watch, fp32, fp8))
            print(f"  {p} over {args.horizon} steps: fp32 {fp32:.4f}, fp8 {fp8:.4f}", file=sys.stderr, flush=True)
    name = "GPT (LayerNorm, GELU MLP)" if MODEL == "gpt" else "Llama (RMSNorm, SwiGLU)"
    print(
        f"\n{name} width {width} (base {BASE}), {steps} AdamW steps, batch {BATCH}×{CTX}; "
        f"lr = the width-64 scan's best × {args.lr_scale:g}"
    )
    print(
        "underflow: hidden matmul operands below 2^-6 (weights / activations), and the share of their squared "
        "norm those elements hold (mass); gap: vs fp32, %\n"
    )
    modes = list(rows[0][4])
    print("| parametrization | lr | underflow at init | after training | " + " | ".join(modes) + " |")
    print("|---|---|---|---|" + "---|" * len(modes))
    for p, lr, init, after, results in rows:
        base = results["fp32"]
        cells = [f"{base:.4f}"] + [
            f"{v:.4f} ({100 * (v - base) / base:+.2f}%)" if math.isfinite(v) else "diverged"
            for v in list(results.values())[1:]
        ]
        a = pct(after) if after else "—"
        print(f"| {p} | 2^{math.log2(lr):.1f} | {pct(init)} | {a} | " + " | ".join(cells) + " |")
    if long_rows:
        marks = list(long_rows[0][3])
        print(
            f"\nover a longer horizon ({args.horizon} steps, the same lr): underflow after k steps of fp32 training\n"
        )
        print(
            "| parametrization | init | "
            + " | ".join(f"after {k}" for k in marks)
            + f" | fp32 loss at {args.horizon} | fp8 | gap |"
        )
        print("|---|---|" + "---|" * len(marks) + "---|---|---|")
        for p, _lr, init, watch, fp32, fp8 in long_rows:
            cells = [pct(r) if r is not None else "—" for r in watch.values()]
            gap = f"{100 * (fp8 - fp32) / fp32:+.2f}%" if math.isfinite(fp8) and math.isfinite(fp32) else "diverged"
            print(f"| {p} | {pct(init)} | " + " | ".join(cells) + f" | {fp32:.4f} | {fp8:.4f} | {gap} |")
    print(f"\ntotal {time.perf_counter() - start:.0f} s (a CPU simulation of FP8's numerics, not its speed)")


if __name__ == "__main__":
    main()
