"""Sweep throughput: trials per minute with 1 and 2 local workers, on SQLite and PostgreSQL.

Each row runs the same grid sweep (the built-in MLP recipe, 1 torch thread per worker, 32
trials) from scratch and reports trials per minute and the ratio to 1 worker on the same
storage, all in one run. The runs alternate (1, 2, 1, 2, ... workers) `--repeats` times and the
table shows medians: on a shared 2-core machine one run's wall time varies by ±30%. This
process warms up first (torch's first optimizer imports torch._dynamo, 2 s), as a CLI run has
by its first trial whatever the number of workers; the extra workers' own start (imports,
about 4 s of CPU each, overlapped with the parent's setup) is in the figures. PostgreSQL rows need a server: pass --postgres URL or set
MUTRANSFER_TEST_POSTGRES (``make test`` starts a throwaway one through scripts/with-postgres.sh:
``scripts/with-postgres.sh .venv/bin/python benchmarks/sweep_throughput.py``).

    python benchmarks/sweep_throughput.py [--postgres postgresql://...] [--steps 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from mutransfer.sweep import run_sweep
from mutransfer.sweep.engine.storage import mask_url
from mutransfer.sweep.launch.workers import _warm_up

CONFIG = """name = "{name}"
objective = "recipe:mlp"
widths = [128]
sampler = "grid"
[space.lr]
type = "log"
low = "2**-12"
high = "2**-2"
grid = 16
[fixed]
steps = {steps}
threads = 1
"""


def one(storage: str | None, workers: int, steps: int, root: Path) -> tuple[int, float]:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    run = root / name
    run.mkdir()
    cfg = run / "sweep.toml"
    cfg.write_text(CONFIG.format(name=name, steps=steps))
    start = time.perf_counter()
    sweep = run_sweep(cfg, run / "run", workers=workers, storage=storage, progress=False)
    return sweep.finished(), time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--postgres", default=os.environ.get("MUTRANSFER_TEST_POSTGRES"))
    p.add_argument("--steps", type=int, default=300, help="training steps per trial (300: about 0.4 s)")
    p.add_argument("--repeats", type=int, default=3, help="runs per row, alternating; the median is shown")
    args = p.parse_args()
    _warm_up()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        backends = [("SQLite", None)] + ([("PostgreSQL", args.postgres)] if args.postgres else [])
        for label, url in backends:
            walls: dict[int, list[float]] = {1: [], 2: []}
            for _ in range(args.repeats):
                for workers in (1, 2):
                    n, dt = one(url, workers, args.steps, root)
                    walls[workers].append(dt)
            for workers in (1, 2):
                dt = statistics.median(walls[workers])
                rows.append(
                    (
                        label,
                        workers,
                        n,
                        dt,
                        60 * n / dt,
                        statistics.median(walls[1]) / dt,
                        min(walls[workers]),
                        max(walls[workers]),
                    )
                )
    print(
        f"sweep throughput: MLP recipe, {args.steps} steps per trial, 1 torch thread per worker, median of "
        f"{args.repeats} alternating runs"
        + (f"; PostgreSQL at {mask_url(args.postgres)}" if args.postgres else "; no PostgreSQL (pass --postgres)")
    )
    print(
        f"{'storage':<11} {'workers':>7} {'trials':>6} {'wall s':>7} {'(min-max)':>11} {'trials/min':>10} "
        f"{'vs 1 worker':>11}"
    )
    for label, workers, n, dt, tpm, ratio, lo, hi in rows:
        print(f"{label:<11} {workers:>7} {n:>6} {dt:>7.1f} {f'({lo:.1f}-{hi:.1f})':>11} {tpm:>10.1f} {ratio:>11.2f}")


if __name__ == "__main__":
    main()
