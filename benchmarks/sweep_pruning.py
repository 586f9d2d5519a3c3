"""Multi-fidelity pruning on the demo's GPT sweep: compute saved, optimum kept.

Runs the demo's sweep (recipe:gpt, lr grid 2^-12 … 2^-4, widths 32 … 256, µP and SP, seeds 0
and 1) twice — without a pruner and with one (default: ``pruner = "median"``, the recommended
setting) — and prints the CPU seconds of each (the sum of the trials' ``cpu_seconds``), their
ratio, and per parametrization and width the chosen optimum of each run: the best grid lr and the
fitted optimum with its interval (verdict.judge, as in summary.json's analysis section).

    python benchmarks/sweep_pruning.py [--quick] [--workers 2] [--pruner median]
                                       [--option n_startup_trials=3 ...] [--keep DIR] [--json out.json]

``--keep DIR`` keeps the run directories there; rerunning with the same settings resumes them
(a finished sweep runs nothing), so another pruner setting can be compared with the same
unpruned baseline. ``--quick``: widths 32 and 64, 4 lrs, 10 steps, seed 0 (a smoke run).
``--ascending`` runs the pruned sweep with its grid enqueued in ascending order instead of centre
first (what the centre-out order buys; the grid is enqueued by this process, before the workers
start, so the order holds for every worker).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

from mutransfer.sweep import Sweep, run_sweep
from mutransfer.sweep.analysis.analysis import best, counts, load_results, verdicts
from mutransfer.sweep.transfer.demo import FIXED as DEMO_FIXED  # the demo's GPT settings

FULL = dict(widths=[32, 64, 128, 256], low=-12, high=-4, grid=9, steps=150, seeds=[0, 1])
QUICK = dict(widths=[32, 64], low=-10, high=-4, grid=4, steps=10, seeds=[0])


def config_text(c: dict, pruner: str, options: dict) -> str:
    head = f'pruner = "{pruner}"\n' if pruner != "none" else ""
    opts = (
        "[pruner_options]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())
        if options and pruner != "none"
        else ""
    )
    return f"""name = "prune-{pruner}"
objective = "recipe:gpt"
widths = {c["widths"]}
parametrizations = ["mup", "sp"]
sampler = "grid"
seeds = {c["seeds"]}
{head}
[space.lr]
type = "log"
low = "2**{c["low"]}"
high = "2**{c["high"]}"
grid = {c["grid"]}
{DEMO_FIXED.format(steps=c["steps"])}{opts}"""


def _ascending(self: Sweep) -> list[dict]:
    names = list(self.config.space)
    axes = [d.grid_points() for d in self.config.space.values()]
    return sorted(_CENTRE_OUT(self), key=lambda g: [a.index(g[n]) for n, a in zip(names, axes)])


_CENTRE_OUT = Sweep.grid


def run(root: Path, c: dict, pruner: str, options: dict, workers: int, ascending: bool = False) -> dict:
    tag = pruner + "".join(f"-{k}{v}" for k, v in sorted(options.items())) + ("-ascending" if ascending else "")
    Sweep.grid = _ascending if ascending else _CENTRE_OUT
    d = root / tag
    d.mkdir(parents=True, exist_ok=True)
    cfg = d / "sweep.toml"
    text = config_text(c, pruner, options)
    if not cfg.exists() or cfg.read_text() != text:
        cfg.write_text(text)
    sweep = run_sweep(cfg, d / "run", workers=workers, progress=False)
    results = load_results(sweep)
    trials = [
        t
        for cell in sweep.config.cells
        for t in sweep.study(*cell).get_trials(deepcopy=False)
        if t.datetime_start is not None and t.datetime_complete is not None
    ]
    # the sweep's own span (first trial start to last trial end): right for a resumed run too
    wall = (max(t.datetime_complete for t in trials) - min(t.datetime_start for t in trials)).total_seconds()
    judged = verdicts(sweep, results)
    cells = {}
    for p in sweep.config.parametrizations:
        v = judged.get(p, {}).get("width")
        fitted = {o.at: o for o in v.hps["lr"].optima} if v is not None else {}
        for w in sweep.config.widths:
            b = best(results, p, w)
            o = fitted.get(w)
            cells[f"{p}/{w}"] = {
                "grid_log2": None if b is None else math.log2(b.params["lr"]),
                "loss": None if b is None else b.loss,
                "fitted_log2": None if o is None else o.x,
                "interval": None if o is None or o.x_interval is None else list(o.x_interval),
                "edge": None if o is None else o.edge,
            }
    return {
        "pruner": pruner,
        "options": options,
        "cpu_seconds": sum(r.cpu_seconds for r in results),
        "wall_seconds": wall,
        "counts": counts(results),
        "cells": cells,
        "run_dir": str(d / "run"),
    }


def _within(x: float, iv) -> bool:
    return iv is not None and iv[0] - 1e-9 <= x <= iv[1] + 1e-9


def same_optimum(a: dict, b: dict) -> bool:
    """The same chosen optimum: the same best grid point, or each fitted optimum inside the other's interval."""
    if a["grid_log2"] is None or b["grid_log2"] is None:
        return False
    if a["grid_log2"] == b["grid_log2"]:
        return True
    return _within(a["fitted_log2"], b["interval"]) and _within(b["fitted_log2"], a["interval"])


def _fit(cell: dict) -> str:
    if cell["fitted_log2"] is None:
        return "—"
    iv = cell["interval"]
    return (
        f"{cell['fitted_log2']:+.2f}" + (f" [{iv[0]:+.2f},{iv[1]:+.2f}]" if iv else "") + ("!" if cell["edge"] else "")
    )


def table(base: dict, pruned: dict) -> str:
    ratio = base["cpu_seconds"] / pruned["cpu_seconds"] if pruned["cpu_seconds"] > 0 else math.nan
    c0, c1 = base["counts"], pruned["counts"]
    lines = [
        "| run | CPU seconds | wall seconds | completed | pruned | diverged | failed |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r, c in (("no pruner", base, c0), (f"pruner {pruned['pruner']}", pruned, c1)):
        lines.append(
            f"| {label} | {r['cpu_seconds']:.1f} | {r['wall_seconds']:.1f} | {c['completed']} | "
            f"{c['pruned']} | {c['diverged']} | {c['failed']} |"
        )
    lines += [
        "",
        f"compute ratio (no pruner / pruner): {ratio:.2f}x",
        "",
        "| parametrization | width | best grid log2 lr (none) | best grid log2 lr (pruned) | "
        "fitted log2 lr [90% interval] (none) | fitted (pruned) | same optimum |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    same_all = True
    for key in base["cells"]:
        p, w = key.split("/")
        a, b = base["cells"][key], pruned["cells"][key]
        same = same_optimum(a, b)
        same_all &= same

        def g(c):
            return "—" if c["grid_log2"] is None else f"{c['grid_log2']:+.0f}"

        lines.append(
            f"| {'µP' if p == 'mup' else 'SP'} | {w} | {g(a)} | {g(b)} | {_fit(a)} | {_fit(b)} | "
            f"{'yes' if same else 'NO'} |"
        )
    lines += ["", f"same chosen optimum in every cell: {'yes' if same_all else 'no'}"]
    return "\n".join(lines)


def _option(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    if not key or not value:
        raise argparse.ArgumentTypeError(f"--option takes KEY=VALUE, got {text!r}")
    return key, value if value == "auto" else int(value)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="widths 32 and 64, 4 lrs, 10 steps, seed 0")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--pruner", default="median", choices=["median", "successive_halving", "hyperband"])
    p.add_argument(
        "--option",
        type=_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a [pruner_options] entry (repeatable)",
    )
    p.add_argument("--ascending", action="store_true", help="pruned run: grid in ascending order, not centre first")
    p.add_argument("--keep", type=Path, help="keep (and resume) the run directories here")
    p.add_argument("--json", type=Path, help="write the numbers here")
    args = p.parse_args(argv)
    c = QUICK if args.quick else FULL
    options = dict(args.option)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        base = run(root, c, "none", {}, args.workers)
        pruned = run(root, c, args.pruner, options, args.workers, args.ascending)
    print(
        f"Demo GPT sweep: widths {c['widths']}, lr 2^{c['low']} … 2^{c['high']} ({c['grid']} points), "
        f"{c['steps']} steps, µP and SP, seeds {c['seeds']}, {args.workers} workers; pruner {args.pruner} "
        f"{options or '(defaults)'}, grid {'ascending' if args.ascending else 'centre first'}\n"
    )
    print(table(base, pruned))
    if args.json:
        args.json.write_text(json.dumps({"none": base, "pruned": pruned}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
