"""Step time of the demo's GPT with `mt.Monitor(every=50)` against without, in one run.

The demo's GPT (2 layers, 4 heads, untied readout, PyTorch's default init; batch 16 × 32 tokens),
µP with AdamW groups from `mt.param_groups`. Rounds interleave: each round trains `--steps` steps
without the monitor and `--steps` with it, the order alternating (two copies of the same model), so drift in the
machine's load hits both alike. Printed: the median over rounds and the total of (with / without),
for wall time and for this process's CPU time (steadier on a shared machine); the goal is ≤ 1.02
at every=50.

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


MONITOR_SECONDS = [0.0]  # wall time inside Monitor.step (the samples; the armed optimizer hooks run in opt.step)


def train(model, opt, batches, monitor=None) -> tuple[float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    for x in batches:
        loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if monitor is not None:
            t = time.perf_counter()
            monitor.step(loss)
            MONITOR_SECONDS[0] += time.perf_counter() - t
    return time.perf_counter() - start, time.process_time() - cpu


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
    walls, cpus = [], []
    for r in range(a.rounds):
        batches = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(a.steps)]
        if r % 2 == 0:  # alternate which goes first: the second run of a round may find warmer caches
            w0, c0 = train(plain, plain_opt, batches)
            w1, c1 = train(watched, watched_opt, batches, monitor)
        else:
            w1, c1 = train(watched, watched_opt, batches, monitor)
            w0, c0 = train(plain, plain_opt, batches)
        walls.append((w0, w1))
        cpus.append((c0, c1))
        print(
            f"round {r}: without {1e3 * w0 / a.steps:7.2f} ms/step (cpu {1e3 * c0 / a.steps:7.2f})   "
            f"with {1e3 * w1 / a.steps:7.2f} ms/step (cpu {1e3 * c1 / a.steps:7.2f})   wall ratio {w1 / w0:.4f}   "
            f"cpu ratio {c1 / c0:.4f}"
        )
    monitor.close()
    print(
        f"\nGPT width {a.width}, batch {BATCH}×{SEQ}, every={a.every}, {a.rounds} rounds × {a.steps} steps, "
        f"{a.threads} thread(s); samples taken: {len(monitor.trajectory()['steps'])}, alarms: {len(monitor.alarms)}"
    )
    for what, pairs in (("wall", walls), ("cpu", cpus)):
        med = statistics.median(t1 / t0 for t0, t1 in pairs)
        total = sum(t1 for _, t1 in pairs) / sum(t0 for t0, _ in pairs)
        print(f"{what:4s} time, with/without: median ratio {med:.4f}   total ratio {total:.4f}")
    print("(cpu: this process's CPU time, less sensitive than wall time to other jobs on the machine)")
    plain_wall = sum(w0 for w0, _ in walls)
    print(
        f"inside Monitor.step: {MONITOR_SECONDS[0]:.3f} s in all = {100 * MONITOR_SECONDS[0] / plain_wall:.2f}% of the "
        "plain run's wall time"
    )


if __name__ == "__main__":
    main()
