"""`mutransfer transfer RUN --width W [--depth D]`: train the target with the proxy's optimum, µP vs SP.

The µP target gets the µP optimum found at the proxy (the smallest swept width, and the
smallest swept depth in a sweep over depths), the u-µP target u-µP's; for comparison the SP target gets
the SP optimum from the same proxy — what one would do without µP. The *transferred parametrization*
(`SweepConfig.transferred`: µP when swept, else u-µP) is the one whose target is costed, forecast and
monitored; "the µP target" below means its target. Compute is counted in CPU seconds (process
time, so that workers sharing cores do not inflate it): its proxy cell alone (what tuning
costs) and the whole sweep (checks at every width included), each over one target run of it. In a
sweep over batch sizes or horizons the target runs at the proxy's batch size and horizon unless
`batch_size` / `steps` are given.

The target must be at least as wide (and deep) as the proxy: narrower is refused, equal runs
with a warning (it transfers nothing). transfer.json holds `target_width`, `proxy_width`
(`target_depth`, `proxy_depth`, `base_depth` in a sweep over depths), `seeds`, one entry per
parametrization — `{"hparams", "loss" (None if diverged), "losses" (one per seed), "seconds"
(wall), "cpu_seconds" (process CPU time of training: the cheapest seed's × the number of seeds,
so that one-time setup in a fresh process is left out), "cpu_seconds_per_seed", and "reused" when the
sweep already trained the target (below)}` — then `sweep_seconds` (wall),
`sweep_cpu_seconds`, `proxy_cpu_seconds`, `cost_ratio` (sweep CPU over the µP target's CPU) and
`proxy_cost_ratio` (µP proxy cell CPU over the µP target's CPU), "flops" (`analysis.costs`' FLOP entries:
`sweep_flops`, `proxy_flops`, `target_flops` and their ratios), "peak" (the TFLOPS that price them in
device-hours, or None), "forecast" (`mt.sweep.forecast`'s, with the actual loss), and `device` / `precision` (where and
how the target trained: e.g. "cuda:0", "bf16"), and `monitor`: the µP target's first seed trains with
`scale.monitor` on (compared with RUN/proxy_trajectory.json when the sweep recorded one) —
`{"alarms": [{step, layer, what, measured, expected, cause}], "trajectory": "target_trajectory.json",
"proxy": "proxy_trajectory.json" or None, "every"}`, or trajectory None and a "note" when the objective
never called `scale.monitor`; in a sweep of both µP and u-µP, "unmonitored": ``{"u-mup": why}`` (the proxy
trajectory is µP's, and a target is compared only with a proxy of its own parametrization). If the run
directory already has a report.html, the report is written again so that it shows this transfer.

When the target is a swept cell (e.g. the largest swept width) and the sweep's trial there has exactly
the transferred hyperparameters and every seed's loss and CPU time recorded, on the same kind of device,
that trial *is* the target run: its per-seed losses and CPU time are used instead of training it
again (`"reused": {"trial": N, "seeds": [...]}`), except for the µP target's first seed, which always
trains (with the monitor).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..._core.atomic import write_atomically
from ..._core.devices import DeviceLike, check_precision, resolve_device
from ..._core.hparam_transfer import AppliedRule
from ..._core.measured_law import MeasuredLaw
from ..analysis.analysis import TrialResult, costs, in_cell, load_results, transferred_hparams
from ..analysis.forecasts import Forecast, forecast
from ..analysis.hparam_fits import fit_measured_laws
from ..analysis.summary import TRANSFER_RUNS, transfer_where
from ..analysis.trajectory import (
    NOISE_FILE,
    PROXY_FILE,
    TARGET_FILE,
    alarm_dicts,
    monitor_line,
    noise_scale_file,
    not_called,
    others_not_recorded,
    proxy_trajectory,
    recorded_run,
    write_proxy_trajectory,
)
from ..config.cells import parametrization_hparams
from ..config.config import short_label, transferred_parametrization
from ..engine.flops import FlopCount, flop_attrs, guarded, known_peak, next_counter
from ..engine.runner import Sweep
from ..report.report import flops_text, write_report
from .target_hparams import target_hparams

if TYPE_CHECKING:
    from ...monitor import Monitor

__all__ = ["format_transfer", "target_depth", "transfer"]


def target_depth(sweep: Sweep, depth: int | None = None) -> int | None:
    """`depth`, else the config's target_depth, else the largest swept depth (None without depths)."""
    cfg = sweep.config
    if cfg.depths is None:
        if depth is not None:
            raise ValueError(f"--depth needs a sweep over depths; {sweep.run_dir}'s config has no depths")
        return None
    if depth is None:
        depth = cfg.target_depth or max(cfg.depths)
    _check_target("depth", depth, cfg.proxy_depth or min(cfg.depths), "deeper", "the proxy's depth", stacklevel=3)
    return depth


def _check_target(axis: str, value: int, proxy: int, bigger: str, same: str, stacklevel: int) -> None:
    """A target below the proxy along `axis` is refused; equal to it, a warning (nothing transfers)."""
    if value < 1:
        raise ValueError(f"--{axis} must be positive (at least the proxy {axis} {proxy}), got {value}")
    if value < proxy:
        raise ValueError(
            f"--{axis} {value} is below the proxy {axis} {proxy} (the smallest swept {axis}): "
            f"µTransfer goes from the proxy to a {bigger} target; give --{axis} {proxy} or more"
        )
    if value == proxy:
        warnings.warn(
            f"--{axis} {value} equals the proxy {axis}: the target is {same}, so nothing is transferred across {axis}",
            UserWarning,
            stacklevel=stacklevel + 1,
        )


def transfer(
    sweep: Sweep,
    width: int | None = None,
    depth: int | None = None,
    batch_size: int | None = None,
    steps: int | None = None,
    device: DeviceLike | None = None,
    tokens: float | None = None,
    optimizer: str | None = None,
    rules: dict[str, str] | None = None,
    critical_batch: float | None = None,
    extrapolate: bool = False,
    say: Callable[[str], None] | None = None,
    peak_tflops: float | None = None,
    precision: str | None = None,
) -> dict:
    """Train the target (width, depth) with each parametrization's proxy optimum; writes transfer.json.
    `batch_size` / `steps`: the target's, where the objective reads them (default: the proxy's);
    `tokens` instead of `steps`: steps = tokens / (batch size × the hyperparameters' `seq_len`).
    Where they differ from the proxy's, the hyperparameters move by the sweep's measurement or by
    rule (`target_hparams`: `optimizer`, `rules`, `critical_batch`, `extrapolate` go to `mt.transfer_hparams`), and
    transfer.json's "hparam_rules" lists every step per parametrization.
    `device`: where the target trains ("auto", "cpu", "cuda", "cuda:N" or a `torch.device`; the
    objective reads it as `scale.device`); None: the sweep's own (`Sweep.scale`). `precision`: what the
    target trains in ("fp32", "bf16", or "fp8": the FP8 simulation, `mutransfer.precision`; the objective
    reads it as `scale.precision`); None: the sweep's own ``precision``; a run the sweep trained is reused
    only in its own precision. `say`: called with the forecast's line before the target trains (the CLI prints it).
    transfer.json's "forecast" is `mt.sweep.forecast` at the target (with `extrapolate`) and the transferred
    parametrization's (µP's, else u-µP's) target's actual loss beside it, or its reason: none where the target's
    batch size or horizon is not the sweep's (the law is in width and depth at the proxy's). Each
    parametrization's entry has "flops" (one target run's: the mean over its seeds, counted by `flops.FlopCount`) and
    "flops_per_seed"; `peak_tflops` (else a known GPU's datasheet peak, `flops.known_peak`) prices the
    FLOPs in device-hours: transfer.json's "peak" (``{"tflops", "source"}`` or None)."""
    where_to = None if device is None else resolve_device(device, "device")
    if width is None:
        width = sweep.config.target_width or max(sweep.config.widths)
    proxy, proxy_depth = sweep.config.proxy_width, sweep.config.proxy_depth
    _check_target("width", width, proxy, "wider", "the proxy itself", stacklevel=2)
    depth = target_depth(sweep, depth)
    results = load_results(sweep)
    write_proxy_trajectory(sweep, results, say=lambda line: None)  # the proxy's, from its trial (cluster sweeps too)
    out: dict = {"target_width": width, "proxy_width": proxy}
    if depth is not None:
        out.update(target_depth=depth, proxy_depth=proxy_depth, base_depth=sweep.config.base_depth)
    overrides = {}
    for key, value in (("batch_size", batch_size), ("steps", steps)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{key.replace('_', '-')} must be a positive integer, got {value!r}")
            overrides[key] = value
    if tokens is not None:
        overrides["steps"] = _steps_for(sweep, results, tokens, steps, overrides.get("batch_size"))
    out.update(overrides)
    if "batch_size" in overrides:
        critical_batch = _critical_batch(sweep, critical_batch, out)
    out["seeds"] = sweep.config.seeds
    placed = sweep.scale(sweep.config.parametrizations[0], width, depth, sweep.config.seeds[0], device=where_to)
    if precision is not None:
        placed = dataclasses.replace(placed, precision=precision)
    check_precision(placed.precision, placed.device, "precision")
    out.update(device=str(placed.device), precision=placed.precision)
    out["peak"] = _peak(peak_tflops, out["device"], placed.precision)
    where = transfer_where(out, "proxy")
    transferred = sweep.config.transferred  # µP, else u-µP: costed, forecast and monitored
    predicted = _forecast(sweep, results, width, depth, overrides, extrapolate)
    if say is not None:
        say(predicted.line())
    for p in sweep.config.parametrizations:
        hp = transferred_hparams(sweep, results, proxy, p, proxy_depth)
        if hp is None:
            raise ValueError(f"{sweep.run_dir}: no finished {p} trial at the proxy {where}; run the sweep first")
        hp = {**hp, **sweep.config.proxy_extra}
        moved = {k: v for k, v in overrides.items() if v != hp.get(k)}
        if moved:
            laws = fit_measured_laws(sweep, results, p)
            out.setdefault("measured_laws", {})[p] = {
                h: {
                    a: {**v.as_dict(), "text": str(v)} if isinstance(v, MeasuredLaw) else {"reason": v}
                    for a, v in by_axis.items()
                }
                for h, by_axis in laws.items()
            }
            hp, applied = target_hparams(
                sweep,
                results,
                p,
                hp,
                moved,
                width,
                depth,
                optimizer,
                rules=rules,
                critical_batch=critical_batch,
                extrapolate=extrapolate,
                measured=laws,
            )
            out.setdefault("hparam_rules", {})[p] = [r.as_dict() for r in applied]
        hp = {**hp, **overrides, **parametrization_hparams(p)}
        start, losses, per_seed = time.perf_counter(), [], []
        swept = _swept(sweep, results, p, width, depth, hp, out["device"])
        if placed.precision != sweep.config.precision:
            swept = None  # the sweep's run trained in its own precision: not this one
        reused_seconds, reused = 0.0, []
        counters: list[FlopCount | None] = []  # the seeds trained here, each counted (`flops`)
        flops_per_seed: list[float | None] = []
        for i, seed in enumerate(sweep.config.seeds):
            monitored = p == transferred and i == 0  # the transferred target's first seed runs with the monitor on
            if swept is not None and not monitored:  # the sweep trained this very run: its loss and cost
                losses.append(swept.losses[i])
                per_seed.append(swept.cpu_seconds / len(swept.losses))
                flops_per_seed.append(swept.flops / len(swept.losses) if math.isfinite(swept.flops) else None)
                reused_seconds += swept.seconds / len(swept.losses)
                reused.append(seed)
                continue
            counter = next_counter(counters, seed)
            counters.append(counter)
            cpu_start = time.process_time()
            scale = dataclasses.replace(sweep.scale(p, width, depth, seed, device=where_to), precision=placed.precision)
            with guarded(counter):
                if monitored:
                    loss, mon = recorded_run(sweep.objective, hp, scale, proxy_trajectory(sweep.run_dir))
                else:
                    loss = float(sweep.objective(dict(hp), scale))
            if monitored:
                out["monitor"] = _monitored(sweep, mon, p)  # p is the transferred parametrization
            losses.append(loss)
            per_seed.append(time.process_time() - cpu_start)
            flops_per_seed.append(flop_attrs([counter])["flops"])
        seconds = time.perf_counter() - start + reused_seconds
        loss = sum(losses) / len(losses)
        # The first call in a process also pays one-time setup (imports, loading data: 1.6 CPU s
        # for recipe:gpt's text); every seed trains the same model, so the cheapest seed × seeds
        # counts the training alone (with one seed, setup cannot be told apart and is included).
        out[p] = {
            "hparams": hp,
            "loss": loss if math.isfinite(loss) else None,
            "losses": [l if math.isfinite(l) else None for l in losses],
            "seconds": seconds,
            "cpu_seconds": min(per_seed) * len(per_seed),
            "cpu_seconds_per_seed": per_seed,
        }
        counted = [f for f in flops_per_seed if f is not None]
        out[p]["flops_per_seed"] = flops_per_seed
        out[p]["flops"] = sum(counted) / len(counted) if counted and len(counted) == len(flops_per_seed) else None
        if out[p]["flops"] is None:
            out[p]["flops_error"] = flop_attrs(counters).get("flops_error") or "a reused trial recorded no FLOPs"
        if swept is not None and reused:  # (none when the transferred target's one seed trained, monitored)
            out[p]["reused"] = {"trial": swept.number, "seeds": reused}
    if transferred is not None and transferred in out:
        predicted = predicted.with_actual(out[transferred]["loss"])
    out["forecast"] = predicted.as_dict()
    cost = costs(sweep, results, out)
    out.update(
        sweep_seconds=sum(r.seconds for r in results),
        sweep_cpu_seconds=cost["sweep_cpu_seconds"],
        proxy_cpu_seconds=cost["proxy_cpu_seconds"],
    )
    if "sweep_over_target" in cost:
        out.update(cost_ratio=cost["sweep_over_target"], proxy_cost_ratio=cost["proxy_over_target"])
    out["flops"] = {k: v for k, v in cost.items() if "flops" in k}
    write_atomically(sweep.run_dir / "transfer.json", json.dumps(out, indent=1))
    if (sweep.run_dir / "report.html").is_file():  # the report shows the transfer, whatever the order
        write_report(sweep)
    return out


def _peak(given: float | None, device: str, precision: str) -> dict | None:
    """The peak TFLOPS that prices FLOPs in device-hours: `given` (--peak-tflops), else a known GPU's."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, (int, float)) or not math.isfinite(given) or given <= 0:
            raise ValueError(f"--peak-tflops must be a positive number of TFLOPS, got {given!r}")
        return {"tflops": float(given), "source": "--peak-tflops"}
    known = known_peak(device, precision)
    return None if known is None else {"tflops": known[0], "source": known[1]}


def _forecast(
    sweep: Sweep, results: list, width: int, depth: int | None, overrides: dict, extrapolate: bool
) -> Forecast:
    """The transferred parametrization's target's forecast (`mt.sweep.forecast`: µP's, else u-µP's), or why there
    is none."""
    p = sweep.config.transferred
    if p is None:
        return Forecast.refused(
            "mup", width, depth, "the sweep ran no µP or u-µP trials (SP's optimum moves with width)"
        )
    proxy_hp = {**(transferred_hparams(sweep, results, parametrization=p) or {}), **sweep.config.proxy_extra}
    moved = {k: v for k, v in overrides.items() if v != proxy_hp.get(k)}
    if moved:
        what = " and ".join(f"{k.replace('_', ' ')} {v}" for k, v in moved.items())
        return Forecast.refused(
            p, width, depth, f"the target trains at {what}; the law is in width (and depth) at the sweep's own"
        )
    try:
        return forecast(sweep, width, depth, parametrization=p, extrapolate=extrapolate, results=results)
    except ValueError as e:  # a target too far past the ladder: the transfer still trains it
        return Forecast.refused(p, width, depth, str(e).replace("extrapolate=True", "--extrapolate"))


def _critical_batch(sweep: Sweep, given: float | None, out: dict) -> float | None:
    """The critical batch size for a batch-size rule: `given`, else the gradient noise scale the sweep
    measured at the transferred parametrization's (µP's, else u-µP's) proxy optimum (RUN/noise_scale.json); recorded
    in transfer.json's "critical_batch"."""
    if given is not None:
        out["critical_batch"] = {"value": given, "source": "--critical-batch"}
        return given
    noise = noise_scale_file(sweep.run_dir)
    if noise is None:
        return None
    value = noise.get("b_simple")
    out["critical_batch"] = {
        "value": value,
        "interval": noise.get("interval"),
        "source": f"{NOISE_FILE}: the gradient noise scale B_simple of the "
        f"{short_label(sweep.config.transferred or 'mup')} proxy at its optimum",
        **({"reason": noise.get("reason")} if value is None else {}),
    }
    return value


def _steps_for(sweep: Sweep, results: list, tokens: Any, steps: int | None, batch_size: int | None) -> int:
    """The target's steps for `tokens`: tokens / (batch size × seq_len), both read from the proxy's hyperparameters
    unless the batch size is given."""
    if steps is not None:
        raise ValueError("give --steps or --tokens, not both (tokens = batch size × steps × seq_len)")
    if isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or not math.isfinite(tokens) or tokens <= 0:
        raise ValueError(f"--tokens must be a positive number, got {tokens!r}")
    hp = transferred_hparams(
        sweep, results, parametrization=sweep.config.transferred or sweep.config.parametrizations[0]
    )
    hp = {**(hp or {}), **sweep.config.proxy_extra}
    batch = batch_size or hp.get("batch_size")
    seq = hp.get("seq_len")
    for name, value in (("batch_size", batch), ("seq_len", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"--tokens needs the proxy's {name} in its hyperparameters (set it in the config's [fixed]) to count "
                "tokens as batch size × steps × seq_len; give --steps instead"
            )
    per_step = int(batch or 0) * int(seq or 0)  # both checked above
    n = round(tokens / per_step)
    if n < 1 or abs(n * per_step - tokens) > 0.01 * tokens:
        raise ValueError(
            f"--tokens {tokens:g} is not a whole number of steps of {batch} × {seq} tokens (nearest: {n} steps); "
            "give --steps, or tokens that are a multiple of batch size × seq_len"
        )
    return int(n)


def _swept(
    sweep: Sweep, results: list, p: str, width: int, depth: int | None, hp: dict, device: str
) -> TrialResult | None:
    """The sweep's finished trial that trained exactly this target — same cell, hyperparameters and
    seeds, on the same kind of device — whose per-seed losses and CPU time were recorded; else None."""
    cfg = sweep.config
    for r in in_cell(results, p, width, depth):
        same = {**cfg.fixed, **r.params, **cfg.proxy_extra, **parametrization_hparams(p)} == hp and r.device.split(":")[
            0
        ] == device.split(":")[0]
        if same and r.ok and len(r.losses) == len(cfg.seeds) and r.cpu_seconds > 0:
            return r
    return None


def _monitored(sweep: Sweep, mon: Monitor | None, parametrization: str) -> dict:
    """transfer.json's "monitor": the alarms of the transferred parametrization's target run and its trajectory
    file (written here); "unmonitored" names the other width-transferring parametrization of a sweep running both
    (u-µP beside µP: no proxy trajectory of its own to compare with)."""
    others = others_not_recorded(parametrization, sweep.config.parametrizations)
    unwatched = {"unmonitored": others} if others else {}
    if mon is None:
        return {"alarms": [], "trajectory": None, "proxy": None, "note": not_called(parametrization), **unwatched}
    proxy = PROXY_FILE if (sweep.run_dir / PROXY_FILE).is_file() else None
    mon.save_trajectory(sweep.run_dir / TARGET_FILE)
    return {"alarms": alarm_dicts(mon), "trajectory": TARGET_FILE, "proxy": proxy, "every": mon.every, **unwatched}


def format_transfer(out: dict) -> str:
    """What `mutransfer transfer` prints: each target run's loss and lr, then the compute ratios.

    Args:
        out: the result of `transfer` (transfer.json's content).

    Returns:
        Lines of text.
    """
    lines = [f"transfer from {transfer_where(out, 'proxy')} to {transfer_where(out, 'target')}:"]
    pad = max([30] + [len(label) for p, label in TRANSFER_RUNS if p in out])  # u-µP's label is 31 long
    for p, label in TRANSFER_RUNS:
        if p in out:
            loss = "diverged" if out[p]["loss"] is None else f"{out[p]['loss']:.4f}"
            lr = out[p]["hparams"].get("lr")
            lines.append(
                f"  {label:<{pad}} loss {loss}"
                + (f"  (lr {lr:.3g})" if lr is not None else "")
                + f"  {out[p]['seconds']:.1f} s"
                + (_reused(out[p]["reused"]) if "reused" in out[p] else "")
            )
    transferred = transferred_parametrization(p for p, _ in TRANSFER_RUNS if p in out)
    if "cost_ratio" in out and transferred is not None:
        target = out[transferred]["cpu_seconds"]
        if "proxy_cost_ratio" in out:
            lines.append(
                f"  tuning at the proxy / one target run: {out['proxy_cost_ratio']:.3g}× "
                f"({out['proxy_cpu_seconds']:.3g} CPU s over {target:.3g} CPU s)"
            )
        lines.append(
            f"  sweep compute / one target run: {out['cost_ratio']:.3g}× "
            f"({out['sweep_cpu_seconds']:.3g} CPU s over {target:.3g} CPU s; the sweep checks every width)"
        )
    flops = flops_text(out.get("flops") or {}, out.get("peak"), label=short_label(transferred or "mup"))
    if flops:
        lines.append(f"  {flops}")
    crit = out.get("critical_batch")
    if crit is not None:
        value = "not resolved" if crit["value"] is None else f"{crit['value']:.4g}"
        iv = crit.get("interval")
        value += f" [{iv[0]:.4g}, {iv[1] if iv[1] is not None else float('inf'):.4g}]" if iv else ""
        lines.append(
            f"  critical batch size: {value} ({crit['source']}{'; ' + crit['reason'] if crit.get('reason') else ''})"
        )
    for p, laws in out.get("measured_laws", {}).items():
        for h, by_axis in laws.items():
            for a, law in by_axis.items():
                text = law["text"] if "reason" not in law else f"{h} along {a}: no law, {law['reason']}"
                lines.append(f"  {p} measured: {text}")
    for p, steps in out.get("hparam_rules", {}).items():
        lines.append(f"  {p} hyperparameters at the target's batch size / horizon:")
        lines += [f"    {AppliedRule.from_dict(r)}" for r in steps]
    line = monitor_line(out)
    if line is not None:
        lines.append(f"  {line}")
    if out.get("forecast") is not None:
        lines.append(f"  {Forecast.from_dict(out['forecast']).line()}")
    return "\n".join(lines)


def _reused(reused: dict) -> str:
    seeds = reused["seeds"]
    which = f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
    return f"  ({which} from the sweep's trial {reused['trial']})"
