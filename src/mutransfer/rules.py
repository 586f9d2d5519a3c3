"""The µP rules as data: one place to read the whole parametrization.

Every quantity is a factor *relative to the base model*, written as exponents of the
parameter's two width ratios ``(m_in, m_out)``: a factor ``m_in**a * m_out**b`` is
the pair ``(a, b)``. ``m_in`` is fan_in/base_fan_in (1 when fan_in is finite) and ``m_out``
likewise for fan_out. Vector-like parameters (biases, norm gains, raw 1-width-dim tensors)
have their one width dim as fan_out. At base width every width ratio is 1, so every factor
is exactly 1 and µP equals the user's own model.

Roles (TP5 §4, Table 3 and Table 8):

- ``input``  fan_in finite, fan_out width: input weights, embeddings
- ``vector`` one width dim, not a weight: biases, norm gains (same rules as ``input``)
- ``hidden`` width → width
- ``output`` fan_in width, fan_out finite: the readout
- ``scalar`` no width dim: nothing scales

Columns: ``init`` (init std), ``forward`` (a multiplier applied in the forward pass), then one
lr column per *kind of update* and the ε columns that go with them (`OPTIMIZERS` says which
optimizer reads which column). µP asks the same of every optimizer: after a step, ``ΔW·x`` is
Θ(1) per coordinate (feature learning, nothing blows up). What differs is how the size of an
optimizer's step depends on the lr, so each kind gets its lr column:

- ``sgd_lr``: *linear* updates, ΔW = −lr·(a linear function of past gradients): SGD, momentum,
  Nesterov, heavy ball. The step scales with the gradient, which differs per role.
- ``adam_lr``: *entrywise-normalised* updates, every entry of ΔW is Θ(lr) whatever the gradient's
  scale: Adam/AdamW/Adamax/NAdam/RAdam/RMSprop/Adagrad (g/√v), Lion (sign of a momentum; its
  entries are exactly ±lr) and SOAP (Adam in a rotated basis; see `OPTIMIZERS`). This column
  is the entry size µP wants for ΔW, so it is the reference the other columns are written against.
- ``spectral_lr``: *spectrally normalised* updates, ‖ΔW‖₂ = Θ(lr): Muon (Newton–Schulz
  orthogonalisation: every singular value ≈ 1). The spectral condition (Yang, Simon & Bernstein
  2023): ‖ΔW‖₂ = Θ(√(fan_out/fan_in)).
  The µP update of a matrix is low-rank and aligned with the inputs (rank ≤ batch·steps while
  the width grows), so its spectral norm is its entry size × √(fan_out·fan_in):
  ``spectral_lr = adam_lr + (½, ½)``. Hidden: (−½, ½) = √(m_out/m_in).
- ``adafactor_lr``: *parameter-relative* updates, entries Θ(lr·RMS(W)): Adafactor as torch and
  the paper run it (step α = max(ε₂, RMS(W))·ρ). RMS(W) scales like the init std, so
  ``adafactor_lr = adam_lr − init`` (hidden: 1/√m_in; readout and input: 1).

ε columns. An ε that is added to a gradient statistic must scale like that statistic, or it
dominates at one end of the width range: ``adam_eps`` (Adam's ε next to √v, Adafactor's ε₁ that
floors √v) scales like a gradient entry, which is ``adam_lr − sgd_lr`` (a linear and a normalised
step of the same size differ by exactly the gradient's scale). Muon's ε only guards a division by
a norm and does not scale. Adafactor's ε₂ floors RMS(W), so it scales like the
init: it reads ``init``. The tests check every one of these identities row by row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import ModelError, OptimizerError

__all__ = [
    "BRANCH_MULTIPLIER",
    "DEFAULT_DEPTH_ALPHA",
    "DEFAULT_FORMULATION",
    "DEFAULT_OPTIMIZER",
    "DEFAULT_PARAMETRIZATION",
    "DEFAULT_WEIGHT_DECAY_POLICY",
    "DEPTH_RULES",
    "FORMULATIONS",
    "FORMULATION_ALIASES",
    "NO_MULTIPLIERS",
    "OPTIMIZERS",
    "PARAMETRIZATIONS",
    "READOUT_MULTIPLIER",
    "ROLES",
    "TABLE3",
    "TABLE8",
    "UMUP",
    "UMUP_DEPTH_ALPHA",
    "UMUP_HPARAMS",
    "UMUP_ROWS",
    "WEIGHT_DECAY_POLICIES",
    "DepthRule",
    "Exponents",
    "OptimizerRule",
    "Rule",
    "TunableMultipliers",
    "check_depth_alpha",
    "depth_factor",
    "factor",
    "formulation_name",
    "formulation_rules",
    "optimizer_family",
    "optimizer_rule",
    "parametrization_name",
    "umup_residual_mults",
]

Exponents = tuple[float, float]  # exponents of (m_in, m_out)

ROLES = ("input", "vector", "hidden", "output", "scalar")


@dataclass(frozen=True)
class Rule:
    """One role's µP rule: each column a pair of exponents of the width ratios (m_in, m_out).

    ``init`` (init std), ``forward`` (a forward constant), then an lr column per kind of update
    (``sgd_lr``, ``adam_lr``, ``spectral_lr``, ``adafactor_lr``) and ``adam_eps`` (ε of entrywise
    updates); `factor` turns a column into a number.
    """

    init: Exponents
    forward: Exponents
    sgd_lr: Exponents
    adam_lr: Exponents
    adam_eps: Exponents
    spectral_lr: Exponents
    adafactor_lr: Exponents


# TP5 Table 3: µP without forward constants. Zero forward overhead; the default.
TABLE3: dict[str, Rule] = {
    #                 init         forward     sgd_lr       adam_lr      adam_eps     spectral_lr  adafactor_lr
    "input": Rule((0.0, 0.0), (0.0, 0.0), (0.0, 1.0), (0.0, 0.0), (0.0, -1.0), (0.5, 0.5), (0.0, 0.0)),
    "vector": Rule((0.0, 0.0), (0.0, 0.0), (0.0, 1.0), (0.0, 0.0), (0.0, -1.0), (0.5, 0.5), (0.0, 0.0)),
    "hidden": Rule((-0.5, 0.0), (0.0, 0.0), (-1.0, 1.0), (-1.0, 0.0), (0.0, -1.0), (-0.5, 0.5), (-0.5, 0.0)),
    "output": Rule((-1.0, 0.0), (0.0, 0.0), (-1.0, 0.0), (-1.0, 0.0), (0.0, 0.0), (-0.5, 0.5), (0.0, 0.0)),
    "scalar": Rule((0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)),
}
# (input/vector: m_in ≡ 1, so their spectral exponents of m_in are written as the identity gives them)

# TP5 Table 8: the readout gets a forward constant 1/m_in and is treated like the other
# vector-like parameters. This is what the `mup` package does, and it is the only way to
# tie the input embedding to the readout (both then share the `input` init and lr).
TABLE8: dict[str, Rule] = {
    **TABLE3,
    "output": Rule((0.0, 0.0), (-1.0, 0.0), (1.0, 0.0), (0.0, 0.0), (-1.0, 0.0), (0.5, 0.5), (0.0, 0.0)),
}

# Formulation names that read without the paper; TP5's table numbers are accepted as aliases.
NO_MULTIPLIERS, READOUT_MULTIPLIER = "no_multipliers", "readout_multiplier"
FORMULATIONS: dict[str, dict[str, Rule]] = {NO_MULTIPLIERS: TABLE3, READOUT_MULTIPLIER: TABLE8}
FORMULATION_ALIASES = {"table3": NO_MULTIPLIERS, "table8": READOUT_MULTIPLIER}
DEFAULT_FORMULATION = NO_MULTIPLIERS


@dataclass(frozen=True)
class OptimizerRule:
    """Which columns of the tables one optimizer reads.

    ``lr``: the lr column of its update kind. ``eps``: the columns its ε option(s) follow, in the
    optimizer's own order (Adafactor's ``eps=(ε₁, ε₂)``); empty when it has none that scales.
    ``partner``: the optimizer that takes the parameters
    this one does not (Muon updates hidden matrices only; the rest go to AdamW, as it is run).
    ``depth``: the depth column (rules.DEPTH_RULES) of its lr; see the derivation there.
    """

    lr: str
    eps: tuple[str, ...] = ()
    kind: str = "entrywise"
    partner: str | None = None
    note: str = ""


_ADAM = OptimizerRule("adam_lr", ("adam_eps",), "entrywise")
# Every optimizer the library builds µP groups for. Derivations (the lr columns above say why each
# kind gets its column):
OPTIMIZERS: dict[str, OptimizerRule] = {
    # SGD, with or without momentum / Nesterov: ΔW is a fixed linear combination of past gradients,
    # so the step scales with the gradient exactly as plain SGD's does. Momentum and Nesterov do not
    # change any exponent (they transfer as HPs, TP5 Table 1). No ε.
    "sgd": OptimizerRule("sgd_lr", (), "linear", note="momentum and nesterov as torch.optim.SGD"),
    # Adam and relatives: g/√v has Θ(1) entries whatever the gradient's scale (TP4b: µP for
    # entrywise adaptive optimizers). ε sits next to √v: gradient-scaled.
    "adam": _ADAM,
    "adamw": _ADAM,
    "adamax": _ADAM,
    "nadam": _ADAM,
    "radam": _ADAM,
    "rmsprop": _ADAM,
    "adagrad": _ADAM,
    # Lion (Chen et al. 2023): ΔW = −lr·sign(β₁m + (1−β₁)g), every entry exactly ±lr: Adam's column
    # with no ε at all. Its decoupled decay is lr·wd per step, like AdamW.
    "lion": OptimizerRule("adam_lr", (), "entrywise", note="sign updates; no ε"),
    # Adafactor as torch runs it (and the paper): U = g/√V̂ with V̂ factored from row and column
    # means (for a rank-one gradient δxᵀ, V̂ = (δ²)(x²)ᵀ exactly, so U = sign(δ)sign(x)ᵀ as Adam),
    # then the step α = max(ε₂, RMS(W))·ρ_t with ρ_t = min(lr, 1/√t): relative to the parameter.
    # lr: adam − init (RMS(W) carries the init's scaling). ε₁ floors √V̂: gradient-scaled (adam_eps).
    # ε₂ floors RMS(W): init-scaled, so a zero-initialised readout steps by ε₂·ρ/m_in as µP wants.
    # Update clipping U/max(1, RMS(U)/d) divides by an average of Θ(1) entries that converges as
    # the width grows: width-consistent, nothing to scale. The 1/√t cap of ρ_t is the same number
    # for every group and would flatten µP's ratios once 1/√t < lr; mt.optim.Adafactor scales the
    # cap by each group's factor (see optimizers.Adafactor).
    "adafactor": OptimizerRule(
        "adafactor_lr", ("adam_eps", "init"), "relative", note="torch.optim.Adafactor: relative step; ε = (ε₁, ε₂)"
    ),
    # Muon (Jordan et al. 2024; torch.optim.Muon): the momentum of a 2-D matrix orthogonalised by
    # Newton–Schulz, every singular value ≈ 1, so ‖ΔW‖₂ = lr·adjust(shape): the spectral column,
    # divided by how torch's `adjust_lr_fn` changes between the base shape and this one (so the
    # product is µP's, never both: see optim.muon_adjust_ratio). Its ε only guards a division by
    # the Frobenius norm (scale-free): not scaled. Only hidden matrices: embeddings, readout,
    # vectors, scalars and tensors that are not 2-D go to the AdamW partner with Adam's columns.
    "muon": OptimizerRule(
        "spectral_lr", (), "spectral", partner="adamw", note="torch.optim.Muon for hidden matrices, AdamW for the rest"
    ),
    # SOAP (Vyas et al. 2024; pytorch_optimizer.SOAP): Adam run in the eigenbasis of Shampoo's factors
    # GGᵀ and GᵀG. The rotation is orthogonal, so the step's entries keep Adam's size Θ(lr). The part of
    # a gradient that lies in the span of the earlier ones (the eigenbasis's top block) gets a
    # spectral-size step, Θ(lr) per coordinate of ΔW·x; the part outside it — fresh inputs put a Θ(1)
    # share there at every step — rotates into a generic basis of the complement, where Adam's
    # normalised update is as aligned with the inputs as in the standard basis: Θ(lr·fan_in) per
    # coordinate. That part dominates as the width grows, so SOAP follows Adam's columns, ε included
    # (in a generic basis the rotated gradient's entries have the gradient's scale). Measured: the
    # coordinate check passes with these and fails with the spectral column (hidden updates grow
    # like √width). (Shampoo itself, L^-¼GR^-¼, is not scale-invariant: its step grows like √‖G‖,
    # and it has no width-independent exponent without grafting; SOAP is the family member offered.)
    "soap": OptimizerRule(
        "adam_lr", ("adam_eps",), "entrywise", note="pytorch_optimizer.SOAP: Adam in a rotated basis"
    ),
}
# Weight decay: torch's AdamW and SGD decay by lr·wd per step, so a group whose lr shrinks
# also decays more slowly. "lr_wd_constant" divides wd by the group's lr factor, keeping the
# per-step decay (and the decay timescale) of the base model; "independent" keeps wd fixed.
WEIGHT_DECAY_POLICIES = ("lr_wd_constant", "independent")
DEFAULT_WEIGHT_DECAY_POLICY = "lr_wd_constant"

# The optimizer `coord_check` (and `mutransfer coord-check`) uses when none is named.
DEFAULT_OPTIMIZER = "adam"


# Depth (TP6 Depth-µP α = ½; CompleteP, Dey et al. 2025, α = 1). m_L = L/L₀, the number of
# residual blocks over the base model's. Every exponent is linear in α: the pair (c, k) means
# m_L ** (c + k·α). Every residual branch's output is multiplied by m_L^-α (BRANCH_MULTIPLIER).
# Parameters inside the repeated blocks follow the "block" row; everything outside them
# (embeddings, final norm, readout) the "outside" row: depth changes nothing there.
#
# Why (the derivations the tests check numerically): behind the branch multiplier, the gradient
# of every parameter in a block scales like m_L^-α. Each block's update should move the residual
# stream by Θ(1/L) (L blocks then add up to Θ(1)), i.e. m_L^-α · |ΔW| ∝ 1/L:
#   linear (SGD, momentum):     |ΔW| ∝ lr · m_L^-α  → lr ∝ m_L^(2α-1)  (½: unchanged as TP6)
#   normalised (Adam, Lion, Adafactor, Muon, SOAP): |ΔW| ∝ lr whatever the gradient's scale
#                               → lr ∝ m_L^(α-1)     (½: m_L^-½ as TP6; 1: unchanged)
#   every gradient-scaled ε (Adam, Adafactor ε₁, SOAP) → ε ∝ m_L^-α. Depth changes no shape, so the
#   spectral and entrywise columns move alike; Adafactor's lr is adam − init, and init does not
#   move in a block. Adafactor's ε₂ follows the init column.
# Init is not scaled with depth (both papers). Weight decay follows the lr through the policy.
#
# "branch_end": with formulation "table3" (no forward constants), the multiplier of a branch
# whose output comes straight out of a Linear/Conv layer is folded into that layer instead
# (abc-symmetry: W' = m_L^-α·W): init × m_L^-α, and to keep W' = m_L^-α·W at every step, a
# normalised step × m_L^-α and its ε × m_L^α on top of the block row, SGD lr × m_L^-2α; Adafactor's
# relative step already carries the init's m_L^-α through RMS(W), so its lr stays the block row's.
# Same function and trajectory as the multiplier (tests check it), zero forward overhead.


@dataclass(frozen=True)
class DepthRule:
    """One place's depth rule (outside the blocks, in a block, a branch end): per column, ``(c, k)``.

    A column's factor is m_L ** (c + k·α), m_L = depth / base depth and α the depth exponent
    (`depth_factor`); the columns are those of `Rule` that depth changes.
    """

    init: tuple[float, float]
    sgd_lr: tuple[float, float]
    adam_lr: tuple[float, float]
    adam_eps: tuple[float, float]
    spectral_lr: tuple[float, float]
    adafactor_lr: tuple[float, float]


BRANCH_MULTIPLIER = (0.0, -1.0)  # m_L^-α on every residual branch output
DEPTH_RULES: dict[str, DepthRule] = {
    #                       init          sgd_lr       adam_lr      adam_eps     spectral_lr  adafactor_lr
    "outside": DepthRule((0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)),
    "block": DepthRule((0.0, 0.0), (-1.0, 2.0), (-1.0, 1.0), (0.0, -1.0), (-1.0, 1.0), (-1.0, 1.0)),
    "branch_end": DepthRule((0.0, -1.0), (-1.0, 0.0), (-1.0, 0.0), (0.0, 0.0), (-1.0, 0.0), (-1.0, 1.0)),
}
DEFAULT_DEPTH_ALPHA = 1.0  # CompleteP: the paper's best; 0.5 is Depth-µP; 0 turns depth scaling off


def depth_factor(exponent: tuple[float, float], m_depth: float, alpha: float) -> float:
    """m_L ** (c + k·α), exactly 1.0 at base depth."""
    c, k = exponent
    e = c + k * alpha
    return 1.0 if (m_depth == 1.0 or e == 0.0) else float(m_depth**e)


def check_depth_alpha(alpha: object, name: str = "depth_alpha") -> float:
    """`alpha` as a float in [0, 1]; TypeError/ValueError naming `name` otherwise (the one check of
    depth_alpha: parametrize, the sweep config and the CLI)."""
    message = f"{name} must be a number in [0, 1] (0.5 Depth-µP, 1.0 CompleteP, 0 no depth scaling), got {alpha!r}"
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(message)
    if not 0.0 <= alpha <= 1.0:
        raise ModelError(message)
    return float(alpha)


def factor(exponents: Exponents, m_in: float, m_out: float) -> float:
    """The µP factor ``m_in**a * m_out**b`` of a pair of exponents: the only place exponents become numbers.

    Args:
        exponents: ``(a, b)``, the exponents of the width ratios (a column of a `Rule`).
        m_in: the fan_in width ratio (1 for a finite fan_in).
        m_out: the fan_out width ratio (1 for a finite fan_out).

    Returns:
        The factor; exactly 1.0 when both width ratios are 1.
    """
    a, b = exponents
    out = 1.0
    if a and m_in != 1.0:
        out *= m_in**a
    if b and m_out != 1.0:
        out *= m_out**b
    return out


def optimizer_rule(name: str) -> OptimizerRule:
    """The rule of the optimizer called `name` (case-insensitive); a clear error otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"optimizer must be a name such as 'adamw', 'sgd', 'muon' or 'lion', got {type(name).__name__}")
    key = name.lower()
    if key not in OPTIMIZERS:
        raise OptimizerError(f"unknown optimizer '{name}'; use one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[key]


def optimizer_family(name: str) -> str:
    """The optimizer's canonical name (checked): what per-optimizer defaults are keyed by."""
    optimizer_rule(name)
    return name.lower()


def formulation_name(name: str) -> str:
    """The canonical name of a formulation: "no_multipliers" (TP5 Table 3, alias "table3") or
    "readout_multiplier" (Table 8, alias "table8")."""
    canonical = FORMULATION_ALIASES.get(name, name) if isinstance(name, str) else name
    if canonical not in FORMULATIONS:
        raise ModelError(
            f"unknown formulation {name!r}; use 'no_multipliers' (TP5 Table 3: init and lr carry the "
            "scaling, no forward constant; default; alias 'table3') or 'readout_multiplier' (Table 8: "
            "the readout multiplies by 1/m, as the mup package; alias 'table8')"
        )
    return canonical


def formulation_rules(name: str) -> dict[str, Rule]:
    """The rule of every role under a formulation.

    Args:
        name: a formulation name or alias (see `formulation_name`).

    Returns:
        Role → `Rule` (`TABLE3` or `TABLE8`).

    Raises:
        ModelError: for an unknown formulation.
    """
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
                    raise ModelError(f"{what}_mult has unknown role '{role}'; roles are {', '.join(ROLES)}")
                if not isinstance(value, (int, float)) or value < 0:
                    raise ModelError(f"{what}_mult['{role}'] must be a non-negative number, got {value!r}")
        for what in ("output", "attention", "embedding"):
            value = getattr(self, what)
            if not isinstance(value, (int, float)):
                raise TypeError(f"{what}_mult must be a number, got {type(value).__name__}")

    def init_mult(self, role: str) -> float:
        """The tunable init factor of `role` (1.0 unless set).

        Args:
            role: one of `ROLES`.

        Returns:
            The factor the role's init std is multiplied by, at every width.
        """
        return float(self.init.get(role, 1.0))

    def lr_mult(self, role: str) -> float:
        """The tunable lr factor of `role` (1.0 unless set).

        Args:
            role: one of `ROLES`.

        Returns:
            The factor the role's learning rate is multiplied by, at every width.
        """
        return float(self.lr.get(role, 1.0))


# ---------------------------------------------------------------------------------------------- u-µP
#
# u-µP (Blake et al., "u-µP: The Unit-Scaled Maximal Update Parametrization", ICLR 2025) is µP with
# unit scaling on top. Its rules are *absolute*: a column's pair (a, b) means fan_in**a * fan_out**b
# of the parameter's own fans (not of its width ratios), so u-µP is not the user's model at the base
# width: every weight starts at unit variance and each matmul carries its own fixed scale.
#
# Rows: "embedding" (an input weight used by lookup: gathered rows), "input" (an input weight used by a
# contraction over a finite fan_in: a Linear or Conv on the raw input), "hidden", "output" (the readout),
# "vector" (biases, norm gains), "scalar". `UMUP_ROWS` says which µP role each row has.
#
# Derivation. u-µP's weight w starts at unit variance and the forward computes W = A·w with the
# `forward` multiplier A (unit scaling's matmul scale: fan_in^-½ keeps W·x unit when x is unit; the
# readout gets µP's 1/fan_in; a lookup needs none). abc-symmetry (TP5 §5) says a multiplier A on w is
# the same network as the plain W = A·w trained with init × A, Adam lr × A and SGD lr × A². So
# u-µP is µP exactly when, for the plain W, init std, Adam lr and SGD lr scale as TP5 Table 3
# (`TABLE3`, here in absolute fans: hidden init fan_in^-½, Adam lr 1/fan_in, SGD lr fan_out/fan_in;
# readout init 1/fan_in, Adam lr 1/fan_in, SGD lr 1/fan_in; input and vectors 1, 1, fan_out):
#   init(w)   = init(W) / A        → 1 for every weight (unit variance: what unit scaling asks);
#   adam(w)   = adam(W) / A        → hidden fan_in^-½, readout 1, vectors 1;
#   sgd(w)    = sgd(W) / A²        → hidden fan_out, readout fan_in, input fan_out·fan_in;
#   adam_eps  = adam − sgd (the gradient's scale, as in µP's tables), spectral = adam + (½, ½),
#   adafactor = adam − init.
# Two places where u-µP departs from the shift, both from the paper:
#   - the embedding lr: u-µP's Adam lr of an embedding is fan_out^-½ (its "embedding LR rule",
#     §4.4 of the paper; graphcore's unit-scaling library uses it), not µP's 1; the update of an
#     embedding row then shrinks like width^-½. SGD and ε follow the same factor;
#   - the finite-fan_in input layer: a "weight" to unit scaling, so fan_in^-½ for A and Adam lr
#     (a constant at every width: µP only asks Θ(1)).
# Vectors (biases, norm gains) keep the model's own init (a gain of 1 is unit already; biases carry
# no matmul), as in µP.
UMUP_ROWS = {
    "embedding": "input",
    "input": "input",
    "vector": "vector",
    "hidden": "hidden",
    "output": "output",
    "scalar": "scalar",
}
UMUP: dict[str, Rule] = {
    #                     init        forward      sgd_lr       adam_lr      adam_eps       spectral_lr  adafactor_lr
    "embedding": Rule((0.0, 0.0), (0.0, 0.0), (0.0, 0.5), (0.0, -0.5), (0.0, -1.0), (0.5, 0.0), (0.0, -0.5)),
    "input": Rule((0.0, 0.0), (-0.5, 0.0), (1.0, 1.0), (-0.5, 0.0), (-1.5, -1.0), (0.0, 0.5), (-0.5, 0.0)),
    "vector": Rule((0.0, 0.0), (0.0, 0.0), (0.0, 1.0), (0.0, 0.0), (0.0, -1.0), (0.5, 0.5), (0.0, 0.0)),
    "hidden": Rule((0.0, 0.0), (-0.5, 0.0), (0.0, 1.0), (-0.5, 0.0), (-0.5, -1.0), (0.0, 0.5), (-0.5, 0.0)),
    "output": Rule((0.0, 0.0), (-1.0, 0.0), (1.0, 0.0), (0.0, 0.0), (-1.0, 0.0), (0.5, 0.5), (0.0, 0.0)),
    "scalar": Rule((0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)),
}
# u-µP scales depth as Depth-µP: residual branches × L^-½ (through the τ rule below), and the Adam lr
# of the parameters in the blocks × L^-½ (the "block" row of DEPTH_RULES at α = ½, with m_L = L: absolute).
UMUP_DEPTH_ALPHA = 0.5

MUP, UMUP_NAME = "mup", "u-mup"
PARAMETRIZATIONS = (MUP, UMUP_NAME)
DEFAULT_PARAMETRIZATION = MUP
# u-µP's hyperparameters (the paper's set, each 1 by default) → what they multiply. α_output and
# α_attn-softmax are the library's `output_mult` and `attn_mult` (the same places in the forward).
UMUP_HPARAMS: dict[str, str] = {
    "alpha_res": "the residual branches' total contribution to the stream relative to the embedding's (τ rule)",
    "alpha_res_attn_ratio": "the attention branches' contribution relative to the MLP branches' (τ rule)",
    "alpha_attn_softmax": "the attention logits: softmax(α · q·k / d_head) (the library's attn_mult)",
    "alpha_ffn_act": "the input of the MLP's nonlinearity: f(α·x)/α, unit-scaled after",
    "alpha_output": "the readout: α · W x / fan_in (the library's output_mult)",
    "alpha_loss_softmax": "the logits as the loss's softmax sees them (× the readout's multiplier)",
}


def parametrization_name(name: object) -> str:
    """The canonical parametrization name: "mup" (default) or "u-mup" (aliases "umup", "u-µP", "u_mup").

    Args:
        name: what the user passed as ``parametrization``.

    Returns:
        "mup" or "u-mup".

    Raises:
        ModelError: any other name (a ValueError listing the choices).
        TypeError: not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"parametrization must be a string, one of {', '.join(PARAMETRIZATIONS)}; got {name!r}")
    key = name.strip().lower().replace("µ", "mu").replace("μ", "mu").replace("_", "-")
    key = {"umup": UMUP_NAME, "unit-mup": UMUP_NAME}.get(key, key)
    if key not in PARAMETRIZATIONS:
        raise ModelError(
            f"unknown parametrization {name!r}; use one of {', '.join(repr(p) for p in PARAMETRIZATIONS)} "
            "('mup': µP relative to the base model, the default; 'u-mup': unit-scaled µP, Blake et al. 2025)"
        )
    return key


def umup_residual_mults(kinds: list[str], alpha_res: float = 1.0, alpha_res_attn_ratio: float = 1.0) -> list[float]:
    """u-µP's τ rule as one multiplier per residual branch, for a pre-norm stack.

    u-µP keeps the residual stream at unit scale with ``x ← (x + τ_k f_k(x)) / √(1 + τ_k²)``, τ_k
    chosen so that the embedding contributes 1 to the final stream's variance, all attention
    branches together α_attn² and all MLP branches α_mlp², with α_mlp = α_res·√(2 / (1 + ρ²)) and
    α_attn = ρ·α_mlp (ρ = α_res_attn_ratio): the average of the two is α_res², their ratio ρ²
    (Appendix G of the paper). Unrolled, the stream before the final norm is
    ``(emb + Σ_k c_k f_k) / √(1 + Σ c_k²)`` with c_k = α_kind / √n_kind. Each branch reads the stream
    through a norm (pre-norm) and the readout through the final norm, so dropping the overall
    1/√(…) changes nothing they compute: the τ rule *is* a multiplier c_k on each branch's output,
    which folds into the branch's last layer (`mt.export`).

    Args:
        kinds: per branch, in forward order, "attention" or "mlp".
        alpha_res: α_res.
        alpha_res_attn_ratio: α_res-attn-ratio (ρ).

    Returns:
        c_k per branch. A stack with one kind of branch only gives each α_res / √n.
    """
    n_attn, n_mlp = kinds.count("attention"), kinds.count("mlp")
    if n_attn and n_mlp:
        a_mlp = alpha_res * (2.0 / (1.0 + alpha_res_attn_ratio**2)) ** 0.5
        a_attn = alpha_res_attn_ratio * a_mlp
    else:
        a_mlp = a_attn = alpha_res
    return [(a_attn / n_attn**0.5) if k == "attention" else (a_mlp / n_mlp**0.5) for k in kinds]
