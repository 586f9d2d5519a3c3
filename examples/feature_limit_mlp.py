"""The infinite-width limit of your own module learns features the kernels of the same module cannot.

Task: a teacher neuron, y = relu(w·x) − E[relu] (scaled to unit variance on the training set),
x ~ N(0, I_16), 64 training points, 512 test points. The target depends on one direction of the
input and has a kink along it: a network that learns features finds the direction and the kink;
a kernel (NNGP, NTK) fits a generic smooth function of 16 inputs from 64 points.

Model: a 2-hidden-layer tanh MLP with LayerNorm (no affine gain), plain torch.nn. Trained alike:
- `mt.limits.FeatureLimit`: the µP limit of that module (width → ∞ of `mt.parametrize(model,
  base=base)`, base width 16), 20 SGD steps of batch 16, lr 0.5;
- finite µP networks of growing width, `mt.limits.finite.train_mup` (`mt.parametrize` + SGD on
  `mt.param_groups`), the same batches;
- the NNGP posterior mean and NTK gradient flow to t = ∞ of the same module (`mt.limits.nngp_predict`,
  `mt.limits.ntk_predict`), their weight and bias variances chosen by leave-one-out error on the
  training set.

    python examples/feature_limit_mlp.py            # 91 s on 2 cores; writes docs/limits_feature_limit.png
    python examples/feature_limit_mlp.py --quick    # ~11 s, no figure unless --plot
"""

from __future__ import annotations

import argparse
import math
import resource
import time
import warnings

import torch
from torch import nn

import mutransfer as mt
from mutransfer.limits import finite as finite_nets


def make_model(d: int, width: int) -> nn.Module:
    """The module every row of the table is about (the limit parametrizes a copy of it)."""
    return nn.Sequential(
        nn.Linear(d, width),
        nn.LayerNorm(width, elementwise_affine=False),
        nn.Tanh(),
        nn.Linear(width, width),
        nn.LayerNorm(width, elementwise_affine=False),
        nn.Tanh(),
        nn.Linear(width, 1, bias=False),
    ).double()


def make_task(d: int, n_train: int, n_test: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    w = torch.zeros(d, dtype=torch.float64)
    w[0] = 1.0
    x = torch.randn(n_train, d, generator=g, dtype=torch.float64)
    xt = torch.randn(n_test, d, generator=g, dtype=torch.float64)
    mean = 1 / math.sqrt(2 * math.pi)  # E[relu(z)], z ~ N(0, 1)
    y, yt = torch.relu(x @ w) - mean, torch.relu(xt @ w) - mean
    scale = y.std()
    return x, y / scale, xt, yt / scale, xt @ w


# weight and bias variances (per fan-in) tried for the kernels; (1/3, 1/48) is nn.Linear's own init here
KERNEL_GRID = [(w, b) for w in (1 / 3, 1.0, 2.0) for b in (0.0, 1 / 48, 0.1, 0.3, 1.0, 3.0)]


def loo_mse(k: torch.Tensor, y: torch.Tensor, jitter: float = 1e-8) -> float:
    """Leave-one-out MSE of kernel regression: residual_i = [K⁻¹y]_i / [K⁻¹]_ii."""
    k = k + jitter * k.diagonal().mean() * torch.eye(len(k), dtype=k.dtype)
    inv = torch.linalg.inv(k)
    return float(((inv @ y) / inv.diagonal()).pow(2).mean())


def mse(pred: torch.Tensor, y: torch.Tensor) -> float:
    return float(((pred - y) ** 2).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=16)
    ap.add_argument("--n-train", type=int, default=64)
    ap.add_argument("--n-test", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--particles", type=int, default=2**13, help="Monte Carlo particles of the limit")
    ap.add_argument("--groups", type=int, default=8, help="independent Monte Carlo replicas of the limit")
    ap.add_argument("--widths", default="256,1024,4096")
    ap.add_argument("--seeds", type=int, default=4, help="finite networks per width")
    ap.add_argument("--quick", action="store_true", help="fewer steps, particles, widths and test points")
    ap.add_argument("--plot", default=None, help="figure path (default: the docs' figure; none with --quick)")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.particles, args.groups, args.widths, args.seeds, args.n_test = 16, 2**11, 2, "256,1024", 1, 64
    if args.plot is None:
        args.plot = "" if args.quick else "docs/limits_feature_limit.png"
    widths = [int(w) for w in args.widths.split(",")]
    start = time.perf_counter()
    x, y, xt, yt, proj = make_task(args.d, args.n_train, args.n_test, 0)
    print(
        f"task: teacher relu neuron in d = {args.d}, {args.n_train} training points, {args.n_test} test points "
        f"(predicting 0: test MSE {mse(torch.zeros_like(yt), yt):.3f})"
    )
    torch.manual_seed(0)
    base = make_model(args.d, 16)

    results: dict[str, float] = {}
    preds: dict[str, torch.Tensor] = {}
    module = make_model(args.d, 64)  # the kernels see the architecture; the width is immaterial
    for name, kernel, fn in (
        ("NNGP (posterior mean)", mt.limits.nngp, mt.limits.nngp_predict),
        ("NTK (gradient flow, t = ∞)", mt.limits.ntk, mt.limits.ntk_predict),
    ):
        # the kernel's variances chosen by leave-one-out error on the training set (the kernels'
        # best case short of looking at the test set)
        best = min(KERNEL_GRID, key=lambda wb: loo_mse(kernel(module, x, weight_var=wb[0], bias_var=wb[1]), y))
        with warnings.catch_warnings():
            warnings.simplefilter("error", mt.limits.KernelWarning)  # the kernels here are exact, not estimates
            out = fn(module, x, y, xt, weight_var=best[0], bias_var=best[1])
        pred = out[0] if isinstance(out, tuple) else out
        results[name], preds[name] = mse(pred, yt), pred
        print(f"{name}: weight_var {best[0]:.3g}, bias_var {best[1]:.3g} by leave-one-out")

    t0 = time.perf_counter()
    limit = mt.limits.FeatureLimit(
        make_model(args.d, 256), base=base, particles=args.particles, groups=args.groups, seed=0
    )
    limit.fit(x, y, steps=args.steps, lr=args.lr, batch_size=args.batch_size)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    f_lim, se = limit.predict(xt, return_error=True)
    f_lim, se = f_lim[:, 0], se[:, 0]
    pred_s = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB
    results["µP limit (FeatureLimit)"], preds["µP limit (FeatureLimit)"] = mse(f_lim, yt), f_lim
    print(
        f"FeatureLimit: {args.steps} steps of batch {args.batch_size}, {args.particles} particles: fit {fit_s:.0f} s, "
        f"predict on {args.n_test} points {pred_s:.0f} s, peak memory {rss:.2f} GB; "
        f"Monte Carlo standard error of f {float(se.mean()):.1e} on average"
    )

    finite_mse, gap = {}, {}
    for width in widths:
        errs, gaps = [], []
        for s in range(args.seeds):
            torch.manual_seed(100 + s)
            # `mt.parametrize` + SGD on `mt.param_groups` over the limit's batches (its seed, 0)
            net = finite_nets.train_mup(make_model(args.d, width), base, x, y, args.steps, args.lr, args.batch_size, 0)
            with torch.no_grad():
                pred = net(xt)[:, 0]
            errs.append(mse(pred, yt))
            gaps.append(math.sqrt(mse(pred, f_lim)))
        finite_mse[width], gap[width] = sum(errs) / len(errs), sum(gaps) / len(gaps)
        results[f"finite µP, width {width} ({args.seeds} seeds)"] = finite_mse[width]

    print("\n| model | test MSE |")
    print("|---|---|")
    for name, value in results.items():
        print(f"| {name} | {value:.3f} |")
    print(f"| (predicting 0) | {mse(torch.zeros_like(yt), yt):.3f} |")
    slope = finite_nets.fitted_slope(widths, [gap[w] for w in widths])
    print(
        "\nfinite µP vs the limit, RMS difference of test predictions: "
        + ", ".join(f"{gap[w]:.3f} (width {w})" for w in widths)
        + f"; fitted slope {slope:+.2f} (theory −0.5)"
    )
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.plot:
        plot(results, preds, proj, yt, widths, gap, slope, float(se.pow(2).mean().sqrt()), args.plot)
        print(f"figure: {args.plot}")
    return 0


def plot(results, preds, proj, yt, widths, gap, slope, floor, path) -> None:
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    names = list(results)
    colors = ["#d62728", "#ff7f0e", "#2ca02c"] + ["#1f77b4"] * (len(names) - 3)
    ax.barh(range(len(names)), [results[n] for n in names], color=colors)
    ax.set_yticks(range(len(names)), [n.replace(" (", "\n(", 1) for n in names], fontsize=8)
    ax.axvline(mse(torch.zeros_like(yt), yt), color="gray", ls=":", label="predicting 0")
    ax.invert_yaxis()
    ax.set_xlabel("test MSE")
    ax.set_title("same module: µP limit vs its kernels")
    ax.legend(fontsize=8)

    ax = axes[1]
    order = proj.argsort()
    ax.plot(proj[order], yt[order], color="black", lw=2, label="target")
    for name, color in (("NNGP (posterior mean)", "#d62728"), ("µP limit (FeatureLimit)", "#2ca02c")):
        ax.scatter(proj, preds[name], s=5, alpha=0.5, color=color, label=name)
    ax.set_xlabel("w·x (the teacher's direction)")
    ax.set_ylabel("prediction on test inputs")
    ax.set_title("predictions along the teacher's direction")
    ax.legend(fontsize=8, markerscale=3)

    ax = axes[2]
    ax.loglog(widths, [gap[w] for w in widths], "-o", color="#1f77b4", label=f"finite µP (slope {slope:+.2f})")
    ref = [gap[widths[0]] * (w / widths[0]) ** -0.5 for w in widths]
    ax.loglog(widths, ref, ":", color="gray", label="width^-1/2")
    ax.axhline(floor, color="#2ca02c", ls="--", label="the limit's Monte Carlo s.e.")
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.minorticks_off()
    ax.set_xlabel("width")
    ax.set_ylabel("RMS distance to the limit (test)")
    ax.set_title("finite µP networks → FeatureLimit")
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
