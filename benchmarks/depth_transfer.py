"""Depth transfer: does the optimal learning rate stay put as the model gets deeper?

An Adam learning-rate sweep at depths 2, 4, 8, 16 (width fixed at the base width, so only depth
changes) for three parametrizations of the same residual network:

- CompleteP (depth_alpha = 1): branch outputs × (L/L₀)^-1, in-block Adam lr unchanged;
- Depth-µP (depth_alpha = ½): branch outputs × (L/L₀)^-½, in-block Adam lr × (L/L₀)^-½;
- no depth scaling: the plain model (standard parametrization at its base width).

Prints the optimal log2 lr per depth and its drift in octaves, then transfers: the lr tuned on
the 2-block, width-64 proxy is used on a 16-block, width-512 target (µP in width and depth in
one `parametrize` call), and compared with a sweep at the target itself. Writes a figure.

    python benchmarks/depth_transfer.py                       # residual MLP (~4 min on 2 cores)
    python benchmarks/depth_transfer.py --model gpt --quick   # pre-LN GPT, fewer lrs and depths
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import sys
import time

import torch

from mutransfer.sweep.recipes import train_gpt, train_resmlp
from mutransfer.sweep.scale import Scale

VARIANTS = [("CompleteP α=1", "mup", 1.0), ("Depth-µP α=½", "mup", 0.5), ("no depth scaling", "sp", None)]
MODELS = {
    "resmlp": (train_resmlp, {"steps": 150, "batch_size": 64}, range(-12, -3)),
    "gpt": (train_gpt, {"steps": 150, "batch_size": 16, "seq_len": 32, "n_head": 2}, range(-11, -2)),
}


def _run(job) -> tuple:
    model, _label, parametrization, alpha, width, depth, log2_lr, seed, steps = job
    train, fixed, _ = MODELS[model]
    hp = {**fixed, "lr": 2.0**log2_lr, "threads": 1, "steps": steps}
    if alpha is not None:
        hp["depth_alpha"] = alpha
    scale = Scale(width, BASE_WIDTH, parametrization, seed, depth=depth, base_depth=BASE_DEPTH)
    return job, float(train(hp, scale))


BASE_WIDTH, BASE_DEPTH = 64, 2


def _mean(values):
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if len(finite) == len(values) else math.nan


def optimum(curve: dict[int, float]) -> int:
    finite = {k: v for k, v in curve.items() if math.isfinite(v)}
    return min(finite, key=finite.get)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="resmlp")
    ap.add_argument("--depths", default="2,4,8,16")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--target", default="512x16", help="WIDTHxDEPTH of the transfer target ('' to skip)")
    ap.add_argument("--quick", action="store_true", help="smoke run: depths 2,4, every other lr, one seed, no target")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (default: the model's, 150)")
    ap.add_argument("--json", help="also write the optima and the transfer result to this JSON file")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--plot", default="docs/depth_transfer.png")
    args = ap.parse_args(argv)
    depths = [2, 4] if args.quick else [int(d) for d in args.depths.split(",")]
    seeds = 1 if args.quick else args.seeds
    target = None if (args.quick or not args.target) else tuple(int(x) for x in args.target.split("x"))
    log2_lrs = list(MODELS[args.model][2])[:: 2 if args.quick else 1]
    steps = args.steps or MODELS[args.model][1]["steps"]

    jobs = [
        (args.model, label, p, a, BASE_WIDTH, d, k, s, steps)
        for label, p, a in VARIANTS
        for d in depths
        for k in log2_lrs
        for s in range(seeds)
    ]
    if target is not None:
        jobs += [
            (args.model, label, p, a, target[0], target[1], k, s, steps)
            for label, p, a in VARIANTS[:1] + VARIANTS[2:]
            for k in log2_lrs
            for s in range(seeds)
        ]
    start = time.perf_counter()
    results: dict[tuple, list[float]] = {}
    # one worker: the runs in this process (a spawned worker would import torch again for nothing)
    with mp.get_context("spawn").Pool(args.workers) if args.workers > 1 else contextlib.nullcontext() as pool:
        for i, (job, loss) in enumerate(pool.imap_unordered(_run, jobs) if pool else map(_run, jobs), 1):
            _, label, _, _, width, depth, k, _, _ = job
            results.setdefault((label, width, depth, k), []).append(loss)
            print(f"\r{i}/{len(jobs)} runs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    seconds = time.perf_counter() - start
    curves = {}
    for (label, width, depth, k), losses in results.items():
        curves.setdefault((label, width, depth), {})[k] = _mean(losses)

    print(
        f"Depth transfer, {args.model}, width {BASE_WIDTH}, Adam, {steps} steps, "
        f"{seeds} seed(s), {len(jobs)} runs in {seconds:.0f} s on {args.workers} workers"
    )
    print(f"optimal log2 lr per depth (base depth {BASE_DEPTH}):")
    print(f"| parametrization | {' | '.join(str(d) for d in depths)} | drift (octaves) |")
    print(f"|---|{'---|' * len(depths)}---|")
    summary: dict = {"model": args.model, "depths": depths, "seconds": seconds, "optima": {}, "transfer": {}}
    for label, _, _ in VARIANTS:
        best = [optimum(curves[(label, BASE_WIDTH, d)]) for d in depths]
        summary["optima"][label] = best
        print(f"| {label} | {' | '.join(f'{b:+d}' for b in best)} | {max(best) - min(best)} |")
    if target is not None:
        print(
            f"\ntransfer from the width-{BASE_WIDTH}, depth-{depths[0]} proxy to width {target[0]}, depth {target[1]}:"
        )
        print(
            "| parametrization | proxy lr (log2) | target loss at proxy lr | target optimum (log2) | best target loss | regret |"
        )
        print("|---|---|---|---|---|---|")
        for label, _, _ in VARIANTS[:1] + VARIANTS[2:]:
            proxy = optimum(curves[(label, BASE_WIDTH, depths[0])])
            tc = curves[(label,) + target]
            best = optimum(tc)
            edge = " (grid edge)" if best in (log2_lrs[0], log2_lrs[-1]) else ""
            name = label if label != VARIANTS[2][0] else "SP (no µP in width or depth)"
            print(
                f"| {name} | {proxy:+d} | {tc[proxy]:.4f} | {best:+d}{edge} | {tc[best]:.4f} | "
                f"{tc[proxy] - tc[best]:+.4f} |"
            )
            summary["transfer"][label] = {
                "proxy_log2_lr": proxy,
                "loss_at_proxy_lr": tc[proxy],
                "target_log2_lr": best,
                "best_loss": tc[best],
            }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    if args.plot:
        _plot(curves, depths, log2_lrs, args.plot, f"{args.model}, width {BASE_WIDTH}")
        print(f"\nfigure: {args.plot}")
    return 0


def _plot(curves, depths, log2_lrs, path, title) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(VARIANTS), figsize=(4.2 * len(VARIANTS), 3.8), sharey=True)
    colors = plt.get_cmap("viridis")([i / max(1, len(depths) - 1) * 0.85 for i in range(len(depths))])
    finite = [v for (_, w, _), c in curves.items() if w == BASE_WIDTH for v in c.values() if math.isfinite(v)]
    lo, hi = min(finite), sorted(finite)[int(0.9 * (len(finite) - 1))]
    for ax, (label, _, _) in zip(axes, VARIANTS):
        for color, d in zip(colors, depths):
            c = curves[(label, BASE_WIDTH, d)]
            ks = [k for k in log2_lrs if math.isfinite(c[k])]
            ax.plot(ks, [c[k] for k in ks], "-o", ms=3, color=color, label=f"depth {d}")
            b = optimum(c)
            ax.plot([b], [c[b]], "*", ms=14, color=color, markeredgecolor="black", zorder=5)
        ax.set_title(label)
        ax.set_xlabel("log2 learning rate")
        ax.set_ylim(lo - 0.02 * (hi - lo), hi + 0.05 * (hi - lo))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("training loss")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Optimal lr across depth ({title}); ★ = optimum per depth")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    torch.set_num_threads(1)
    raise SystemExit(main())
