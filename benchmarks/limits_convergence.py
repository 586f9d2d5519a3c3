"""Finite networks → their infinite-width limits: the RMS gap at growing widths and its fitted slope.

One run, one table, for every feature-learning limit of `mt.limits` (theory: slope −½):
- the π-limit (`PiLimit`) of 2- and 3-hidden-layer relu MLPs against finite π-nets (`PiNet` +
  `train_pi`), widths 256 … 8192, minibatch SGD;
- the µP limit of a 1-hidden-layer tanh net under Adam (TP4b) and under SGD with momentum
  (`MuPLimit`) against `train_finite`, widths 256 … 16384;
- word2vec's µP limit (`Word2VecLimit`) against finite µP skip-gram nets on a small random corpus,
  widths 256 … 4096 (logits).
The gap is the RMS over seeds and evaluation points of f_width − f_∞; the limits of the
1-hidden-layer nets are exact (quadrature) or Monte Carlo with a standard error far below the gaps.

    .venv/bin/python benchmarks/limits_convergence.py          # ≈ 3 min on 2 cores
    .venv/bin/python benchmarks/limits_convergence.py --quick
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from mutransfer import limits as L


def data(n: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    return x, torch.sin(2 * x[:, 0]) + x[:, 1], torch.randn(16, d, generator=g, dtype=torch.float64)


def rms_gap(preds, limit) -> float:
    return math.sqrt(sum(float(((p - limit) ** 2).mean()) for p in preds) / len(preds))


def pi_case(depth: int, widths, seeds: int, steps: int):
    x, y, xe = data(32, 8, 0)
    fit = dict(steps=steps, lr=0.5, batch_size=8)
    limit = L.PiLimit(depth, 8, seed=1).fit(x, y, **fit).predict(xe)
    gaps = []
    for width in widths:
        preds = []
        for s in range(seeds):
            net = L.finite.train_pi(
                L.finite.PiNet(8, width, depth, 8, seed=1, omega_seed=1000 * width + s), x, y, **fit
            )
            with torch.no_grad():
                preds.append(net(xe)[:, 0])
        gaps.append(rms_gap(preds, limit))
    return gaps, float(limit.pow(2).mean().sqrt())


def one_layer_case(widths, seeds: int, steps: int, samples: int, **opt):
    x, y, xe = data(16, 8, 0)
    lr = 0.02 if opt.get("optimizer") == "adam" else 0.05
    limit = L.MuPLimit("tanh", method="monte_carlo", samples=samples, **opt).fit(x, y, steps, lr).predict(xe)
    gaps = []
    for width in widths:
        preds = []
        for s in range(seeds):
            torch.manual_seed(s)
            net = L.finite.train_finite(L.finite.OneHiddenLayer(8, width, activation="tanh"), x, y, steps, lr, **opt)
            with torch.no_grad():
                preds.append(net(xe)[:, 0])
        gaps.append(rms_gap(preds, limit))
    return gaps, float(limit.pow(2).mean().sqrt())


def word2vec_case(widths, seeds: int):
    vocab = 40
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (3000,), generator=g)
    batches = L.word2vec.skipgram_batches(tokens, vocab, epochs=1, batch_size=256, window=2, negatives=3, seed=0)
    limit = L.Word2VecLimit(vocab).fit(batches, lr=2.0).logits()
    gaps = []
    for width in widths:
        preds = []
        for s in range(seeds):
            net = L.word2vec.SkipGram(vocab, width, dtype=torch.float64, seed=s)
            L.word2vec.train_skipgram(net, batches, lr=2.0)
            with torch.no_grad():
                preds.append(net.logits())
        gaps.append(rms_gap(preds, limit))
    return gaps, float(limit.pow(2).mean().sqrt())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="small widths and few seeds (smoke test)")
    args = ap.parse_args(argv)
    pi_widths = [256, 1024, 4096, 8192] if not args.quick else [64, 128]
    one_widths = [256, 1024, 4096, 16384] if not args.quick else [64, 128]
    w2v_widths = [256, 1024, 4096] if not args.quick else [64, 128]
    seeds = 1 if args.quick else args.seeds
    samples = 2**12 if args.quick else 2**18  # Monte Carlo neurons of the 1-hidden-layer limits
    cases = [
        (
            "π-limit, 2 hidden layers (rank 8, 20 steps of batch 8)",
            pi_widths,
            lambda: pi_case(2, pi_widths, seeds, 20 if not args.quick else 2),
        ),
        (
            "π-limit, 3 hidden layers (rank 8, 20 steps of batch 8)",
            pi_widths,
            lambda: pi_case(3, pi_widths, seeds, 20 if not args.quick else 2),
        ),
        (
            "µP limit, 1 hidden layer, Adam (40 steps)",
            one_widths,
            lambda: one_layer_case(one_widths, seeds, 40, samples, optimizer="adam"),
        ),
        (
            "µP limit, 1 hidden layer, SGD + Nesterov momentum 0.9 (40 steps)",
            one_widths,
            lambda: one_layer_case(one_widths, seeds, 40, samples, momentum=0.9, nesterov=True),
        ),
        ("word2vec µP limit (logits; V = 40, 1 epoch)", w2v_widths, lambda: word2vec_case(w2v_widths, seeds)),
    ]
    print("| limit | widths | RMS gap finite − limit | RMS of the limit | fitted slope | seconds |")
    print("|---|---|---|---|---|---|")
    for name, widths, run in cases:
        start = time.perf_counter()
        gaps, size = run()
        slope = L.finite.fitted_slope(widths, gaps)
        print(
            f"| {name} | {', '.join(map(str, widths))} | {', '.join(f'{g:.2e}' for g in gaps)} | {size:.2f} | "
            f"{slope:+.2f} | {time.perf_counter() - start:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
