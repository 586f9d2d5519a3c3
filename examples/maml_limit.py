"""Few-shot learning at infinite width: the µP limit of MAML against its NTK and GP limits (Tensor Programs IV).

5-way 1-shot tasks from scikit-learn's digits (8 × 8, d = 64): meta-train tasks draw from one half of
each class's images, meta-test tasks from the other. The model is the linear net
``Linear(64, n) → Linear(n, 5)`` (no biases) in µP (`mt.parametrize(model, base=...)`, base width 64),
meta-trained by first-order MAML (one inner SGD step on the support, the query loss's gradient at the
adapted weights, 16 tasks a meta-batch).

1. For each limit (µP, NTK, GP) the inner step and the meta lr are chosen on validation tasks (drawn
   from the meta-train images with another seed) over a small grid, meta_lr = 0 (no meta-training)
   included;
2. each limit, meta-trained with its choice, is scored on the meta-test tasks;
3. finite µP nets at widths 256, 1024, 4096, meta-trained on the same meta-batches with the µP limit's
   choice, are scored too, with their adapted logits' RMS gap to the limit's.

    python examples/maml_limit.py            # ~2 min on 2 CPU cores
    python examples/maml_limit.py --quick    # the smoke run the tests use (~15 s)
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import torch
from torch import nn

import mutransfer as mt
from mutransfer.limits import maml

STEPS = (0.1, 0.3, 1.0)
META_LRS = (0.0, 0.1, 0.3, 1.0)


def net(width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, width, bias=False), nn.Linear(width, 5, bias=False))


def finite_accuracy(model: nn.Module, tasks: list, step: float) -> tuple[float, torch.Tensor]:
    logits = [maml.maml_logits(model, xs, ys, xq, step) for xs, ys, xq, _ in tasks]
    right = sum(int((lg.argmax(-1) == yq).sum()) for lg, (_, _, _, yq) in zip(logits, tasks))
    return right / sum(len(t[3]) for t in tasks), torch.cat(logits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer meta-steps, tasks and widths")
    args = ap.parse_args()
    meta_steps, n_test, widths = (60, 100, (256, 1024)) if args.quick else (500, 1000, (256, 1024, 4096))
    torch.manual_seed(0)
    start = time.perf_counter()
    train = maml.meta_batches(maml.digits_tasks("train", 16 * meta_steps, seed=0), 16)
    valid = maml.digits_tasks("train", 300, seed=1)
    test = maml.digits_tasks("test", n_test, seed=2)
    model, base = net(1024), net(64)  # the limits read µP's constants off this pair

    rows, chosen = [], {}
    for kind in ("mup", "ntk", "gp"):
        fresh = maml.MAMLLimit(model, base, kind)
        best = max(
            itertools.product(STEPS, META_LRS),
            key=lambda hp: fresh.restarted(hp[0]).fit(train, meta_lr=hp[1]).accuracy(valid),
        )
        lim = fresh.restarted(best[0]).fit(train, meta_lr=best[1])
        chosen[kind] = (best, lim)
        rows.append((f"{kind} limit", best, lim.accuracy(test)))
    (step, meta_lr), limit = chosen["mup"]
    reference = torch.cat([limit.predict(xs, ys, xq) for xs, ys, xq, _ in test])
    for width in widths:
        torch.manual_seed(0)
        m = net(width)
        mt.parametrize(m, base=net(64))
        m.double()
        maml.train_maml(m, train, step, meta_lr)
        acc, logits = finite_accuracy(m, test, step)
        gap = float((logits - reference).pow(2).mean().sqrt())
        rows.append((f"µP width {width}", (step, meta_lr), acc, gap))

    print(f"digits, 5-way 1-shot: {meta_steps} meta-batches of 16 tasks, {n_test} meta-test tasks")
    print(f"{'model':<16} {'step':>6} {'meta lr':>8} {'accuracy':>9} {'RMS gap to µP limit':>20}")
    for row in rows:
        name, (s, lr), acc = row[:3]
        gap = f"{row[3]:.4f}" if len(row) > 3 else "—"
        print(f"{name:<16} {s:>6g} {lr:>8g} {acc:>9.3f} {gap:>20}")
    kernels = max(r[2] for r in rows if r[0] in ("ntk limit", "gp limit"))
    finite = [r[2] for r in rows if r[0].startswith("µP width")]
    print(
        f"µP limit − best kernel limit: {100 * (rows[0][2] - kernels):+.1f} points; "
        f"− widest finite net: {100 * (rows[0][2] - finite[-1]):+.1f} points"
    )
    gaps = [r[3] for r in rows if len(r) > 3]
    if len(gaps) > 1:
        slope = (math.log(gaps[-1]) - math.log(gaps[0])) / (math.log(widths[-1]) - math.log(widths[0]))
        print(f"RMS gap against width: log-log slope {slope:.2f} (theory −0.5)")
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
