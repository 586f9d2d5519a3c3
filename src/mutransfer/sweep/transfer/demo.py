"""`mutransfer demo`: TP5's headline figure (Fig. 1) on a laptop, end to end, the way µTransfer is used.

A byte-level GPT (2 layers, 4 heads, untied readout, PyTorch's default init) learns text made
from the Python standard library's own docstrings, with AdamW for 150 steps.

1. **Tune at the proxy** (width 32, µP only): Adam's lr × the output multiplier α_output, HPs
   TP5 tunes on the small model (its Table 1: multipliers transfer). Cheap at width 32.
2. **Check the transfer** (widths 32 → 128, µP with the tuned α_output, and SP): an lr sweep at
   every width, 2 seeds: the figure with µP's optima lined up and SP's moving, the verdict with
   intervals, regret per width, and µP at width 128 against SP re-tuned there.
3. **Transfer**: train width 128 with the proxy's HPs, µP and SP, and count the compute.

Why α_output: measured while building this demo (README, "What the demo shows"): with α_output
left at 1, µP at width 256 stays 4–5% behind SP re-tuned at 256 — µP's readout starts 1/m
smaller than the proxy's and its logits take steps to grow. The base width (64), the horizon
(300 steps) and the attention scale do not explain the gap, and TP5's zero-init readout (D.2)
makes it worse here. SP tunes only its lr, as in TP5 Fig. 1: at the base width SP and µP are the
same model, so an α_output tuned there is the one µP carries to the wider models.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..._core.atomic import write_atomically
from ..analysis.analysis import load_results, transferred_hparams
from ..analysis.summary import head_to_head_line
from ..config.placement import visible_devices
from ..launch.workers import run_sweep
from ..report.report import write_report
from .transfer import format_transfer, transfer

__all__ = ["FIXED", "FULL", "LR", "QUICK", "demo_config", "format_summary", "run_demo", "tune_config"]

# lr grids in integer octaves (low..high, one range for both parametrizations); output_mult in half
# octaves (2^mult_low .. 2^mult_high, mult_grid points):
# at width 32 its loss valley is shallow (1.6% from α=1 to the best) and its floor lies between 2 and 4.
# Widths stop at 128: one width-256 run costs 30 CPU s against 10 at 128 (150 steps, one thread, measured
# on a 2-core CPU), so 256 alone made the demo take 15 minutes; from 32 to 128 SP's lr optimum already moves
# about 1.7 octaves while µP's stays put.
FULL = dict(
    widths=[32, 64, 128],
    low=-10,
    high=-4,
    tune_low=-8,
    tune_high=-4,
    steps=150,
    seeds=[0, 1],
    mult_low=0.5,
    mult_high=2.5,
    mult_grid=5,
)
# The smoke run (`--quick`, and the suite's end-to-end test): the same 4× in width one size down, 16 → 64
# (a width-64 run costs 4 CPU s against 9 at 128), 120 steps, 6 lrs: about 190 CPU s against 360 for
# 32 → 128 at 150 steps and 6 lrs, the same verdicts (measured: µP +0.05 octaves, CI −0.23 … +0.34; SP
# −1.52, CI −1.80 … −1.24; µP 2.8% below SP re-tuned at 64). At width 16 µP's optimum sits higher
# (2^-5.3), hence the grid one octave up; µP's own grid starts at 2^-8 (44 runs in stage 2, not 48):
# the same verdicts to the digit, 107 s of wall for the whole quick demo on 2 cores.
QUICK = dict(
    widths=[16, 64],
    low=-9,
    high=-4,
    mup_low=-8,  # µP's optimum stays near 2^-5.3: its grid starts an octave higher than SP's ([mup.space.lr])
    tune_low=-6,
    tune_high=-4,
    steps=120,
    seeds=[0, 1],
    mult_low=1,
    mult_high=2,
    mult_grid=3,
)
FIXED = """
[fixed]
steps = {steps}
batch_size = 16
seq_len = 32
n_layer = 2
n_head = 4
tied = false
init_std = "default"
threads = 1
"""
LR = """
[space.lr]
type = "log"
low = "2**{low}"
high = "2**{high}"
grid = {n}
"""


def _settings(quick: bool) -> dict:
    return QUICK if quick else FULL


def _lr(low: int, high: int) -> str:
    return LR.format(low=low, high=high, n=high - low + 1)


def tune_config(quick: bool = False) -> str:
    """Stage 1: lr × output_mult at the proxy width, µP only."""
    c = _settings(quick)
    return (
        f"# Written by `mutransfer demo` (stage 1: tune at the proxy); `mutransfer sweep` resumes it.\n"
        f'name = "demo-tune{"-quick" if quick else ""}"\nobjective = "recipe:gpt"\nwidths = [{c["widths"][0]}]\n'
        f'parametrizations = ["mup"]\nsampler = "grid"\nseeds = {c["seeds"]}\n'
        + _lr(c["tune_low"], c["tune_high"])
        + f'\n[space.output_mult]\ntype = "log"\nlow = "2**{c["mult_low"]}"\nhigh = "2**{c["mult_high"]}"\n'
        f"grid = {c['mult_grid']}\n" + FIXED.format(steps=c["steps"])
    )


def demo_config(quick: bool = False, output_mult: float = 1.0) -> str:
    """Stage 2: the lr sweep at every width, µP (with the proxy's output_mult) and SP."""
    c = _settings(quick)
    return (
        f"# Written by `mutransfer demo` (stage 2: check the transfer); `mutransfer sweep` resumes it.\n"
        f'name = "demo{"-quick" if quick else ""}"\nobjective = "recipe:gpt"\nwidths = {c["widths"]}\n'
        f'parametrizations = ["mup", "sp"]\nsampler = "grid"\nseeds = {c["seeds"]}\n'
        + _lr(c["low"], c["high"])
        + (
            f'\n[mup.space.lr]\nlow = "2**{c["mup_low"]}"\ngrid = {c["high"] - c["mup_low"] + 1}\n'
            if "mup_low" in c
            else ""
        )
        + FIXED.format(steps=c["steps"])
        + f"# µP's α_output, tuned at width {c['widths'][0]} in stage 1. recipe:gpt applies µP's multipliers\n"
        f"# to µP models only: SP tunes its lr alone, as in TP5 Fig. 1.\noutput_mult = {output_mult!r}\n"
    )


def _write(path: Path, text: str) -> Path:
    if not path.exists() or path.read_text() != text:
        write_atomically(path, text)
    return path


Devices = str | list[int] | None


def _sweep(config: Path, run: Path, workers: int, progress: bool, devices: Devices = None):
    try:
        # --workers counts CPU workers; on GPUs the workers are one per GPU (see `placement`)
        on_cpu = devices is None or devices == "cpu" or (devices == "auto" and visible_devices() == 0)
        return run_sweep(config, run, workers=workers if on_cpu else None, progress=progress, devices=devices)
    except ValueError as e:
        if "different config" in str(e):  # a demo of another version (or another --quick) ran here
            raise ValueError(
                f"{run} holds a demo run with other settings: give another --out, or delete "
                f"{run.parent} to start afresh"
            ) from None
        raise


def _target_device(devices: Devices) -> str | None:
    """The one device the transfer's target trains on: "auto"/"cpu" as they are, the first GPU of a list."""
    if isinstance(devices, list):
        return f"cuda:{devices[0]}" if devices else None
    return devices


def run_demo(
    out: str | Path = "mutransfer-demo",
    quick: bool = False,
    workers: int = 2,
    progress: bool = True,
    devices: Devices = None,
) -> dict:
    """Run the demo's three stages in `out` (resuming what is there); the summary `format_summary` prints.

    `devices`: where the sweeps train, as `run_sweep` takes it (None: the configs' own, "auto", "cpu"
    or a list of GPU ids); the transfer's target trains on the first of them."""
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tune = _sweep(_write(out / "tune.toml", tune_config(quick)), out / "tune", workers, progress, devices)
    write_report(tune)
    tune_summary = json.loads((tune.run_dir / "summary.json").read_text())
    tuned = transferred_hparams(tune, load_results(tune))
    if tuned is None:
        raise ValueError(f"{tune.run_dir}: no finished trial at the proxy; rerun `mutransfer demo` to resume")
    sweep = _sweep(
        _write(out / "demo.toml", demo_config(quick, tuned["output_mult"])), out / "run", workers, progress, devices
    )
    transferred = transfer(sweep, max(sweep.config.widths), device=_target_device(devices))
    report = write_report(sweep)
    summary = json.loads((sweep.run_dir / "summary.json").read_text())
    tune_results = load_results(tune)
    return {
        "report": report,
        "summary": summary,
        "transfer": transferred,
        "tuned": tuned,
        "tune_trials": len(tune_results),
        "tune_optima": tune_summary["verdicts"][1:],
        "tune_cpu_seconds": sum(r.cpu_seconds for r in tune_results),
        "seconds": time.perf_counter() - start,
        "sweep": sweep,
    }


def format_summary(result: dict) -> str:
    """The terminal's account of the demo: every sentence from the run's own summary.json.

    Args:
        result: what `run_demo` returns.

    Returns:
        Lines of text, the last one the report's path and the time taken.
    """
    s = result["summary"]
    t = result["tuned"]
    lines = [
        "",
        f"Stage 1, tuned at width {s['proxy_width']} (µP, {result['tune_trials']} trials): "
        f"lr {t['lr']:.3g}, output_mult {t['output_mult']:g}",
    ]
    lines += (
        [f"  {line}" for line in result.get("tune_optima", [])]
        + ["", "Verdict:"]
        + [f"  {line}" for line in s["verdicts"]]
    )
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
    if any(
        o.get("edge")
        for p in s["analysis"].values()
        for o in p.get("width", {}).get("hparams", {}).get("lr", {}).get("optimum", {}).values()
    ):
        lines.append("  (! on the grid's edge)")
    lines += ["", format_transfer(result["transfer"])]
    target = result["transfer"].get("mup", {}).get("cpu_seconds")
    if target:
        lines.append(
            f"  stage 1 (tuning lr × output_mult at width {s['proxy_width']}): "
            f"{result['tune_cpu_seconds']:.0f} CPU s = {result['tune_cpu_seconds'] / target:.1f}× one "
            f"target run"
        )
    better = s["wider_is_better"]
    lines.append(
        "Wider is better: "
        + ", ".join(
            f"{'µP' if p == 'mup' else 'SP'} {'yes' if v else 'no'}" for p, v in better.items() if v is not None
        )
    )
    lines.append(f"Report: {result['report']}   ({result['seconds']:.0f} s in all)")
    return "\n".join(lines)
