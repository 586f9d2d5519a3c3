"""The target's hyperparameters when it trains at another batch size or horizon than the proxy.

`mutransfer transfer --batch-size B --steps S` (or `--tokens D`): width and depth keep µP's base
hyperparameters; a change of batch size or horizon moves them by the best evidence there is, in
this order, each step recorded as an `mt.AppliedRule` (transfer.json's ``"hparam_rules"``):

1. **Measured in this sweep**: the target's batch size (or horizon) is one the sweep swept at the
   proxy width (`batch_sizes`, `horizons`): the optimum there over the optimum at the proxy's — for
   every swept log-scaled hyperparameter (lr, weight_decay) — multiplies the proxy's value.
2. **A measured power law** (`mt.sweep.fit_measured_laws`: η*(B), η*(S), λ*(B), λ*(S) fitted on the
   sweep's batch sizes or horizons, validated on the largest one held out), within a decade of its
   range (`extrapolate` past it).
3. **By rule** (`mt.transfer_hparams`): η ∝ √B (Adam, AdamW) or η ∝ B (SGD) below the critical batch
   size (`critical_batch`, needed whenever the batch size changes by rule); the horizon keeps lr (no
   rule without a measured fit); weight decay by the τ rule (AdamW) or kept (`rules`).

The proxy's batch size and horizon are read from its hyperparameters (`batch_size`, `steps`, set in
[fixed] or swept as an axis): when the objective's own defaults are used, mutransfer cannot see
them and says so. Tokens are batch size × steps × `seq_len` when the hyperparameters have one, else
batch size × steps (examples); only their ratio enters a rule.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..._core.hparam_transfer import AppliedRule, transfer_hparams
from ..._core.measured_law import MEASURED_SOURCE
from ..._core.scale import Scale
from ...errors import HParamTransferError
from ..analysis.analysis import best
from ..analysis.hparam_fits import fit_measured_laws
from ..config.config import TRANSFERRING
from ..config.space import LogUniform

if TYPE_CHECKING:
    from ..analysis.analysis import TrialResult
    from ..engine.runner import Sweep

__all__ = ["AXIS_FLAGS", "target_hparams"]

AXIS_FLAGS = {"batch_size": "--batch-size", "steps": "--steps"}


def target_hparams(
    sweep: Sweep,
    results: list[TrialResult],
    parametrization: str,
    hp: dict[str, Any],
    targets: dict[str, int],
    width: int,
    depth: int | None,
    optimizer: str | None = None,
    rules: dict[str, str] | None = None,
    critical_batch: float | None = None,
    extrapolate: bool = False,
    measured: dict[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], list[AppliedRule]]:
    """`parametrization`'s hyperparameters at the target's batch size and horizon, with the steps taken.

    Args:
        sweep: the sweep the proxy's optimum comes from.
        results: its trials (`load_results`).
        parametrization: "mup", "u-mup" or "sp".
        hp: the proxy's hyperparameters (its optimum, [fixed] and its batch size and horizon).
        targets: the target's values of "batch_size" and/or "steps" that differ from the proxy's.
        width: the target's width.
        depth: the target's depth (None without depths).
        optimizer: the optimizer the objective trains with; None: ``hp["optimizer"]``, or "adamw"
            for the built-in recipes (their default).
        rules: `mt.transfer_hparams`' rules (``{"batch": ..., "weight_decay": ...}``).
        critical_batch: the critical batch size, for a batch-size change by rule.
        extrapolate: apply a measured law more than a decade past its range (with a warning).
        measured: `fit_measured_laws(sweep, results, parametrization)` when the caller has it (else fitted here).

    Returns:
        The target's hyperparameters (batch size and steps set) and the rules applied.

    Raises:
        HParamTransferError: the proxy's batch size or horizon is not in its hyperparameters, the
            optimizer is unknown, or `mt.transfer_hparams` refuses (past the critical batch, no
            critical batch, ...).
    """
    cfg = sweep.config
    missing: list[str] = []  # everything the transfer still needs, asked for in one message
    for axis in targets:
        if not _count(hp.get(axis)):
            missing.append(
                f"the proxy's {axis} is not in its hyperparameters (the objective's own default is invisible to "
                f"mutransfer): set {axis} in the config's [fixed] (or sweep it) to transfer to "
                f"{AXIS_FLAGS[axis]} {targets[axis]}"
            )
    known = _optimizer(sweep, hp, optimizer)
    if known is None and any(value not in cfg.axes.get(axis, []) for axis, value in targets.items()):  # a rule step
        missing.append(
            "the optimizer is unknown (the objective's hyperparameters name none): pass --optimizer (e.g. adamw, "
            "sgd) so that the batch-size and weight-decay rules for it apply"
        )
    out, applied = dict(hp), []
    by_rule = {}
    if all(_count(hp.get(axis)) for axis in targets):  # else no step can be taken: what is missing is asked for
        for axis, value in targets.items():
            if value in cfg.axes.get(axis, []):
                applied += _measured_step(sweep, results, parametrization, out, axis, hp[axis], value)
            else:
                by_rule[axis] = value
            out[axis] = value
    if by_rule:  # the rule steps start where the measured ones left off
        start = {**out, **{a: hp[a] for a in by_rule}}
        ruled, asked = _by_rule(
            start,
            _scale(cfg.proxy_width, cfg.proxy_depth, start),
            _scale(width, depth, out),
            optimizer=known or "adamw",  # a stand-in while the optimizer is asked for: finds the other needs
            rules=rules,
            critical_batch=critical_batch,
            measured=measured if measured is not None else fit_measured_laws(sweep, results, parametrization),
            extrapolate=extrapolate,
        )
        missing += asked
        if not missing and ruled is not None:
            out.update(ruled.hparams)
            applied += [r for r in ruled.rules if not _silent(r, by_rule, parametrization)]
    if missing:
        if len(missing) == 1:
            raise HParamTransferError(missing[0])
        raise HParamTransferError(
            f"the transfer needs {len(missing)} more things: "
            + "; ".join(f"({i}) {m}" for i, m in enumerate(missing, 1))
        )
    return out, applied


# what `transfer_hparams` asks for, and the stand-in that lets the next need show: (message start, stand-in)
_NEEDS = (
    ("critical_batch= is needed", ("critical_batch", 1e300)),
    ("no batch-size rule for optimizer", ("batch", "none")),
    ("no default weight-decay rule for optimizer", ("weight_decay", "independent")),
    ("the τ rule for weight_decay needs", ("weight_decay", "independent")),
)


def _by_rule(hparams: dict[str, Any], proxy: Scale, target: Scale, **kw: Any) -> tuple[Any, list[str]]:
    """`transfer_hparams` on the log-scaled hyperparameters, with every missing input collected: each need it
    reports is recorded and given a stand-in, and the call is tried again, so that the user hears of all of
    them at once. Returns (the result, or None when something was missing; the needs)."""
    asked: list[str] = []
    kw = {**kw, "rules": dict(kw.get("rules") or {})}
    for _ in range(len(_NEEDS) + 1):
        try:
            ruled = transfer_hparams(
                {k: hparams[k] for k in ("lr", "weight_decay") if k in hparams},
                proxy,
                target,
                **{**kw, "rules": kw["rules"] or None},
            )
            return (None if asked else ruled), asked
        except HParamTransferError as e:
            need = next((n for n in _NEEDS if str(e).startswith(n[0])), None)
            if need is None:
                if asked:  # a refusal behind what is missing: say what is missing first
                    return None, asked
                raise
            asked.append(str(e))
            key, standin = need[1]
            if key == "critical_batch":
                kw["critical_batch"] = standin
            else:
                kw["rules"][key] = standin
    return None, asked


def _count(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value > 0


def _scale(width: int, depth: int | None, hp: dict[str, Any]) -> Scale:
    batch = hp["batch_size"] if _count(hp.get("batch_size")) else None
    steps = hp["steps"] if _count(hp.get("steps")) else None
    seq = hp["seq_len"] if _count(hp.get("seq_len")) else 1
    tokens = float(batch * steps * seq) if batch is not None and steps is not None else None
    return Scale(width=width, depth=depth, batch_size=batch, tokens=tokens)


def _optimizer(sweep: Sweep, hp: dict[str, Any], given: str | None) -> str | None:
    """The optimizer the objective trains with: given, in its hyperparameters, the recipes' default; else None."""
    if given is not None:
        return given
    if isinstance(hp.get("optimizer"), str):
        return hp["optimizer"]
    if sweep.config.objective.startswith("recipe:"):
        return "adamw"  # the recipes' default (`sweep.recipes`)
    return None


def _measured_step(
    sweep: Sweep, results: list[TrialResult], p: str, out: dict[str, Any], axis: str, proxy_value: int, value: int
) -> list[AppliedRule]:
    """Multiply each swept log-scaled HP by its optimum at `value` over its optimum at the proxy's value."""
    cfg = sweep.config
    here = best(results, p, cfg.proxy_width, cfg.proxy_depth)
    there = best(results, p, cfg.proxy_width, cfg.proxy_depth, ((axis, value),) if value != proxy_value else ())
    if here is None or there is None:
        raise HParamTransferError(
            f"{AXIS_FLAGS[axis]} {value} was swept at the proxy, but its {p} cell has no finished trial: finish the "
            "sweep (`mutransfer sweep CONFIG --run RUN`) first"
        )
    steps = []
    for name, dim in cfg.space_for(p).items():
        if not isinstance(dim, LogUniform) or name not in out:
            continue
        ratio = there.params[name] / here.params[name]
        new = out[name] * ratio
        regime = (
            f"{axis} {proxy_value} → {value}: the optimum at the proxy width moved ×{ratio:.4g} "
            f"({math.log2(ratio):+.2f} octaves) between the two swept cells"
        )
        steps.append(AppliedRule(name, out[name], new, f"{axis}: measured", regime, MEASURED_SOURCE))
        out[name] = new
    return steps


def _silent(rule: AppliedRule, by_rule: dict[str, int], parametrization: str) -> bool:
    """A step not to list: an axis set by its measurement shown as unchanged, or µP's width step for SP (µP's
    and u-µP's own: base values kept across width, per-layer factors by `mt.param_groups`)."""
    if rule.rule == "µP":
        return parametrization not in TRANSFERRING
    return (rule.rule == "batch: unchanged" and "batch_size" not in by_rule) or (
        rule.rule == "horizon: unchanged" and "steps" not in by_rule
    )
