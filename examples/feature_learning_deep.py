"""Feature learning beyond one layer and beyond SGD: the π-limit and the Adam µP limit against kernels.

Task (as in `examples/feature_learning.py`): y = (w·x)² − 1 with x ~ N(0, I_32) and a unit vector
w, 256 training points, 1000 test points. It depends on one direction of the input: a network that
learns features finds it, a kernel (NNGP, NTK) must fit a generic quadratic in 32 dimensions.

All trained models see the same minibatches (`mt.limits.finite.sgd_batches`): `--steps` steps of batch 32.
- NNGP posterior mean and NTK gradient flow to t = ∞, relu, the same depth as the π-net (and 1);
- the µP limit of a 1-hidden-layer relu net trained by SGD (`MuPLimit`, Monte Carlo);
- the **π-limit** of a 2-hidden-layer relu MLP in µP (`PiLimit`, rank r) and finite π-nets of
  growing width started from the same rank-r state (`PiNet` + `train_pi`): they approach it;
- the **Adam µP limit** of the 1-hidden-layer net (`MuPLimit(optimizer="adam")`, TP4b) and finite
  µP Adam nets (lr η, ε/n) of growing width: they approach it.

    .venv/bin/python examples/feature_learning_deep.py      # ≈ 4 min on 2 cores; writes docs/limits_deep.png
    .venv/bin/python examples/feature_learning_deep.py --quick
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from mutransfer import limits as L
from mutransfer.limits import finite as finite_nets


def make_task(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    return x, x[:, 0] ** 2 - 1  # w = e₁: the inputs are isotropic, so any unit w is the same task


def mse(pred: torch.Tensor, y: torch.Tensor) -> float:
    return float(((pred - y) ** 2).mean())


def rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return math.sqrt(mse(a, b))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--n-train", type=int, default=256)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--depth", type=int, default=2, help="hidden layers of the π-net and the kernels")
    ap.add_argument("--rank", type=int, default=64, help="rank r of the π-limit")
    ap.add_argument("--pi-lr", type=float, default=0.3)
    ap.add_argument("--pi-input-alpha", type=float, default=0.3)
    ap.add_argument("--sgd-lr", type=float, default=0.3, help="1-hidden-layer µP limit, SGD")
    ap.add_argument("--adam-lr", type=float, default=1e-3)
    ap.add_argument("--samples", type=int, default=32768, help="Monte Carlo neurons of the 1-hidden-layer limits")
    ap.add_argument("--pi-widths", default="256,1024,4096")
    ap.add_argument("--adam-widths", default="256,1024,4096,16384")
    ap.add_argument("--seeds", type=int, default=2, help="finite networks per width")
    ap.add_argument("--quick", action="store_true", help="a small run (seconds) that checks the pipeline")
    ap.add_argument("--plot", default="docs/limits_deep.png")
    args = ap.parse_args(argv)
    if args.quick:
        args.n_train, args.steps, args.samples, args.seeds = 64, 20, 1024, 1
        args.pi_widths, args.adam_widths, args.rank = "128,256", "128,256", 16
    pi_widths = [int(w) for w in args.pi_widths.split(",")]
    adam_widths = [int(w) for w in args.adam_widths.split(",")]
    start = time.perf_counter()

    x, y = make_task(args.n_train, args.d, 0)
    xt, yt = make_task(1000, args.d, 1)
    fit = dict(steps=args.steps, batch_size=args.batch)
    print(
        f"task: y = (w·x)² − 1, d = {args.d}, {args.n_train} training points, 1000 test points "
        f"(predicting 0: test MSE {mse(torch.zeros_like(yt), yt):.3f}); {args.steps} steps of batch {args.batch}"
    )

    rows: list[tuple[str, float, str]] = []
    for depth in sorted({1, args.depth}):
        mean, _ = L.nngp_predict(x, y, xt, depth=depth, noise_var=1e-6)
        rows.append((f"NNGP posterior mean, {depth} hidden layer{'s' * (depth > 1)}", mse(mean, yt), ""))
        rows.append(
            (
                f"NTK gradient flow t = ∞, {depth} hidden layer{'s' * (depth > 1)}",
                mse(L.ntk_predict(x, y, xt, depth=depth), yt),
                "",
            )
        )
    sgd_limit = L.MuPLimit("relu", method="monte_carlo", samples=args.samples).fit(x, y, lr=args.sgd_lr, **fit)
    rows.append(("µP limit, 1 hidden layer, SGD", mse(sgd_limit.predict(xt), yt), ""))

    t0 = time.perf_counter()
    pi = L.PiLimit(args.depth, args.rank, input_alpha=args.pi_input_alpha).fit(x, y, lr=args.pi_lr, **fit)
    pi_pred = pi.predict(xt)
    pi_seconds = time.perf_counter() - t0
    rows.append((f"**π-limit**, {args.depth} hidden layers, rank {args.rank}, SGD", mse(pi_pred, yt), ""))
    adam = L.MuPLimit("relu", optimizer="adam", samples=args.samples).fit(x, y, lr=args.adam_lr, **fit)
    adam_pred = adam.predict(xt)
    rows.append(("**Adam µP limit**, 1 hidden layer", mse(adam_pred, yt), ""))

    def finite(widths, build_and_train, limit_pred):
        out = {}
        for width in widths:
            errs, gaps = [], []
            for seed in range(args.seeds):
                pred = build_and_train(width, seed)
                errs.append(mse(pred, yt))
                gaps.append(rms(pred, limit_pred))
            out[width] = (sum(errs) / len(errs), sum(gaps) / len(gaps))
        return out

    def pi_net(width, seed):
        net = finite_nets.PiNet(args.d, width, args.depth, args.rank, input_alpha=args.pi_input_alpha, omega_seed=seed)
        finite_nets.train_pi(net, x, y, lr=args.pi_lr, **fit)
        with torch.no_grad():
            return net(xt)[:, 0]

    def adam_net(width, seed):
        torch.manual_seed(seed)
        net = finite_nets.train_finite(
            finite_nets.OneHiddenLayer(args.d, width, activation="relu"), x, y, lr=args.adam_lr, optimizer="adam", **fit
        )
        with torch.no_grad():
            return net(xt)[:, 0]

    t0 = time.perf_counter()
    pi_finite = finite(pi_widths, pi_net, pi_pred)
    pi_net_seconds = time.perf_counter() - t0
    adam_finite = finite(adam_widths, adam_net, adam_pred)
    for width, (err, gap) in pi_finite.items():
        rows.append((f"finite π-net, width {width}", err, f"{gap:.3f}"))
    for width, (err, gap) in adam_finite.items():
        rows.append((f"finite µP Adam net, width {width}", err, f"{gap:.3f}"))

    print("\n| model | test MSE | RMS distance to its limit |")
    print("|---|---|---|")
    for name, value, gap in rows:
        print(f"| {name} | {value:.3f} | {gap} |")
    s_pi = finite_nets.fitted_slope(pi_widths, [pi_finite[w][1] for w in pi_widths])
    s_adam = finite_nets.fitted_slope(adam_widths, [adam_finite[w][1] for w in adam_widths])
    print(
        f"\nfinite → limit, fitted slope of the RMS distance vs width: π-nets {s_pi:+.2f}, "
        f"Adam nets {s_adam:+.2f} (theory −0.5)"
    )
    print(
        f"π-limit: fit {pi_seconds:.1f} s, state {pi.state_size * 8 / 1e6:.1f} MB; "
        f"finite π-nets {pi_net_seconds:.0f} s; total {time.perf_counter() - start:.0f} s"
    )
    if args.plot:
        plot(rows, pi_finite, adam_finite, s_pi, s_adam, mse(torch.zeros_like(yt), yt), args)
        print(f"figure: {args.plot}")
    return 0


def plot(rows, pi_finite, adam_finite, s_pi, s_adam, zero_mse, args) -> None:
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.6))
    value = {name: v for name, v, _ in rows}
    pw, aw = list(pi_finite), list(adam_finite)
    a1.plot(pw, [pi_finite[w][0] for w in pw], "-o", color="tab:blue", label="finite π-nets")
    a1.plot(aw, [adam_finite[w][0] for w in aw], "-s", color="tab:purple", label="finite µP Adam nets")
    lines = [(n, v) for n, v, _ in rows if "finite" not in n]
    colors = {"π-limit": "tab:blue", "Adam": "tab:purple", "SGD": "tab:green", "NNGP": "tab:red", "NTK": "tab:orange"}
    styles = ["-", "--", ":", "-."]
    for i, (name, v) in enumerate(lines):
        color = next((c for k, c in colors.items() if k in name), "gray")
        a1.axhline(v, color=color, ls=styles[i % len(styles)], lw=1.6, label=name.replace("**", ""))
    a1.axhline(zero_mse, color="k", lw=0.8, alpha=0.5, label="predicting 0")
    a1.set_xscale("log", base=2)
    a1.set_xlabel("width")
    a1.set_ylabel("test MSE")
    a1.set_ylim(0, max(value.values()) * 1.12)
    a1.set_title(f"y = (w·x)² − 1, d = {args.d}, {args.n_train} samples, {args.steps} steps")
    a1.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    a2.loglog(
        pw, [pi_finite[w][1] for w in pw], "-o", base=2, color="tab:blue", label=f"π-nets → π-limit (slope {s_pi:+.2f})"
    )
    a2.loglog(
        aw,
        [adam_finite[w][1] for w in aw],
        "-s",
        base=2,
        color="tab:purple",
        label=f"µP Adam nets → Adam limit (slope {s_adam:+.2f})",
    )
    for widths, data in ((pw, pi_finite), (aw, adam_finite)):
        ref = [data[widths[0]][1] * (widths[0] / w) ** 0.5 for w in widths]
        a2.loglog(widths, ref, "k--", lw=0.8, base=2)
    a2.plot([], [], "k--", lw=0.8, label="∝ width^-½")
    a2.set_xlabel("width")
    a2.set_ylabel("RMS(finite − limit) on test inputs")
    a2.set_title("finite networks → their limits")
    a2.grid(alpha=0.3, which="both")
    a2.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.plot) or ".", exist_ok=True)
    fig.savefig(args.plot, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
