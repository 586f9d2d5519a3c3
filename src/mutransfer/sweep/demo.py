"""`mutransfer demo`: TP5's headline figure on a laptop, end to end.

A byte-level GPT (2 layers, untied readout, PyTorch's default init) learns text made from the
Python standard library's own docstrings. The demo sweeps Adam's learning rate at four widths in
standard parametrization and in µP, writes the report, then trains the widest model with the lr
tuned at the narrowest one — µP's and SP's — and prints how far each optimum moved.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Union

from .report import head_to_head_line, write_report
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
    summary = json.loads((sweep.run_dir / "summary.json").read_text())
    return {"report": report, "summary": summary, "transfer": transferred,
            "seconds": time.perf_counter() - start, "sweep": sweep}


def format_summary(result: dict) -> str:
    """The terminal's account of the demo: every sentence from the run's own summary.json."""
    s = result["summary"]
    lines = ["", "Verdict:"] + [f"  {line}" for line in s["verdicts"]]
    h2h = head_to_head_line(s.get("head_to_head"))
    if h2h:
        lines.append(f"  {h2h}")
    lines += ["", "Fitted optimum log2 lr per width (90% interval over seeds):"]
    widths = s["widths"]
    lines.append("  width " + "".join(f"{w:>20d}" for w in widths))
    for p, label in (("mup", "µP"), ("sp", "SP")):
        opt = s["analysis"].get(p, {}).get("width", {}).get("hparams", {}).get("lr", {}).get("optimum", {})
        cells = []
        for w in widths:
            o = opt.get(str(w))
            if o is None:
                cells.append("—")
                continue
            iv = o.get("log2_interval")
            text = f"{o['log2']:+.2f}" + (f" [{iv[0]:+.1f},{iv[1]:+.1f}]" if iv else "")
            cells.append(text + ("!" if o["edge"] else ""))
        lines.append(f"  {label:<5} " + "".join(f"{c:>20}" for c in cells))
    if any(o.get("edge") for p in s["analysis"].values() for o in
           p.get("width", {}).get("hparams", {}).get("lr", {}).get("optimum", {}).values()):
        lines.append("  (! on the grid's edge)")
    lines += ["", format_transfer(result["transfer"])]
    better = s["wider_is_better"]
    lines.append("Wider is better: " + ", ".join(f"{'µP' if p == 'mup' else 'SP'} {'yes' if v else 'no'}"
                                                 for p, v in better.items() if v is not None))
    lines.append(f"Report: {result['report']}   ({result['seconds']:.0f} s in all)")
    return "\n".join(lines)
