"""Which modules get a µP forward constant (α_output, α_embedding, the readout's 1/m, a readout
input's width-dependent constant), checked against the probe forward, and installed on them.

`parametrize` decides the roles; this module turns them into (module, side, constant) triples
(`forward_constants`), drops those whose module never runs (`in_effect`) and installs the rest
with `scaled_forward` (`install_forward_constants`).
"""

from __future__ import annotations

import warnings

from torch import nn

from .. import scaled_forward
from ..errors import ModelError, MuPWarning
from ..rules import READOUT_MULTIPLIER, TunableMultipliers, factor, formulation_rules
from .depth import DepthMap
from .observation import Observation
from .roles import ParamInfo
from .shapes import WidthShapes
from .width_constants import ForwardConstants

__all__ = ["forward_constants", "in_effect", "install_forward_constants", "readout_input_ratio"]


def readout_input_ratio(seen: Observation, shapes: WidthShapes, depth: DepthMap):
    """For a readout module: the base's constant on its input over the model's (1 when neither has one).

    A model whose forward multiplies the readout's input by a width-dependent constant (T5's tied
    readout gets the decoder output × d_model^-½) would add that dependence on top of µP's; the
    readout's input multiplier takes it back to the base model's value.
    """

    def ratio(module: str) -> float:
        if not seen.ran:
            return 1.0
        return shapes.input_scales.get(depth.to_base(module), 1.0) / seen.input_scales.get(module, 1.0)

    return ratio


def _is_layer(model: nn.Module, name: str) -> bool:
    """A module that holds only a weight (and bias) of its own and no children: its first input is
    the input of that weight, so an input multiplier acts on the readout alone."""
    module = model.get_submodule(name)
    return not list(module.children()) and set(module._parameters) <= {"weight", "bias"}


def forward_constants(
    infos: dict[str, ParamInfo],
    rules,
    tunable: TunableMultipliers,
    input_ratio=lambda module: 1.0,
    model: nn.Module | None = None,
) -> ForwardConstants:
    """Which modules need a forward constant, and its value (none in Table 3 at α = 1)."""
    readout_rule = formulation_rules(READOUT_MULTIPLIER)["output"]
    found: ForwardConstants = []
    for name, info in infos.items():
        if info.role == "input" and tunable.embedding != 1.0 and info.layout is not None:
            # α_embedding on the lookup / input projection — a tied embedding's too (not on its readout)
            found += [
                (m, scaled_forward.Side.OUTPUT, tunable.embedding)
                for m, local in info.usages
                if local == "weight" and m not in info.tied_readouts
            ]
        if info.role == "output":
            c = tunable.output * factor(rules["output"].forward, info.m_in, info.m_out)
            readouts = [m for m, _ in info.usages]
            needs_module = model is None or all(_is_layer(model, m) for m in readouts)
        elif info.tied_readouts:
            # Table 8 on a tied readout; its fan_in is the embedding's fan_out.
            c = tunable.output * factor(readout_rule.forward, info.m_out, 1.0)
            readouts, needs_module = info.tied_readouts, True
        else:
            continue
        per_module = {m: c * input_ratio(m) for m in readouts}
        if all(v == 1.0 for v in per_module.values()):
            continue
        if not needs_module:
            raise ModelError(
                f"'{name}' is a readout held as a raw parameter of a module that does more than apply "
                f"it, so its forward constant ({c:.4g}) cannot be installed; make the readout an "
                "nn.Linear, or use formulation='no_multipliers' with output_mult=1"
            )
        found += [(m, scaled_forward.Side.INPUT, v) for m, v in per_module.items() if v != 1.0]
    return found


def in_effect(constants: ForwardConstants, seen: Observation) -> ForwardConstants:
    """The forward constants whose module's forward ran on the probe. A constant on a module that
    never runs (its parent uses its weight directly, as HF Mamba's mixer does with `dt_proj`)
    would have no effect: it is left out, with a warning naming the module, not recorded as if it
    were in effect."""
    kept = []
    for mname, side, c in constants:
        if mname and mname not in seen.called:
            warnings.warn(
                f"parametrize: '{mname}' should get a forward constant ({side}{c:.4g}: α_output, "
                f"α_embedding or the readout's 1/m), but its forward never runs on the probe (another module "
                f"uses its parameters directly), so no multiplier can be installed on it; it is left out. "
                f"Call the module instead of reading its weight, or keep the multiplier at 1 "
                f"(output_mult / embedding_mult)",
                MuPWarning,
                stacklevel=3,
            )
            continue
        kept.append((mname, side, c))
    return kept


def install_forward_constants(model: nn.Module, constants: ForwardConstants) -> None:
    """Install each constant as an input or output multiplier of its module (`scaled_forward`)."""
    for mname, kind, c in constants:
        module = model.get_submodule(mname)
        if kind is scaled_forward.Side.INPUT:
            scaled_forward.install(module, input_mult=c)
        else:
            scaled_forward.install(module, output_mult=c)
