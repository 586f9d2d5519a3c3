"""The µP monitor in sweeps and transfers: the proxy's trajectory at its optimum, the target's against it.

Every trial of a width-transferring parametrization (µP or u-µP, `config.TRANSFERRING`) records, in its worker
and on its device, the trajectory of its first seed's run (`Scale.monitor` is a real `mutransfer.Monitor` there;
≤ 1 % of the run) and stores it with the trial (`TRAJECTORY_ATTR`); the trials of the transferred
parametrization's proxy cell (`SweepConfig.transferred`: µP when swept, else u-µP; proxy width and depth) also
measure the gradient noise scale when the objective calls `Scale.noise_scale` (`NOISE_ATTR`). Nothing is trained
again: the proxy trajectory (RUN/proxy_trajectory.json, `PROXY_FILE`) is the transferred parametrization's
optimum's trial's, "wider" the next swept width's trial at the same point (the finite-width trend), and
RUN/noise_scale.json the optimum's noise scale (`write_proxy_trajectory`, run after a sweep, by ``mutransfer
report`` and by ``mutransfer transfer``: cluster sweeps get them the same way). ``mutransfer transfer`` records
the transferred parametrization's target (RUN/target_trajectory.json, `TARGET_FILE`), compared with the proxy's
on the fly (`mutransfer.Monitor(proxy=...)`: the two are of one parametrization). In a sweep of both µP and u-µP
the file is µP's; u-µP's proxy optimum gets none of its own and its target trains unmonitored (`OTHER_NOTE`),
its trials' trajectories stay in the storage. An objective that never calls `scale.monitor` costs nothing extra
and gets no file, with one line saying so; a monitor that raises costs the trajectory, never the trial.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._core.atomic import write_atomically
from ...monitor import Monitor, load_trajectory
from ..config.config import TRANSFERRING, short_label
from ..engine.recording import (
    MONITOR_FAILURE_ATTR,
    NOISE_ATTR,
    SAMPLES,
    TRAJECTORY_ATTR,
    Recording,
    every_for,
    trial_attrs,
)

if TYPE_CHECKING:
    from ..engine.runner import Sweep
    from ..scale import Scale

__all__ = [
    "NOISE_ATTR",
    "NOISE_FILE",
    "NOT_CALLED",
    "OTHER_NOTE",
    "PROXY_FILE",
    "SAMPLES",
    "TARGET_FILE",
    "TRAJECTORY_ATTR",
    "Recording",
    "alarm_dicts",
    "every_for",
    "monitor_line",
    "noise_scale_file",
    "not_called",
    "others_not_recorded",
    "proxy_trajectory",
    "recorded_run",
    "trial_attrs",
    "write_proxy_trajectory",
]

PROXY_FILE = "proxy_trajectory.json"
NOISE_FILE = "noise_scale.json"
TARGET_FILE = "target_trajectory.json"
NOT_CALLED = "the objective never called scale.monitor(model, optimizer), so no µP trajectory was recorded"
# why the other width-transferring parametrization of a sweep running both (u-µP beside µP) gets no proxy trajectory
OTHER_NOTE = (
    "{other}'s proxy optimum has no trajectory file of its own: {file} is {label}'s, the transferred "
    "parametrization's, and the monitor compares a target only with a proxy of its own parametrization, so "
    "`mutransfer transfer` trains the {other} target unmonitored ({other}'s trials keep their own trajectories in "
    "the storage: the trial attribute {attr!r})"
)


def not_called(parametrization: str) -> str:
    """`NOT_CALLED` naming `parametrization` (µP's is `NOT_CALLED` itself)."""
    return NOT_CALLED.replace("no µP trajectory", f"no {short_label(parametrization)} trajectory")


def others_not_recorded(transferred: str | None, parametrizations: list[str]) -> dict[str, str]:
    """{parametrization: why it has no proxy trajectory} for each width-transferring parametrization swept beside
    the transferred one (u-µP in a sweep of µP and u-µP); {} otherwise."""
    if transferred is None:
        return {}
    return {
        p: OTHER_NOTE.format(
            other=short_label(p), file=PROXY_FILE, label=short_label(transferred), attr=TRAJECTORY_ATTR
        )
        for p in parametrizations
        if p in TRANSFERRING and p != transferred
    }


def recorded_run(
    objective: Any, hparams: dict, scale: Scale, proxy: dict | None = None, noise: bool = False
) -> tuple[float, Monitor | None]:
    """Run `objective(hparams, scale)` with `scale.monitor` recording (and `scale.noise_scale` measuring,
    with `noise`: read it with `recorded_noise`).

    Returns:
        (the objective's loss, the first monitor it started — closed — or None when it started none).
    """
    loss, rec = _recorded(objective, hparams, scale, proxy, noise)
    return loss, (rec.monitors[0] if rec.monitors else None)


def _recorded(objective: Any, hparams: dict, scale: Scale, proxy: dict | None, noise: bool) -> tuple[float, Recording]:
    rec = Recording(hparams.get("steps"), proxy, noise)
    try:
        loss = float(objective(dict(hparams), dataclasses.replace(scale, _recording=rec)))
    finally:
        rec.close()
    return loss, rec


def noise_scale_file(run_dir: Path) -> dict | None:
    """RUN/noise_scale.json (the gradient noise scale measured at the transferred parametrization's proxy optimum:
    µP's, else u-µP's), or None."""
    path = Path(run_dir) / NOISE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def alarm_dicts(monitor: Monitor) -> list[dict]:
    """The monitor's alarms as JSON-able dicts (step, layer, what, measured, expected, cause)."""
    return [{**a._asdict(), "measured": _finite(a.measured), "expected": _finite(a.expected)} for a in monitor.alarms]


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def proxy_trajectory(run_dir: Path) -> dict | None:
    """RUN/proxy_trajectory.json, loaded, or None when the sweep wrote none."""
    path = Path(run_dir) / PROXY_FILE
    return load_trajectory(path) if path.is_file() else None


def write_proxy_trajectory(sweep: Sweep, results: list | None = None, say: Any = print) -> dict | None:
    """Write RUN/proxy_trajectory.json (and RUN/noise_scale.json) from the sweep's own trials: the transferred
    parametrization's proxy optimum's trial (`SweepConfig.transferred`: µP when swept, else u-µP), "wider" the
    next swept width's trial at the same point. Nothing is trained; a file whose content would not change is
    left as it is.

    Args:
        sweep: a sweep (finished, or partly: the optimum so far).
        results: its `load_results` (loaded when None).
        say: where the one line about a missing trajectory goes.

    Returns:
        run.json's "proxy_trajectory" entry (``{"file", "parametrization", "hparams", "width", "depth", "seed",
        "trial", "samples"}``, "wider_width" when the next width's trial recorded too, "noise_scale" when
        measured, "not_recorded" ``{parametrization: why}`` for u-µP in a sweep of µP and u-µP (`OTHER_NOTE`);
        "file" None with a "reason" when the optimum's trial recorded nothing: the objective never called
        `scale.monitor`, or the monitor raised — or the trial ran before trials recorded), or None when neither
        µP nor u-µP was swept or the transferred one has no finished trial at the proxy.
    """
    from .analysis import best, load_results

    cfg = sweep.config
    p = cfg.transferred
    if p is None:
        return None
    results = load_results(sweep) if results is None else results
    b = best(results, p, cfg.proxy_width, cfg.proxy_depth)
    if b is None:
        return None
    hp = {**cfg.fixed, **b.params, **cfg.proxy_extra}
    entry: dict[str, Any] = {
        "hparams": hp,
        "width": cfg.proxy_width,
        "depth": cfg.proxy_depth,
        "seed": cfg.seeds[0],
        "trial": b.number,
        "parametrization": p,
    }
    others = others_not_recorded(p, cfg.parametrizations)
    if others:
        entry["not_recorded"] = others
    proxy_attrs = _attrs_by_number(sweep, p, cfg.proxy_width, cfg.proxy_depth)  # the proxy cell's trials, read once
    attrs = proxy_attrs.get(b.number, {})
    noise = _noise_near_optimum(sweep, results, p, b, proxy_attrs)
    if noise is not None:  # the objective measured the noise scale (`Scale.noise_scale`) in the proxy cell
        _write_if_changed(sweep.run_dir / NOISE_FILE, noise)
        entry["noise_scale"] = NOISE_FILE
    trajectory = attrs.get(TRAJECTORY_ATTR)
    if trajectory is None:
        reason = attrs.get(MONITOR_FAILURE_ATTR)
        reason = f"not recorded: {reason}" if reason else not_called(p)
        say(f"proxy trajectory: {reason} (docs/monitor.md, 'In sweeps and transfers')")
        return {**entry, "file": None, "reason": reason}
    trajectory = {**trajectory, "hparams": hp}
    # the next swept width's trial at the same point: the finite-width trend the target's band spans
    wider = min((w for w in cfg.widths if w > cfg.proxy_width), default=None)
    if wider is not None:
        twin = next((r for r in _in_cell(results, p, wider, cfg.proxy_depth) if r.params == b.params), None)
        twin_attrs = {} if twin is None else _attrs_by_number(sweep, p, wider, cfg.proxy_depth).get(twin.number, {})
        found = twin_attrs.get(TRAJECTORY_ATTR)
        if found is not None:
            trajectory["wider"] = found
            entry["wider_width"] = wider
        else:
            say(f"proxy trajectory: no trial at width {wider} recorded the same point; the proxy's alone is kept")
    _write_if_changed(sweep.run_dir / PROXY_FILE, trajectory)
    return {**entry, "file": PROXY_FILE, "samples": len(trajectory["steps"])}


def _in_cell(results: list, parametrization: str, width: int, depth: int | None) -> list:
    from .analysis import in_cell

    return list(in_cell(results, parametrization, width, depth))


def _noise_near_optimum(sweep: Sweep, results: list, p: str, b: Any, attrs: dict[int, dict]) -> dict | None:
    """The noise scale measured in the proxy optimum's trial, else in the lowest-loss proxy trial that measured
    one (with several seeds the optimum's first seed may not have beaten the best so far), with its trial and
    hyperparameters; None when no trial measured one. `p`: the transferred parametrization; `attrs`: its proxy
    cell's trials' user attributes by number."""
    cfg = sweep.config
    ranked = sorted((r for r in _in_cell(results, p, cfg.proxy_width, cfg.proxy_depth) if r.ok), key=lambda r: r.loss)
    for r in sorted(ranked, key=lambda r: r.number != b.number):  # the optimum first, then by loss
        noise = attrs.get(r.number, {}).get(NOISE_ATTR)
        if noise is not None:
            return {**noise, "hparams": {**cfg.fixed, **r.params, **cfg.proxy_extra}, "trial": r.number}
    return None


def _attrs_by_number(sweep: Sweep, parametrization: str, width: int, depth: int | None) -> dict[int, dict]:
    """Trial number → user attributes, for `parametrization`'s study at (width, depth)."""
    return {t.number: dict(t.user_attrs) for t in sweep.study(parametrization, width, depth).get_trials(deepcopy=False)}


def _write_if_changed(path: Path, data: dict) -> None:
    text = json.dumps(data, indent=1)
    if not (path.is_file() and path.read_text() == text):
        write_atomically(path, text)


def monitor_line(out: dict) -> str | None:
    """The monitor's line of `format_transfer`: the alarms' count and layers, "monitor: no alarm", or why
    nothing was watched (and, in a sweep of µP and u-µP, that the u-µP target trained unmonitored); None for a
    transfer.json written before the monitor existed."""
    m = out.get("monitor")
    if m is None:
        return None
    unwatched = "".join(
        f"; the {short_label(p)} target trained unmonitored (no {short_label(p)} proxy trajectory)"
        for p in m.get("unmonitored", {})
    )
    if m.get("trajectory") is None:
        return f"monitor: off ({m.get('note', NOT_CALLED)}){unwatched}"
    against = "against the proxy's trajectory" if m.get("proxy") else "without a proxy trajectory"
    alarms = m["alarms"]
    if not alarms:
        return f"monitor: no alarm ({against}; {m['trajectory']}){unwatched}"
    layers = ", ".join(dict.fromkeys(a["layer"] for a in alarms))
    return (
        f"monitor: {len(alarms)} alarm(s) on {layers} ({against}; details in transfer.json and the report){unwatched}"
    )
