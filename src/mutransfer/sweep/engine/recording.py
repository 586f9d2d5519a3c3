"""What a run records while it trains: `Scale.monitor`'s monitors and `Scale.noise_scale`'s measurement.

A sweep's µP or u-µP trial (`config.TRANSFERRING`) carries a `Recording` on its first seed's `Scale` (guarded: a
monitor that raises costs the trajectory, never the trial); `trial_attrs` turns it into what the trial stores (`TRAJECTORY_ATTR`,
`MONITOR_FAILURE_ATTR`, `NOISE_ATTR`). `mutransfer transfer`'s recorded target run carries one too. What is
done with the stored trajectories (the proxy's file, the target's comparison) is `trajectory`'s.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..._core.noise_scale import NoiseScale, gradient_noise_scale
from ..._core.scale import NO_MONITOR
from ...monitor import Monitor
from ..config.config import short_label
from .flops import counting

__all__ = [
    "MONITOR_FAILURE_ATTR",
    "NOISE_ATTR",
    "SAMPLES",
    "TRAJECTORY_ATTR",
    "Recording",
    "every_for",
    "noise_entry",
    "trial_attrs",
]

SAMPLES = 12  # samples per recorded run: a 150-step run is sampled every 13 steps (12 samples, step 1 included)
TRAJECTORY_ATTR = "monitor_trajectory"  # a µP/u-µP trial's user attribute: its first seed's trajectory
MONITOR_FAILURE_ATTR = "monitor_failure"  # … or why the monitor could not record it
NOISE_ATTR = "noise_scale"  # a transferred proxy-cell trial's user attribute: the gradient noise scale after training


def every_for(steps: Any) -> int:
    """The sampling interval giving at most about `SAMPLES` samples over `steps` training steps (10 when unknown)."""
    if isinstance(steps, bool) or not isinstance(steps, (int, float)) or not steps >= 1:
        return 10
    return max(1, math.ceil(steps / SAMPLES))


class Recording:
    """What a recorded run's `Scale` carries: the sampling interval, the proxy trajectory to compare with,
    and the monitors the objective started (`Scale.monitor`). Pickled (to a worker), it keeps the
    settings and drops the monitors.

    `noise_below`: `Scale.noise_scale` measures only for a run whose final loss is below it (the best finished
    trial of the proxy cell so far). `guarded` (a sweep's trial): a monitor that raises — when it starts or at a sample — is dropped and the
    reason kept in `failure`; the run goes on (the trajectory is lost, never the trial).
    """

    def __init__(
        self,
        steps: Any = None,
        proxy: dict | None = None,
        noise: bool = False,
        guarded: bool = False,
        noise_below: float | None = None,
    ):
        self.steps, self.proxy, self.noise, self.guarded = steps, proxy, noise, guarded
        self.noise_below = noise_below  # measure the noise scale only for a final loss below this (None: always)
        self.monitors: list[Any] = []
        self.noise_scales: list[NoiseScale] = []
        self.failure: str | None = None

    def start(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int | None) -> Any:
        """A `Monitor` on `model` and `optimizer`, kept for the runner (see `Scale.monitor`)."""
        every = every_for(steps if steps is not None else self.steps)
        if self.proxy is not None:
            every = int(self.proxy.get("every", every))  # the same steps as the proxy's, to compare them
        if not self.guarded:
            mon = Monitor(model, optimizer, every=every, proxy=self.proxy)
            self.monitors.append(mon)
            return mon
        try:
            guarded = _Guarded(Monitor(model, optimizer, every=every, proxy=self.proxy), self)
        except Exception as e:
            self.failure = f"scale.monitor raised {type(e).__name__}: {e}"
            return NO_MONITOR
        self.monitors.append(guarded)
        return guarded

    def measure_noise(self, model: torch.nn.Module, loss_fn: Any, batches: Any, small: int, big: int) -> Any:
        """`mt.gradient_noise_scale` on the objective's model, kept for the runner (see `Scale.noise_scale`).
        A trial's `FlopCount` counts it apart from the training steps (`flops.counting`, sampled by forward pass)."""
        if not self.guarded:
            with counting(model):
                noise = gradient_noise_scale(model, loss_fn, batches, small, big)
        else:
            try:
                with counting(model):
                    noise = gradient_noise_scale(model, loss_fn, batches, small, big)
            except Exception as e:
                self.failure = self.failure or f"scale.noise_scale raised {type(e).__name__}: {e}"
                return None
        self.noise_scales.append(noise)
        return noise

    def close(self) -> None:
        """Close every monitor (their hooks off)."""
        for mon in self.monitors:
            mon.close()

    def __reduce__(self):
        return (Recording, (self.steps, self.proxy, self.noise, self.guarded, self.noise_below))


class _Guarded:
    """A trial's monitor: a sample that raises stops the monitoring (its reason kept), not the trial."""

    def __init__(self, monitor: Monitor, recording: Recording):
        self.monitor, self.recording, self.stopped = monitor, recording, False

    @property
    def alarms(self) -> list:
        return self.monitor.alarms

    def step(self, loss: Any = None) -> list:
        if self.stopped:
            return []
        try:
            return self.monitor.step(loss)
        except Exception as e:
            self.stopped = True
            self.monitor.close()
            self.recording.failure = f"the monitor raised {type(e).__name__}: {e}"
            return []

    def trajectory(self) -> dict:
        return self.monitor.trajectory()

    def close(self) -> None:
        self.monitor.close()


def trial_attrs(rec: Recording, width: int, depth: int | None, parametrization: str = "mup") -> dict:
    """What a µP or u-µP trial stores of its recorded first seed: the trajectory (or why there is none) and the
    noise scale (`parametrization`: the trial's, named in the noise scale's "where").

    Returns:
        User attributes: `TRAJECTORY_ATTR` (the trajectory with "width" and "depth"), else
        `MONITOR_FAILURE_ATTR` (why not), nothing when the objective never called `scale.monitor`;
        `NOISE_ATTR` when it measured the gradient noise scale.
    """
    out: dict[str, Any] = {}
    if rec.failure is not None and not (rec.monitors and not getattr(rec.monitors[0], "stopped", False)):
        out[MONITOR_FAILURE_ATTR] = rec.failure
    elif rec.monitors:
        out[TRAJECTORY_ATTR] = _json_safe({**rec.monitors[0].trajectory(), "width": width, "depth": depth})
    if rec.noise_scales:
        out[NOISE_ATTR] = noise_entry(rec.noise_scales[-1], {}, width, depth, parametrization)
    return out


def _json_safe(obj: Any) -> Any:
    """`obj` with non-finite floats as None (JSON has no NaN; the storage keeps JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def noise_entry(noise: NoiseScale, hp: dict, width: int, depth: int | None, parametrization: str = "mup") -> dict:
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
        "where": f"the {short_label(parametrization)} proxy at its optimum, after training (McCandlish et al. 2018's "
        "B_simple)",
    }


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None
