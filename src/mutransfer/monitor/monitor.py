"""`Monitor`: watches a µP run step by step and raises alarms when it leaves µP.

Cost: a counter check per `step`; the step before a sample arms hooks for one forward (its inputs,
sliced to a few rows) and one optimizer step (gradient norms, the update ΔW); the sampled `step` then
runs one no-grad forward on the sliced inputs and a few power iterations per layer.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._core.atomic import write_atomically
from .._core.init_check import init_findings
from .._core.naming import canonical_name
from .._core.spec import MuSpec, find_spec, require_spec
from ..coord.measure import MODEL_OUTPUT
from ..errors import MonitorAlarm, UsageError
from ..rules import MUP, UMUP_NAME, factor
from .alarms import CAUSES, Alarm
from .predictions import (
    attention_findings,
    layer_of,
    lr_findings,
    optimizer_kind,
    proxy_findings,
    swap_findings,
    umup_factors,
    umup_unit_findings,
)
from .quantities import StepProbe, activation_sizes, rms, spectral_norm
from .sinks import make_sink, tag

__all__ = ["TRAJECTORY_FORMAT", "Monitor", "load_trajectory"]

TRAJECTORY_FORMAT = "mutransfer-monitor/1"


def load_trajectory(source: str | Path | dict) -> dict:
    """A trajectory saved by `Monitor.trajectory` (a dict, or the path of its JSON file), checked.

    Raises:
        UsageError: the file or dict is not a monitor trajectory.
    """
    data = source
    if not isinstance(source, dict):
        path = Path(source)
        if not path.is_file():
            raise UsageError(f"Monitor.compare: no trajectory file at {path}; save one with Monitor.save_trajectory")
        data = json.loads(path.read_text())
    data = _checked(data)
    if data.get("wider") is not None:  # a second proxy, wider (see Monitor's `proxy`)
        _checked(data["wider"])
    return data


def _checked(data: Any) -> dict:
    if not isinstance(data, dict) or data.get("format") != TRAJECTORY_FORMAT:
        raise UsageError(
            f"Monitor.compare: not a monitor trajectory (format {TRAJECTORY_FORMAT!r} expected); "
            "pass what Monitor.trajectory() returned or the file Monitor.save_trajectory wrote"
        )
    return data


def _monitored(model: nn.Module) -> nn.Module:
    """The parametrized model itself, or the one parametrized submodule (a LightningModule holding the net)."""
    if find_spec(model) is not None:
        return model
    found = [m for m in model.modules() if find_spec(m) is not None and m is not model]
    outer = [m for m in found if not any(m is not o and any(m is c for c in o.modules()) for o in found)]
    if len(outer) == 1:
        return outer[0]
    require_spec(model, "Monitor")  # raises: never parametrized
    return model


class Monitor:
    """Watch a µP training run: per layer, at every `every`-th step, activation sizes, update sizes
    (RMS and spectral), effective lrs, attention and output logits, gradient norms; alarms when the run
    is not in µP.

    Without a proxy, the alarms come from what `parametrize` recorded: an optimizer group not built
    by `param_groups` (or an lr changed by hand) for a parameter whose µP lr is not the base lr, a
    layer swapped after `parametrize`, an attention logit scale that is not the installed one, and — checked
    when the monitor starts, if the optimizer has not stepped yet — an init that is not µP's (`mt.check`:
    the model re-initialised by its own code after `parametrize`, or a meta build never given
    `mt.init_weights`), raised at the first sample. With a
    proxy trajectory (`proxy=` or `compare`), every quantity is also compared with the proxy's at the
    same step, scaled to this model's widths by the rules.

    Args:
        model: the parametrized model (or a module holding exactly one parametrized submodule).
        optimizer: the torch optimizer that trains it (its hooks give gradients and updates).
        every: sample every `every` steps (and step 1).
        log: None, ``"tensorboard:DIR"``, ``"wandb"``, ``"csv:PATH"`` or ``fn(step, {tag: value})``;
            tags are ``mup/<role>/<layer>/<quantity>``.
        on_alarm: called with each new `Alarm`.
        raise_on_alarm: raise `mutransfer.errors.MonitorAlarm` from `step` when a sample raised alarms.
        proxy: a proxy run's trajectory (dict or JSON path) to compare with at the same steps. With a
            ``"wider"`` entry — a second proxy's trajectory at a larger width, what ``mutransfer sweep``
            records — the band also spans the finite-width trend from one to the other, extrapolated to
            this model's width (`predictions.trend_band`).
        tolerance: the band around a proxy-predicted value: [expected / tolerance, expected × tolerance].
        persist: a quantity compared with the proxy alarms once it is outside the band, on the same side, at
            this many consecutive samples: one sample of a small proxy is noisy (a correct µP GPT from width 32
            to 128 left the band ×2 at single samples of its early steps), a mistake stays out.
        rows: rows of the captured micro-batch the activation forward runs on.
        power_iters: power iterations per spectral-norm estimate (warm-started from the last sample).
        history: samples kept in memory for `trajectory` (None: all, what a proxy run saves; a long
            target run that only compares can keep a few: each sample holds ~12 floats per layer).
        check_init: compare every parameter's RMS with µP's init now (`mt.check`) and raise what is off at
            the first sample. None: when the run has not started (no optimizer state, no gradient);
            False for a monitor started on a model that already trained (plain SGD keeps no state).

    Raises:
        ModelError: the model was never parametrized.
        UsageError: a bad `every`, `tolerance` or `log`.
        TypeError: `optimizer` is not a torch optimizer (nor a wrapper holding one as `.optimizer`).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        every: int = 50,
        log: str | Callable[[int, dict[str, float]], Any] | None = None,
        on_alarm: Callable[[Alarm], Any] | None = None,
        raise_on_alarm: bool = False,
        proxy: str | Path | dict | None = None,
        tolerance: float = 2.0,
        persist: int = 3,
        rows: int = 4,
        power_iters: int = 3,
        history: int | None = None,
        check_init: bool | None = None,
    ):
        if not isinstance(every, int) or every < 1:
            raise UsageError(f"Monitor every={every!r}: give a whole number of steps ≥ 1 (50 costs < 2%)")
        if not (isinstance(tolerance, (int, float)) and tolerance > 1):
            raise UsageError(f"Monitor tolerance={tolerance!r}: give a factor > 1 (2.0: within ×/÷ 2 of the proxy)")
        self.model = _monitored(model)
        self.spec: MuSpec = require_spec(self.model, "Monitor")
        # wrappers (accelerate's AcceleratedOptimizer, Lightning's LightningOptimizer) keep the torch one inside
        while not hasattr(optimizer, "_optimizer_step_pre_hooks") and hasattr(optimizer, "optimizer"):
            optimizer = optimizer.optimizer
        if not hasattr(optimizer, "register_step_pre_hook"):
            raise TypeError(
                f"Monitor needs the torch.optim.Optimizer that trains the model, got {type(optimizer).__name__}"
            )
        self.optimizer = optimizer
        if not isinstance(persist, int) or persist < 1:
            raise UsageError(f"Monitor persist={persist!r}: give a whole number of samples ≥ 1 (3: three in a row)")
        self.every, self.tolerance, self.power_iters = every, float(tolerance), power_iters
        self.persist = persist
        self._streaks: dict[tuple[str, str], tuple[bool, int]] = {}
        self.on_alarm, self.raise_on_alarm = on_alarm, raise_on_alarm
        self.kind = optimizer_kind(self.optimizer)
        self.names: dict[int, str] = {}
        for n, p in self.model.named_parameters():
            self.names.setdefault(id(p), canonical_name(n))
        self.layers = self._layers()
        self.alarms: list[Alarm] = []
        self._seen: set[tuple[str, str]] = set()
        self._records: deque[dict] = deque(maxlen=history)
        self._vectors: dict[tuple[str, str], torch.Tensor | None] = {}
        self._sink = make_sink(log)
        self._proxy: dict | None = None
        self._proxy_steps: dict[int, dict] = {}
        self._wider_steps: dict[int, dict] = {}
        self._t = 0
        # the init, checked before the first step (after one, the values have moved): alarms at the first sample
        self._init_found: list = []
        fresh = not self.optimizer.state and all(p.grad is None for p in self.model.parameters())
        self._unit_due = fresh and self.spec.parametrization == UMUP_NAME  # u-µP: unit activations at init
        if check_init if check_init is not None else fresh:
            with torch.no_grad():
                found, _, _ = init_findings(self.spec, self.model)
            self._init_found = [
                (layer_of(f.parameter), f"{f.what} of {f.parameter.rsplit('.', 1)[-1]}", f.measured, f.expected, "init")
                for f in found
            ]
        self._probe = StepProbe(self.model, self.optimizer, self.names, rows)
        self._probe.arm()  # step 1 is sampled
        if proxy is not None:
            self._set_proxy(load_trajectory(proxy))

    # ------------------------------------------------------------------ layers and what µP says of them
    def _layers(self) -> dict[str, dict[str, Any]]:
        """Layer → its main parameter (the first of ≥ 2 dims, else the first), role, width ratios, shape."""
        by_layer: dict[str, list[str]] = {}
        for name in self.names.values():
            if name in self.spec.params:
                by_layer.setdefault(layer_of(name), []).append(name)
        out: dict[str, dict[str, Any]] = {}
        for layer, params in by_layer.items():
            main = next((n for n in params if len(self.spec.params[n].shape) >= 2), params[0])
            info = self.spec.params[main]
            out[layer] = {
                "param": main,
                "role": info.role,
                "m_in": float(info.m_in),
                "m_out": float(info.m_out),
                "shape": list(info.shape),
            }
            plan = self.spec.__dict__.get("umup")
            if plan is not None and main in plan.rows:  # u-µP: its rules read the absolute fans (rules.UMUP)
                fan_in, fan_out = plan.fans[main]
                out[layer].update(
                    row=plan.rows[main], fan_in=fan_in, fan_out=fan_out, factors=umup_factors(self.spec, main)
                )
        return out

    def _spectral_factor(self, name: str, meta: dict[str, Any]) -> float:
        """The spectral condition's width factor of parameter `name`: u-µP's at its absolute fans (the factor
        `param_groups` gave it), µP's at the layer's width ratios."""
        factors = meta.get("factors")
        if factors is not None:
            return float(factors["spectral_lr"])
        return factor(self.spec.rule(name).spectral_lr, meta["m_in"], meta["m_out"])

    def _role(self, layer: str) -> str:
        if layer == MODEL_OUTPUT:
            return "output"
        meta = self.layers.get(layer)
        return meta["role"] if meta else "attention"

    # ------------------------------------------------------------------ the training-loop call
    def step(self, loss: Any = None) -> list[Alarm]:
        """Count one training step; at a sampled step, measure, check and log.

        Call it once per optimizer step, after ``optimizer.step()``. On steps that are not sampled it only
        counts (and, the step before a sample, arms hooks for the next forward and optimizer step).

        Args:
            loss: the step's loss (a tensor or float; logged as ``mup/loss``), or None.

        Returns:
            The new alarms of this step (empty on steps that are not sampled).

        Raises:
            MonitorAlarm: ``raise_on_alarm=True`` and this sample raised alarms.
        """
        self._t += 1
        t = self._t
        new: list[Alarm] = []
        if t == 1 or t % self.every == 0:
            new = self._sample(t, loss)
        if (t + 1) % self.every == 0:
            self._probe.arm()
        if new and self.raise_on_alarm:
            raise MonitorAlarm(new)
        return new

    def _sample(self, t: int, loss: Any) -> list[Alarm]:
        probe = self._probe
        probe.disarm()
        layers: dict[str, dict[str, float]] = {}
        calls: list[Any] = []
        if probe.inputs is not None:
            sizes, calls = activation_sizes(self.model, probe.inputs)
            for label, q in sizes.items():
                if label in self.layers or label == MODEL_OUTPUT or "attn_logit_rms" in q:
                    layers.setdefault(label, {}).update(q)
            for c in calls:  # the head dim: attention logits at init shrink like its −½ power (see proxy_findings)
                if "attn_logit_rms" in layers.get(c.module, {}):
                    layers[c.module]["head_dim"] = float(c.head_dim)
        ref, lrs, lr_found = lr_findings(self.spec, self.optimizer, self.names, self.kind)
        params = dict(self.model.named_parameters())
        named = {canonical_name(n): p for n, p in params.items()}
        for layer, meta in self.layers.items():
            name = meta["param"]
            p = named.get(name)
            if p is None:
                continue
            q = layers.setdefault(layer, {})
            q["w_rms"] = rms(p)
            q["w_spec"], self._vectors[(layer, "w")] = spectral_norm(
                p, self._vectors.get((layer, "w")), self.power_iters
            )
            d = probe.deltas.get(name)
            if d is not None:
                q["dw_rms"] = rms(d)
                q["dw_spec"], self._vectors[(layer, "dw")] = spectral_norm(
                    d, self._vectors.get((layer, "dw")), self.power_iters
                )
                if q["w_spec"] > 0:
                    q["dw_rel"] = q["dw_spec"] / q["w_spec"]
                f = self._spectral_factor(name, meta)
                if ref:  # ‖ΔW‖₂ over the spectral condition's width factor and the base lr: Θ(1) in width under µP
                    q["dw_spec_mup"] = q["dw_spec"] / (ref * f)
            if name in probe.grad_norms:
                q["grad_norm"] = probe.grad_norms[name]
            if name in lrs:
                q["lr"], q["lr_mup"] = lrs[name]
        loss_v = None
        if loss is not None:
            loss_v = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        record = {"step": t, "loss": loss_v, "lr_base": ref, "layers": layers}
        self._records.append(record)
        found = (
            lr_found + swap_findings(self.spec, self.model, self.optimizer, rms) + attention_findings(self.spec, calls)
        )
        found += self._compare_record(record)
        if self._unit_due and t == 1:  # step 1's sample: one small update after init, still init's scale
            found += umup_unit_findings(self.spec, record, self.tolerance)
        self._unit_due = False
        found, self._init_found = found + self._init_found, []
        new = self._raise(t, found)
        if self._sink is not None:
            self._sink.write(t, self._scalars(record))
        return new

    def _scalars(self, record: dict) -> dict[str, float]:
        out = {
            tag(self._role(layer), layer, k): float(v)
            for layer, q in record["layers"].items()
            for k, v in q.items()
            if v is not None and math.isfinite(v) and k != "head_dim"
        }
        if record["loss"] is not None:
            out["mup/loss"] = record["loss"]
        return out

    def _raise(self, t: int, found: list) -> list[Alarm]:
        new = []
        for layer, what, measured, expected, cause in found:
            key = (layer, what)
            if key in self._seen:
                continue
            self._seen.add(key)
            alarm = Alarm(t, layer, what, float(measured), float(expected), CAUSES[cause])
            new.append(alarm)
            self.alarms.append(alarm)
            if self.on_alarm is not None:
                self.on_alarm(alarm)
        return new

    # ------------------------------------------------------------------ proxy trajectories
    def _set_proxy(self, proxy: dict) -> None:
        theirs = proxy.get("parametrization", MUP)
        if theirs != self.spec.parametrization:
            raise UsageError(
                f"Monitor: the proxy trajectory was recorded under parametrization {theirs!r}, this model is "
                f"{self.spec.parametrization!r}; compare with a proxy of the same parametrization (their update "
                "sizes scale by different rules)"
            )
        self._proxy = proxy
        self._proxy_steps = {int(r["step"]): r for r in proxy.get("steps", [])}
        wider = proxy.get("wider")
        self._wider_steps = {int(r["step"]): r for r in wider.get("steps", [])} if wider else {}

    def _compare_record(self, record: dict) -> list:
        if self._proxy is None:
            return []
        p = self._proxy_steps.get(record["step"])
        if p is None:
            return []
        w = self._wider_steps.get(record["step"])
        wider = (w, self._proxy["wider"].get("layers", {})) if w is not None else None
        found = proxy_findings(
            record, p, self.layers, self._proxy.get("layers", {}), self.spec.formulation, self.tolerance, wider
        )
        # a finding counts once it repeats, on the same side of the band, at `persist` samples in a row
        streaks: dict[tuple[str, str], tuple[bool, int]] = {}
        kept = []
        for f in found:
            layer, what, measured, expected = f[0], f[1], f[2], f[3]
            high = measured > expected
            side, n = self._streaks.get((layer, what), (high, 0))
            streaks[(layer, what)] = (high, n + 1 if side == high else 1)
            if streaks[(layer, what)][1] >= self.persist:
                kept.append(f)
        self._streaks = streaks
        return kept

    def compare(self, proxy: str | Path | dict) -> list[Alarm]:
        """Compare this run with a proxy's trajectory: the samples so far now, later samples as they come.

        Args:
            proxy: what `trajectory()` returned on the proxy run, or the JSON file `save_trajectory` wrote.

        Returns:
            The new alarms the samples so far raise.
        """
        self._set_proxy(load_trajectory(proxy))
        self._streaks = {}
        new: list[Alarm] = []
        for record in self._records:
            new += self._raise(record["step"], self._compare_record(record))
        return new

    def trajectory(self) -> dict:
        """What a proxy run saves for a target to compare with (JSON-able).

        Returns:
            ``{"format", "every", "optimizer", "formulation", "parametrization", "layers": {layer: {param,
            role, m_in, m_out, shape}}, "steps": [{"step", "loss", "lr_base", "layers": {layer: {quantity:
            value}}}]}``; m_in/m_out are the layer's width ratios to the base model, so a target of the same
            base scales each quantity by the rules. Under u-µP a layer also holds its ``row`` of
            `rules.UMUP`, its absolute ``fan_in``/``fan_out`` and the ``factors`` its update sizes scale
            with (`predictions.umup_factors`).
        """
        return {
            "format": TRAJECTORY_FORMAT,
            "every": self.every,
            "optimizer": self.kind,
            "formulation": self.spec.formulation,
            "parametrization": self.spec.parametrization,
            "layers": self.layers,
            "steps": list(self._records),
        }

    def save_trajectory(self, path: str | Path) -> Path:
        """Write `trajectory()` as JSON to `path` (atomically) and return the path."""
        path = Path(path)
        write_atomically(path, json.dumps(self.trajectory(), indent=1))
        return path

    def close(self) -> None:
        """Remove every hook and close the log destination."""
        self._probe.disarm()
        if self._sink is not None:
            self._sink.close()
            self._sink = None
