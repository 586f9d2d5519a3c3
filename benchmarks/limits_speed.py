"""Speed of the infinite-width kernels on 2 CPU cores.

NTK (and NNGP) of a 3-hidden-layer relu MLP on 2000 × 2000 inputs (closed form), the same at
4000 × 4000, and a tanh network through Mehler's Hermite series on 2000 × 2000. Median of
`--repeats` runs after one warm-up, float64. For scale: neural-tangents (JAX) takes about 0.5 s
for the first case on such a machine.

    python benchmarks/limits_speed.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mutransfer import limits


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    args = ap.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    cases = [
        ("NTK+NNGP, relu, 3 layers", 2000, "relu", 3),
        ("NTK+NNGP, relu, 3 layers", 4000, "relu", 3),
        ("NTK+NNGP, tanh (Mehler series), 3 layers", 2000, "tanh", 3),
    ]
    if args.quick:
        cases = [(name, n // 10, act, depth) for name, n, act, depth in cases]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float64")
    print("| kernel | inputs | seconds (median) |")
    print("|---|---|---|")
    for name, n, act, depth in cases:
        x = torch.randn(n, 64, generator=g, dtype=torch.float64)
        seconds = timed(lambda: limits.kernels(x, depth=depth, activation=act), args.repeats)
        print(f"| {name} | {n} × {n} | {seconds:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
