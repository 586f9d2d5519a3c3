"""The µP limit of a small transformer block against the kernels of the same module, on sequences.

Task: y = mean over the 2 tokens of relu(x_t·e₀) (standardized on the training set), tokens
x_t ~ N(0, I_16), 64 training sequences, 256 test sequences. The target depends on one direction of
each token and has a kink along it: a network that learns features can find the direction; a kernel
(NNGP, NTK) fits a generic function of 2 × 16 inputs from 64 sequences.

Model: one pre-norm self-attention block (SDPA, one head, LayerNorm without affine, tanh, mean over
positions, linear readout), plain torch.nn. Trained alike, on the same 64 sequences, with the MLP
example's budget (examples/feature_limit_mlp.py: 20 SGD steps of batch 16):
- `mt.limits.FeatureLimit`: its µP limit (base width 16), `derivatives="stein"`; the lr chosen by
  4-fold cross-validation of finite width-256 µP networks on the training set (never the test set);
- finite µP networks at widths 256 and 1024, `mt.limits.finite.train_mup` on the limit's batches;
- the NNGP posterior mean and the NTK gradient flow to t = ∞ of the same module. No exact rule exists
  for attention, so `mt.limits.nngp`/`ntk` estimate them by Monte Carlo over finite networks of the
  module (width 64; a KernelWarning says so); their weight, bias and ridge variances are chosen by
  leave-one-out error on the training set, and their standard errors are printed.

With 4 positions, 32 sequences and 16 steps of batch 8 (`--positions 4 --n-train 32 --steps 16
--batch-size 8`) the NTK wins (0.312 against the limit's 0.405; docs/limits/transformers.md).

    python examples/transformer_limit.py            # a few minutes on 2 cores
    python examples/transformer_limit.py --quick    # fewer particles, test points, kernel samples
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


class Block(nn.Module):
    """The module every row of the table is about (the limit parametrizes a copy of it)."""

    def __init__(self, d: int, width: int):
        super().__init__()
        self.inp = nn.Linear(d, width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.ln = nn.LayerNorm(width, elementwise_affine=False)
        self.out = nn.Linear(width, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, T, d) → (N, 1)
        h = self.inp(x)
        a = self.ln(h)
        h = h + self.o(nn.functional.scaled_dot_product_attention(self.q(a), self.k(a), self.v(a)))
        return self.out(torch.tanh(self.ln(h)).mean(1))


def make_model(d: int, width: int) -> nn.Module:
    return Block(d, width).double()


def make_task(d: int, positions: int, n_train: int, n_test: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_train, positions, d, generator=g, dtype=torch.float64)
    xt = torch.randn(n_test, positions, d, generator=g, dtype=torch.float64)
    y, yt = torch.relu(x[..., 0]).mean(1), torch.relu(xt[..., 0]).mean(1)
    mean, scale = y.mean(), y.std()
    return x, (y - mean) / scale, xt, (yt - mean) / scale


# weight and bias variances (per fan-in) and ridges (× the kernel's mean diagonal) tried for the kernels
KERNEL_GRID = [(w, b) for w in (0.5, 1.0, 2.0) for b in (0.0, 0.1, 1.0)]
RIDGES = (0.0, 1e-3, 1e-2, 1e-1)
LR_GRID = (0.1, 0.2, 0.5, 1.0)


def solve(k: torch.Tensor, ridge: float) -> torch.Tensor:
    return k + (ridge + 1e-8) * k.diagonal().mean() * torch.eye(len(k), dtype=k.dtype)


def loo_mse(k: torch.Tensor, y: torch.Tensor, ridge: float) -> float:
    """Leave-one-out MSE of kernel regression: residual_i = [K⁻¹y]_i / [K⁻¹]_ii."""
    inv = torch.linalg.inv(solve(k, ridge))
    return float(((inv @ y) / inv.diagonal()).pow(2).mean())


def mse(pred: torch.Tensor, y: torch.Tensor) -> float:
    return float(((pred - y) ** 2).mean())


def cv_lr(d, base, x, y, steps, batch_size, folds=4) -> dict[float, float]:
    """k-fold cross-validation MSE of finite width-256 µP networks for each lr (training data only)."""
    out = {}
    idx = torch.arange(len(x))
    for lr in LR_GRID:
        errs = []
        for f in range(folds):
            held = idx % folds == f
            torch.manual_seed(200 + f)
            net = finite_nets.train_mup(make_model(d, 256), base, x[~held], y[~held], steps, lr, batch_size, 0)
            with torch.no_grad():
                pred = net(x[held])[:, 0]
            errs.append(mse(pred, y[held]) if torch.isfinite(pred).all() else math.inf)
        out[lr] = sum(errs) / folds
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=16)
    ap.add_argument("--positions", type=int, default=2)
    ap.add_argument("--n-train", type=int, default=64)
    ap.add_argument("--n-test", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=None, help="the limit's lr (default: by cross-validation)")
    ap.add_argument("--particles", type=int, default=2**13, help="Monte Carlo particles of the limit")
    ap.add_argument("--groups", type=int, default=4, help="independent Monte Carlo replicas of the limit")
    ap.add_argument("--widths", default="256,1024")
    ap.add_argument("--seeds", type=int, default=2, help="finite networks per width")
    ap.add_argument("--kernel-width", type=int, default=64, help="width of the kernels' Monte Carlo networks")
    ap.add_argument("--ntk-samples", type=int, default=16)
    ap.add_argument("--nngp-samples", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="fewer particles, test points and kernel samples")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.particles, args.groups, args.n_test, args.seeds = 2**12, 2, 64, 1
        args.ntk_samples, args.nngp_samples = 8, 64
    history = (args.n_train + args.steps * args.batch_size) * args.positions
    if args.particles // args.groups < 2 * history:
        ap.error(f"particles per group must be ≥ 2 × {history} (the stein history) for this run")
    widths = [int(w) for w in args.widths.split(",")]
    start = time.perf_counter()
    x, y, xt, yt = make_task(args.d, args.positions, args.n_train, args.n_test, 0)
    zero = mse(torch.zeros_like(yt), yt)
    print(
        f"task: mean over {args.positions} tokens of relu(x_t·e₀), tokens in d = {args.d}, {args.n_train} training "
        f"sequences, {args.n_test} test sequences (predicting 0: test MSE {zero:.3f})"
    )
    torch.manual_seed(0)
    base = make_model(args.d, 16)

    results: dict[str, float] = {}
    n, xa = len(x), torch.cat([x, xt])
    module = make_model(args.d, args.kernel_width)
    for name, kernel, samples in (
        ("NNGP (posterior mean)", mt.limits.nngp, args.nngp_samples),
        ("NTK (gradient flow, t = ∞)", mt.limits.ntk, args.ntk_samples),
    ):
        t0, best = time.perf_counter(), None
        for wv, bv in KERNEL_GRID:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", mt.limits.KernelWarning)  # Monte Carlo: no rule for SDPA
                k = kernel(module, xa, weight_var=wv, bias_var=bv, samples=samples)
            for ridge in RIDGES:
                loo = loo_mse(k[:n, :n], y, ridge)
                if best is None or loo < best[0]:
                    best = (loo, wv, bv, ridge, k)
        _, wv, bv, ridge, k = best
        # the kernel's variances and ridge chosen by leave-one-out error on the training set; train
        # and test entries from the same Monte Carlo networks
        pred = k[n:, :n] @ torch.linalg.solve(solve(k[:n, :n], ridge), y)
        results[name] = mse(pred, yt)
        rel = float(k.std_error[:n, :n].diagonal().mean() / k[:n, :n].diagonal().mean())
        print(
            f"{name}: Monte Carlo over {samples} networks of width {args.kernel_width}; weight_var {wv:.3g}, "
            f"bias_var {bv:.3g}, ridge {ridge:.0e} by leave-one-out ({best[0]:.3f}); standard error "
            f"{float(k.std_error.mean()):.2e} on average, {rel:.1%} of the mean diagonal; {time.perf_counter() - t0:.0f} s"
        )

    if args.lr is None:
        cv = cv_lr(args.d, base, x, y, args.steps, args.batch_size)
        args.lr = min(cv, key=cv.get)
        print(
            "lr by 4-fold cross-validation of width-256 µP networks: "
            + ", ".join(f"{k:g}: {v:.3f}" for k, v in cv.items())
        )

    t0 = time.perf_counter()
    limit = mt.limits.FeatureLimit(
        make_model(args.d, 256), base=base, particles=args.particles, groups=args.groups, seed=0, example_input=x
    )
    limit.fit(x, y, steps=args.steps, lr=args.lr, batch_size=args.batch_size, derivatives="stein")
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    f_lim, se = limit.predict(xt, return_error=True)
    f_lim, se = f_lim[:, 0], se[:, 0]
    pred_s = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB
    results["µP limit (FeatureLimit)"] = mse(f_lim, yt)
    print(
        f"FeatureLimit: {args.steps} steps of batch {args.batch_size} at lr {args.lr:g}, stein, {args.particles} "
        f"particles in {args.groups} groups: fit {fit_s:.0f} s, predict on {args.n_test} sequences {pred_s:.0f} s, "
        f"peak memory {rss:.2f} GB; Monte Carlo standard error of f {float(se.mean()):.1e} on average"
    )

    gap = {}
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
        gap[width] = sum(gaps) / len(gaps)
        results[f"finite µP, width {width} ({args.seeds} seeds)"] = sum(errs) / len(errs)

    print("\n| model | test MSE |")
    print("|---|---|")
    for name, value in results.items():
        print(f"| {name} | {value:.3f} |")
    print(f"| (predicting 0) | {zero:.3f} |")
    print(
        "\nfinite µP vs the limit, RMS difference of test predictions: "
        + ", ".join(f"{gap[w]:.3f} (width {w})" for w in widths)
    )
    best_kernel = min(results["NNGP (posterior mean)"], results["NTK (gradient flow, t = ∞)"])
    verdict = "beats" if results["µP limit (FeatureLimit)"] < best_kernel else "does not beat"
    print(f"the limit {verdict} both kernels ({results['µP limit (FeatureLimit)']:.3f} vs {best_kernel:.3f})")
    print(
        f"total {time.perf_counter() - start:.0f} s, peak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
