"""Sweep throughput with CPU threads split between workers vs every worker using every core.

The same grid sweep (the built-in MLP recipe, 16 trials) runs from scratch with `--workers`
local workers twice per repeat, alternating: *split* — each worker ``torch.set_num_threads(cores
// workers)`` (what `mutransfer sweep` does) — and *unsplit* — each worker uses every core (what it
did before: ``--workers 4`` on 2 cores ran 8 threads). The table gives the median trials per
minute of each and their ratio, measured in one run. With ``--devices 0,1`` the sweep places
its workers on GPUs instead (one per GPU × --trials-per-device); only run that on a GPU machine,
and name the GPU beside the figure.

    python benchmarks/sweep_threads.py [--workers 4] [--steps 200] [--width 256] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from mutransfer.sweep import run_sweep
from mutransfer.sweep.config.placement import available_cores

CONFIG = """name = "{name}"
objective = "recipe:mlp"
widths = [{width}]
parametrizations = ["mup"]
sampler = "grid"
[space.lr]
type = "log"
low = "2**-12"
high = "2**-2"
grid = 16
[fixed]
steps = {steps}
"""


def one(root: Path, label: str, workers: int, threads: int, steps: int, width: int, devices, tpd) -> float:
    """Trials per minute of one sweep from scratch."""
    cfg = root / f"{label}.toml"
    cfg.write_text(CONFIG.format(name=label, steps=steps, width=width))
    start = time.perf_counter()
    sweep = run_sweep(
        cfg,
        root / label,
        workers=None if devices else workers,
        progress=False,
        threads=threads,
        devices=devices,
        trials_per_device=tpd,
    )
    seconds = time.perf_counter() - start
    return 60 * sweep.finished() / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--devices", help="GPU ids like 0,1 (default: CPU workers)")
    ap.add_argument("--trials-per-device", type=int, default=1)
    args = ap.parse_args()
    devices = [int(d) for d in args.devices.split(",")] if args.devices else None
    cores = available_cores()
    slots = len(devices) * args.trials_per_device if devices else args.workers
    split, unsplit = max(1, cores // slots), cores
    rates: dict[str, list[float]] = {"split": [], "unsplit": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for label, threads in (("split", split), ("unsplit", unsplit)):
                rate = one(
                    Path(tmp),
                    f"{label}{r}",
                    args.workers,
                    threads,
                    args.steps,
                    args.width,
                    devices,
                    args.trials_per_device,
                )
                rates[label].append(rate)
                print(f"  repeat {r}: {label:<8} {rate:6.1f} trials/min", flush=True)
    where = f"GPUs {args.devices}" if devices else f"{args.workers} CPU workers"
    print(
        f"\nMLP recipe, width {args.width}, {args.steps} steps, 16 trials, {where}, {cores} cores, "
        f"median of {args.repeats}"
    )
    print(f"{'threads per worker':<28}{'trials/min':>12}{'ratio':>8}")
    base = statistics.median(rates["unsplit"])
    for label, threads in (("unsplit", unsplit), ("split", split)):
        m = statistics.median(rates[label])
        print(f"{f'{threads} ({label})':<28}{m:>12.1f}{m / base:>7.2f}×")


if __name__ == "__main__":
    main()
