"""µP with every optimizer: coordinate checks and learning-rate transfer across 8× width.

For each optimizer (SGD with Nesterov momentum, AdamW, Lion, Adafactor, Muon + AdamW, SOAP) and
each of two models — the quickstart-style MLP (sweep recipe "mlp" with the quickstart's 128 inputs
and batch 128: 3-layer ReLU MLP, Gaussian inputs, a random teacher's classes) and the demo's GPT (sweep recipe "gpt": byte-level, tied
embeddings, text from the standard library's docs) — in one run:

1. the coordinate check in µP and in standard parametrization (SP) on the recipe's data;
2. an lr sweep (a grid of powers of 2) at four widths spanning 8×, in µP and in SP, training with
   the sweep recipes' own objectives (`mutransfer.sweep.recipes`): the mean training loss of the
   last tenth of the steps. The optimum's position on the grid at each width, and how many grid
   steps it moves across the widths (max − min of the argmin), and the move from the narrowest to the
   widest of the optimum refined by the sweep report's parabola (`sweep.verdict.parabolic_minimum`),
   in octaves. Losses are the mean over `--seeds` seeds (data order and init).

Prints the table; `--figure` draws loss against log2 lr, one curve per width, per optimizer,
model and parametrization; `--json` keeps every number.

    python benchmarks/optimizer_transfer.py --figure docs/optimizer_transfer.png --json optimizer_transfer.json
    python benchmarks/optimizer_transfer.py --quick           # a two-minute smoke run
    # on 2 cores, two processes of one thread each, then one table and figure:
    python benchmarks/optimizer_transfer.py --models mlp --threads 1 --json mlp.json &
    python benchmarks/optimizer_transfer.py --models gpt --threads 1 --json gpt.json; wait
    python benchmarks/optimizer_transfer.py --merge mlp.json gpt.json --figure docs/optimizer_transfer.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings

import numpy as np
import torch

import mutransfer as mt
from mutransfer.recipes import get_recipe
from mutransfer.sweep.analysis.verdict import parabolic_minimum
from mutransfer.sweep.recipes import train_gpt, train_mlp
from mutransfer.sweep.scale import Scale

# (name in mt, extra hyperparameters of the sweep objective, lr grid as log2 (lo, hi) per model)
OPTIMIZERS = {
    "sgd": ({"momentum": 0.9, "nesterov": True}, {"mlp": (-6, 1), "gpt": (-5, 1)}),
    "adamw": ({}, {"mlp": (-11, -4), "gpt": (-11, -5)}),
    "lion": ({}, {"mlp": (-12, -5), "gpt": (-12, -6)}),
    # below lr ≈ 1/√steps: above it the relative step's 1/√t cap makes lr nearly irrelevant
    "adafactor": ({}, {"mlp": (-8, -1), "gpt": (-8, -2)}),
    # one lr for Muon and its AdamW partner: what torch's "match_rms_adamw" adjustment is for
    "muon": ({"adjust_lr_fn": "match_rms_adamw"}, {"mlp": (-11, -4), "gpt": (-9, -3)}),
    "soap": ({}, {"mlp": (-11, -4), "gpt": (-11, -5)}),
}
# the quickstart's MLP (examples/quickstart.py: 128 inputs, batch 128) through the sweep recipe "mlp";
# the demo's GPT through the sweep recipe "gpt"
MODELS = {
    "mlp": (train_mlp, (64, 128, 256, 512), {"steps": 150, "d_in": 128, "batch_size": 128}),
    "gpt": (train_gpt, (32, 64, 128, 256), {"steps": 80, "seq_len": 32, "batch_size": 16}),
}
COORD_WIDTHS = {"mlp": (64, 128, 256, 512), "gpt": (32, 64, 128, 256)}


def coord(model: str, optimizer: str, parametrization: str, widths) -> bool:
    recipe = get_recipe(model)
    data = recipe.data()

    def make(w):
        m = recipe.build(w)
        if parametrization == "mup":
            mt.parametrize(m, base=recipe.build(widths[0]), delta=recipe.build(2 * widths[0]))
        return m

    return mt.coord_check(
        make, list(widths), data, optimizer=optimizer, lr=recipe.lr_for(optimizer), steps=4, seeds=2, progress=False
    ).passed


def sweep(model: str, optimizer: str, parametrization: str, widths, grid, steps_scale: float, seeds: int) -> dict:
    """Loss per width per grid point: the mean over `seeds` (data order and init), NaN if any diverged."""
    train, _, base_hp = MODELS[model]
    extra = OPTIMIZERS[optimizer][0]
    losses = {}
    for w in widths:
        row = []
        for k in grid:
            hp = {**base_hp, **extra, "optimizer": optimizer, "lr": 2.0**k, "threads": torch.get_num_threads()}
            hp["steps"] = max(10, int(hp["steps"] * steps_scale))
            runs = [train(hp, Scale(w, widths[0], parametrization, seed=s)) for s in range(seeds)]
            row.append(sum(runs) / seeds if all(math.isfinite(v) for v in runs) else float("nan"))
        losses[w] = row
    return losses


def optimum(row) -> int:
    finite = [(v, i) for i, v in enumerate(row) if math.isfinite(v)]
    return min(finite)[1] if finite else -1


def refined(grid, row) -> float:
    """The grid optimum refined by the sweep report's parabola through it and its two neighbours."""
    xs, _ = parabolic_minimum(np.asarray(grid, dtype=float), np.asarray([row], dtype=float))
    return float(xs[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two widths, four lrs, few steps, MLP only: a smoke run")
    ap.add_argument("--optimizers", default=",".join(OPTIMIZERS), help="comma-separated subset")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of mlp,gpt")
    ap.add_argument("--no-coord", action="store_true", help="skip the coordinate checks")
    ap.add_argument("--figure", help="write loss-vs-lr curves here (PNG)")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per grid point, losses averaged (default 2)")
    ap.add_argument("--threads", type=int, help="torch threads (default torch's)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="only print the table (and --figure) of earlier runs")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.merge:
        results = [e for path in args.merge for e in json.load(open(path))]
        print(table(results))
        if args.figure:
            figure(results, args.figure)
            print(f"figure: {args.figure}")
        return 0
    optimizers = [o for o in args.optimizers.split(",") if o]
    models = [m for m in args.models.split(",") if m]
    for o in optimizers:
        if o not in OPTIMIZERS:
            ap.error(f"unknown optimizer {o!r}; choose from {', '.join(OPTIMIZERS)}")
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    if args.quick and args.models == ",".join(MODELS):
        models = ["mlp"]
    results = []
    t0 = time.time()
    for model in models:
        widths = MODELS[model][1]
        cwidths = COORD_WIDTHS[model]
        if args.quick:
            # the sweep at the smallest and the second-largest width (the largest costs most); the
            # coordinate check, cheap, still spans them all
            widths, cwidths = (widths[0], widths[-2]), (cwidths[0], cwidths[-1])
        for opt in optimizers:
            lo, hi = OPTIMIZERS[opt][1][model]
            grid = list(range(lo, hi + 1))
            if args.quick:
                mid = (lo + hi) // 2
                grid = [mid - 2, mid - 1, mid, mid + 1]
            entry = {"model": model, "optimizer": opt, "widths": list(widths), "log2_lr": grid}
            for par in ("mup", "sp"):
                if not args.no_coord:
                    entry[f"coord_{par}"] = coord(model, opt, par, cwidths)
                losses = sweep(
                    model, opt, par, widths, grid, 0.25 if args.quick else 1.0, 1 if args.quick else args.seeds
                )
                best = [optimum(losses[w]) for w in widths]
                fine = [refined(grid, losses[w]) for w in widths]
                entry[par] = {
                    "losses": {str(w): v for w, v in losses.items()},
                    "best_log2_lr": [grid[b] for b in best],
                    "shift": max(best) - min(best),
                    "refined_log2_lr": fine,
                    "refined_move": fine[-1] - fine[0],
                    "at_edge": any(b in (0, len(grid) - 1) for b in best),
                }
            results.append(entry)
            print(
                f"[{time.time() - t0:6.0f} s] {model} {opt}: µP optima {entry['mup']['best_log2_lr']}, "
                f"SP {entry['sp']['best_log2_lr']}",
                file=sys.stderr,
                flush=True,
            )
    print(table(results))
    print(f"\n{time.time() - t0:.0f} s on {torch.get_num_threads()} threads")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.figure:
        figure(results, args.figure)
        print(f"figure: {args.figure}")
    return 0


def table(results) -> str:
    head = (
        "| model | optimizer | coord µP | coord SP | µP optimal log2 lr by width | µP shift (refined move) | "
        "SP optimal log2 lr by width | SP shift (refined move) |"
    )
    lines = [head, "|" + "---|" * 8]
    for e in results:

        def verdict(key):
            return "—" if key not in e else ("pass" if e[key] else "fail")

        def opt(par):
            s = ", ".join(f"{v:+d}" for v in e[par]["best_log2_lr"])
            return s + (" (grid edge)" if e[par]["at_edge"] else "")

        def shift(par):
            return f"{e[par]['shift']} ({e[par]['refined_move']:+.2f})"

        lines.append(
            f"| {e['model']} | {e['optimizer']} | {verdict('coord_mup')} | {verdict('coord_sp')} | "
            f"{opt('mup')} | {shift('mup')} | {opt('sp')} | {shift('sp')} |"
        )
    return "\n".join(lines)


def figure(results, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [(m, p) for m in dict.fromkeys(e["model"] for e in results) for p in ("mup", "sp")]
    rows = list(dict.fromkeys(e["optimizer"] for e in results))
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(3.2 * len(cols), 2.4 * len(rows)), squeeze=False)
    for e in results:
        for par in ("mup", "sp"):
            ax = axes[rows.index(e["optimizer"])][cols.index((e["model"], par))]
            n = len(e["widths"])
            for i, w in enumerate(e["widths"]):
                ys = e[par]["losses"][str(w)]
                color = plt.cm.viridis(i / max(1, n - 1))
                ax.plot(e["log2_lr"], ys, "o-", ms=3, color=color, label=f"width {w}")
                b = optimum(ys)
                if b >= 0:
                    ax.plot([e["log2_lr"][b]], [ys[b]], "*", ms=10, color=color)
            finite = [v for w in e["widths"] for v in e[par]["losses"][str(w)] if math.isfinite(v)]
            if finite:
                lo = min(finite)
                ax.set_ylim(lo - 0.05 * abs(lo), lo + max(0.6, 0.5 * abs(lo)))
            ax.set_title(
                f"{e['optimizer']} · {e['model']} · {'µP' if par == 'mup' else 'SP'} (shift {e[par]['shift']})",
                fontsize=9,
            )
            ax.tick_params(labelsize=7)
            if rows.index(e["optimizer"]) == len(rows) - 1:
                ax.set_xlabel("log2 lr", fontsize=8)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
