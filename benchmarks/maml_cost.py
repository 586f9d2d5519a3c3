"""What `mt.limits.MAMLLimit` costs per meta-step: time and peak memory against the input size d, the
number of classes k and the tasks per meta-batch, for the µP limit (state: the (d+k) × (d+k) matrix A,
one adapted copy per task of a batch) and the NTK limit (state: the k × d matrix B), and the headline
of issue 47: a 1000-meta-step fit on d = 64, k = 5, 16 tasks a batch ("well under a minute").

Tasks are random (inputs N(0, I_d), so E|x|² = d as the digits and Omniglot loaders normalise them):
k-way 1-shot with 5 queries per class (5-way for k = 5, 20-way for k = 20); step 0.3, meta_lr 0.3;
the limit is read off `Linear(d, 64) → Linear(64, k)` with base width 16, float64, on `--threads`
torch threads (1 by default: the numbers do not depend on what else the machine runs).

Time: the wall time of one `fit` call over n meta-batches, / n, after 3 warm-up steps; n ≥ 3, up to
40 and about 1 s of them (four distinct random meta-batches, cycled). One call over many batches, as
a fit is used: calling `fit` once per meta-batch measured ~2× slower a step at d = 64 (2.3 vs 1.1 ms,
16 tasks): glibc's malloc hands blocks back between calls (with MALLOC_MMAP_THRESHOLD_ and
MALLOC_TRIM_THRESHOLD_ set to 10⁹ the two agree). Memory: each row runs in a fresh process, and the
peak column is how much its peak resident memory (`resource.getrusage(RUSAGE_SELF).ru_maxrss`,
Linux: KiB) grew during the fit (warm-up and timed steps), above the peak of everything before it
(imports, the tasks, the limit's construction): torch's CPU tensors bypass Python's allocator, so
tracemalloc would not see them. `state` is the size of the limit's state; `batch` is one state per
task of a meta-batch (each task's adapted A, or B, held at once): the fit's temporaries are a few
of those.

    .venv/bin/python benchmarks/maml_cost.py            # the full table and the headline
    .venv/bin/python benchmarks/maml_cost.py --quick    # smoke test, seconds, rows in this process
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

STEP, META_LR, QUERIES, WIDTH, BASE, WARMUP = 0.3, 0.3, 5, 64, 16, 3


def random_batches(d: int, k: int, tasks: int, batches: int, seed: int = 0) -> list:
    """`batches` meta-batches of `tasks` random k-way 1-shot tasks with QUERIES queries per class."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ys, yq = torch.arange(k), torch.arange(k).repeat_interleave(QUERIES)
    return [
        [
            (
                torch.randn(k, d, generator=g, dtype=torch.float64),
                ys,
                torch.randn(k * QUERIES, d, generator=g, dtype=torch.float64),
                yq,
            )
            for _ in range(tasks)
        ]
        for _ in range(batches)
    ]


def make_limit(kind: str, d: int, k: int):
    import torch
    from torch import nn

    import mutransfer as mt

    def net(n: int) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(d, n, bias=False), nn.Linear(n, k, bias=False))

    return mt.limits.MAMLLimit(net(WIDTH), net(BASE), kind, STEP)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def one(kind: str, d: int, k: int, tasks: int, max_steps: int = 40, budget_s: float = 1.0) -> dict:
    """One row: seconds per meta-step (one `fit` call over n meta-batches, / n) and the peak-memory
    growth over the fits (warm-up included). Four distinct meta-batches, cycled."""
    import torch

    pool = random_batches(d, k, tasks, 4)
    t0 = time.perf_counter()
    lim = make_limit(kind, d, k)
    setup = time.perf_counter() - t0
    before = rss_mb()
    lim.fit(pool[:WARMUP], META_LR)  # warm-up (the allocator's too)
    t0 = time.perf_counter()
    lim.fit(pool[-1:], META_LR)
    first = time.perf_counter() - t0
    n = max(3, min(max_steps, int(budget_s / first)))
    t0 = time.perf_counter()
    lim.fit([pool[i % 4] for i in range(n)], META_LR)
    per_step = (time.perf_counter() - t0) / n
    assert torch.isfinite(lim.state).all()
    return {
        "kind": kind,
        "d": d,
        "k": k,
        "tasks": tasks,
        "steps": n,
        "step_ms": 1e3 * per_step,
        "setup_s": setup,
        "peak_mb": rss_mb() - before,
        "state_mb": lim.state.numel() * 8 / 2**20,
        "batch_mb": lim.state.numel() * 8 / 2**20 * tasks,
    }


def headline(kind: str, steps: int) -> dict:
    """A `steps`-meta-step fit on d = 64, k = 5, 16 tasks a batch: the wall time of `fit` alone, of
    the whole (the limit's construction included) and of drawing the tasks."""
    import torch

    t0 = time.perf_counter()
    batches = random_batches(64, 5, 16, steps, seed=1)
    draw = time.perf_counter() - t0
    t0 = time.perf_counter()
    lim = make_limit(kind, 64, 5)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    lim.fit(batches, META_LR)
    fit = time.perf_counter() - t0
    assert torch.isfinite(lim.state).all() and lim.meta_steps == steps
    return {"kind": kind, "steps": steps, "fit_s": fit, "setup_s": setup, "draw_s": draw}


def in_fresh_process(spec: str, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run(
        [sys.executable, __file__, "--one", spec, "--threads", str(threads)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two small rows in this process and a 200-step headline")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--kinds", default="mup,ntk")
    ap.add_argument("--d", default="64,256,784")
    ap.add_argument("--k", default="5,20")
    ap.add_argument("--tasks", default="4,16,64")
    ap.add_argument("--headline-steps", type=int, default=1000)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # kind,d,k,tasks: one row, as JSON (fresh process)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    if args.one:
        kind, d, k, tasks = args.one.split(",")
        print(json.dumps(one(kind, int(d), int(k), int(tasks))))
        return 0

    kinds = args.kinds.split(",")
    if args.quick:
        specs = [(kind, 64, 5, 4) for kind in kinds]
        steps = 200
    else:
        specs = [
            (kind, int(d), int(k), int(t))
            for kind in kinds
            for d in args.d.split(",")
            for k in args.k.split(",")
            for t in args.tasks.split(",")
        ]
        steps = args.headline_steps
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"MAMLLimit cost: {cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} thread(s)")
    print(
        "peak = growth of ru_maxrss over the fit"
        + (" (in-process: indicative only)" if args.quick else ", fresh process per row")
    )
    print(
        f"{'kind':>4} {'d':>4} {'k':>3} {'tasks':>5} {'ms/step':>9} {'steps':>5} {'peak MB':>8} {'state MB':>9} {'batch MB':>9} {'setup s':>8}"
    )
    for kind, d, k, t in specs:
        r = one(kind, d, k, t) if args.quick else in_fresh_process(f"{kind},{d},{k},{t}", args.threads)
        print(
            f"{r['kind']:>4} {r['d']:>4} {r['k']:>3} {r['tasks']:>5} {r['step_ms']:>9.2f} {r['steps']:>5} "
            f"{r['peak_mb']:>8.1f} {r['state_mb']:>9.3f} {r['batch_mb']:>9.2f} {r['setup_s']:>8.2f}",
            flush=True,
        )
    for kind in kinds:
        h = headline(kind, steps)
        print(
            f"headline: {h['steps']}-meta-step fit, {kind}, d=64, k=5, 16 tasks a batch: {h['fit_s']:.2f} s "
            f"({1e3 * h['fit_s'] / h['steps']:.2f} ms a step; + {h['setup_s']:.2f} s to build the limit, "
            f"{h['draw_s']:.2f} s to draw the tasks)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
