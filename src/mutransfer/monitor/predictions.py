"""What µP predicts for a running model, and where the running model differs: the lrs `param_groups`
built (after schedulers), the parameters `parametrize` marked, the attention scales it installed,
and a proxy's trajectory scaled to the target's widths by the rules (`rules.factor`, never a
hard-coded exponent).

Each check returns findings ``(layer, what, measured, expected, cause key)``; `Monitor` turns them
into `Alarm`s. A quantity the library cannot predict on this model is not checked (and the docs say
which), never guessed.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .._core.depth import DepthMap
from .._core.groups import ADJUST_KEY, MUP_MARK
from .._core.naming import canonical_name
from .._core.spec import MuSpec
from ..optimizers import LR_FACTOR_KEY
from ..rules import OPTIMIZERS, factor, formulation_rules
from ..scaled_forward import Side

__all__ = [
    "Finding",
    "attention_findings",
    "close",
    "layer_of",
    "lr_findings",
    "optimizer_kind",
    "proxy_findings",
    "scaled_proxy",
    "swap_findings",
    "trend_band",
    "umup_factors",
    "umup_unit_findings",
    "width_ratio",
]

Finding = tuple[str, str, float, float, str]  # (layer, what, measured, expected, cause key of alarms.CAUSES)

# proxy comparison: which column of the role's rule predicts how each update size scales with width
# (`rules`: the adam_lr column is the entry size µP wants for ΔW; spectral_lr its ‖ΔW‖₂, the spectral condition)
UPDATE_COLUMNS = {"dw_rms": "adam_lr", "dw_spec": "spectral_lr"}
# quantities µP keeps Θ(1) in width: compared with the proxy's as they are
INVARIANT = {"act_rms": "act", "attn_logit_rms": "attn_logits"}
# u-µP's rows (rules.UMUP) whose layer output is unit-scaled at init (the readout is 1/fan_in: not unit)
UNIT_ROWS = ("embedding", "input", "hidden")


def close(a: float, b: float, rel: float = 1e-6) -> bool:
    """True when `a` and `b` agree within `rel` of the larger (two zeros agree)."""
    return abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-300


def layer_of(param: str) -> str:
    """The module a parameter belongs to (its name without the last part)."""
    head, _, _ = param.rpartition(".")
    return head or param


def optimizer_kind(optimizer: torch.optim.Optimizer) -> str | None:
    """The `rules.OPTIMIZERS` name of `optimizer`'s class (``AdamW`` → "adamw"), or None when not one of them."""
    name = type(optimizer).__name__.lower()
    return name if name in OPTIMIZERS else None


def _reference_base_lr(optimizer: torch.optim.Optimizer) -> float | None:
    """The base lr in effect: lr / µP factor of the groups `param_groups` built, the value most of them share
    (a schedule scales every group alike, so they agree unless one was changed by hand); None without such groups."""
    votes: list[tuple[float, int, int]] = []  # (base lr, groups, params)
    for g in optimizer.param_groups:
        f = g.get(LR_FACTOR_KEY)
        if not f:
            continue
        base = float(g["lr"]) / float(f)
        for i, (b, n, k) in enumerate(votes):
            if close(b, base, 1e-6):
                votes[i] = (b, n + 1, k + len(g["params"]))
                break
        else:
            votes.append((base, 1, len(g["params"])))
    if not votes:
        return None
    return max(votes, key=lambda v: (v[1], v[2]))[0]


def lr_findings(
    spec: MuSpec, optimizer: torch.optim.Optimizer, names: dict[int, str], kind: str | None
) -> tuple[float | None, dict[str, tuple[float, float]], list[Finding]]:
    """The lr each µP parameter runs with against µP's: base lr in effect × its factor.

    Returns:
        (the base lr in effect, or None without groups; parameter → (lr, µP's lr); findings). A group not
        built by `param_groups` is taken to run the base lr (what the user passed), so its µP lr is
        lr × factor (and without any `param_groups` group the first group's lr is the base lr in effect);
        under an optimizer outside `rules.OPTIMIZERS` such a group is not checked.
    """
    ref = _reference_base_lr(optimizer)
    # no group built by param_groups: the first plain group's lr is taken as the base lr in effect
    base = ref if ref is not None else next((float(g["lr"]) for g in optimizer.param_groups), None)
    lrs: dict[str, tuple[float, float]] = {}
    found: list[Finding] = []
    for g in optimizer.param_groups:
        lr, f = float(g["lr"]), g.get(LR_FACTOR_KEY)
        for p in g["params"]:
            name = names.get(id(p))
            if name is None or name not in spec.params:
                continue
            role = spec.params[name].role
            want_f = spec.factors(name, kind)[0] if kind is not None else None
            if f is not None:
                f = float(f)
                if want_f is not None and ADJUST_KEY not in g and not close(f, want_f, 1e-6):
                    found.append((layer_of(name), "lr factor", f, want_f, "other_optimizer"))
                expected = lr if ref is None else ref * f
                if ref is not None and not close(lr, expected, 1e-4):
                    found.append(
                        (layer_of(name), "lr", lr, expected, "readout_lr" if role == "output" else "lr_changed")
                    )
            elif want_f is not None:
                expected = (lr if ref is None else ref) * want_f  # a plain group's own lr is its base lr
                if not close(lr, expected, 1e-4):
                    found.append((layer_of(name), "lr", lr, expected, "plain_group"))
            else:
                continue
            lrs[name] = (lr, expected)
    return base, lrs, found


def swap_findings(spec: MuSpec, model: nn.Module, optimizer: torch.optim.Optimizer, rms: Any) -> list[Finding]:
    """Parameters `parametrize` never saw, saw with another shape, or marked but now unmarked (a layer
    swapped after `parametrize`: same name and shape, a fresh tensor); and parameters no optimizer group holds."""
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    found: list[Finding] = []
    nan = float("nan")
    for n, p in model.named_parameters():
        name = canonical_name(n)
        info = spec.params.get(name)
        if info is None:
            found.append((layer_of(name), "parameter", rms(p), nan, "added"))
            continue
        if tuple(p.shape) != tuple(info.shape) and p.numel() > 0 and not p.is_meta:
            found.append((layer_of(name), "parameter", rms(p), nan, "swapped"))
        elif any(spec.factors(name, o)[0] != 1.0 for o in ("sgd", "adam")) and getattr(p, MUP_MARK, None) != name:
            found.append((layer_of(name), "parameter", rms(p), nan, "swapped"))
        if p.requires_grad and id(p) not in held:
            found.append((layer_of(name), "trained", 0.0, 1.0, "untrained"))
    return found


def attention_findings(spec: MuSpec, calls: list[Any]) -> list[Finding]:
    """Attention calls on the sampled forward whose logit scale is not µP's: the one `parametrize` installed,
    or — for a module it left alone (``attention=False``, or none found then) — µP's α·s₀·d₀/d from the
    base's head dim d₀ and measured scale s₀ (the base's attention, as `parametrize` would have set it)."""
    want = {a.module: float(a.scale) for a in spec.attention}
    depth = DepthMap(dict(spec.depth))
    # u-µP: q and k leave their layers through its scaled matmul's 1/√fan_in, a constant the measurement sees
    # on top of the installed scale — as it saw it right after parametrize (`MuSpec.attention_effective`); a
    # model parametrized on meta has no such record: the matmul scales of q's and k's layers are applied
    effective = dict(spec.__dict__.get("attention_effective") or {})
    plan = spec.__dict__.get("umup")
    matmul = dict(getattr(plan, "matmul_scales", None) or {}) if plan is not None else {}
    found: list[Finding] = []
    for c in calls:
        expected = effective.get(c.module)
        if expected is None:
            expected = want.get(c.module)
            if expected is None:
                expected = _mup_scale(spec, depth.to_base(c.module), c.head_dim)
            elif matmul:
                for source in (c.query, c.key):
                    expected *= matmul.get(source or "", 1.0)
        if expected is None or close(float(c.scale), expected, 1e-3):
            continue
        sqrt_d = c.head_dim**-0.5 if c.head_dim else math.nan
        cause = "attention_sqrt" if close(float(c.scale), sqrt_d, 1e-3) else "attention_other"
        found.append((c.module, "attention logit scale", float(c.scale), expected, cause))
    return found


def _mup_scale(spec: MuSpec, base_name: str, d: int | None) -> float | None:
    """µP's logit scale α·s₀·d₀/d of an attention module at head dim `d`, from the base's measured (d₀, s₀);
    None when the base's attention there was not measured (nothing to compare with: no alarm)."""
    measured = spec.shapes.attention_scales.get(base_name)
    if measured is None or not d:
        return None
    d0, s0 = measured
    return spec.multipliers.attention * s0 * d0 / d


def umup_factors(spec: MuSpec, name: str) -> dict[str, float]:
    """u-µP's factor of each update column (`UPDATE_COLUMNS`) for parameter `name`, as `param_groups` applies
    it: `rules.UMUP`'s row at the absolute fans (`MuSpec.column_factor`), so a u-µP trajectory carries what
    its updates scale with (µP's Table 3 exponents of the width ratios are not u-µP's)."""
    return {col: float(spec.column_factor(name, col)) for col in sorted(set(UPDATE_COLUMNS.values()))}


def _width_ratio(column: str, role: str, formulation: str, target: dict, proxy: dict) -> float:
    """How a quantity scaled like `column` moves from the proxy's layer to the target's: u-µP layers carry their
    factors (`umup_factors`), µP layers their width ratios to the base (the formulation's table)."""
    tf, pf = target.get("factors"), proxy.get("factors")
    if tf is not None and pf is not None and column in tf and column in pf and pf[column]:
        return float(tf[column]) / float(pf[column])
    rule = formulation_rules(formulation)[role]
    exps = getattr(rule, column)
    return factor(exps, target["m_in"], target["m_out"]) / factor(exps, proxy["m_in"], proxy["m_out"])


def umup_unit_findings(spec: MuSpec, record: dict, tolerance: float) -> list[Finding]:
    """u-µP at init: every weight layer's output has unit scale, times the constants `parametrize` installed on
    that output (α_embedding, α_ffn_act, the τ rule's branch multipliers; not the scaled matmul's 1/√fan_in,
    which is what brings it to one); a finding for a layer whose
    activation RMS is above `tolerance` × that. Only growth is a finding: a layer reading an attention average
    sits below 1 at init by design (a mean of unit vectors), a readout at 1/√fan_in (its 1/fan_in rule).

    Args:
        spec: a u-µP model's spec (``spec.umup`` set; anything else gives no finding).
        record: the first sample of a fresh run (layer → {"act_rms": …}).
        tolerance: the factor allowed above the expected scale.
    """
    plan = spec.__dict__.get("umup")
    if plan is None:
        return []
    out_mult: dict[str, float] = {}
    for module, side, c in plan.constants:
        if str(side) == str(Side.OUTPUT):
            out_mult[module] = out_mult.get(module, 1.0) * float(c)
    restoring = {**(getattr(plan, "matmul_scales", None) or {})}
    for module, c in (getattr(plan, "compensations", None) or {}).items():
        restoring[module] = restoring.get(module, 1.0) * c
    for module, c in restoring.items():  # the unit-restoring part (scaled matmul, compensation): not on top
        if module in out_mult:
            out_mult[module] /= float(c)
    found: list[Finding] = []
    for name, row in plan.rows.items():
        if row not in UNIT_ROWS:
            continue
        layer = layer_of(name)
        measured = record["layers"].get(layer, {}).get("act_rms")
        expected = abs(out_mult.get(layer, 1.0))
        if measured is not None and expected > 0 and measured > expected * tolerance:
            found.append((layer, "act_rms at init", float(measured), expected, "unit"))
    return found


def scaled_proxy(
    record: dict, proxy_record: dict, layers: dict, proxy_layers: dict, formulation: str
) -> dict[str, dict[str, float]]:
    """The proxy's sample of a step as µP predicts it at the target's widths: layer → quantity → expected
    value, for the layers both samples hold. Activation, output and attention-logit sizes are Θ(1) (the
    proxy's value as it is); update sizes scale like the role's adam_lr (RMS) and spectral_lr (‖ΔW‖₂)
    columns of the rules, times the ratio of the base lrs in effect (`record["lr_base"]`)."""
    lr_t, lr_p = record.get("lr_base"), proxy_record.get("lr_base")
    lr_ratio = lr_t / lr_p if lr_t and lr_p else 1.0
    out: dict[str, dict[str, float]] = {}
    for layer in record["layers"]:
        pq = proxy_record["layers"].get(layer)
        if not pq:
            continue
        checks: list[tuple[str, float]] = [(k, 1.0) for k in INVARIANT]
        meta, pmeta = layers.get(layer), proxy_layers.get(layer)
        if meta and pmeta and meta.get("role") in formulation_rules(formulation):
            for k, col in UPDATE_COLUMNS.items():
                checks.append((k, _width_ratio(col, meta["role"], formulation, meta, pmeta) * lr_ratio))
        expected = {k: pq[k] * ratio for k, ratio in checks if pq.get(k) is not None}
        if expected:
            out[layer] = expected
    return out


def width_ratio(layers: dict) -> float:
    """A run's width over the base's: the largest width ratio (m_in or m_out) of its layers (1 without any)."""
    return max((max(float(m.get("m_in", 1)), float(m.get("m_out", 1))) for m in layers.values()), default=1.0)


def trend_band(e1: float, e2: float, r1: float, r2: float, rt: float) -> tuple[float, float, float]:
    """The values µP allows at width ratio `rt` given a quantity's (width-scaled) values `e1` at the proxy's
    ratio `r1` and `e2` at a wider proxy's `r2`: the finite-width gap is taken to close like width^-½
    (the fluctuations' rate), so log e(r) = log e∞ + c·r^-½ through both points, extrapolated to `rt`.

    Returns:
        (low, high, extrapolated): the smallest and largest of e1, e2 and the extrapolation, and the
        extrapolation itself (e1 and e2 as they are when the widths do not allow one).
    """
    if not (e1 > 0 and e2 > 0 and r2 > r1 > 0 and rt > 0):
        return min(e1, e2), max(e1, e2), e2 if r2 > r1 else e1
    slope = (math.log(e1) - math.log(e2)) / (r1**-0.5 - r2**-0.5)
    et = math.exp(math.log(e2) + slope * (rt**-0.5 - r2**-0.5))
    return min(e1, e2, et), max(e1, e2, et), et


def proxy_findings(
    record: dict,
    proxy_record: dict,
    layers: dict,
    proxy_layers: dict,
    formulation: str,
    tolerance: float,
    wider: tuple[dict, dict] | None = None,
) -> list[Finding]:
    """The target's sample against the proxy's sample of the same step, each quantity width-scaled by the
    rules (`scaled_proxy`): attention logits are Θ(1) once trained, but at init they shrink like
    d_head^-½, so their band reaches down by √(d_proxy/d_target). A finding when the target is outside
    [expected / tolerance, expected × tolerance].

    `wider`: (the same step's sample, the layers) of a second proxy run at a larger width. A proxy far from
    the infinite-width limit differs from its target by more than noise; with two proxies the band spans
    both width-scaled values and their trend extrapolated to the target's width (`trend_band`), and the
    extrapolation is what the finding reports as expected."""
    found: list[Finding] = []
    others: dict[str, dict[str, float]] = {}
    ratios = (0.0, 0.0, 0.0)
    if wider is not None:
        others = scaled_proxy(record, wider[0], layers, wider[1], formulation)
        ratios = (width_ratio(proxy_layers), width_ratio(wider[1]), width_ratio(layers))
    for layer, expect in scaled_proxy(record, proxy_record, layers, proxy_layers, formulation).items():
        q, pq = record["layers"][layer], proxy_record["layers"][layer]
        for k, expected in expect.items():
            measured, base = q.get(k), pq[k]
            if measured is None or not base > 1e-12:
                continue
            lo_e = hi_e = expected
            other = others.get(layer, {}).get(k)
            if other is not None and other > 1e-12:
                lo_e, hi_e, expected = trend_band(lo_e, other, *ratios)
            low = lo_e / tolerance
            if k == "attn_logit_rms":
                # q·k/d: Θ(1) once training aligns q and k, but at init (q, k independent) Θ(d^-½) — so a
                # target below the proxy by up to √(d_proxy/d_target) is µP too; only growth is a finding
                d, d_p = q.get("head_dim"), pq.get("head_dim")
                low = lo_e * math.sqrt(d_p / d) / tolerance if d and d_p else 0.0
            if not (low <= measured <= hi_e * tolerance):
                if k in UPDATE_COLUMNS:
                    cause = "update"
                elif layer == "(model output)":
                    cause = "logits"
                else:
                    cause = INVARIANT[k]
                found.append((layer, k, float(measured), float(expected), cause))
    return found
