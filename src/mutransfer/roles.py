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
the optimizer and gets TP5 Table 8's forward multiplier 1/m_in where it is used as readout.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

from torch import nn

from .depth import DepthMap
from .rules import ROLES
from .shapes import ParamShape, WidthShapes, canonical_name

Layout = Optional[tuple[int, int]]  # (fan_in dim, fan_out dim) or None when not a weight matrix


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
    tied_readouts: list[str] = field(default_factory=list)       # modules using it as readout
    module_fan_in_mult: float = 1.0  # m of the owning weight's fan_in, for biases (meta-base init)
    base_name: str = ""              # its name in the base model (differs inside deeper blocks)
    block: Optional[str] = None      # the depth container holding it (None outside repeated blocks)
    m_depth: float = 1.0             # L/L₀ of that container
    depth_role: str = "outside"      # row of rules.DEPTH_RULES: outside, block, branch_end

    @property
    def aliases(self) -> list[str]:
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
            "in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"):
        return (1, 0)
    if type(module).__name__ == "Conv1D" and local == "weight" and hasattr(module, "nf"):
        return (0, 1)  # Hugging Face GPT-2 style: weight stored (in, out)
    return None


def _role_from_layout(name: str, shape: ParamShape, layout: tuple[int, int]) -> str:
    fi, fo = layout
    extra = [i for i, w in enumerate(shape.width) if w and i not in (fi, fo)]
    if extra:
        raise ValueError(f"parameter '{name}' has width dim {extra[0]} that is neither its fan_in nor its "
                         f"fan_out dim; set its role with roles={{'{name}': ...}}")
    return {(False, False): "scalar", (False, True): "input",
            (True, False): "output", (True, True): "hidden"}[(shape.width[fi], shape.width[fo])]


def _role_from_count(name: str, shape: ParamShape) -> str:
    n = sum(shape.width)
    if n == 0:
        return "scalar"
    if n == 1:
        return "vector"
    if n == 2:
        return "hidden"
    raise ValueError(f"parameter '{name}' has {n} width dims; mutransfer handles at most two. "
                     f"Set its role with roles={{'{name}': ...}} and its layout with transposed=")


def _multipliers(name: str, role: str, shape: ParamShape, tshape: tuple[int, ...], layout: Layout):
    mult = shape.multipliers(tshape)
    width_dims = [i for i, w in enumerate(shape.width) if w]
    if role == "scalar":
        return 1.0, 1.0
    if role in ("vector", "input") and layout is None:
        if len(width_dims) != 1:
            raise ValueError(f"parameter '{name}' is treated as {role} but has {len(width_dims)} width dims")
        return 1.0, mult[width_dims[0]]
    if layout is None:  # hidden/output without a known layout: nn.Linear convention
        if len(tshape) < 2:
            raise ValueError(f"parameter '{name}' has role '{role}' but only {len(tshape)} dim(s)")
        layout = (1, 0)
    fi, fo = layout
    return mult[fi], mult[fo]


def classify(model: nn.Module, shapes: WidthShapes, roles: Optional[Mapping[str, str]] = None,
             transposed: Iterable[str] = (), depth: Optional[DepthMap] = None) -> dict[str, ParamInfo]:
    """Role and width multipliers of every parameter of `model` (keyed by canonical name).

    `depth` maps the names of a model deeper (or shallower) than the base onto the base's.
    """
    depth = depth or DepthMap()
    roles = dict(roles or {})
    transposed = list(transposed or ())
    for pat, role in roles.items():
        if role not in ROLES:
            raise ValueError(f"roles['{pat}'] = '{role}' is not a role; use one of {', '.join(ROLES)}")

    canonical: dict[int, str] = {}
    for n, p in model.named_parameters():
        canonical.setdefault(id(p), canonical_name(n))
    missing = sorted(n for n in canonical.values() if depth.to_base(n) not in shapes.params)
    extra = sorted({depth.normalized(n) for n in shapes.params} - {depth.normalized(n) for n in canonical.values()})
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"not in the base shapes: {', '.join(missing[:5])}")
        if extra:
            parts.append(f"only in the base shapes: {', '.join(extra[:5])}")
        raise ValueError(f"model and base shapes have different parameter names ({'; '.join(parts)})")

    usages: dict[int, list[tuple[str, nn.Module, str]]] = {}
    for mname, module in model.named_modules(remove_duplicate=False):
        for local, p in module._parameters.items():
            if p is not None:
                usages.setdefault(id(p), []).append((canonical_name(mname) if mname else "", module, local))

    infos: dict[str, ParamInfo] = {}
    params = {id(p): p for p in model.parameters()}
    for pid, name in canonical.items():
        p = params[pid]
        base_name = depth.to_base(name)
        shape = shapes.params[base_name]
        tshape = tuple(p.shape)
        if len(tshape) != len(shape.base):
            raise ValueError(f"parameter '{name}' has rank {len(tshape)} in the model but rank "
                             f"{len(shape.base)} in the base shapes")
        uses = usages.get(pid, [])
        aliases = [f"{m}.{l}" if m else l for m, _, l in uses] or [name]
        is_transposed = any(_match(a, transposed) for a in aliases)
        per_use = []
        for mname, module, local in uses:
            layout = _module_layout(module, local, len(tshape), is_transposed)
            role = _role_from_layout(name, shape, layout) if layout else _role_from_count(name, shape)
            per_use.append((mname, module, local, layout, role))
        if not per_use:
            per_use = [("", model, name, None, _role_from_count(name, shape))]

        override = next((r for pat, r in roles.items() if any(_match(a, [pat]) for a in aliases)), None)
        use_roles = {u[4] for u in per_use}
        tied_readouts: list[str] = []
        layout = next((u[3] for u in per_use if u[3] is not None), None)
        if override is not None:
            role = override
            if is_transposed and len(tshape) >= 2:
                layout = (0, 1)
        elif len(use_roles) == 1:
            role = use_roles.pop()
        elif use_roles == {"input", "output"}:
            role = "input"
            layout = next(u[3] for u in per_use if u[4] == "input")
            tied_readouts = [u[0] for u in per_use if u[4] == "output"]
        else:
            raise ValueError(f"parameter '{name}' is shared by modules that use it in different roles "
                             f"({', '.join(sorted(use_roles))}); set its role with roles={{'{name}': ...}}")

        m_in, m_out = _multipliers(name, role, shape, tshape, layout)
        module_fan_in_mult = 1.0
        mname, module, local = per_use[0][:3]
        if len(tshape) == 1 and local.endswith("bias") and hasattr(module, "weight"):
            w = getattr(module, "weight")
            wname = f"{mname}.weight" if mname else "weight"
            wl = _module_layout(module, "weight", getattr(w, "ndim", 0), is_transposed)
            wbase = depth.to_base(wname)
            if wl is not None and wbase in shapes.params:
                module_fan_in_mult = shapes.params[wbase].multipliers(tuple(w.shape))[wl[0]]
        where = depth.locate(name)
        infos[name] = ParamInfo(name, tshape, role, float(m_in), float(m_out), layout,
                                [(u[0], u[2]) for u in per_use], tied_readouts, float(module_fan_in_mult),
                                base_name, where[0] if where else None, depth.multiplier(name),
                                "block" if where else "outside")
    return infos
