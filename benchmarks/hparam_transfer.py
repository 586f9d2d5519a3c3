"""Issue 32's benchmark: do lr and weight decay, moved to another batch size, horizon and width by
rule or by the sweep's measured laws, land near the target's real optimum?

For each task (``gpt``: the demo's byte-level GPT, `mutransfer.sweep.transfer.demo.FIXED` without its
steps and batch size; ``mlp``: ``recipe:mlp``, the 3-layer ReLU MLP on a teacher's labels), AdamW:

1. **Proxy sweep** (µP, width P, `run_sweep`): ``batch_sizes = [16, 32, 64, 128]``,
   ``horizons = [S, 2S]``, a log lr grid in octaves × a log weight_decay grid 2^-4 … 2^1 (η·λ·steps
   of order 1), 2 seeds. Its recorded µP proxy run measures the gradient noise scale
   (RUN/noise_scale.json), the critical batch the √B rule asks for.
2. **Predictions** at batch 512, 4·S steps, width 4·P, by `sweep.target_hparams.target_hparams`
   (called as `mutransfer transfer` calls it): *rule-only* (``measured={}``: √B, the horizon's
   "no rule", the τ rule) and *measured* (``measured=None``: the sweep's validated power laws,
   rules where none validated). When the measured noise scale is below 512 the library refuses the
   √B rule (past the critical batch no rule gives a number); the path is then predicted again with
   ``critical_batch=512`` given explicitly, and the row and the JSON say so (``critical_batch``).
3. **Target sweep** at width 4·P (µP, base width P: the proxy's model family), batch 512, 4·S
   steps, an lr × weight_decay grid in √2 steps over both predictions ± `--margin` octaves (at most
   `--max-points` per axis), 2 seeds; its optimum located by the sweep report's own finder
   (`analysis.proxy_verdict`: the sub-grid parabola over the profile, bootstrap over seeds). Each
   prediction is trained at the target too (taken from the grid when it is a grid point); its
   regret is its mean loss over the best grid point's − 1, and per seed (same seed, same data).
4. One table per task; ``--json FILE`` holds everything (rules applied as text, laws, optima).

    python benchmarks/hparam_transfer.py [--task gpt|mlp|all] [--quick] [--workers 2] [--out DIR]
        [--json FILE] [--gpt-width 8] [--gpt-steps 24] [--mlp-width 32] [--mlp-steps 100] ...

``--out DIR`` keeps the run directories (default: a temporary one); rerunning resumes the sweeps
and reuses the prediction runs (DIR/TASK/predictions.json).

**Cost and scale** (timed single runs: `train_gpt` / `train_mlp` called directly with
`Scale(width, base, "mup", 0)`, one thread, on this 2-core CPU without a GPU, shared with another
job at load ~2.7, so upper bounds): GPT at width 64, batch 512, 200 steps 124 CPU s; at width 32,
batch 512, 200 steps 61 s, 128 steps 42 s, **96 steps 30.7 s**; at width 8, 24 steps, batch 16 /
32 / 64 / 128: 0.35 / 0.47 / 0.78 / 1.39 s, batch 16 and 48 steps 0.66 s; MLP at width 128, batch
512, 400 steps 3.2 s. The issue's ratios (batch 16…128 → 512, ×4 steps, ×4 width) are kept, but at
the demo's width (32 → 128, 150 → 600 steps) one GPT target run would take ~12 min and a 7 × 7 grid
× 2 seeds ~20 CPU hours (extrapolated ×2 width, ×3 steps from the width-64 run), so the GPT is shrunk in WIDTH and S: **P = 8 → 32, S = 24 → 96** (4 heads:
head dim 2 at the proxy, 8 at the target). MLP: P = 32 → 128, S = 100 → 400.

**Measured** (2-core CPU, no GPU; `--max-points 7`): GPT proxy 270 trials 399 CPU s, target 49
trials 3,114 CPU s (61 min of wall on 2 workers, shared with the MLP run); MLP proxy 162 CPU s,
target 332 CPU s (317 s of wall alone on 2 workers). ``--max-points 7`` bounds the target at 7 × 7;
the default 9 × 9 runs 81 target trials instead of 49.

**Seen at reduced sizes** (same machine, not the full run; the table's numbers, 2 seeds):
``--task mlp --mlp-width 16 --mlp-steps 50`` (4 min): B_simple 256 [145, 520] < 512, so the √B rule was
refused and given 512; rule-only lr +2.16 √2-steps from the target's optimum, regret 8.3 % (7.8, 8.7);
the measured path (a validated η ∝ B^0.20 [-0.82, 1.22], whose held-out interval spans 3.4 decades)
-0.82 steps, regret 1.3 % (0.7, 1.9); the MLP's loss only grows with weight decay (no interior
optimum: wd "not located"). ``--task gpt --gpt-steps 12 --max-points 5`` (12 min): B_simple 23.8
[18.7, 30.8]; both paths fell back to the rules (the lr optimum at batch 32 on the proxy grid's high
edge 2^-1: hence the grid to 2^0 here), lr 0.707 vs the target's optimum at or below the capped
grid's low edge 0.354 (≥ +2 steps), wd −1.48 steps, regret 1.6 % (0.3, 3.0).

``--quick`` (the test's smoke run): widths 4 → 16 (gpt) and 8 → 32 (mlp), S = 2, 2-point grids; it
checks the code paths, not the numbers (``--task mlp --quick``: 8 s in pytest; ``--task gpt --quick``: 44 s, as its target
sweep's recorded run measures the noise scale on 8 × 4096 sequences).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

from mutransfer.errors import HParamTransferError
from mutransfer.sweep import run_sweep
from mutransfer.sweep.analysis.analysis import best, in_cell, load_results, proxy_verdict, transferred_hparams
from mutransfer.sweep.analysis.hparam_fits import fit_measured_laws
from mutransfer.sweep.analysis.trajectory import noise_scale_file
from mutransfer.sweep.transfer.demo import FIXED as DEMO_FIXED
from mutransfer.sweep.transfer.target_hparams import target_hparams

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TARGET_BATCH = 512
BATCH_SIZES = [16, 32, 64, 128]
FULL = {
    "gpt": dict(width=8, steps=24, lr=(-8, 0), wd=(-4, 1), seeds=[0, 1]),
    "mlp": dict(width=32, steps=100, lr=(-10, -3), wd=(-4, 1), seeds=[0, 1]),
}
QUICK = {
    "gpt": dict(width=4, steps=2, lr=(-7, -6), wd=(-2, -1), seeds=[0, 1]),
    "mlp": dict(width=8, steps=2, lr=(-7, -6), wd=(-2, -1), seeds=[0, 1]),
}
PATHS = (("rule-only", {}), ("measured", None))


def fixed_of(task: str) -> dict:
    """[fixed] of the task, without steps and batch size (the sweep's axes set them)."""
    if task == "gpt":  # the demo's GPT settings, read from the demo's own [fixed] table
        fixed = tomllib.loads(DEMO_FIXED.format(steps=1))["fixed"]
        return {k: v for k, v in fixed.items() if k not in ("steps", "batch_size")}
    return {"threads": 1}


def _toml_value(v) -> str:
    return json.dumps(v) if isinstance(v, (str, bool)) else repr(v)


def config_text(
    task: str, name: str, width: int, base: int, space: dict, step: float, seeds: list[int], axes: dict
) -> str:
    """The sweep's TOML: µP at `width` against base `base`; `space` maps an HP to its log2 ends, `step` apart."""
    lines = [
        f'name = "{name}"',
        f'objective = "recipe:{task}"',
        f"widths = [{width}]",
        f"base_width = {base}",
        'parametrizations = ["mup"]',
        'sampler = "grid"',
        f"seeds = {seeds}",
        *(f"{k} = {v}" for k, v in axes.items()),
    ]
    for hp, (low, high) in space.items():
        n = round((high - low) / step) + 1
        lines += ["", f"[space.{hp}]", 'type = "log"', f'low = "2**{low:g}"', f'high = "2**{high:g}"', f"grid = {n}"]
    lines += ["", "[fixed]", *(f"{k} = {_toml_value(v)}" for k, v in fixed_of(task).items())]
    return "\n".join(lines) + "\n"


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file renamed over it: a kill mid-write leaves the
    old file or the new one, never half of one for a rerun to read."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        _replace(path, text)
    return path


def predict(sweep, results, s: dict, critical: float | None, source: str) -> dict:
    """Both paths' (lr, wd) at the target, with every rule applied (str), via `target_hparams`."""
    cfg = sweep.config
    hp = transferred_hparams(sweep, results, cfg.proxy_width, "mup", cfg.proxy_depth)
    if hp is None:
        raise SystemExit(f"{sweep.run_dir}: no finished µP trial at the proxy")
    hp = {**hp, **cfg.proxy_extra}
    targets = {"batch_size": TARGET_BATCH, "steps": 4 * s["steps"]}
    out = {}
    for path, measured in PATHS:
        entry: dict = {"proxy": {"lr": hp["lr"], "weight_decay": hp["weight_decay"]}}
        used = critical
        for attempt in range(2):
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    got, applied = target_hparams(
                        sweep, results, "mup", dict(hp), targets, 4 * s["width"], None, optimizer="adamw",
                        critical_batch=used, extrapolate=False, measured=measured,
                    )  # fmt: skip
                break
            except HParamTransferError as e:
                if attempt or "critical_batch" not in str(e):
                    raise
                entry["refused"] = str(e)  # the measured critical batch is below 512: said, then overridden
                used = float(TARGET_BATCH)
        entry.update(
            lr=got["lr"],
            weight_decay=got["weight_decay"],
            critical_batch=used,
            critical_batch_source=source if used == critical else f"given: {TARGET_BATCH} ({source} refused)",
            rules=[str(r) for r in applied],
            rule_names=[r.rule for r in applied],
            warnings=[str(w.message) for w in caught],
        )
        out[path] = entry
    return out


def target_space(preds: dict, margin: float, max_points: int) -> dict:
    """log2 ends of each axis on the half-octave lattice: both predictions ± margin, at most max_points."""
    space = {}
    for hp in ("lr", "weight_decay"):
        xs = [math.log2(p[hp]) for p in preds.values()]
        low, high = round((min(xs) - margin) * 2) / 2, round((max(xs) + margin) * 2) / 2  # within ¼ octave
        span = (max_points - 1) / 2
        if high - low > span:  # capped, centred on the predictions' midpoint
            low = round(low + high - span) / 2
            high = low + span
        space[hp] = (low, high)
    return space


def regret_of(sweep, results, preds: dict, cache_path: Path) -> None:
    """Train the target at each prediction (a grid point's trial when it is one) and add its regret."""
    cfg = sweep.config
    width = cfg.proxy_width
    top = best(results, "mup", width)
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    for entry in preds.values():
        params = {"lr": entry["lr"], "weight_decay": entry["weight_decay"]}
        on_grid = next(
            (r for r in in_cell(results, "mup", width) if all(math.isclose(r.params[k], v, rel_tol=1e-9)
             for k, v in params.items()) and not r.failed),
            None,
        )  # fmt: skip
        key = json.dumps([params, cfg.seeds, cfg.fixed, cfg.proxy_extra, width], sort_keys=True)
        if on_grid is not None and len(on_grid.losses) == len(cfg.seeds):
            losses, source = list(on_grid.losses), f"grid trial {on_grid.number}"
        elif key in cache:
            losses, source = cache[key], "trained (earlier run)"
        else:
            losses = [float(sweep.objective(sweep.hparams(params), sweep.scale("mup", width, None, seed)))
                      for seed in cfg.seeds]  # fmt: skip
            cache[key], source = losses, "trained"
            _replace(cache_path, json.dumps(cache, indent=1))
        per_seed = [(a / b - 1) if math.isfinite(a) else math.inf for a, b in zip(losses, top.losses)]
        mean = sum(losses) / len(losses)
        entry.update(
            target_losses=losses,
            target_source=source,
            regret=(mean / top.loss - 1) if math.isfinite(mean) else math.inf,
            regret_per_seed=per_seed,
        )


def run_task(task: str, s: dict, args, root: Path) -> dict:
    start = time.perf_counter()
    d = root / task
    P, S = s["width"], s["steps"]
    space = {"lr": s["lr"], "weight_decay": s["wd"]}
    proxy_cfg = config_text(
        task, f"h40-{task}-proxy", P, P, space, 1.0, s["seeds"], {"batch_sizes": BATCH_SIZES, "horizons": [S, 2 * S]}
    )
    proxy = run_sweep(_write(d / "proxy.toml", proxy_cfg), d / "proxy", workers=args.workers, progress=False)
    presults = load_results(proxy)
    noise = noise_scale_file(proxy.run_dir) or {}
    critical = args.critical_batch or noise.get("b_simple")
    source = "--critical-batch" if args.critical_batch else f"the proxy's noise scale ({noise.get('b_simple')})"
    preds = predict(proxy, presults, s, critical, source)
    laws = {h: {a: str(law) for a, law in by_axis.items()} for h, by_axis in fit_measured_laws(proxy, presults).items()}
    tspace = target_space(preds, args.margin, args.max_points)
    target_cfg = config_text(
        task,
        f"h40-{task}-target",
        4 * P,
        P,
        tspace,
        0.5,
        s["seeds"],
        {"batch_sizes": [TARGET_BATCH], "horizons": [4 * S]},
    )
    target = run_sweep(_write(d / "target.toml", target_cfg), d / "target", workers=args.workers, progress=False)
    tresults = load_results(target)
    verdict = proxy_verdict(target, tresults, "mup")
    optimum = {}
    for hp in ("lr", "weight_decay"):
        o = verdict.hps[hp].optima[0]
        optimum[hp] = {"value": 2**o.x, "log2": o.x, "log2_interval": o.x_interval, "located": o.located,
                       "grid_value": 2**o.grid_x, "edge": o.edge, "flat": o.flat}  # fmt: skip
    for entry in preds.values():
        entry["steps_off"] = {hp: 2 * (math.log2(entry[hp]) - optimum[hp]["log2"]) for hp in optimum}
    regret_of(target, tresults, preds, d / "predictions.json")
    top = best(tresults, "mup", 4 * P)
    return {
        "task": task,
        "proxy_width": P, "target_width": 4 * P, "proxy_steps": S, "target_steps": 4 * S,
        "batch_sizes": BATCH_SIZES, "target_batch": TARGET_BATCH, "seeds": s["seeds"],
        "noise_scale": noise,
        "measured_laws": laws,
        "proxy_grid": {"lr": s["lr"], "weight_decay": s["wd"]},
        "target_grid": tspace,
        "target_optimum": optimum,
        "target_best": {"params": top.params, "loss": top.loss, "losses": list(top.losses)},
        "proxy_trials": len(presults), "target_trials": len(tresults),
        "proxy_cpu_seconds": sum(r.cpu_seconds for r in presults),
        "target_cpu_seconds": sum(r.cpu_seconds for r in tresults),
        "paths": preds,
        "seconds": time.perf_counter() - start,
    }  # fmt: skip


def _opt(o: dict) -> str:
    return f"{o['value']:.4g}" + ("" if o["located"] else "*")


def table(res: dict) -> str:
    o = res["target_optimum"]
    ns = res["noise_scale"].get("b_simple")
    lines = [
        f"## {res['task']}: proxy width {res['proxy_width']}, batch {res['batch_sizes']}, steps "
        f"{res['proxy_steps']}/{2 * res['proxy_steps']} → target width {res['target_width']}, batch "
        f"{res['target_batch']}, {res['target_steps']} steps; noise scale B_simple "
        + ("not resolved" if ns is None else f"{ns:.4g}")
        + "; √2-steps: log2(predicted / measured optimum) × 2; * an optimum not located (grid edge or flat)",
        f"measured target optimum: lr {o['lr']['value']:.4g}{'' if o['lr']['located'] else ' (not located)'}, "
        f"wd {o['weight_decay']['value']:.4g}{'' if o['weight_decay']['located'] else ' (not located)'}; best grid "
        f"loss {res['target_best']['loss']:.4f}",
        "",
        "| path | lr | wd | opt lr | opt wd | lr √2-steps | wd √2-steps | regret % (per seed) | rules |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, p in res["paths"].items():
        seeds = ", ".join(f"{100 * r:.2f}" for r in p["regret_per_seed"])
        note = "" if "refused" not in p else " (critical batch given: 512)"
        rules = "; ".join(dict.fromkeys(p["rule_names"]))
        lines.append(
            f"| {name}{note} | {p['lr']:.4g} | {p['weight_decay']:.4g} | {_opt(o['lr'])} | "
            f"{_opt(o['weight_decay'])} | {p['steps_off']['lr']:+.2f} | {p['steps_off']['weight_decay']:+.2f} | "
            f"{100 * p['regret']:.2f} ({seeds}) | {rules} |"
        )
    for name, p in res["paths"].items():
        lines += ["", f"{name}: every rule applied"] + [f"  {r}" for r in p["rules"]]
        if "refused" in p:
            lines.append(f"  (with the measured critical batch the library refused: {p['refused']})")
    lines += ["", "measured laws (proxy sweep):"] + [
        f"  {text}" for by_axis in res["measured_laws"].values() for text in by_axis.values()
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=["gpt", "mlp", "all"], default="all")
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny widths and steps, small grids")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="run directories (default: a temporary one)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--margin", type=float, default=None, help="octaves around the predictions (1.5; quick 0.5)")
    ap.add_argument("--max-points", type=int, default=None, help="target grid points per axis at most (9; quick 2)")
    ap.add_argument("--critical-batch", type=float, default=None, help="default: the proxy's measured noise scale")
    for task in ("gpt", "mlp"):
        ap.add_argument(f"--{task}-width", type=int, default=None, help=f"proxy width P ({FULL[task]['width']})")
        ap.add_argument(f"--{task}-steps", type=int, default=None, help=f"proxy steps S ({FULL[task]['steps']})")
        for hp in ("lr", "wd"):
            ap.add_argument(f"--{task}-{hp}", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
                            help=f"proxy {hp} grid, log2 ends in octaves ({FULL[task][hp]})")  # fmt: skip
    args = ap.parse_args(argv)
    args.margin = args.margin if args.margin is not None else (0.5 if args.quick else 1.5)
    args.max_points = args.max_points if args.max_points is not None else (2 if args.quick else 9)
    tasks = ["gpt", "mlp"] if args.task == "all" else [args.task]
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        results = []
        for task in tasks:
            s = dict((QUICK if args.quick else FULL)[task])
            for key, flag in (("width", "width"), ("steps", "steps"), ("lr", "lr"), ("wd", "wd")):
                given = getattr(args, f"{task}_{flag}")
                s[key] = tuple(given) if isinstance(given, list) else (given if given is not None else s[key])
            res = run_task(task, s, args, root)
            print(table(res) + "\n", flush=True)
            results.append(res)
    if args.json:
        _replace(args.json, json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
