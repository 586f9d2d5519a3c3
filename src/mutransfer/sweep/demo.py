"""`mutransfer demo`: TP5's headline figure on a laptop, end to end.

A byte-level GPT (2 layers, untied readout, PyTorch's default init) learns text made from the
Python standard library's own docstrings. The demo sweeps Adam's learning rate at four widths in
standard parametrization and in µP, writes the report, then trains the widest model with the lr
tuned at the narrowest one — µP's and SP's — and prints how far each optimum moved.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Union

from .analysis import best, load_results, max_drift_steps
from .report import write_report
from .runner import run_sweep
from .transfer import format_transfer, transfer

FULL = dict(widths=[32, 64, 128, 256], low=-12, high=-4, steps=150)
QUICK = dict(widths=[32, 128, 256], low=-10, high=-5, steps=150)


def demo_config(quick: bool = False) -> str:
    c = QUICK if quick else FULL
    return f'''# Written by `mutransfer demo`; rerun with `mutransfer sweep` to resume or extend.
name = "demo{'-quick' if quick else ''}"
objective = "recipe:gpt"
widths = {c["widths"]}
parametrizations = ["mup", "sp"]
sampler = "grid"
seeds = [0]

[space.lr]
type = "log"
low = "2**{c["low"]}"
high = "2**{c["high"]}"
grid = {c["high"] - c["low"] + 1}

[fixed]
steps = {c["steps"]}
batch_size = 16
seq_len = 32
n_layer = 2
n_head = 4
tied = false
init_std = "default"
threads = 1
'''


def run_demo(out: Union[str, Path] = "mutransfer-demo", quick: bool = False, workers: int = 2,
             progress: bool = True) -> dict:
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = out / "demo.toml"
    text = demo_config(quick)
    if not config.exists() or config.read_text() != text:
        config.write_text(text)
    sweep = run_sweep(config, out / "run", workers=workers, progress=progress)
    transferred = transfer(sweep, max(sweep.config.widths))
    report = write_report(sweep)
    results = load_results(sweep)
    moved = {p: max_drift_steps(sweep, results, p, "lr") for p in sweep.config.parametrizations}
    optima = {p: {w: round(math.log2(b.params["lr"])) for w in sweep.config.widths
                  if (b := best(results, p, w)) is not None} for p in sweep.config.parametrizations}
    return {"report": report, "optima": optima, "moved": moved, "transfer": transferred,
            "seconds": time.perf_counter() - start, "sweep": sweep}


def format_summary(result: dict) -> str:
    lines = ["", "Optimal log2 learning rate per width:"]
    widths = sorted(next(iter(result["optima"].values())))
    lines.append("  width  " + "".join(f"{w:>7d}" for w in widths) + "   moved (grid steps)")
    for p, label in (("mup", "µP"), ("sp", "SP")):
        row = result["optima"][p]
        lines.append(f"  {label:<6} " + "".join(f"{row.get(w, float('nan')):>7}" for w in widths)
                     + f"   {result['moved'][p]:.0f}")
    lines.append(format_transfer(result["transfer"]))
    t = result["transfer"]
    ok = result["moved"]["mup"] <= 1 and result["moved"]["sp"] >= 2
    win = t["mup"]["loss"] is not None and (t["sp"]["loss"] is None or t["mup"]["loss"] < t["sp"]["loss"])
    lines.append("")
    lines.append("µP's optimum stays put while SP's moves: tune small, train big." if ok else
                 "This run does not show the usual picture (µP ≤ 1 grid step, SP ≥ 2).")
    if win:
        lines.append("The µP target trained with the proxy's lr beats the SP target trained with SP's proxy lr.")
    lines.append(f"Report: {result['report']}   ({result['seconds']:.0f} s in all)")
    return "\n".join(lines)
