"""What `mt.limits.FeatureLimit` costs: fit and predict time and peak memory against steps, batch and
particles, on 64 training inputs (issue 33: "report memory and time for 20 steps on 64 inputs").

Model: the 2-hidden-layer tanh MLP with LayerNorm of the docs (`Linear(8, n)` first, base width 16),
trained by SGD (lr 0.1) on 64 inputs in d = 8, then `predict` on 16 inputs. Each row runs in a
fresh process, so its peak resident memory (ru_maxrss) is its own. Rows are (steps, batch,
particles); the default table is the docs' one. The particles must be at least twice the vectors
a hidden matrix sees per group (64 + steps × batch), plus 4 per input predicted at once (16 here);
the full-batch rows use the fewest that fit (the 20-step row ran 48 min and peaked at 19 GB).

    .venv/bin/python benchmarks/feature_limit_cost.py                 # the docs' table
    .venv/bin/python benchmarks/feature_limit_cost.py --rows 10x64x12288
    .venv/bin/python benchmarks/feature_limit_cost.py --inputs 16 --rows 20x16x16384   # issue 45's row
    .venv/bin/python benchmarks/feature_limit_cost.py --quick         # smoke test, seconds (in-process rows)

Issue 49's attention rows: the causal self-attention block of benchmarks/limits_convergence.py (2 heads,
width 256 over base 16) on 8 sequences of 4 positions (32 vectors a step), predicting 8 sequences;
`--derivatives` chooses how Ż's expectations are taken (autograd: per-particle reverse passes; stein:
least squares on the Gaussian leaves, no autograd graph) and `--optimizer adam` trains by Adam:

    .venv/bin/python benchmarks/feature_limit_cost.py --model attention --inputs 8 --derivatives stein \
        --rows 5x8x16384,5x8x32768,5x8x65536
    .venv/bin/python benchmarks/feature_limit_cost.py --model attention --inputs 8 --rows 2x8x8192,5x8x8192
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

ROWS = "5x8x8192,10x8x8192,20x8x8192,5x64x8192,10x64x12288,20x64x22528"
QUICK = "2x8x2048,4x8x2048"


def one(
    steps: int,
    batch: int,
    particles: int,
    groups: int,
    inputs: int = 64,
    model: str = "mlp",
    optimizer: str = "sgd",
    derivatives: str | None = None,
) -> dict:
    import torch
    from limits_convergence import attention_block, ln_mlp, sequence_data  # this folder: the convergence models

    import mutransfer as mt

    def make(n: int):
        torch.manual_seed(0)
        return ln_mlp(n, d=8) if model == "mlp" else attention_block(n)

    if model == "mlp":
        g = torch.Generator().manual_seed(0)
        x = torch.randn(inputs, 8, generator=g, dtype=torch.float64)
        y = torch.tanh(x[:, 0]) + 0.5 * x[:, 1]
        xt = torch.randn(16, 8, generator=g, dtype=torch.float64)
    else:
        x, y, xt = sequence_data(inputs, 4, 4, 0)
    lim = mt.limits.FeatureLimit(make(256), base=make(16), particles=particles, groups=groups, seed=0, example_input=x)
    lr = (0.1 if model == "mlp" else 0.3) if optimizer == "sgd" else 0.02
    t0 = time.perf_counter()
    lim.fit(x, y, steps=steps, lr=lr, batch_size=batch, optimizer=optimizer, derivatives=derivatives)
    fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    f, se = lim.predict(xt, return_error=True)
    predict = time.perf_counter() - t0
    assert torch.isfinite(f).all()
    return {
        "fit_s": fit,
        "predict_s": predict,
        "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # Linux: KiB
        "se": float(se.mean()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=ROWS, help="comma-separated STEPSxBATCHxPARTICLES")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--inputs", type=int, default=64, help="training inputs (the docs' table: 64)")
    ap.add_argument("--quick", action="store_true", help="two tiny rows (smoke test)")
    ap.add_argument("--model", choices=("mlp", "attention"), default="mlp")
    ap.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    ap.add_argument("--derivatives", choices=("autograd", "stein"), default=None)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one row, print JSON
    args = ap.parse_args(argv)
    if args.one:
        steps, batch, particles = (int(v) for v in args.one.split("x"))
        print(
            json.dumps(
                one(steps, batch, particles, args.groups, args.inputs, args.model, args.optimizer, args.derivatives)
            )
        )
        return 0
    rows = QUICK if args.quick else args.rows
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch CPU float64, groups {args.groups}, "
        f"{args.inputs} training inputs, model {args.model}, {args.optimizer}, "
        f"derivatives {args.derivatives or ('stein' if args.optimizer == 'adam' else 'autograd')}"
    )
    held_out = "16 inputs" if args.model == "mlp" else "8 sequences"
    print(f"| steps | batch | particles | fit | predict ({held_out}) | peak memory | mean s.e. of f |")
    print("|---|---|---|---|---|---|---|")
    for row in rows.split(","):
        steps, batch, particles = (int(v) for v in row.split("x"))
        if args.quick:  # a smoke test: in this process, so the peak memory is the process's so far
            r = one(steps, batch, particles, args.groups, args.inputs, args.model, args.optimizer, args.derivatives)
        else:
            cmd = [sys.executable, __file__, "--one", row, "--groups", str(args.groups), "--inputs", str(args.inputs)]
            cmd += ["--model", args.model, "--optimizer", args.optimizer]
            cmd += ["--derivatives", args.derivatives] if args.derivatives else []
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                print(done.stderr, file=sys.stderr)
                print(f"| {steps} | {batch} | {particles} | failed (exit {done.returncode}) | | | |")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"| {steps} | {batch} | {particles} | {r['fit_s']:.1f} s | {r['predict_s']:.1f} s "
            f"| {r['peak_gb']:.2f} GB | {r['se']:.1e} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
