"""µTransfer on a ResNet with BatchNorm: does the optimal learning rate stay put as it widens?

TP5 verified µTransfer on ResNets (CIFAR-10); this is the same experiment at CPU scale. A small
ResNet (`mutransfer.recipes.ResNet`: conv stem, three BasicBlock stages of `width`, 2·width and
4·width channels with BatchNorm and 1×1-conv shortcuts, global average pool, linear head,
PyTorch's default init) is trained on sklearn's handwritten digits (1797 8×8 images, shipped
inside scikit-learn, no download; a fixed stratified 80/20 train/test split) at widths 16, 32, 64
and 128 over a grid of learning rates, for Adam and for SGD with momentum 0.9, twice:

- SP: plain PyTorch, `torch.optim.Adam(model.parameters(), lr)`;
- µP: `mt.parametrize(model, base=ResNet(16), delta=ResNet(32))` and
  `torch.optim.Adam(mt.param_groups(model, lr, "adam"))` (SGD likewise).

The loss of a run is the training loss after a fixed number of steps: the cross-entropy over the
whole training set, in training mode (BatchNorm on batch statistics, batches of the training
batch size) — less noisy than the last minibatches' losses, and free of BatchNorm's running
averages, which lag behind after a short run at a large lr. Every run at a given seed sees the
same batches in the same order; the seed also fixes the initial weights. Losses are averaged
over seeds. Prints the optimal log2 lr per width and its drift in grid steps (one grid step =
one octave), the loss of reusing the base width's lr at the widest width, and the optimum refined
between grid points (a parabola through the best point and its neighbours, for near-ties); writes
a figure. 60 steps of batch 64 is ~2.7 epochs: long enough to leave the initial transient, short
enough that the training loss has not yet collapsed to ~0 (where every lr looks alike).

    python benchmarks/resnet_transfer.py            # widths 16…128, 2 optimizers, 2 seeds, 256 runs
    python benchmarks/resnet_transfer.py --quick    # smoke run: widths 8, 24, every other lr, 1 seed, 30 steps
    python benchmarks/resnet_transfer.py --widths 8,16,32,64 --log2-lrs=-13:1   # a base only 8 channels wide

With a base 8 channels wide, SGD's µP optimum moved 2 grid steps (near-ties at 8 and 64; the first
stage's 8 channels cost SGD about an octave of finite-width error, Adam nothing); from 16 on it
moves 1. See the README for the measured tables.
Needs scikit-learn for the data (`pip install scikit-learn`).
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
from functools import lru_cache

import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer.recipes import ResNet

PARAMETRIZATIONS = ("SP", "µP")
# log2 lr grids (one octave per step), wide enough that no optimum sits on an edge
GRIDS = {"adam": range(-11, -3), "sgd": range(-8, 0)}
BATCH = 64


@lru_cache(maxsize=1)
def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """sklearn's digits as (x_train, y_train, x_test, y_test): (n, 1, 8, 8) floats standardized
    with the training set's mean and std; a fixed stratified 80/20 split (1437 / 360 images)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(d.target, dtype=torch.long)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    mean, std = x_tr.mean(), x_tr.std()
    return (x_tr - mean) / std, y_tr, (x_te - mean) / std, y_te


def make_model(width: int, mup: bool, base_width: int) -> torch.nn.Module:
    model = ResNet(width, in_channels=1, n_classes=10)
    if mup:
        mt.parametrize(
            model,
            base=ResNet(base_width, in_channels=1, n_classes=10),
            delta=ResNet(2 * base_width, in_channels=1, n_classes=10),
        )
    return model


def make_optimizer(model: torch.nn.Module, optimizer: str, lr: float, mup: bool) -> torch.optim.Optimizer:
    groups = mt.param_groups(model, lr, optimizer) if mup else model.parameters()
    if optimizer == "adam":
        return torch.optim.Adam(groups, lr=lr)
    return torch.optim.SGD(groups, lr=lr, momentum=0.9)


def train(width: int, mup: bool, optimizer: str, log2_lr: int, steps: int, seed: int, base_width: int) -> float:
    """Training-set loss after `steps` steps (NaN if training diverged)."""
    x, y, _, _ = digits()
    torch.manual_seed(seed)  # same initial weights for SP and µP (before µP rescales them)
    model = make_model(width, mup, base_width)
    opt = make_optimizer(model, optimizer, 2.0**log2_lr, mup)
    batches = torch.Generator().manual_seed(10_000 + seed)  # same batch order at every width and lr
    for _ in range(steps):
        idx = torch.randint(0, len(x), (BATCH,), generator=batches)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        if not torch.isfinite(loss):
            return math.nan
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():  # training mode: batch statistics, as in training
        total = sum(
            F.cross_entropy(model(x[i : i + BATCH]), y[i : i + BATCH], reduction="sum").item()
            for i in range(0, len(x), BATCH)
        )
    return total / len(x) if math.isfinite(total) else math.nan


def _run(job) -> tuple:
    torch.set_num_threads(1)
    optimizer, name, width, log2_lr, seed, steps, base_width = job
    return job, train(width, name == "µP", optimizer, log2_lr, steps, seed, base_width)


def _mean(values):
    return sum(values) / len(values) if all(math.isfinite(v) for v in values) else math.nan


def optimum(curve: dict[int, float]) -> int:
    finite = {k: v for k, v in curve.items() if math.isfinite(v)}
    return min(finite, key=finite.get)


def interpolated_optimum(curve: dict[int, float]) -> float:
    """The grid optimum refined by a parabola through log(loss) at it and its two neighbours
    (the grid optimum itself at an edge or next to a diverged run)."""
    best = optimum(curve)
    ks = sorted(curve)
    i = ks.index(best)
    if i == 0 or i == len(ks) - 1 or not all(math.isfinite(curve[k]) for k in ks[i - 1 : i + 2]):
        return float(best)
    (a, b, c), h = (math.log(curve[k]) for k in ks[i - 1 : i + 2]), ks[i + 1] - ks[i]
    return best + 0.5 * h * (a - c) / (a - 2 * b + c) if a - 2 * b + c > 0 else float(best)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="16,32,64,128", help="the first is µP's base width")
    ap.add_argument("--optimizers", default="adam,sgd")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument(
        "--log2-lrs",
        metavar="LO:HI",
        help="log2 lr grid LO, LO+1, …, HI for every optimizer (default: Adam -13:-2, SGD -9:1)",
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: widths 8,24, every other lr, 1 seed, 30 steps")
    ap.add_argument("--json", help="also write the losses and optima to this JSON file")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--plot", default="docs/resnet_transfer.png", help="figure path ('' for none)")
    args = ap.parse_args(argv)
    widths = [8, 24] if args.quick else [int(w) for w in args.widths.split(",")]
    optimizers = args.optimizers.split(",")
    seeds, steps = (1, 30) if args.quick else (args.seeds, args.steps)
    if args.log2_lrs:
        lo, hi = (int(v) for v in args.log2_lrs.split(":"))
        grids = {o: list(range(lo, hi + 1)) for o in optimizers}
    else:
        grids = {o: list(GRIDS[o])[:: 2 if args.quick else 1] for o in optimizers}
    base = widths[0]
    digits()  # fail early, in this process, if scikit-learn is missing

    # widest first, so that the slow runs do not straggle at the end
    jobs = [
        (o, p, w, k, s, steps, base)
        for w in sorted(widths, reverse=True)
        for o in optimizers
        for p in PARAMETRIZATIONS
        for k in grids[o]
        for s in range(seeds)
    ]
    start = time.perf_counter()
    results: dict[tuple, list[float]] = {}
    with contextlib.ExitStack() as stack:
        if args.workers > 1:
            done = stack.enter_context(mp.get_context("spawn").Pool(args.workers)).imap_unordered(_run, jobs)
        else:  # in this process: a worker process would import torch and the data again for nothing
            done = map(_run, jobs)
        for i, (job, loss) in enumerate(done, 1):
            o, p, w, k, _, _, _ = job
            results.setdefault((o, p, w, k), []).append(loss)
            print(f"\r{i}/{len(jobs)} runs, {time.perf_counter() - start:.0f} s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    seconds = time.perf_counter() - start
    curves: dict[tuple, dict[int, float]] = {}
    for (o, p, w, k), losses in sorted(results.items()):
        curves.setdefault((o, p, w), {})[k] = _mean(losses)

    print(
        f"µTransfer on a ResNet with BatchNorm (sklearn digits, {len(digits()[0])} training images), "
        f"widths {', '.join(map(str, widths))} (base {base}), batch {BATCH}, {steps} steps, {seeds} seed(s); "
        f"{len(jobs)} runs in {seconds:.0f} s on {args.workers} worker(s)"
    )
    summary = {
        "steps": steps,
        "seeds": seeds,
        "batch": BATCH,
        "seconds": seconds,
        "workers": args.workers,
        **report(curves, optimizers, widths, grids),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, ensure_ascii=False)
    if args.plot:
        _plot(curves, optimizers, widths, grids, args.plot, f"{steps} steps, {seeds} seed(s)")
        print(f"figure: {args.plot}")
    return 0


def report(curves: dict[tuple, dict[int, float]], optimizers, widths, grids) -> dict:
    """Print the tables; return the summary (optima, drifts, losses) for the JSON file."""
    base = widths[0]
    print(
        "loss = training-set cross-entropy after the last step, mean over seeds; optimum = the grid's lowest; "
        "drift = max − min optimum across widths\n"
    )
    print(
        f"| optimizer | parametrization | {' | '.join(f'width {w}' for w in widths)} | drift (grid steps) |"
        f" loss at width {widths[-1]}: base's lr / own best |"
    )
    print(f"|---|---|{'---|' * len(widths)}---|---|")
    summary: dict = {
        "widths": widths,
        "base_width": base,
        "grids": grids,
        "optima": {},
        "drift": {},
        "interpolated": {},
        "interpolated_drift": {},
        "transfer": {},
        "edge": {},
        "losses": {},
    }
    edges, fine = [], []
    for o in optimizers:
        spacing = grids[o][1] - grids[o][0]
        for p in PARAMETRIZATIONS:
            key, name = f"{o}/{p}", "Adam" if o == "adam" else "SGD m=0.9"
            best = [optimum(curves[(o, p, w)]) for w in widths]
            on_edge = [w for w, b in zip(widths, best) if b in (grids[o][0], grids[o][-1])]
            edges += [f"{o} {p} width {w}" for w in on_edge]
            drift = (max(best) - min(best)) // spacing
            wide = curves[(o, p, widths[-1])]
            cells = " | ".join(f"{b:+d}{' (edge)' if w in on_edge else ''}" for w, b in zip(widths, best))
            print(f"| {name} | {p} | {cells} | {drift} | {wide[best[0]]:.4f} / {wide[best[-1]]:.4f} |")
            sub = [interpolated_optimum(curves[(o, p, w)]) for w in widths]
            fine.append(f"| {name} | {p} | {' | '.join(f'{v:+.2f}' for v in sub)} | {max(sub) - min(sub):.2f} |")
            summary["optima"][key] = dict(zip(map(str, widths), best))
            summary["drift"][key] = drift
            summary["interpolated"][key] = dict(zip(map(str, widths), sub))
            summary["interpolated_drift"][key] = max(sub) - min(sub)
            summary["edge"][key] = on_edge
            summary["transfer"][key] = {
                "base_log2_lr": best[0],
                "loss_at_base_lr": wide[best[0]],
                "own_log2_lr": best[-1],
                "own_best_loss": wide[best[-1]],
            }
            summary["losses"][key] = {str(w): {str(k): v for k, v in curves[(o, p, w)].items()} for w in widths}
    print(
        "\nbetween grid points (vertex of a parabola through the lowest point and its neighbours, log loss "
        "vs log2 lr), for near-ties:"
    )
    print(f"| optimizer | parametrization | {' | '.join(f'width {w}' for w in widths)} | drift (octaves) |")
    print(f"|---|---|{'---|' * len(widths)}---|")
    print("\n".join(fine))
    same = all(curves[(o, "SP", base)] == curves[(o, "µP", base)] for o in optimizers)
    print(f"\nAt the base width {base} µP is the SP model: losses {'identical' if same else 'DIFFER'}.")
    summary["base_identical"] = same
    if edges:
        print(f"warning: optimum on the edge of the lr grid for {', '.join(edges)}; widen it with --log2-lrs")
    return summary


def _plot(curves, optimizers, widths, grids, path, subtitle) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(optimizers), 2, figsize=(9.5, 3.6 * len(optimizers)), squeeze=False)
    colors = plt.get_cmap("viridis")([i / max(1, len(widths) - 1) * 0.85 for i in range(len(widths))])
    for row, o in zip(axes, optimizers):
        finite = [v for (oo, _, _), c in curves.items() if oo == o for v in c.values() if math.isfinite(v)]
        lo, hi = min(finite), math.log(10)  # up to chance level: ln 10
        for ax, p in zip(row, PARAMETRIZATIONS):
            for color, w in zip(colors, widths):
                c = curves[(o, p, w)]
                ks = [k for k in grids[o] if math.isfinite(c[k])]
                ax.plot(ks, [c[k] for k in ks], "-o", ms=3, color=color, label=f"width {w}")
                b = optimum(c)
                ax.plot([b], [c[b]], "*", ms=14, color=color, markeredgecolor="black", zorder=5)
            ax.set_title(f"{'Adam' if o == 'adam' else 'SGD, momentum 0.9'}, {p}")
            ax.set_yscale("log")
            ax.set_ylim(lo / 1.3, hi * 1.3)
            ax.set_xlabel("log2 learning rate")
            ax.grid(alpha=0.3)
        row[0].set_ylabel("training loss")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"ResNet + BatchNorm on digits: loss vs lr across width ({subtitle}); ★ = optimum per width")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    torch.set_num_threads(1)
    raise SystemExit(main())
