"""Infinite-width CNN kernels on sklearn's digits, against finite CNNs trained at growing widths.

The architecture is one ordinary PyTorch module (3×3 convs, relu, a stride-2 conv, global average
pooling, a linear readout). `mt.limits` traces it and computes its NNGP and NTK exactly; kernel
regression with them classifies the digits. The same module at widths 16…256, in the NTK
parametrization (W ~ N(0, 2/fan_in), per-layer learning rates 2/fan_in: `finite_nets.layer_factors`),
is trained by full-batch gradient descent on ½·mean‖f − y‖², centred (f − f at init, so the
random function at init does not count), and approaches the NTK's gradient-flow prediction at
the same time t as its width grows.

    .venv/bin/python examples/cnn_kernels_digits.py --figure docs/limits_cnn_digits.png
    .venv/bin/python examples/cnn_kernels_digits.py --quick    # seconds (smoke test)

Needs scikit-learn for the data (`pip install scikit-learn`, or the `test` extra).
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

from mutransfer import limits
from mutransfer.limits import finite as finite_nets


def cnn(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, 10),
    )


def digits(n_train: int, n_test: int, seed: int = 0):
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float64)[:, None] / 16.0
    x = (x - x.mean()) / x.std()
    y = torch.tensor(data.target)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    tr, te = perm[:n_train], perm[n_train : n_train + n_test]
    onehot = torch.nn.functional.one_hot(y, 10).to(torch.float64) - 0.1
    return x[tr], onehot[tr], y[tr], x[te], y[te]


def train_finite(width: int, x, y, xt, lr: float, steps: int, weight_var: float, bias_var: float, seed: int):
    """Full-batch GD in the NTK parametrization, float32 (the kernels are float64); returns the
    centred test predictions in float64."""
    torch.manual_seed(seed)
    net = cnn(width)
    x, y, xt = x.float(), y.float(), xt.float()
    factors = finite_nets.layer_factors(net, weight_var, bias_var)
    with torch.no_grad():
        for name, p in net.named_parameters():  # W ~ N(0, σ_w²/fan_in), b ~ N(0, σ_b²)
            p.normal_(0.0, math.sqrt(factors[name]) if factors[name] > 0 else 0.0)
        f0_train, f0_test = net(x), net(xt)
    groups = [{"params": [p], "lr": lr * factors[name]} for name, p in net.named_parameters() if factors[name] > 0]
    opt = torch.optim.SGD(groups, lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss = 0.5 * ((net(x) - f0_train - y) ** 2).sum(1).mean()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return (net(xt) - f0_test).double()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny run (seconds) that checks the pipeline")
    ap.add_argument("--figure", default=None, help="write the figure here (PNG)")
    args = ap.parse_args(argv)
    n_train, n_test = (60, 60) if args.quick else (400, 400)
    widths = [8, 16] if args.quick else [16, 32, 64, 128, 256]
    steps = 20 if args.quick else 400
    seeds = [0] if args.quick else [0, 1]
    wv, bv = 2.0, 0.0
    x, y, _labels, xt, labels_t = digits(n_train, n_test)
    model = cnn(8)

    start = time.perf_counter()
    # the kernels once (nngp_predict(model, ...) and ntk_predict(model, ...) would compute them per call)
    k_train, theta_train = limits.kernels(model, x, None, wv, bv)
    k_test, theta_test = limits.kernels(model, xt, x, wv, bv)
    kernel_seconds = time.perf_counter() - start
    lam_max = float(torch.linalg.eigvalsh(theta_train)[-1])
    lr = n_train / lam_max  # stable: GD on ½·mean‖f − y‖² contracts at rate lr·λ/n ≤ 1
    t = steps * lr / n_train  # the same time for the kernel flow df/dt = −Θ(f − y)
    nngp_mean, _ = limits.gp_posterior(k_train, k_test, y, noise_var=1e-4)
    ntk_t = limits.gradient_flow(theta_train, theta_test, y, t=t)
    ntk_inf = limits.gradient_flow(theta_train, theta_test, y)

    def accuracy(pred):
        return float((pred.argmax(1) == labels_t).double().mean())

    rows = [
        ("NNGP posterior mean", accuracy(nngp_mean), None),
        (f"NTK gradient flow, t = {t:.3g} (same time as the finite nets)", accuracy(ntk_t), None),
        ("NTK gradient flow, t = ∞", accuracy(ntk_inf), None),
    ]
    finite = {}
    for width in widths:
        preds = [train_finite(width, x, y, xt, lr, steps, wv, bv, seed) for seed in seeds]
        accs = [accuracy(p) for p in preds]
        gaps = [float((p - ntk_t).pow(2).mean().sqrt() / ntk_t.pow(2).mean().sqrt()) for p in preds]
        finite[width] = (sum(accs) / len(accs), sum(gaps) / len(gaps))
        rows.append(
            (f"finite CNN, width {width} (centred, GD, {len(seeds)} seeds)", finite[width][0], finite[width][1])
        )

    print(
        f"digits: {n_train} train / {n_test} test images (8×8); kernels {kernel_seconds:.1f} s; "
        f"GD lr {lr:.3g}, {steps} steps"
    )
    print("| model | test accuracy | relative RMS distance to the NTK flow at t |")
    print("|---|---|---|")
    for name, acc, gap in rows:
        print(f"| {name} | {acc:.3f} | {'' if gap is None else f'{gap:.3f}'} |")
    ws = list(finite)
    if len(ws) > 1:
        lw = torch.log(torch.tensor(ws, dtype=torch.float64))
        lg = torch.log(torch.tensor([finite[w][1] for w in ws], dtype=torch.float64))
        slope = float(((lw - lw.mean()) * (lg - lg.mean())).sum() / ((lw - lw.mean()) ** 2).sum())
        print(f"distance to the NTK flow falls as width^{slope:.2f} (the theory: width^-0.5)")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        a1.plot(ws, [finite[w][0] for w in ws], "o-", label="finite CNN (NTK param., GD)")
        for (name, acc, _), style, color in zip(rows[:3], ("--", ":", "-."), ("tab:green", "k", "tab:red")):
            a1.axhline(acc, linestyle=style, color=color, label=name.split(" (")[0])
        a1.set_xscale("log", base=2)
        a1.set_xlabel("width (channels)")
        a1.set_ylabel("test accuracy")
        a1.set_title("digits, CNN with global average pooling")
        a1.legend(fontsize=8)
        a2.loglog(ws, [finite[w][1] for w in ws], "o-", base=2, label="finite CNN")
        ref = finite[ws[0]][1] * (torch.tensor(ws, dtype=torch.float64) / ws[0]) ** -0.5
        a2.loglog(ws, ref.tolist(), "k--", base=2, label="∝ width^-1/2")
        a2.set_xlabel("width (channels)")
        a2.set_ylabel("relative RMS distance to NTK prediction")
        a2.set_title(f"finite nets → their NTK limit (t = {t:.3g})")
        a2.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=120)
        print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
