"""Feature learning in the infinite-width limit: µP learns what the kernels cannot.

Task: a single-index target y = (w·x)² − 1 with x ~ N(0, I_32) and a unit vector w — it depends
on one direction of the input, which a network can find by learning features, while a kernel
(NNGP, NTK: the limits of standard / NTK parametrizations) must fit a generic quadratic in 32
dimensions from few samples.

Trained by full-batch gradient descent on the same n training points:
- the µP limit of a 1-hidden-layer relu network (`mt.limits.MuPLimit`, Monte Carlo over neurons);
- finite µP networks of growing width (they approach the limit);
- NNGP posterior mean and NTK gradient flow to t = ∞ (relu kernels, one hidden layer);
and the hidden preactivations' movement under µP vs the NTK parametrization as width grows.

    python examples/feature_learning.py            # ~3 min on 2 cores; writes docs/limits_feature_learning.png
    python examples/feature_learning.py --quick
"""

from __future__ import annotations

import argparse
import copy
import math
import time

import torch

from mutransfer import limits as L
from mutransfer.limits import finite as finite_nets


def make_task(n: int, d: int, seed: int, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    return x, (x @ w) ** 2 - 1


def mse(pred: torch.Tensor, y: torch.Tensor) -> float:
    return float(((pred - y) ** 2).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--n-train", type=int, default=256)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=0.3)
    ap.add_argument("--samples", type=int, default=8192, help="Monte Carlo neurons of the µP limit")
    ap.add_argument("--widths", default="64,256,1024,4096")
    ap.add_argument("--seeds", type=int, default=2, help="finite networks per width")
    ap.add_argument("--quick", action="store_true", help="fewer steps, samples and widths")
    ap.add_argument("--plot", default="docs/limits_feature_learning.png")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.samples, args.widths, args.seeds = 150, 2048, "64,256,1024", 1
    widths = [int(w) for w in args.widths.split(",")]
    torch.set_default_dtype(torch.float64)
    start = time.perf_counter()

    w = torch.zeros(args.d, dtype=torch.float64)
    w[0] = 1.0
    x, y = make_task(args.n_train, args.d, 0, w)
    xt, yt = make_task(2000, args.d, 1, w)
    print(
        f"task: y = (w·x)² − 1, d = {args.d}, {args.n_train} training points, 2000 test points "
        f"(predicting 0 gives test MSE {mse(torch.zeros_like(yt), yt):.3f})"
    )

    results: dict[str, float] = {}
    mean, _ = L.nngp_predict(x, y, xt, depth=1, noise_var=1e-6)
    results["NNGP (posterior mean)"] = mse(mean, yt)
    results["NTK (gradient flow, t = ∞)"] = mse(L.ntk_predict(x, y, xt, depth=1), yt)
    limit = L.MuPLimit("relu", method="monte_carlo", samples=args.samples).fit(x, y, args.steps, args.lr)
    lim_pred, lim_err = limit.predict(xt, return_error=True)
    results["µP limit"] = mse(lim_pred, yt)
    print(
        f"µP limit: test MSE {results['µP limit']:.4f} (Monte Carlo standard error of f: "
        f"{float(lim_err.mean()):.1e} on average)"
    )

    finite_mse, gap, moves = {}, {}, {"mup": [], "ntk": []}
    for width in widths:
        errs, gaps = [], []
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            net = finite_nets.train_finite(
                finite_nets.OneHiddenLayer(args.d, width, activation="relu"), x, y, args.steps, args.lr
            )
            with torch.no_grad():
                pred = net(xt)[:, 0]
            errs.append(mse(pred, yt))
            gaps.append(math.sqrt(mse(pred, lim_pred)))
        finite_mse[width], gap[width] = sum(errs) / len(errs), sum(gaps) / len(gaps)
        for p in moves:  # feature movement after a fixed budget of steps
            torch.manual_seed(0)
            net = finite_nets.OneHiddenLayer(args.d, width, activation="relu", parametrization=p)
            initial = copy.deepcopy(net)
            finite_nets.train_finite(net, x, y, args.steps, args.lr)
            moves[p].append(finite_nets.feature_movement(net, initial, x))
    for width in widths:
        results[f"finite µP, width {width}"] = finite_mse[width]

    print("\n| model | test MSE |")
    print("|---|---|")
    for name, value in results.items():
        print(f"| {name} | {value:.4f} |")
    slope = finite_nets.fitted_slope(widths, [gap[w] for w in widths])
    print(
        "\nfinite µP vs the µP limit, RMS difference of test predictions: "
        + ", ".join(f"{gap[w]:.3f} (width {w})" for w in widths)
        + f"; fitted slope {slope:+.2f} (theory −0.5)"
    )
    s_mup, s_ntk = finite_nets.fitted_slope(widths, moves["mup"]), finite_nets.fitted_slope(widths, moves["ntk"])
    print(
        f"hidden-preactivation movement: µP {', '.join(f'{m:.3f}' for m in moves['mup'])} (slope {s_mup:+.2f}); "
        f"NTK {', '.join(f'{m:.3f}' for m in moves['ntk'])} (slope {s_ntk:+.2f}, theory −0.5)"
    )
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.plot:
        plot(results, widths, finite_mse, gap, moves, args, args.plot)
        print(f"figure: {args.plot}")
    return 0


def plot(results, widths, finite_mse, gap, moves, args, path) -> None:
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    ax.plot(widths, [finite_mse[w] for w in widths], "-o", color="#1f77b4", label="finite µP networks")
    styles = {
        "µP limit": ("#2ca02c", "-"),
        "NNGP (posterior mean)": ("#d62728", "--"),
        "NTK (gradient flow, t = ∞)": ("#ff7f0e", ":"),
    }
    for name, (color, ls) in styles.items():
        ax.axhline(results[name], color=color, ls=ls, lw=2, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(widths)
    ax.set_xticklabels([str(w) for w in widths])
    ax.set_xlabel("width")
    ax.set_ylabel("test MSE")
    ax.set_ylim(0, max(results.values()) * 1.15)
    ax.set_title(f"y = (w·x)² − 1, d = {args.d}, {args.n_train} samples")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.loglog(widths, [gap[w] for w in widths], "-o", label="RMS(finite µP − µP limit)")
    ref = gap[widths[0]] * (widths[0] / torch.tensor(widths, dtype=torch.float64)) ** 0.5
    ax.loglog(widths, ref, "k--", lw=1, label="∝ width^-½")
    ax.set_xlabel("width")
    ax.set_title("finite µP networks → µP limit")
    ax.legend(fontsize=8)
    ax = axes[2]
    ax.loglog(widths, moves["mup"], "-o", label="µP")
    ax.loglog(widths, moves["ntk"], "-s", label="NTK parametrization")
    ax.set_xlabel("width")
    ax.set_ylabel("mean |Δ hidden preactivation|")
    ax.set_title("feature movement")
    ax.legend(fontsize=8)
    for a in axes[1:]:
        a.grid(alpha=0.3, which="both")
        a.set_xticks(widths)
        a.set_xticklabels([str(w) for w in widths])
        a.minorticks_off()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
