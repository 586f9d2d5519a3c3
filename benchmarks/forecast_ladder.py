"""Forecast a GPT's loss at a width 4× past the sweep, then train it and compare (issue 46's bar).

A µP lr sweep of the built-in byte-level GPT (`recipe:gpt`, the demo's settings: 2 layers, 4 heads, 150 AdamW
steps of 16 × 32 bytes, α_output 2^1.5 as the demo tunes it) at widths 32, 64, 128, 256, two seeds; `mt.sweep.forecast` fits the law to the loss at
the transferred lr, holds out 256 (predicted from 32…128), and forecasts the target; `transfer` then trains the
target on both seeds. Printed: the ladder, the held-out check, the forecast against the actual loss, the naive
guess (the target reaches the largest proxy's loss), the bar (inside; at least twice as close as the naive
guess; half-width at most twice the gain), and the FLOPs of tuning against one target run.

    python benchmarks/forecast_ladder.py                 # target 1024 (~8 min on 2 cores)
    python benchmarks/forecast_ladder.py --output-mult 1 --out forecast-ladder-1   # α_output left at 1
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import mutransfer as mt
from mutransfer.sweep.launch.workers import run_sweep
from mutransfer.sweep.transfer.demo import FIXED
from mutransfer.sweep.transfer.transfer import transfer

CONFIG = """
name = "forecast-ladder"
objective = "recipe:gpt"
widths = [32, 64, 128, 256]
parametrizations = ["mup"]
sampler = "grid"
seeds = [0, 1]
[space.lr]
type = "log"
low = "2**-8"
high = "2**-4"
grid = 5
"""  # then the demo's own [fixed] table (the model and its training), and α_output


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=int, default=1024, help="the target width (default 1024)")
    ap.add_argument("--out", default="forecast-ladder", help="run directory's parent (resumes what is there)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--output-mult",
        type=float,
        default=2**1.5,
        help="µP's α_output (default 2^1.5, what the demo's stage 1 tunes at width 32; with 1 µP's readout "
        "starts too small and the ladder bends: the README's 'What the demo shows')",
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = CONFIG + FIXED.format(steps=150) + f"output_mult = {args.output_mult!r}\n"
    (out / "sweep.toml").write_text(config)
    start = time.perf_counter()
    sweep = run_sweep(out / "sweep.toml", out / "run", workers=args.workers, progress=False)
    swept = time.perf_counter() - start
    fc = mt.sweep.forecast(sweep, width=args.target)
    print(fc.line(), flush=True)
    start = time.perf_counter()
    done = transfer(sweep, width=args.target)
    trained = time.perf_counter() - start
    actual = done["mup"]["loss"]
    fc = fc.with_actual(actual)
    print(f"\nladder (loss at the transferred lr {done['mup']['hparams']['lr']:.4g}; sweep {swept:.0f} s wall):")
    print(f"  {'width':>6} {'mean':>8}   seeds")
    for p in fc.points:
        print(f"  {p['width']:>6} {p['loss']:>8.4f}   " + ", ".join(f"{v:.4f}" for v in p["losses"]))
    h = fc.held_out
    if h is not None:
        print(
            f"held out: width {h['width']} measured {h['measured']:.4f}, predicted from {h['fit_widths']} "
            f"{h['loss']:.4f} [{h['interval'][0]:.4f}, {h['interval'][1]:.4f}]: {'inside' if h['inside'] else 'OUTSIDE'}"
        )
    print(f"law (fit on every width): {fc.law}")
    if fc.loss is None or fc.interval is None or actual is None:
        print(f"no forecast to judge: {fc.reason or 'the target diverged'}")
        return
    lo, hi = fc.interval
    naive = fc.points[-1]["loss"]
    gain = naive - actual
    rows = [
        ("forecast", f"{fc.loss:.4f} [{lo:.4f}, {hi:.4f}]"),
        (f"actual (width {args.target}, {len(done['mup']['losses'])} seeds; {trained:.0f} s)", f"{actual:.4f}"),
        ("inside the interval", str(lo <= actual <= hi)),
        ("|forecast − actual|", f"{abs(fc.loss - actual):.4f}"),
        ("|naive − actual| (naive: the largest proxy's loss)", f"{abs(naive - actual):.4f}"),
        ("forecast at least 2× closer than naive", str(2 * abs(fc.loss - actual) <= abs(naive - actual))),
        ("half-width / gain from the largest proxy", f"{(hi - lo) / 2 / gain:.2f}" if gain > 0 else "no gain"),
    ]
    cost = done.get("flops") or {}
    if cost:
        rows += [(k, f"{v:.3g}") for k, v in cost.items() if isinstance(v, (int, float))]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


if __name__ == "__main__":
    main()
