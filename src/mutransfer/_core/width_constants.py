"""Width-dependent constants in the model's own forward, and the output multipliers that undo them.

A model may multiply an activation by a constant that depends on width: Gemma scales its embedding
output by √hidden (a Python float in the parent's forward, or a buffer inside a scaled-embedding
module), fairseq by √d_model before adding positions. µP's rules are written for a forward whose
constants do not change with width, so such a constant would add its own width dependence on top
of µP's (the embedding output growing like √m). The probe forwards of the base and of the model
record each constant against the module whose output it multiplies (`recorder`/`trails`); where
the two differ, that module gets an output multiplier c₀/c, which makes the forward the base's at
every width. Constants on q or k are left to `attention`, those on a readout's input to
`parametrize`'s readout ratio; a constant on a tensor that is no module's output (a raw parameter
looked up in the model's own forward) cannot be moved and is reported.
"""

from __future__ import annotations

import math
import warnings

from .. import scaled_forward
from ..errors import MuPWarning
from .depth import DepthMap
from .observation import Observation
from .roles import ParamInfo
from .shapes import WidthShapes

__all__ = ["ForwardConstants", "merge_constants", "width_constants"]

ForwardConstants = list[tuple[str, scaled_forward.Side, float]]  # (module name, input or output, constant)


def width_constants(
    seen: Observation,
    shapes: WidthShapes,
    depth: DepthMap,
    infos: dict[str, ParamInfo],
    absolute: bool = False,
) -> ForwardConstants:
    """The output multipliers that undo the width dependence of constants in the model's own forward.

    Args:
        seen: the model's probe forward.
        shapes: the base's shapes, with the constants its probe forward measured (`output_scales`).
        depth: maps the model's module names to the base's.
        infos: the parameters' roles (readouts are left to `parametrize`'s readout input ratio).
        absolute: u-µP's compensation, 1/c (the output at unit scale, as every u-µP op's), instead of µP's
            c₀/c (the output at the base's scale).

    Returns:
        (module, Side.OUTPUT, c₀/c, or 1/c when `absolute`) for every module whose output the forward
        multiplies by a constant c that differs from the base's c₀; warns (MuPWarning) about those it cannot
        compensate.
    """
    if not seen.ran:
        return []
    readouts = {m for i in infos.values() if i.role == "output" for m, _ in i.usages}
    readouts |= {m for i in infos.values() for m in i.tied_readouts}
    base = shapes.output_scales
    found: ForwardConstants = []
    unknown, unplaced = [], []
    for origin, (c, consumer) in seen.carried_constants.items():
        if origin in seen.logit_origins or consumer in readouts:
            continue
        if base is None:
            unknown.append(f"'{origin or '<model>'}' (× {c:.4g})")
            continue
        c0 = base.get(depth.to_base(origin), 1.0)
        if not math.isclose(c0, c, rel_tol=1e-6):
            found.append((origin, scaled_forward.Side.OUTPUT, (1.0 if absolute else c0) / c))
    for consumer, c in seen.unplaced_constants.items():
        if consumer in readouts:
            continue
        at_base = None if base is None else base.get(f"{depth.to_base(consumer)}:input", 1.0)
        if at_base is None or not math.isclose(at_base, c, rel_tol=1e-6):
            known = "" if at_base is None else f", {at_base:.4g} at base width"
            unplaced.append(f"'{consumer}' (× {c:.4g}{known})")
    if unknown:
        warnings.warn(
            f"parametrize: the forward multiplies the output of {', '.join(unknown)} by a constant, and the base "
            f"model's constants were not measured (base_shapes saved by an older version, a base whose probe "
            f"forward did not run, or a meta-device base holding constants in buffers), so a constant that depends "
            f"on width cannot be compensated. Pass base= (the model at base width, with real values) or save the "
            f"shapes again with mt.save_shapes",
            MuPWarning,
            stacklevel=3,
        )
    if unplaced:
        warnings.warn(
            f"parametrize: the input of {', '.join(unplaced)} is multiplied in the forward by a constant that "
            f"depends on width and does not come from any module's output (it is computed from raw parameters), "
            f"so µP cannot compensate it and activations there scale with width. Compute the multiplied tensor "
            f"in a submodule (an nn.Embedding / nn.Linear), or multiply by the constant's value at base width",
            MuPWarning,
            stacklevel=3,
        )
    return found


def merge_constants(constants: ForwardConstants) -> ForwardConstants:
    """One entry per (module, side): constants on the same place multiply.

    Args:
        constants: (module, side, constant) entries, possibly several per place.

    Returns:
        The merged entries, without those that came out as 1.
    """
    merged: dict[tuple[str, scaled_forward.Side], float] = {}
    for mname, side, c in constants:
        merged[(mname, side)] = merged.get((mname, side), 1.0) * c
    return [(m, side, c) for (m, side), c in merged.items() if c != 1.0]
