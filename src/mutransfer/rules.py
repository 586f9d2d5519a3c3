"""The µP rules as data: one place to read the whole parametrization.

Every quantity is a factor *relative to the base model*, written as exponents of the
parameter's two width multipliers ``(m_in, m_out)``: a factor ``m_in**a * m_out**b`` is
the pair ``(a, b)``. ``m_in`` is fan_in/base_fan_in (1 when fan_in is finite) and ``m_out``
likewise for fan_out. Vector-like parameters (biases, norm gains, raw 1-width-dim tensors)
have their one width dim as fan_out. At base width every multiplier is 1, so every factor
is exactly 1 and µP equals the user's own model.

Roles (TP5 §4, Table 3 and Table 8):

- ``input``  fan_in finite, fan_out width: input weights, embeddings
- ``vector`` one width dim, not a weight: biases, norm gains (same rules as ``input``)
- ``hidden`` width → width
- ``output`` fan_in width, fan_out finite: the readout
- ``scalar`` no width dim: nothing scales

Columns: ``init`` (init std), ``forward`` (a multiplier applied in the forward pass),
``sgd_lr``, ``adam_lr``, ``adam_eps``. Adam's ε must scale like the gradient of the
group, and the gradient scales as ``adam_lr / sgd_lr`` (both give the same Θ(1) update), so
``adam_eps = adam_lr - sgd_lr`` holds row by row; the tests check that identity.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["Exponents", "ROLES", "Rule", "TABLE3", "TABLE8", "FORMULATIONS", "OPTIMIZER_FAMILIES",
           "WEIGHT_DECAY_POLICIES", "DEFAULT_WEIGHT_DECAY_POLICY", "DepthRule", "BRANCH_MULTIPLIER",
           "DEPTH_RULES", "DEFAULT_DEPTH_ALPHA", "depth_factor", "check_depth_alpha", "factor",
           "optimizer_family", "formulation_rules", "formulation_name", "Multipliers", "TunableMultipliers",
           "NO_MULTIPLIERS", "READOUT_MULTIPLIER", "FORMULATION_ALIASES", "DEFAULT_FORMULATION"]

Exponents = tuple[float, float]  # exponents of (m_in, m_out)

ROLES = ("input", "vector", "hidden", "output", "scalar")


@dataclass(frozen=True)
class Rule:
    init: Exponents
    forward: Exponents
    sgd_lr: Exponents
    adam_lr: Exponents
    adam_eps: Exponents


# TP5 Table 3: µP without forward multipliers. Zero forward overhead; the default.
TABLE3: dict[str, Rule] = {
    #                 init         forward     sgd_lr      adam_lr     adam_eps
    "input":   Rule((0.0, 0.0),  (0.0, 0.0), (0.0, 1.0),  (0.0, 0.0), (0.0, -1.0)),
    "vector":  Rule((0.0, 0.0),  (0.0, 0.0), (0.0, 1.0),  (0.0, 0.0), (0.0, -1.0)),
    "hidden":  Rule((-0.5, 0.0), (0.0, 0.0), (-1.0, 1.0), (-1.0, 0.0), (0.0, -1.0)),
    "output":  Rule((-1.0, 0.0), (0.0, 0.0), (-1.0, 0.0), (-1.0, 0.0), (0.0, 0.0)),
    "scalar":  Rule((0.0, 0.0),  (0.0, 0.0), (0.0, 0.0),  (0.0, 0.0), (0.0, 0.0)),
}

# TP5 Table 8: the readout gets a forward multiplier 1/m_in and is treated like the other
# vector-like parameters. This is what the `mup` package does, and it is the only way to
# tie the input embedding to the readout (both then share the `input` init and lr).
TABLE8: dict[str, Rule] = {
    **TABLE3,
    "output":  Rule((0.0, 0.0),  (-1.0, 0.0), (1.0, 0.0),  (0.0, 0.0), (-1.0, 0.0)),
}

# Formulation names that read without the paper; TP5's table numbers are accepted as aliases.
NO_MULTIPLIERS, READOUT_MULTIPLIER = "no_multipliers", "readout_multiplier"
FORMULATIONS: dict[str, dict[str, Rule]] = {NO_MULTIPLIERS: TABLE3, READOUT_MULTIPLIER: TABLE8}
FORMULATION_ALIASES = {"table3": NO_MULTIPLIERS, "table8": READOUT_MULTIPLIER}
DEFAULT_FORMULATION = NO_MULTIPLIERS

# Optimizer names → the family whose lr column applies. SGD momentum and Nesterov are linear
# in the gradient, so they follow SGD; entrywise-normalising optimizers follow Adam.
OPTIMIZER_FAMILIES: dict[str, str] = {
    "sgd": "sgd",
    "adam": "adam",
    "adamw": "adam",
    "adamax": "adam",
    "nadam": "adam",
    "radam": "adam",
    "rmsprop": "adam",
    "adagrad": "adam",
}

# Weight decay: torch's AdamW and SGD decay by lr·wd per step, so a group whose lr shrinks
# also decays more slowly. "lr_wd_constant" divides wd by the group's lr factor, keeping the
# per-step decay (and the decay timescale) of the base model; "independent" keeps wd fixed.
WEIGHT_DECAY_POLICIES = ("lr_wd_constant", "independent")
DEFAULT_WEIGHT_DECAY_POLICY = "lr_wd_constant"


# Depth (TP6 Depth-µP α = ½; CompleteP, Dey et al. 2025, α = 1). m_L = L/L₀, the number of
# residual blocks over the base model's. Every exponent is linear in α: the pair (c, k) means
# m_L ** (c + k·α). Every residual branch's output is multiplied by m_L^-α (BRANCH_MULTIPLIER).
# Parameters inside the repeated blocks follow the "block" row; everything outside them
# (embeddings, final norm, readout) the "outside" row: depth changes nothing there.
#
# Why (the derivations the tests check numerically): behind the branch multiplier, the gradient
# of every parameter in a block scales like m_L^-α. Each block's update should move the residual
# stream by Θ(1/L) (L blocks then add up to Θ(1)), i.e. m_L^-α · |ΔW| ∝ 1/L:
#   Adam:  |ΔW| ∝ lr                  → lr ∝ m_L^(α-1)   (½: m_L^-½ as TP6; 1: unchanged)
#   SGD:   |ΔW| ∝ lr · m_L^-α         → lr ∝ m_L^(2α-1)  (½: unchanged as TP6)
#   Adam ε scales like the gradient   → ε ∝ m_L^-α       (adam_eps = adam_lr - sgd_lr)
# Init is not scaled with depth (both papers). Weight decay follows the lr through the policy.
#
# "branch_end": with formulation "table3" (no forward multipliers), the multiplier of a branch
# whose output comes straight out of a Linear/Conv layer is folded into that layer instead
# (abc-symmetry: W' = m_L^-α·W): init × m_L^-α, and to keep W' = m_L^-α·W at every step,
# Adam lr × m_L^-α and ε × m_L^α on top of the block row, SGD lr × m_L^-2α. Same function and
# trajectory as the multiplier (tests check it), zero forward overhead.


@dataclass(frozen=True)
class DepthRule:
    init: tuple[float, float]
    sgd_lr: tuple[float, float]
    adam_lr: tuple[float, float]
    adam_eps: tuple[float, float]


BRANCH_MULTIPLIER = (0.0, -1.0)  # m_L^-α on every residual branch output
DEPTH_RULES: dict[str, DepthRule] = {
    #                       init          sgd_lr       adam_lr      adam_eps
    "outside":    DepthRule((0.0, 0.0),   (0.0, 0.0),  (0.0, 0.0),  (0.0, 0.0)),
    "block":      DepthRule((0.0, 0.0),   (-1.0, 2.0), (-1.0, 1.0), (0.0, -1.0)),
    "branch_end": DepthRule((0.0, -1.0),  (-1.0, 0.0), (-1.0, 0.0), (0.0, 0.0)),
}
DEFAULT_DEPTH_ALPHA = 1.0  # CompleteP: the paper's best; 0.5 is Depth-µP; 0 turns depth scaling off


def depth_factor(exponent: tuple[float, float], m_depth: float, alpha: float) -> float:
    """m_L ** (c + k·α), exactly 1.0 at base depth."""
    c, k = exponent
    e = c + k * alpha
    return 1.0 if (m_depth == 1.0 or e == 0.0) else float(m_depth ** e)


def check_depth_alpha(alpha, name: str = "depth_alpha") -> float:
    """`alpha` as a float in [0, 1]; TypeError/ValueError naming `name` otherwise (the one check of
    depth_alpha: parametrize, the sweep config and the CLI)."""
    message = (f"{name} must be a number in [0, 1] (0.5 Depth-µP, 1.0 CompleteP, 0 no depth scaling), "
               f"got {alpha!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(message)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(message)
    return float(alpha)


def factor(exponents: Exponents, m_in: float, m_out: float) -> float:
    """m_in**a * m_out**b, exactly 1.0 when both multipliers are 1."""
    a, b = exponents
    out = 1.0
    if a and m_in != 1.0:
        out *= m_in ** a
    if b and m_out != 1.0:
        out *= m_out ** b
    return out


def optimizer_family(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"optimizer must be a name such as 'sgd', 'adam' or 'adamw', got {type(name).__name__}")
    key = name.lower()
    if key not in OPTIMIZER_FAMILIES:
        raise ValueError(f"unknown optimizer '{name}'; use one of {', '.join(sorted(OPTIMIZER_FAMILIES))}")
    return OPTIMIZER_FAMILIES[key]


def formulation_name(name: str) -> str:
    """The canonical name of a formulation: "no_multipliers" (TP5 Table 3, alias "table3") or
    "readout_multiplier" (Table 8, alias "table8")."""
    canonical = FORMULATION_ALIASES.get(name, name) if isinstance(name, str) else name
    if canonical not in FORMULATIONS:
        raise ValueError(f"unknown formulation {name!r}; use 'no_multipliers' (TP5 Table 3: init and lr carry the "
                         "scaling, no forward multiplier; default; alias 'table3') or 'readout_multiplier' (Table 8: "
                         "the readout multiplies by 1/m, as the mup package; alias 'table8')")
    return canonical


def formulation_rules(name: str) -> dict[str, Rule]:
    return FORMULATIONS[formulation_name(name)]


@dataclass
class TunableMultipliers:
    """Tunable multipliers (µTransfer HPs: α_output, α_attention, α_embedding, per-role init and lr
    factors). They apply at every width, base included. Distinct words in this library: the
    *width ratio* m = width / base width (fixed by the shapes), these *tunable multipliers* (HPs
    you sweep), and *forward constants* (the few factors µP puts in a forward pass, `spec.forward_constants`).

    ``init`` and ``lr`` are per-role factors; ``output`` (α_output) multiplies the readout's
    forward pass, ``attention`` (α_attention) the attention logits, ``embedding``
    (α_embedding) the output of input layers (embeddings, input projections).
    """

    init: dict[str, float] = field(default_factory=dict)
    lr: dict[str, float] = field(default_factory=dict)
    output: float = 1.0
    attention: float = 1.0
    embedding: float = 1.0

    def __post_init__(self) -> None:
        for what in ("init", "lr"):
            table = getattr(self, what)
            if not isinstance(table, Mapping):
                raise TypeError(f"{what}_mult must be a dict of role → float, got {type(table).__name__}")
            for role, value in table.items():
                if role not in ROLES:
                    raise ValueError(f"{what}_mult has unknown role '{role}'; roles are {', '.join(ROLES)}")
                if not isinstance(value, (int, float)) or value < 0:
                    raise ValueError(f"{what}_mult['{role}'] must be a non-negative number, got {value!r}")
        for what in ("output", "attention", "embedding"):
            value = getattr(self, what)
            if not isinstance(value, (int, float)):
                raise TypeError(f"{what}_mult must be a number, got {type(value).__name__}")

    def init_mult(self, role: str) -> float:
        return float(self.init.get(role, 1.0))

    def lr_mult(self, role: str) -> float:
        return float(self.lr.get(role, 1.0))


Multipliers = TunableMultipliers  # the earlier name, kept for code that imports it
