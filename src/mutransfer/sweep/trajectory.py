"""The µP monitor in sweeps and transfers: the proxy's trajectory at its optimum, the target's against it.

After a sweep over µP, one extra run trains the µP proxy (smallest width, proxy depth, first seed) at
the transferred hyperparameters with `Scale.monitor` recording, a second one the next swept width at the
same hyperparameters (kept under "wider": the finite-width trend), and writes RUN/proxy_trajectory.json
(`PROXY_FILE`); ``mutransfer transfer`` records the µP target the same way (RUN/target_trajectory.json,
`TARGET_FILE`), compared with the proxy's on the fly (`mutransfer.Monitor(proxy=...)`). An objective
that never calls `scale.monitor` gets no file and one line saying so; the sweep's run.json remembers
the hyperparameters it was tried with, so a resumed sweep does not train that run again.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .._core.atomic import write_atomically
from .._core.noise_scale import NoiseScale, gradient_noise_scale
from ..monitor import Monitor, load_trajectory

if TYPE_CHECKING:
    from .runner import Sweep
    from .scale import Scale

__all__ = [
    "NOISE_FILE",
    "NOT_CALLED",
    "PROXY_FILE",
    "SAMPLES",
    "TARGET_FILE",
    "Recording",
    "alarm_dicts",
    "every_for",
    "monitor_line",
    "noise_scale_file",
    "proxy_trajectory",
    "record_proxy_trajectory",
    "recorded_run",
]

PROXY_FILE = "proxy_trajectory.json"
NOISE_FILE = "noise_scale.json"
TARGET_FILE = "target_trajectory.json"
SAMPLES = 12  # samples per recorded run: a 150-step run is sampled every 13 steps (12 samples, step 1 included)
NOT_CALLED = "the objective never called scale.monitor(model, optimizer), so no µP trajectory was recorded"


def every_for(steps: Any) -> int:
    """The sampling interval giving at most about `SAMPLES` samples over `steps` training steps (10 when unknown)."""
    if isinstance(steps, bool) or not isinstance(steps, (int, float)) or not steps >= 1:
        return 10
    return max(1, math.ceil(steps / SAMPLES))


class Recording:
    """What a recorded run's `Scale` carries: the sampling interval, the proxy trajectory to compare with,
    and the monitors the objective started (`Scale.monitor`). Pickled (to a worker), it keeps the
    settings and drops the monitors."""

    def __init__(self, steps: Any = None, proxy: dict | None = None, noise: bool = False):
        self.steps, self.proxy, self.noise = steps, proxy, noise
        self.monitors: list[Monitor] = []
        self.noise_scales: list[NoiseScale] = []

    def start(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int | None) -> Monitor:
        """A `Monitor` on `model` and `optimizer`, kept for the runner (see `Scale.monitor`)."""
        every = every_for(steps if steps is not None else self.steps)
        if self.proxy is not None:
            every = int(self.proxy.get("every", every))  # the same steps as the proxy's, to compare them
        mon = Monitor(model, optimizer, every=every, proxy=self.proxy)
        self.monitors.append(mon)
        return mon

    def measure_noise(self, model: torch.nn.Module, loss_fn: Any, batches: Any, small: int, big: int) -> NoiseScale:
        """`mt.gradient_noise_scale` on the objective's model, kept for the runner (see `Scale.noise_scale`)."""
        noise = gradient_noise_scale(model, loss_fn, batches, small, big)
        self.noise_scales.append(noise)
        return noise

    def __reduce__(self):
        return (Recording, (self.steps, self.proxy, self.noise))


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
    loss = float(objective(dict(hparams), dataclasses.replace(scale, _recording=rec)))
    for mon in rec.monitors:
        mon.close()
    return loss, rec


def noise_scale_file(run_dir: Path) -> dict | None:
    """RUN/noise_scale.json (the gradient noise scale measured at the µP proxy optimum), or None."""
    path = Path(run_dir) / NOISE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _noise_entry(noise: NoiseScale, hp: dict, width: int, depth: int | None) -> dict:
    return {
        "b_simple": noise.b_simple,
        "interval": None if noise.interval is None else [_finite(v) for v in noise.interval],
        "reason": noise.reason,
        "small": noise.small,
        "big": noise.big,
        "batches": noise.batches,
        "confidence": noise.confidence,
        "width": width,
        "depth": depth,
        "hparams": hp,
        "where": "the µP proxy at its optimum, after training (McCandlish et al. 2018's B_simple)",
    }


def alarm_dicts(monitor: Monitor) -> list[dict]:
    """The monitor's alarms as JSON-able dicts (step, layer, what, measured, expected, cause)."""
    return [{**a._asdict(), "measured": _finite(a.measured), "expected": _finite(a.expected)} for a in monitor.alarms]


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def proxy_trajectory(run_dir: Path) -> dict | None:
    """RUN/proxy_trajectory.json, loaded, or None when the sweep wrote none."""
    path = Path(run_dir) / PROXY_FILE
    return load_trajectory(path) if path.is_file() else None


def record_proxy_trajectory(sweep: Sweep, previous: dict | None = None, say: Any = print) -> dict | None:
    """Train the µP proxy at the transferred hyperparameters once, recording, and once more at the next
    swept width (its trajectory under "wider": the finite-width trend); write RUN/proxy_trajectory.json.

    Args:
        sweep: a finished sweep.
        previous: run.json's "proxy_trajectory" entry of an earlier run (skip when it holds the same hparams).
        say: where the one line about a missing trajectory goes.

    Returns:
        run.json's "proxy_trajectory" entry (``{"file", "hparams", "width", "depth", "seed", "samples"}``,
        and "wider_width" when the next width was recorded too;
        "file" None with a "reason" when nothing was recorded: the objective never called `scale.monitor`,
        or the run raised — the sweep is finished either way), or None when µP was not swept or has no
        finished trial at the proxy.
    """
    from .analysis import load_results, transferred_hparams

    cfg = sweep.config
    if "mup" not in cfg.parametrizations:
        return None
    hp = transferred_hparams(sweep, load_results(sweep), cfg.proxy_width, "mup", cfg.proxy_depth)
    if hp is None:
        return None
    hp = {**hp, **cfg.proxy_extra}
    path = sweep.run_dir / PROXY_FILE
    if previous is not None and _same(previous.get("hparams"), hp) and (previous.get("file") is None or path.is_file()):
        return previous
    seed = cfg.seeds[0]
    entry: dict[str, Any] = {"hparams": hp, "width": cfg.proxy_width, "depth": cfg.proxy_depth, "seed": seed}
    rec, failure = _try_recorded(sweep, hp, cfg.proxy_width, seed, noise=True)
    mon = None if rec is None or not rec.monitors else rec.monitors[0]
    if rec is not None and rec.noise_scales:  # the objective measured the noise scale (`Scale.noise_scale`)
        noise = _noise_entry(rec.noise_scales[-1], hp, cfg.proxy_width, cfg.proxy_depth)
        write_atomically(sweep.run_dir / NOISE_FILE, json.dumps(noise, indent=1))
        entry["noise_scale"] = NOISE_FILE
    if failure is not None:  # the sweep is done: a failed extra run costs its trajectory, not the sweep
        say(f"proxy trajectory: not recorded, {failure}")
        return {**entry, "file": None, "reason": failure}
    if mon is None:
        say(f"proxy trajectory: {NOT_CALLED} (docs/monitor.md, 'In sweeps and transfers')")
        return {**entry, "file": None, "reason": NOT_CALLED}
    trajectory = {**mon.trajectory(), "hparams": hp, "width": cfg.proxy_width, "depth": cfg.proxy_depth}
    # the next swept width, at the same hparams: the finite-width trend the target's band spans (Monitor's `proxy`)
    wider = min((w for w in cfg.widths if w > cfg.proxy_width), default=None)
    if wider is not None:
        rec, failure = _try_recorded(sweep, hp, wider, seed)
        if failure is not None:
            say(f"proxy trajectory: at width {wider}, {failure}; the proxy's alone is kept")
        elif rec is not None and rec.monitors:
            trajectory["wider"] = {**rec.monitors[0].trajectory(), "width": wider, "depth": cfg.proxy_depth}
            entry["wider_width"] = wider
    write_atomically(path, json.dumps(trajectory, indent=1))
    return {**entry, "file": PROXY_FILE, "samples": len(trajectory["steps"])}


def _try_recorded(
    sweep: Sweep, hp: dict, width: int, seed: int, noise: bool = False
) -> tuple[Recording | None, str | None]:
    """The µP run at `width` (the proxy depth), recording: (its recording, None), or (None, why) when it raised."""
    try:
        _, rec = _recorded(sweep.objective, hp, sweep.scale("mup", width, sweep.config.proxy_depth, seed), None, noise)
    except Exception as e:
        return None, f"the recorded run raised {type(e).__name__}: {e}"
    return rec, None


def _same(a: Any, b: dict) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def monitor_line(out: dict) -> str | None:
    """The monitor's line of `format_transfer`: the alarms' count and layers, "monitor: no alarm", or why
    nothing was watched; None for a transfer.json written before the monitor existed."""
    m = out.get("monitor")
    if m is None:
        return None
    if m.get("trajectory") is None:
        return f"monitor: off ({m.get('note', NOT_CALLED)})"
    against = "against the proxy's trajectory" if m.get("proxy") else "without a proxy trajectory"
    alarms = m["alarms"]
    if not alarms:
        return f"monitor: no alarm ({against}; {m['trajectory']})"
    layers = ", ".join(dict.fromkeys(a["layer"] for a in alarms))
    return f"monitor: {len(alarms)} alarm(s) on {layers} ({against}; details in transfer.json and the report)"
