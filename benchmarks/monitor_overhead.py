"""Step time of the demo's GPT with `mt.Monitor(every=50)` against without, in one run.

The demo's GPT (2 layers, 4 heads, untied readout, PyTorch's default init; batch 16 × 32 tokens),
µP with AdamW groups from `mt.param_groups`. Rounds interleave: each round trains `--steps` steps
without the monitor, then `--steps` with it (two copies of the same model), so drift in the
machine's load hits both alike. The ratio is the median over rounds of (with / without); the goal
is ≤ 1.02 at every=50.

    python benchmarks/monitor_overhead.py                    # width 256, 6 rounds of 50 steps
    python benchmarks/monitor_overhead.py --quick            # width 64, 2 rounds of 10 steps, every=10
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer.recipes import GPT

VOCAB, BATCH, SEQ = 256, 16, 32


def gpt(width: int) -> GPT:
    return GPT(width, vocab=VOCAB, n_layer=2, n_head=4, ctx=SEQ, tied=False, init_std=None)


def build(width: int) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = gpt(width)
    mt.parametrize(model, base=gpt(32), delta=gpt(64))
    return model, torch.optim.AdamW(mt.param_groups(model, lr=1e-3, optimizer="adamw", weight_decay=0.1))


def train(model, opt, batches, monitor=None) -> float:
    start = time.perf_counter()
    for x in batches:
        loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if monitor is not None:
            monitor.step(loss)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=50, help="steps per round and condition")
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    if a.quick:
        a.width, a.rounds, a.steps, a.every = 64, 2, 10, 10
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    plain, plain_opt = build(a.width)
    watched, watched_opt = build(a.width)
    monitor = mt.Monitor(watched, watched_opt, every=a.every)
    train(plain, plain_opt, [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(3)])
    ratios, times = [], []
    for r in range(a.rounds):
        batches = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(a.steps)]
        t0 = train(plain, plain_opt, batches)
        t1 = train(watched, watched_opt, batches, monitor)
        ratios.append(t1 / t0)
        times.append((t0, t1))
        print(
            f"round {r}: without {1e3 * t0 / a.steps:7.2f} ms/step   with {1e3 * t1 / a.steps:7.2f} ms/step   "
            f"ratio {t1 / t0:.4f}"
        )
    monitor.close()
    total0, total1 = sum(t for t, _ in times), sum(t for _, t in times)
    print(
        f"\nGPT width {a.width}, batch {BATCH}×{SEQ}, every={a.every}, {a.rounds} rounds × {a.steps} steps, "
        f"{a.threads} thread(s); samples taken: {len(monitor.trajectory()['steps'])}, alarms: {len(monitor.alarms)}"
    )
    print(f"median ratio with/without: {statistics.median(ratios):.4f}   total ratio: {total1 / total0:.4f}")


if __name__ == "__main__":
    main()
