"""Hyperparameters from a proxy's scale to a target's, by rule (`mt.transfer_hparams`).

µP (width) and CompleteP (depth) keep the *base* hyperparameters and change them per layer
(`mt.param_groups`, `mt.parametrize`). A target also differs from its proxy in batch size and
training horizon, where TP5 lists transfer as empirical; for those the literature gives rules, each
valid in a regime. The rules are data (`_BATCH_RULES`, `_WEIGHT_DECAY_RULES`, the defaults per
optimizer), each with its derivation and source; `transfer_hparams` applies them in order — width
and depth, batch size, horizon, weight decay — and records every step (`AppliedRule`). Where no rule
holds (past the critical batch, η*(D) without a measured fit) it says so and gives no number.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import HParamTransferError, MuPWarning
from ..rules import OPTIMIZERS
from .measured_law import MEASURED_SOURCE, MeasuredLaw, MeasuredStep, check_measured
from .scale import Scale

__all__ = ["AppliedRule", "MeasuredLaw", "TransferredHParams", "transfer_hparams"]

_TP5 = "TP5 (Yang et al. 2022); CompleteP (Dey et al. 2025)"
_MALLADI = "Malladi et al. 2022 (SDEs of adaptive methods)"
_GOYAL = "Goyal et al. 2017 (large-minibatch SGD)"
_TAU = "Wang & Aitchison 2025; Bergsma et al. 2025 (Power Lines)"
_USER = "rules= (the user's choice)"


@dataclass(frozen=True)
class _BatchRule:
    formula: str  # what it says, e.g. "η ∝ √B"
    exponent: float  # η ∝ B^exponent
    source: str


# Batch-size rules for the learning rate, κ = B_target / B_proxy.
# - "sqrt" (Adam, RMSprop): Malladi et al. derive the SDE of adaptive methods; the update is
#   normalised, so its drift is Θ(η) whatever the gradient's size while its noise term falls like
#   1/√B. The SDE stays the same when B ↦ κB with η ↦ √κ·η (their full rule also takes 1−β ↦
#   κ(1−β) and ε ↦ ε/√κ; this rule scales η only and keeps β, ε).
# - "linear" (SGD): SGD's SDE dθ = −∇L dt + √(η/B)·Σ^½ dW (time t = η·steps) keeps its noise
#   temperature η/B when η ↦ κη (Goyal et al. 2017: ImageNet up to B = 8k with warm-up).
# Both hold while the gradient noise dominates the step, i.e. below the critical batch size
# (McCandlish et al. 2018: B_crit ≈ the gradient noise scale tr Σ / |G|²). Past it the optimal
# lr stops growing and for Adam falls again (the surge, Li et al. 2024): no rule, no number.
_BATCH_RULES: dict[str, _BatchRule] = {
    "sqrt": _BatchRule("η ∝ √B", 0.5, _MALLADI),
    "linear": _BatchRule("η ∝ B", 1.0, _GOYAL),
}
# The rule an optimizer gets under rules={"batch": "auto"}: only where the literature derives one.
_DEFAULT_BATCH_RULE = {"sgd": "linear", "adam": "sqrt", "adamw": "sqrt"}

# Weight-decay rules. "tau": AdamW's decoupled decay makes the weights an exponential moving
# average of the updates with timescale τ_iter = 1/(η·λ) iterations (Wang & Aitchison 2025); what
# should stay fixed is τ as a fraction of the run, τ_iter / T with T = D/B iterations, i.e.
# τ = B/(η·λ·D) (Power Lines, Bergsma et al. 2025, who find the optimal τ constant in
# tokens-per-parameter). Solving for λ: λ_t = λ_p · (η_p/η_t) · (B_t/B_p) · (D_p/D_t).
# "independent": λ fixed (TP5 Table 1 lists weight decay among the HPs that do not transfer).
_WEIGHT_DECAY_RULES = ("tau", "independent")
_DEFAULT_WEIGHT_DECAY_RULE = {"adamw": "tau"}

_RULE_OPTIONS: dict[str, tuple[str, ...]] = {
    "batch": ("auto", "sqrt", "linear", "none"),
    "weight_decay": _WEIGHT_DECAY_RULES,
}


@dataclass(frozen=True)
class AppliedRule:
    """One step of `transfer_hparams`: a hyperparameter, its value before and after, and why.

    Attributes:
        hparam: the hyperparameter's name in `hparams` ("lr", "weight_decay", ...).
        value_from: its value before this step.
        value_to: its value after this step.
        rule: the rule's short name (e.g. "batch: η ∝ √B").
        regime: why the rule holds here (e.g. "B = 512 is below the critical batch 2048").
        source: the paper (or the user's choice) the rule comes from.
        interval: the interval of `value_to` when the step is a measured law (the law's exponent interval
            applied to the same ratio); None for rules, which state no uncertainty.
    """

    hparam: str
    value_from: Any
    value_to: Any
    rule: str
    regime: str
    source: str
    interval: tuple[float, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The record as plain data (for JSON): keys hparam, from, to, rule, regime, source (and interval)."""
        out = {
            "hparam": self.hparam,
            "from": self.value_from,
            "to": self.value_to,
            "rule": self.rule,
            "regime": self.regime,
            "source": self.source,
        }
        if self.interval is not None:
            out["interval"] = list(self.interval)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AppliedRule:
        """The record back from `as_dict`'s plain data (e.g. read from transfer.json)."""
        interval = data.get("interval")
        return cls(
            data["hparam"],
            data["from"],
            data["to"],
            data["rule"],
            data["regime"],
            data["source"],
            None if interval is None else (float(interval[0]), float(interval[1])),
        )

    def __str__(self) -> str:
        iv = "" if self.interval is None else f" [{_fmt(self.interval[0])}, {_fmt(self.interval[1])}]"
        return (
            f"{self.hparam}: {_fmt(self.value_from)} → {_fmt(self.value_to)}{iv}  {self.rule} — {self.regime} "
            f"[{self.source}]"
        )


@dataclass(frozen=True)
class TransferredHParams:
    """What `transfer_hparams` returns: the target's hyperparameters and every rule applied.

    Attributes:
        hparams: the target's hyperparameters (a new dict; the proxy's is not changed).
        rules: one `AppliedRule` per step, in the order applied; `str()` of each is one line.
        proxy: the proxy's scale.
        target: the target's scale.
    """

    hparams: dict[str, Any]
    rules: list[AppliedRule] = field(default_factory=list)
    proxy: Scale | None = None
    target: Scale | None = None

    def __str__(self) -> str:
        head = f"hyperparameters from {_describe(self.proxy)} to {_describe(self.target)}"
        width = max((len(r.hparam) for r in self.rules), default=0)
        rows = [
            f"  {r.hparam:<{width}}  {_fmt(r.value_from):>10} → {_fmt(r.value_to):<10}  {r.rule} — {r.regime} "
            f"[{r.source}]"
            for r in self.rules
        ]
        return "\n".join([head, *rows])


def transfer_hparams(
    hparams: dict[str, Any],
    proxy: Scale,
    target: Scale,
    optimizer: str = "adamw",
    rules: dict[str, str] | None = None,
    critical_batch: float | None = None,
    measured: Mapping[str, Mapping[str, MeasuredLaw | str]] | Iterable[MeasuredLaw] | None = None,
    extrapolate: bool = False,
) -> TransferredHParams:
    """The target's hyperparameters from the proxy's, each with the rule and regime that set it.

    Width and depth keep the base values (µP and CompleteP act per layer through `mt.parametrize`
    and `mt.param_groups`). A batch-size change scales ``lr`` by the optimizer's rule — η ∝ √B for
    Adam/AdamW (Malladi et al. 2022), η ∝ B for SGD (Goyal et al. 2017) — only while both batch
    sizes are at most `critical_batch`. A horizon change keeps ``lr`` (no rule without a measured
    fit). ``weight_decay`` follows the τ rule (AdamW's timescale B/(η·λ·D) kept, Wang & Aitchison
    2025, Bergsma et al. 2025) or stays fixed. Any other hyperparameter is kept and recorded.

    Args:
        hparams: the proxy's hyperparameters; ``lr`` (the base learning rate) is required,
            ``weight_decay`` optional.
        proxy: the proxy's scale: `width`, and `depth`, `batch_size`, `tokens` where they change.
        target: the target's scale, at least as wide and deep as the proxy.
        optimizer: the optimizer's name, one of `mt.rules.OPTIMIZERS` ("adamw" by default).
        rules: overrides by key: ``"batch"``: "auto" (the optimizer's rule), "sqrt", "linear" or
            "none" (lr kept on purpose); ``"weight_decay"``: "tau" (default for AdamW) or
            "independent".
        critical_batch: the critical batch size (measure it: the gradient noise scale, McCandlish
            et al. 2018); needed when the batch size changes under a batch rule.
        measured: power laws measured on the proxy sweep: what `mt.sweep.fit_measured_laws`
            returns (``{hparam: {axis: MeasuredLaw or the reason there is none}}``) or a list of
            `MeasuredLaw`. A law whose held-out check passed replaces the default batch rule
            (η*(B); `critical_batch` is then not needed), the horizon's "no rule" (η*(S)) and the τ
            rule (λ*(B), λ*(S): used when every axis that changes has one) unless `rules=` chooses
            that rule explicitly; one that failed it, or a reason, is recorded beside the default
            rule. The proxy is taken at the law's `reference` horizon (the sweep's proxy steps);
            the target's steps follow from tokens ÷ batch size relative to the proxy.
        extrapolate: apply a measured law more than a decade (10×) beyond its measured range,
            with a `MuPWarning`; otherwise that is refused.

    Returns:
        The target's hyperparameters and the list of rules applied (`str()` prints the table).

    Raises:
        HParamTransferError: bad sizes, an unknown optimizer or rule, a target smaller than the
            proxy, no ``lr``, a batch change without `critical_batch` or past it, a τ rule without
            tokens or batch sizes on both scales, a measured law applied more than a decade beyond
            its measured range without `extrapolate=True`.
        TypeError: `hparams` is not a dict, `proxy` / `target` not a `Scale`, or `measured` neither
            what `mt.sweep.fit_measured_laws` returns nor a list of `MeasuredLaw`.
    """
    if not isinstance(hparams, dict):
        raise TypeError(f"hparams must be a dict of the proxy's hyperparameters, got {type(hparams).__name__}")
    for name, scale in (("proxy", proxy), ("target", target)):
        if not isinstance(scale, Scale):
            raise TypeError(f"{name} must be a mt.Scale(width=, depth=, batch_size=, tokens=), got {scale!r}")
        _check_scale(name, scale)
    optimizer = _check_optimizer(optimizer)
    chosen = _check_rules(rules)
    if critical_batch is not None and not _positive(critical_batch):
        raise HParamTransferError(
            f"critical_batch must be a positive number (a batch size) or None, got {critical_batch!r}"
        )
    if "lr" not in hparams:
        raise HParamTransferError(
            "hparams has no 'lr': transfer_hparams scales the base learning rate; pass hparams={'lr': ..., ...}"
        )
    if not _positive(hparams["lr"]):
        raise HParamTransferError(f"hparams['lr'] must be a positive number, got {hparams['lr']!r}")
    wd = hparams.get("weight_decay")
    if wd is not None and not (_number(wd) and wd >= 0):
        raise HParamTransferError(f"hparams['weight_decay'] must be a number ≥ 0, got {wd!r}")
    _check_sizes(proxy, target)
    step = MeasuredStep(check_measured(measured), proxy, target, bool(extrapolate))

    out = dict(hparams)
    applied: list[AppliedRule] = []
    applied += _width_depth(out, proxy, target)
    lr = _batch_lr(hparams["lr"], proxy, target, optimizer, chosen["batch"], critical_batch, applied, step)
    lr = _horizon_lr(lr, proxy, target, applied, step)
    out["lr"] = lr
    if wd is not None:
        out["weight_decay"] = _weight_decay(wd, hparams["lr"], lr, proxy, target, optimizer, chosen, applied, step)
    for name in hparams:
        if name not in ("lr", "weight_decay"):
            applied.append(AppliedRule(name, hparams[name], hparams[name], "kept", "no rule for it here", "-"))
    return TransferredHParams(out, applied, proxy, target)


def _width_depth(hparams: dict[str, Any], proxy: Scale, target: Scale) -> list[AppliedRule]:
    moves = [f"width {proxy.width} → {target.width}"] if proxy.width != target.width else []
    if proxy.depth != target.depth:
        moves.append(f"depth {proxy.depth} → {target.depth}")
    regime = ", ".join(moves) if moves else f"width {target.width}" + _depth_text(target) + " unchanged"
    lr = hparams["lr"]
    out = [AppliedRule("lr", lr, lr, "µP", f"{regime}: base lr kept, per-layer factors by mt.param_groups", _TP5)]
    if "weight_decay" in hparams:
        wd, policy = hparams["weight_decay"], "per-layer λ by mt.param_groups' weight_decay_policy"
        out.append(AppliedRule("weight_decay", wd, wd, "µP", f"{regime}: base λ kept, {policy}", _TP5))
    return out


def _batch_lr(
    lr: float,
    proxy: Scale,
    target: Scale,
    optimizer: str,
    choice: str,
    critical: float | None,
    applied: list,
    step: MeasuredStep,
) -> float:
    bp, bt = proxy.batch_size, target.batch_size
    if bp is None or bt is None:
        applied.append(AppliedRule("lr", lr, lr, "batch: not stated", "batch_size is None on both scales", "-"))
        return lr
    if bp == bt:
        applied.append(AppliedRule("lr", lr, lr, "batch: unchanged", f"B = {bt} on both scales", "-"))
        return lr
    law, why = step.law("lr", "batch_size", explicit=choice != "auto")
    if law is not None:
        return _measured(step, law, lr, applied, "batch")
    before = len(applied)
    lr = _batch_rule_lr(lr, bp, bt, optimizer, choice, critical, applied)
    _note(applied, before, why)
    return lr


def _batch_rule_lr(
    lr: float, bp: int, bt: int, optimizer: str, choice: str, critical: float | None, applied: list
) -> float:
    if choice == "none":
        regime = f"B {bp} → {bt}, lr kept on purpose (rules={{'batch': 'none'}})"
        applied.append(AppliedRule("lr", lr, lr, "batch: none", regime, _USER))
        return lr
    if choice == "auto":
        if optimizer not in _DEFAULT_BATCH_RULE:
            raise HParamTransferError(
                f"no batch-size rule for optimizer '{optimizer}' (the literature gives one for "
                f"{', '.join(_DEFAULT_BATCH_RULE)}): the batch size changes {bp} → {bt}; pass "
                "rules={'batch': 'sqrt'}, {'batch': 'linear'} or {'batch': 'none'} to choose on purpose"
            )
        choice = _DEFAULT_BATCH_RULE[optimizer]
    rule = _BATCH_RULES[choice]
    if critical is None:
        raise HParamTransferError(
            f"critical_batch= is needed: the batch size changes {bp} → {bt}, and {rule.formula} holds only "
            "below the critical batch size; measure it (the gradient noise scale, McCandlish et al. 2018) and "
            "pass critical_batch=, or pass rules={'batch': 'none'} to keep lr on purpose"
        )
    for name, b in (("target", bt), ("proxy", bp)):
        if b > critical:
            raise HParamTransferError(
                f"{name}.batch_size {b} is above critical_batch {_fmt(critical)}: past the critical batch the "
                "optimal lr stops growing with B and, for Adam, falls again (the surge, Li et al. 2024); no rule "
                "gives a number there: measure the optimal lr at that batch size, or pass rules={'batch': 'none'} "
                "to keep lr on purpose"
            )
    new = lr * (bt / bp) ** rule.exponent
    where = "at" if bt == critical else "below"
    regime = f"B = {bt} is {where} the critical batch {_fmt(critical)} (proxy B = {bp})"
    source = rule.source if choice == _DEFAULT_BATCH_RULE.get(optimizer) else f"{rule.source}; {_USER}"
    applied.append(AppliedRule("lr", lr, new, f"batch: {rule.formula}", regime, source))
    return new


def _horizon_lr(lr: float, proxy: Scale, target: Scale, applied: list, step: MeasuredStep) -> float:
    dp, dt = proxy.tokens, target.tokens
    law, why = step.law("lr", "steps")
    if law is not None and step.steps_ratio not in (None, 1.0):
        return _measured(step, law, lr, applied, "horizon")
    before = len(applied)
    if dp is None or dt is None:
        applied.append(AppliedRule("lr", lr, lr, "horizon: not stated", "tokens is None on both scales", "-"))
    elif dp == dt:
        applied.append(AppliedRule("lr", lr, lr, "horizon: unchanged", f"D = {_fmt(dt)} tokens on both scales", "-"))
    else:
        regime = (
            f"D {_fmt(dp)} → {_fmt(dt)} tokens: lr kept; no rule: η*(D) needs a measured fit "
            "(a sweep over horizons, mt.sweep.fit_measured_laws)"
        )
        applied.append(AppliedRule("lr", lr, lr, "horizon: no rule", regime, "-"))
    _note(applied, before, why)
    return lr


def _weight_decay(
    wd: float,
    lr_p: float,
    lr_t: float,
    proxy: Scale,
    target: Scale,
    optimizer: str,
    chosen: dict[str, str],
    applied: list,
    step: MeasuredStep,
) -> float:
    choice = chosen.get("weight_decay") or _DEFAULT_WEIGHT_DECAY_RULE.get(optimizer)
    if wd == 0:  # under every rule
        applied.append(AppliedRule("weight_decay", wd, wd, "zero", "λ = 0 stays 0", "-"))
        return wd
    laws, why = step.weight_decay_laws(explicit="weight_decay" in chosen)
    if laws:
        for law, what in laws:
            wd = _measured(step, law, wd, applied, what)
        return wd
    before = len(applied)
    wd = _weight_decay_rule(wd, lr_p, lr_t, proxy, target, optimizer, choice, applied)
    _note(applied, before, why)
    return wd


def _weight_decay_rule(
    wd: float,
    lr_p: float,
    lr_t: float,
    proxy: Scale,
    target: Scale,
    optimizer: str,
    choice: str | None,
    applied: list,
) -> float:
    if choice is None:
        raise HParamTransferError(
            f"no default weight-decay rule for optimizer '{optimizer}' (the τ rule is derived for AdamW's "
            "decoupled decay): pass rules={'weight_decay': 'tau'} or rules={'weight_decay': 'independent'}"
        )
    if choice == "independent":
        regime = "λ fixed (rules={'weight_decay': 'independent'}); AdamW's timescale 1/(η·λ) then moves with η"
        applied.append(AppliedRule("weight_decay", wd, wd, "independent", regime, _USER))
        return wd
    bp, bt, dp, dt = proxy.batch_size, target.batch_size, proxy.tokens, target.tokens
    if bp is None or bt is None or dp is None or dt is None:
        missing = " and ".join(w for w, v in (("batch_size", bp), ("tokens", dp)) if v is None)
        raise HParamTransferError(
            f"the τ rule for weight_decay needs {missing} on both scales (proxy and target): τ = B/(η·λ·D) "
            "is kept as a fraction of the run; set them, or pass rules={'weight_decay': 'independent'} to keep λ"
        )
    eta, batch, tokens = lr_t / lr_p, bt / bp, dt / dp
    factor = batch / (eta * tokens)
    new = wd * factor
    regime = f"τ = B/(η·λ·D) kept: η ×{_fmt(eta)}, B ×{_fmt(batch)}, D ×{_fmt(tokens)} ⇒ λ ×{_fmt(factor)}"
    if target.width != proxy.width or target.depth != proxy.depth:
        # Power Lines: at fixed model and data λ* ∝ B (τ kept), but across sizes the optimal τ follows a
        # power law in tokens per parameter D/N, measured, not derived: keeping τ is exact only at the same D/N
        regime += (
            "; exact at the same tokens per parameter — the model's size changes here, and the optimal τ "
            "is a measured power law in D/N (Power Lines), not applied"
        )
        warnings.warn(
            f"transfer_hparams: the τ rule keeps AdamW's timescale B/(η·λ·D), but the model grows (width "
            f"{proxy.width} → {target.width}, depth {proxy.depth} → {target.depth}) and the optimal τ moves with "
            "tokens per parameter (Bergsma et al. 2025): measure τ* at two model sizes, or pass "
            "rules={'weight_decay': 'independent'} to keep λ on purpose",
            MuPWarning,
            stacklevel=4,
        )
    source = _TAU if optimizer in _DEFAULT_WEIGHT_DECAY_RULE else f"{_TAU}; {_USER}"
    applied.append(AppliedRule("weight_decay", wd, new, "τ rule", regime, source))
    return new


def _measured(step: MeasuredStep, law: MeasuredLaw, value: float, applied: list, what: str) -> float:
    new, regime, interval = step.apply(law, value)
    applied.append(
        AppliedRule(law.hparam, value, new, f"{what}: measured {law.formula}", regime, MEASURED_SOURCE, interval)
    )
    return new


def _note(applied: list, before: int, why: str) -> None:
    """Add to the records made since `before` why a measured law was not used."""
    if why:
        for i in range(before, len(applied)):
            applied[i] = replace(applied[i], regime=f"{applied[i].regime}; {why}")


def _check_scale(name: str, scale: Scale) -> None:
    if not _positive_int(scale.width):
        raise HParamTransferError(f"{name}.width must be a positive integer, got {scale.width!r}")
    for what in ("depth", "batch_size"):
        value = getattr(scale, what)
        if value is not None and not _positive_int(value):
            raise HParamTransferError(f"{name}.{what} must be a positive integer or None, got {value!r}")
    if scale.tokens is not None and not _positive(scale.tokens):
        raise HParamTransferError(f"{name}.tokens must be a positive number or None, got {scale.tokens!r}")


def _check_sizes(proxy: Scale, target: Scale) -> None:
    for what in ("depth", "batch_size", "tokens"):
        if (getattr(proxy, what) is None) != (getattr(target, what) is None):
            side = "proxy" if getattr(proxy, what) is not None else "target"
            raise HParamTransferError(
                f"{what} is set on the {side} only: set proxy.{what} and target.{what} both (or neither)"
            )
    for what in ("width", "depth"):
        p, t = getattr(proxy, what), getattr(target, what)
        if p is not None and t < p:
            raise HParamTransferError(
                f"target.{what} {t} is below proxy.{what} {p}: µTransfer goes from a small proxy to a larger "
                "target; swap proxy and target, or tune at the smaller scale"
            )


def _check_optimizer(optimizer: str) -> str:
    name = optimizer.lower() if isinstance(optimizer, str) else optimizer
    if name not in OPTIMIZERS:
        raise HParamTransferError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    return name


def _check_rules(rules: dict[str, str] | None) -> dict[str, str]:
    if rules is None:
        rules = {}
    if not isinstance(rules, dict):
        raise TypeError(f"rules must be a dict such as {{'batch': 'sqrt'}} or None, got {rules!r}")
    chosen = {"batch": "auto"}
    for key, value in rules.items():
        if key not in _RULE_OPTIONS:
            raise HParamTransferError(f"unknown rules key {key!r}; use {', '.join(map(repr, _RULE_OPTIONS))}")
        if value not in _RULE_OPTIONS[key]:
            raise HParamTransferError(
                f"unknown rules[{key!r}] value {value!r}; use one of {', '.join(map(repr, _RULE_OPTIONS[key]))}"
            )
        chosen[key] = value
    return chosen


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _positive(value: Any) -> bool:
    return _number(value) and value > 0


def _positive_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value > 0


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if _number(value) else str(value)


def _depth_text(scale: Scale) -> str:
    return "" if scale.depth is None else f", depth {scale.depth}"


def _describe(scale: Scale | None) -> str:
    if scale is None:
        return "?"
    parts = [f"width {scale.width}"]
    parts += [f"depth {scale.depth}"] if scale.depth is not None else []
    parts += [f"batch {scale.batch_size}"] if scale.batch_size is not None else []
    parts += [f"tokens {_fmt(scale.tokens)}"] if scale.tokens is not None else []
    return "(" + ", ".join(parts) + ")"
