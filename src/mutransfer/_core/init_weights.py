"""`init_weights`: draw µP's init in place, on plain tensors or on the shards of DTensor parameters.

The big run is built on the meta device, parametrized from shapes (`parametrize` on a meta model
records each parameter's `InitLaw`, read off the real base's values), sharded (FSDP2, tensor
parallel) and materialised with `to_empty`: its values are then whatever the memory held.
`init_weights` draws every parameter from its law — each rank only its local shard, each value a
fixed function of (seed, parameter name, global position), so the full tensor is the same for the
same seed whatever the sharding — then multiplies the pieces µP's init multiplies (rows of another
role in a fused projection) and zeroes what parametrize zeroed (`zero_init_readout/query`).

The model's own `reset_parameters` / `init_weights` / Hugging Face `_init_weights` would draw the
standard parametrization's init instead; `mt.check` and `mt.Monitor` catch that.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

import torch
from torch import nn

from ..errors import ModelError
from .init_law import draw
from .naming import canonical_name
from .sharding import is_dtensor, local_part
from .spec import MuSpec, require_spec, spec_holder

__all__ = ["check_head_splits", "init_weights"]


def init_weights(model: nn.Module, seed: int | None = None, *, skip: Iterable[str] = ()) -> nn.Module:
    """Draw µP's init for every parameter of a parametrized model, in place; returns `model`.

    The law of each parameter is the one `parametrize` read off the base's values (normal, uniform,
    truncated normal, constant, zeros, … with the base's RMS) times µP's width (and depth) factor —
    the same law as eager `parametrize` gives; `mt.describe(model)` lists them. Works on plain
    tensors and on DTensor parameters (FSDP2 `fully_shard`, tensor parallel, both): each rank draws
    only its local shard. Buffers are not touched (compute them as the model's code does).

    Args:
        model: a model put in µP by `mt.parametrize` with a real `base` (also wrapped: DDP,
            torch.compile), its parameters materialised (``model.to_empty(device=...)`` after a
            meta build).
        seed: the draw's seed; the same seed gives the same full tensors whatever the sharding. None:
            one drawn from torch's default generator (in a process group of several ranks, rank 0's,
            broadcast — sharded or DDP replicas alike: then every rank must call `init_weights`).
        skip: name patterns (fnmatch) of parameters to leave as they are, e.g. values the model's own
            code computes that µP has no law for.

    Returns:
        `model`.

    Raises:
        ModelError: the model was never parametrized, or with no base values (``base_shapes=`` or a meta
            base: no law is known; load a checkpoint instead), a parameter is still on the meta device, a
            parameter has no law µP can draw (named, with the reason: pass it in `skip`), or a tensor-
            parallel sharding splits an attention head.
    """
    spec = require_spec(model, "init_weights")
    root = spec_holder(model) or model
    laws = getattr(spec, "init_laws", {})
    if not laws:
        raise ModelError(
            f"init_weights: no init law is known for this {type(root).__name__}: parametrize read none (init from "
            f"{spec.init_source}). Call mt.parametrize with base= a model holding real values (its values are the "
            "laws), or load the values from a checkpoint instead"
        )
    patterns = [skip] if isinstance(skip, str) else list(skip)
    params: dict[str, torch.Tensor] = {}  # parameters (and DTensor parameters), by canonical name
    for n, p in root.named_parameters():
        params.setdefault(canonical_name(n), p)
    skipped = {n for n in params if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)}
    unused = [pat for pat in patterns if not any(fnmatch.fnmatchcase(n, pat) for n in params)]
    if unused:
        raise ModelError(f"init_weights: skip={unused[0]!r} matches no parameter of the model; check the names")
    added = [n for n in params if n not in spec.params and n not in skipped]
    tied = {f"{m}.weight": n for n, i in spec.params.items() for m in i.tied_readouts}
    untied = [n for n in added if n in tied]
    if untied:
        raise ModelError(
            f"init_weights: '{untied[0]}' is no longer the same tensor as '{tied[untied[0]]}' (tied when parametrized): "
            "to_empty and load_state_dict(assign=True) untie shared parameters. Tie them again first "
            f"(model.{untied[0]} = model.{tied[untied[0]]}, or a Hugging Face model's tie_weights())"
        )
    if added:
        raise ModelError(
            f"init_weights: '{added[0]}' was added after mt.parametrize (it has no role and no law); build the model "
            "with it and call mt.parametrize again"
        )
    meta = [n for n, p in params.items() if p.is_meta and n not in skipped]
    if meta:
        raise ModelError(
            f"init_weights: '{meta[0]}' (and {len(meta) - 1} more) still on the meta device; materialise the model "
            "first (model.to_empty(device=...), after fully_shard / parallelize_module), then call init_weights"
        )
    lawless = [(n, laws[n].reason if n in laws else "no law recorded") for n in params if n not in skipped]
    lawless = [(n, why) for n, why in lawless if n not in laws or laws[n].kind == "unknown"]
    if lawless:
        raise ModelError(
            f"init_weights: no µP law to draw '{lawless[0][0]}' from: {lawless[0][1]}"
            + (f" (and {len(lawless) - 1} more: {', '.join(n for n, _ in lawless[1:4])})" if len(lawless) > 1 else "")
            + ". Initialise it with the model's own code after init_weights, and pass "
            + f"skip=[{', '.join(repr(n) for n, _ in lawless[:3])}]"
        )
    check_head_splits(spec, root)
    seed = _resolve_seed(seed)
    with torch.no_grad():
        for name, param in params.items():
            if name in skipped:
                continue
            part = local_part(param, name)
            if part is None:
                continue
            mults: list[torch.Tensor | None] = [None] * param.ndim
            for dim, start, stop, c in spec.init_pieces.get(name, []):
                g = part.indices[dim]
                end = part.global_shape[dim] if stop is None else stop
                inside = (g >= start) & (g < end)
                prev = mults[dim]
                m = prev if prev is not None else torch.ones(len(g), dtype=torch.float64, device=g.device)
                mults[dim] = torch.where(inside, m * c, m)
            draw(laws[name], part.tensor, part.global_shape, part.indices, seed, name, mults)
    spec.init_seed = seed
    spec.init_pending = False
    spec.init_scales = {}  # the values are now the law's draw, not a rescale of the model's own
    return model


def _resolve_seed(seed: int | None) -> int:
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise TypeError(f"init_weights: seed must be a non-negative int or None, got {seed!r}")
        return seed
    drawn = int(torch.randint(0, 2**62, (1,)).item())
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:  # sharded or replicas (DDP)
        box = [drawn]
        dist.broadcast_object_list(box, src=0)  # every rank draws the same replicated values
        drawn = int(box[0])
    return drawn


def _tensor_parallel(module: nn.Module) -> int:
    """The number of mesh dims torch's tensor parallel split `module` over (0: not parallelized): read off
    the device mesh its forward hooks (parallelize_module's input/output redistribution) hold."""
    hooks = list(module._forward_pre_hooks.values()) + list(module._forward_hooks.values())
    found = 0
    for h in hooks:
        fn = getattr(h, "func", h)
        if not getattr(fn, "__module__", "").startswith("torch.distributed.tensor"):
            continue
        found = max(found, 1)
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if type(value).__name__ == "DeviceMesh":
                found = max(found, int(value.ndim))
    return found


def check_head_splits(spec: MuSpec, root: nn.Module) -> None:
    """Refuse a tensor-parallel sharding that cuts an attention module's projection inside a head.

    Column-wise (q/k/v: rows, dim 0) and row-wise (o: columns, dim 1) tensor-parallel shards of a
    projection inside an attention module must hold whole heads: the head count a multiple of the number
    of pieces. FSDP2's own shard (mesh dim 0 of a 2-D mesh, or the whole 1-D mesh) is gathered before
    the forward and is not a split of the computation: only the trailing mesh dims of tensor parallel's own
    mesh (read off its forward hooks) count. The same answer on every rank.

    Raises:
        ModelError: naming the parameter, the pieces and the head dim, with the fix.
    """
    for a in spec.attention:
        try:
            attention = root.get_submodule(a.module)
        except AttributeError:
            continue
        d = int(a.d)
        for mname, module in attention.named_modules():
            tp_dims = _tensor_parallel(module)
            if not tp_dims:
                continue
            for pname, p in module.named_parameters(recurse=False):
                if p.ndim != 2 or not is_dtensor(p):
                    continue
                name = canonical_name(".".join(x for x in (a.module, mname, pname) if x))
                part = local_part(p, name)
                if part is None:
                    continue
                first_tp = p.device_mesh.ndim - tp_dims  # FSDP2 / HSDP put their mesh dims in front of TP's
                pieces: dict[int, int] = {}
                for mesh_dim, dim, n in part.cuts:
                    if mesh_dim < first_tp:
                        continue  # FSDP2's shard: gathered before the forward
                    pieces[dim] = pieces.get(dim, 1) * n
                for dim, n in pieces.items():
                    size = part.global_shape[dim]
                    if dim > 1 or size % d:
                        continue
                    heads = size // d
                    if heads % n:
                        raise ModelError(
                            f"'{name}' is split by tensor parallel along dim {dim} ({heads} heads × head dim {d}) into "
                            f"{n} pieces, which cuts heads: attention on a rank would mix pieces of heads. Use a "
                            f"tensor-parallel degree that divides {heads} (the head count of '{a.module}'), or "
                            "change the number of heads"
                        )
