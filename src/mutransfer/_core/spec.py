"""The µP spec kept on a parametrized model, and how to find it through wrappers."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..errors import ModelError
from ..rules import (
    DEPTH_RULES,
    MUP,
    UMUP,
    DepthRule,
    Rule,
    TunableMultipliers,
    depth_factor,
    factor,
    formulation_rules,
    optimizer_rule,
)
from .attention import AttentionScale
from .init_law import InitLaw
from .naming import DDP_ATTR, WRAPPER_ATTRS
from .roles import ParamInfo
from .shapes import WidthShapes
from .umup import UMuPPlan

__all__ = ["SPEC_ATTR", "MuSpec", "find_spec", "require_spec", "spec_holder"]

SPEC_ATTR = "_mutransfer_spec"
# Attributes under which wrappers keep the user's model: torch.compile, DDP/DataParallel, FSDP1, checkpointing.
_WRAPPED_ATTRS = (WRAPPER_ATTRS[0], DDP_ATTR) + WRAPPER_ATTRS[1:]


@dataclass
class MuSpec:
    """What `parametrize` decided, stored on the model as a plain attribute.

    A plain attribute survives `copy.deepcopy` and `torch.compile` (the compiled wrapper keeps
    the original module). A state_dict does not carry it: rebuild by constructing the model,
    calling `parametrize` the same way, then `load_state_dict`.
    """

    shapes: WidthShapes
    params: dict[str, ParamInfo]
    formulation: str
    multipliers: TunableMultipliers  # the tunable ones (α_output, …), as passed to parametrize
    init_scales: dict[str, float] = field(default_factory=dict)
    init_source: str = "base values"
    # module → (Side.INPUT or Side.OUTPUT, constant): the forward constants parametrize installed
    forward_constants: dict[str, tuple[str, float]] = field(default_factory=dict)
    attention: list[AttentionScale] = field(default_factory=list)  # one per attention module, as installed
    zero_init: list[str] = field(default_factory=list)
    depth_alpha: float = 0.0
    depth: dict[str, tuple[int, int]] = field(default_factory=dict)  # container → (L₀, L)
    branches: dict[str, float] = field(default_factory=dict)  # module (or helper block) → multiplier
    folded_branches: dict[str, float] = field(default_factory=dict)  # layer holding a folded multiplier
    # parameter → why its values were kept, not rescaled (not a random init: constant, structured, …)
    kept_values: dict[str, str] = field(default_factory=dict)
    # module → output multiplier installed to undo a width-dependent constant the forward applies after the
    # module (embedding × √hidden in the parent's code, an inline 1/√d moved onto the query projection):
    # the coordinate check measures that output without it
    compensated: dict[str, float] = field(default_factory=dict)
    # parameter → the law of its µP init (read off the base's values, × µP's factor): what mt.init_weights draws
    init_laws: dict[str, InitLaw] = field(default_factory=dict)
    # parameter → pieces (dim, start, stop, factor) its init multiplies on top of the law: rows of another role,
    # zero-initialised readouts and queries (factor 0; stop None: to the end)
    init_pieces: dict[str, list[tuple[int, int, int | None, float]]] = field(default_factory=dict)
    init_pending: bool = False  # parametrized on meta: no init drawn yet (mt.init_weights draws it)
    init_seed: int | None = None  # the seed of the last mt.init_weights
    # parameter → µP's RMS of its init (the law's, with its pieces; measured when no law is known; None: unknown)
    init_rms: dict[str, float | None] = field(default_factory=dict)
    parametrization: str = MUP  # "mup" or "u-mup" (rules.PARAMETRIZATIONS)
    umup: UMuPPlan | None = None  # u-µP's plan (rows, fans, constants, residual multipliers), for "u-mup"
    # attention module → the constant multiplying q·kᵀ as the recorder measures it on the probe right after
    # parametrize installed everything (u-µP: its scaled matmuls' 1/√fan_in on q and k included, however the
    # model's own code carries them to the attention): what the monitor compares a later measurement with
    attention_effective: dict[str, float] = field(default_factory=dict)

    def expected_rms(self, name: str) -> float:
        """µP's RMS of parameter `name`'s init: its law's, with the pieces its init multiplies (rows, zeros).

        Args:
            name: a parameter with a law (a key of `init_laws`).

        Returns:
            The root mean square a draw of the law has, in expectation.
        """
        law = self.init_laws[name]
        shape = self.params[name].shape
        numel = 1
        for s in shape:
            numel *= s
        mean_sq = 1.0
        for dim, start, stop, c in self.init_pieces.get(name, []):
            rows = (shape[dim] if stop is None else stop) - start
            frac = rows / shape[dim] if shape else 1.0
            mean_sq += frac * (c * c - 1.0)
        return law.rms * max(mean_sq, 0.0) ** 0.5

    def rule(self, name: str) -> Rule:
        """The width rule of parameter `name` (its role's row of the formulation's table).

        Args:
            name: a canonical parameter name (a key of `params`).

        Returns:
            The `rules.Rule` of the parameter's role.
        """
        umup = self.__dict__.get("umup")
        if umup is not None:
            return UMUP[umup.rows[name]]
        return formulation_rules(self.formulation)[self.params[name].role]

    def depth_rule(self, name: str) -> DepthRule:
        """The depth rule of parameter `name` ("outside" when depth scaling is off).

        Args:
            name: a canonical parameter name (a key of `params`).

        Returns:
            The `rules.DepthRule` of the parameter's place (outside the blocks, in a block, a branch end).
        """
        # depth_alpha = 0 means no depth scaling at all (not the α → 0 end of the formulas)
        return DEPTH_RULES[self.params[name].depth_role if self.depth_alpha > 0 else "outside"]

    def updater(self, name: str, optimizer: str) -> str:
        """Which optimizer updates parameter `name` when the model trains with `optimizer`: the
        optimizer itself, or its partner (Muon: hidden 2-D matrices only; AdamW takes the rest)."""
        rule = optimizer_rule(optimizer)
        if rule.partner is None:
            return optimizer.lower()
        info = self.params[name]
        return optimizer.lower() if (info.role == "hidden" and len(info.shape) == 2) else rule.partner

    def columns(self, name: str, optimizer: str) -> tuple[str, tuple[str, ...]]:
        """(lr column, ε columns) of the tables that parameter `name` follows under `optimizer`."""
        rule = optimizer_rule(self.updater(name, optimizer))
        return rule.lr, rule.eps

    def column_factor(self, name: str, column: str) -> float:
        """The factor of one column of the tables for one parameter: width × depth."""
        info = self.params[name]
        umup = self.__dict__.get("umup")
        if umup is not None:  # u-µP's columns read the absolute fans; a multiplier folded into the init moves
            fan_in, fan_out = umup.fans[name]  # its lr and ε by abc-symmetry (Adam lr × A, SGD × A², ε × 1/A)
            a = umup.folded.get(name, 1.0)
            shift = {"adam_lr": a, "spectral_lr": a, "sgd_lr": a * a, "adam_eps": 1.0 / a, "init": a}.get(column, 1.0)
            width = factor(getattr(self.rule(name), column), fan_in, fan_out) * shift
        else:
            width = factor(getattr(self.rule(name), column), info.m_in, info.m_out)
        return width * depth_factor(getattr(self.depth_rule(name), column), info.m_depth, self.depth_alpha)

    def factors(self, name: str, optimizer: str) -> tuple[float, ...]:
        """(lr factor, ε factors…) of one parameter under `optimizer` ("sgd", "adam", "muon", …):
        width × depth, the lr also × the tunable lr multiplier of its role. Optimizers without a
        scaled ε give (lr factor, 1.0), as the two-number form older callers unpack."""
        lr_col, eps_cols = self.columns(name, optimizer)
        lr_f = self.column_factor(name, lr_col) * self.multipliers.lr_mult(self.params[name].role)
        eps = tuple(self.column_factor(name, c) for c in eps_cols)
        return (lr_f,) + (eps or (1.0,))


def spec_holder(model: nn.Module) -> nn.Module | None:
    """The module that carries the spec: the model itself or the user's model inside wrappers
    (torch.compile, DDP/DataParallel, FSDP1, activation checkpointing); None if never parametrized."""
    current: nn.Module | None = model
    seen = 0
    while current is not None and seen < 8:
        if SPEC_ATTR in current.__dict__:
            return current
        current = next(
            (getattr(current, a) for a in _WRAPPED_ATTRS if isinstance(getattr(current, a, None), nn.Module)), None
        )
        seen += 1
    return None


def find_spec(model: nn.Module) -> MuSpec | None:
    """The `MuSpec` that `parametrize` left on `model` (through wrappers), or None.

    Args:
        model: a model, parametrized or not, possibly wrapped.

    Returns:
        The spec, or None for a model that was never parametrized.
    """
    holder = spec_holder(model)
    return None if holder is None else holder.__dict__[SPEC_ATTR]


def require_spec(model: nn.Module, caller: str) -> MuSpec:
    """The model's `MuSpec`, or an error naming `caller` and the fix.

    Args:
        model: the model a function was given.
        caller: the function's name, for the message.

    Returns:
        The spec.

    Raises:
        TypeError: `model` is not an nn.Module.
        ModelError: the model was never parametrized.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"{caller} needs an nn.Module, got {type(model).__name__}")
    spec = find_spec(model)
    if spec is None:
        raise ModelError(
            f"{caller}: the model ({type(model).__name__}) was never parametrized; "
            "call mt.parametrize(model, base=..., delta=...) first"
        )
    return spec
