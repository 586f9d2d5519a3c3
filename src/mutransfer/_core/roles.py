"""Classify every parameter as input, hidden, output, vector or scalar.

A parameter's role follows from which of its fan_in / fan_out dims are width dims. Where a
dim is fan_in or fan_out is read from the module that owns the parameter:

======================================  ==========================
module / parameter                      layout
======================================  ==========================
nn.Linear, nn.Conv{1,2,3}d ``weight``   (fan_out, fan_in, *kernel)
nn.ConvTranspose* ``weight``            (fan_in, fan_out, *kernel)
nn.Embedding / EmbeddingBag ``weight``  (num_embeddings → fan_in, dim → fan_out): input-like
nn.MultiheadAttention projections       (fan_out, fan_in)
Hugging Face ``Conv1D`` ``weight``      (fan_in, fan_out)
names matched by ``transposed=``        (fan_in, fan_out)
======================================  ==========================

Any other parameter (raw ``nn.Parameter`` in a custom module, biases, norm gains) is
classified by how many width dims it has: none → ``scalar``, one → ``vector`` (treated like
an input weight, as TP5 Table 8 does), two → ``hidden`` with the ``nn.Linear`` layout
(fan_out, fan_in). A raw readout matrix therefore needs ``roles={"name": "output"}``.

A parameter shared between an embedding and a readout (tied weights) is an input weight for
the optimizer and gets TP5 Table 8's forward constant 1/m_in where it is used as readout.
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import nn

from ..errors import ModelError, MuPWarning
from ..rules import ROLES
from .depth import DepthMap
from .naming import canonical_name, listed_differences
from .observation import Observation, Use
from .shapes import ParamShape, WidthShapes

__all__ = ["Layout", "MuPWarning", "ParamInfo", "classify"]

Layout = tuple[int, int] | None  # (fan_in dim, fan_out dim) or None when not a weight matrix


@dataclass
class ParamInfo:
    """Everything the rules need to know about one parameter."""

    name: str
    shape: tuple[int, ...]
    role: str
    m_in: float
    m_out: float
    layout: Layout
    usages: list[tuple[str, str]] = field(default_factory=list)  # (module name, local name)
    tied_readouts: list[str] = field(default_factory=list)  # modules using it as readout
    module_fan_in_mult: float = 1.0  # m of the owning weight's fan_in, for biases (meta-base init)
    base_name: str = ""  # its name in the base model (differs inside deeper blocks)
    block: str | None = None  # the depth container holding it (None outside repeated blocks)
    m_depth: float = 1.0  # L/L₀ of that container
    depth_role: str = "outside"  # row of rules.DEPTH_RULES: outside, block, branch_end
    source: str = "module"  # what settled the role: usage (probe forward), module, shape, override
    fan_in_dims: tuple[int, ...] = ()
    fan_out_dims: tuple[int, ...] = ()
    # row ranges of a fused projection whose role differs from `role` (`row_roles.RowRole`: B/C of an SSM's in_proj)
    row_roles: tuple = ()

    @property
    def aliases(self) -> list[str]:
        """Every ``module.parameter`` name this parameter is used under (tied weights have several)."""
        return [f"{m}.{p}" if m else p for m, p in self.usages]


def _match(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pat) for pat in patterns)


def _module_layout(module: nn.Module, local: str, ndim: int, transposed: bool) -> Layout:
    if ndim < 2:
        return None
    if transposed:
        return (0, 1)
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and local == "weight":
        return (0, 1)
    if isinstance(module, nn.modules.conv._ConvTransposeNd) and local == "weight":
        return (0, 1)
    if isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)) and local == "weight":
        return (1, 0)
    if isinstance(module, nn.MultiheadAttention) and local in (
        "in_proj_weight",
        "q_proj_weight",
        "k_proj_weight",
        "v_proj_weight",
    ):
        return (1, 0)
    if type(module).__name__ == "Conv1D" and local == "weight" and hasattr(module, "nf"):
        return (0, 1)  # Hugging Face GPT-2 style: weight stored (in, out)
    return None


def _role_from_layout(name: str, shape: ParamShape, layout: tuple[int, int]) -> str:
    fi, fo = layout
    extra = [i for i, w in enumerate(shape.width) if w and i not in (fi, fo)]
    if extra:
        raise ModelError(
            f"parameter '{name}' has width dim {extra[0]} that is neither its fan_in nor its "
            f"fan_out dim; set its role with roles={{'{name}': ...}}"
        )
    return {(False, False): "scalar", (False, True): "input", (True, False): "output", (True, True): "hidden"}[
        (shape.width[fi], shape.width[fo])
    ]


def _role_from_count(name: str, shape: ParamShape) -> str:
    n = sum(shape.width)
    if n == 0:
        return "scalar"
    if n == 1:
        return "vector"
    if n == 2:
        return "hidden"
    raise ModelError(
        f"parameter '{name}' has {n} width dims; mutransfer handles at most two. "
        f"Set its role with roles={{'{name}': ...}} and its layout with transposed="
    )


def _multipliers(name: str, role: str, shape: ParamShape, tshape: tuple[int, ...], layout: Layout):
    mult = shape.width_ratios(tshape)
    width_dims = [i for i, w in enumerate(shape.width) if w]
    if role == "scalar":
        return 1.0, 1.0
    if role in ("vector", "input") and layout is None:
        if len(width_dims) != 1:
            raise ModelError(f"parameter '{name}' is treated as {role} but has {len(width_dims)} width dims")
        return 1.0, mult[width_dims[0]]
    if layout is None:  # hidden/output without a known layout: nn.Linear convention
        if len(tshape) < 2:
            raise ModelError(f"parameter '{name}' has role '{role}' but only {len(tshape)} dim(s)")
        layout = (1, 0)
    fi, fo = layout
    return mult[fi], mult[fo]


def _role_from_dims(name: str, shape: ParamShape, fan_in: tuple[int, ...], fan_out: tuple[int, ...], what: str) -> str:
    extra = [i for i, w in enumerate(shape.width) if w and i not in fan_in and i not in fan_out]
    if extra:
        raise ModelError(
            f"parameter '{name}' has width dim {extra[0]} that is neither its fan_in nor its fan_out "
            f"dim in `{what}` (a batch dim that grows with width); set its role with "
            f"roles={{'{name}': ...}}"
        )
    return {(False, False): "scalar", (False, True): "input", (True, False): "output", (True, True): "hidden"}[
        (any(shape.width[i] for i in fan_in), any(shape.width[i] for i in fan_out))
    ]


def _product(mult: tuple[float, ...], dims: Iterable[int]) -> float:
    out = 1.0
    for d in dims:
        out *= mult[d]
    return out


@dataclass
class _UseRole:
    module: str
    owner: nn.Module | None
    local: str
    layout: Layout
    role: str
    fan_in: tuple[int, ...] = ()
    fan_out: tuple[int, ...] = ()
    observed: bool = False


def _observed_roles(
    name: str, shape: ParamShape, uses: list[Use], modules: Mapping[str, nn.Module], warnings: list[str]
) -> list[_UseRole]:
    """Per-use roles from what the probe forward saw: contractions and embedding lookups settle the
    role (both at once: a tied embedding); rows gathered by index count as a lookup unless the
    parameter is also contracted (experts gathered per token); elementwise uses (gains, biases,
    added tensors) make a parameter vector-like."""
    picked = [u for u in uses if u.op in ("contraction", "lookup")]
    op = "contraction"
    if not picked:
        picked = [u for u in uses if u.op == "gather"]
    if not picked:
        picked, op = [u for u in uses if u.op == "elementwise"], "elementwise"
    out = []
    for u in dict.fromkeys(picked):
        if op == "elementwise":
            n = sum(shape.width)
            if n > 1:
                warnings.append(
                    f"'{name}' is used elementwise (in `{u.what}`) but has {n} width dims; treated as "
                    f"vector-like along its first. Set roles={{'{name}': ...}} to settle it"
                )
                first = shape.width.index(True)
                out.append(_UseRole(u.module, modules.get(u.module), "", None, "vector", (), (first,), True))
                continue
            role = "scalar" if n == 0 else "vector"
            dims = tuple(i for i, w in enumerate(shape.width) if w)
            out.append(_UseRole(u.module, modules.get(u.module), "", None, role, (), dims, True))
            continue
        role = _role_from_dims(name, shape, u.fan_in, u.fan_out, u.what)
        layout = (u.fan_in[0], u.fan_out[0]) if len(u.fan_in) == 1 and len(u.fan_out) == 1 else None
        out.append(_UseRole(u.module, modules.get(u.module), "", layout, role, u.fan_in, u.fan_out, True))
    return out


def classify(
    model: nn.Module,
    shapes: WidthShapes,
    roles: Mapping[str, str] | None = None,
    transposed: Iterable[str] = (),
    depth: DepthMap | None = None,
    observation: Observation | None = None,
) -> dict[str, ParamInfo]:
    """Role and width multipliers of every parameter of `model` (keyed by canonical name).

    `depth` maps the names of a model deeper (or shallower) than the base onto the base's.
    `observation` (from a probe forward, see `observe`) gives each parameter's role from how the
    forward uses it; without it, or for parameters the forward did not use, the module layouts
    above and the count of width dims decide, and parameters those cannot settle are warned about.
    """
    depth = depth or DepthMap()
    roles = dict(roles or {})
    transposed = list(transposed or ())
    for pat, role in roles.items():
        if role not in ROLES:
            raise ModelError(f"roles['{pat}'] = '{role}' is not a role; use one of {', '.join(ROLES)}")

    canonical: dict[int, str] = {}
    for n, p in model.named_parameters():
        canonical.setdefault(id(p), canonical_name(n))
    missing = sorted(n for n in canonical.values() if depth.to_base(n) not in shapes.params)
    extra = sorted({depth.normalized(n) for n in shapes.params} - {depth.normalized(n) for n in canonical.values()})
    if missing or extra:
        parts = listed_differences(("not in the base shapes", missing), ("only in the base shapes", extra))
        raise ModelError(f"model and base shapes have different parameter names ({parts})")

    usages: dict[int, list[tuple[str, nn.Module, str]]] = {}
    modules: dict[str, nn.Module] = {}
    for mname, module in model.named_modules(remove_duplicate=False):
        modules.setdefault(canonical_name(mname) if mname else "", module)
        for local, p in module._parameters.items():
            if p is not None:
                usages.setdefault(id(p), []).append((canonical_name(mname) if mname else "", module, local))

    every_alias = [f"{m}.{l}" if m else l for m, _, l in (u for us in usages.values() for u in us)]
    every_alias += list(canonical.values())
    for what, patterns in (("roles", list(roles)), ("transposed", transposed)):
        for pat in patterns:
            if not any(_match(a, [pat]) for a in every_alias):
                raise ModelError(
                    f"{what} pattern '{pat}' matches no parameter of the model; parameter names look "
                    f"like '{next(iter(canonical.values()), '')}' (see model.named_parameters())"
                )
    observed = observation.uses if observation is not None and observation.ran else {}
    warnings: list[str] = []
    guessed: list[str] = []
    infos: dict[str, ParamInfo] = {}
    params = {id(p): p for p in model.parameters()}
    for pid, name in canonical.items():
        p = params[pid]
        base_name = depth.to_base(name)
        shape = shapes.params[base_name]
        tshape = tuple(p.shape)
        if len(tshape) != len(shape.base):
            raise ModelError(
                f"parameter '{name}' has rank {len(tshape)} in the model but rank {len(shape.base)} in the base shapes"
            )
        uses = usages.get(pid, [])
        aliases = [f"{m}.{l}" if m else l for m, _, l in uses] or [name]
        is_transposed = any(_match(a, transposed) for a in aliases)
        override = next((r for pat, r in roles.items() if any(_match(a, [pat]) for a in aliases)), None)
        per_use: list[_UseRole] = []
        if name in observed and not is_transposed:
            per_use = _observed_roles(name, shape, observed[name], modules, warnings)
        if not per_use:
            for mname, module, local in uses:
                layout = _module_layout(module, local, len(tshape), is_transposed)
                if layout:
                    per_use.append(
                        _UseRole(
                            mname,
                            module,
                            local,
                            layout,
                            _role_from_layout(name, shape, layout),
                            (layout[0],),
                            (layout[1],),
                        )
                    )
                else:
                    per_use.append(_UseRole(mname, module, local, None, _role_from_count(name, shape)))
                    if override is None and sum(shape.width) >= 1 and len(tshape) >= 2:
                        guessed.append(name)
        if not per_use:
            per_use = [_UseRole("", model, name, None, _role_from_count(name, shape))]

        use_roles = {u.role for u in per_use}
        tied_readouts: list[str] = []
        chosen = next((u for u in per_use if u.layout is not None or u.fan_in or u.fan_out), per_use[0])
        if override is not None:
            role = override
            if is_transposed and len(tshape) >= 2:
                chosen = _UseRole(chosen.module, chosen.owner, chosen.local, (0, 1), override, (0,), (1,))
        elif len(use_roles) == 1:
            role = use_roles.pop()
        elif use_roles == {"input", "output"}:
            role = "input"
            chosen = next(u for u in per_use if u.role == "input")
            tied_readouts = list(dict.fromkeys(u.module for u in per_use if u.role == "output"))
        else:
            raise ModelError(
                f"parameter '{name}' is used in different roles ({', '.join(sorted(use_roles))}"
                f"{' in ' + ', '.join(sorted({u.module for u in per_use})) if per_use else ''}); "
                f"set its role with roles={{'{name}': ...}}"
            )

        mult = shape.width_ratios(tshape)
        if chosen.fan_in or chosen.fan_out:
            m_in, m_out = _product(mult, chosen.fan_in), _product(mult, chosen.fan_out)
            if role in ("vector", "input") and not chosen.fan_in:
                m_in = 1.0
        else:
            m_in, m_out = _multipliers(name, role, shape, tshape, chosen.layout)
        if role == "scalar":
            m_in, m_out = 1.0, 1.0
        module_fan_in_mult = 1.0
        if uses:
            mname, module, local = uses[0]
            if len(tshape) == 1 and local.endswith("bias") and hasattr(module, "weight"):
                w = cast(torch.Tensor, module.weight)
                wname = f"{mname}.weight" if mname else "weight"
                wl = _module_layout(module, "weight", getattr(w, "ndim", 0), is_transposed)
                wbase = depth.to_base(wname)
                if wl is not None and wbase in shapes.params:
                    module_fan_in_mult = shapes.params[wbase].width_ratios(tuple(w.shape))[wl[0]]
        where = depth.locate(name)
        source = (
            "override"
            if override is not None
            else "usage"
            if chosen.observed
            else "module"
            if chosen.layout is not None
            else "shape"
        )
        infos[name] = ParamInfo(
            name,
            tshape,
            role,
            float(m_in),
            float(m_out),
            chosen.layout,
            [(m, l) for m, _, l in uses] or [("", name)],
            tied_readouts,
            float(module_fan_in_mult),
            base_name,
            where[0] if where else None,
            depth.multiplier(name),
            "block" if where else "outside",
            source,
            chosen.fan_in,
            chosen.fan_out,
        )
    if guessed:
        why = (
            "the probe forward did not use them"
            if observed
            else f"no probe forward ran ({observation.error})"
            if observation is not None and observation.error
            else "usage was not observed"
        )
        warnings.append(
            f"roles of {', '.join(guessed[:6])}{' …' if len(guessed) > 6 else ''} follow their shapes only "
            f"({why}): a raw matrix is taken as (fan_out, fan_in). Pass example_inputs= to parametrize "
            f"so that usage can be observed, or set roles={{'name': ...}} / transposed="
        )
    for message in warnings:
        _warn(message)
    return infos


def _warn(message: str) -> None:
    warnings.warn(message, MuPWarning, stacklevel=4)
