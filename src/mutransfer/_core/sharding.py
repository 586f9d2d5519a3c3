"""Parameters that may be DTensors (FSDP2 `fully_shard`, tensor parallel): their local shard and where it sits.

`local_part(p)` gives the tensor a rank holds and, per dim, the global index of each of its positions,
so that code written for whole tensors (an init draw, a row range) can act on a shard. Sharding
follows torch's own split of each placement (`Shard`: `torch.chunk`; `_StridedShard`: FSDP2 over
tensor parallel), checked against the local tensor's shape. Nothing here communicates except
`full_values`, `global_rms` and `gathered_copy`, which are collective: every rank of the mesh must call them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import ModelError

__all__ = ["LocalPart", "full_values", "gathered_copy", "global_rms", "is_dtensor", "is_sharded", "local_part"]


def is_dtensor(t: object) -> bool:
    """Whether `t` is a `torch.distributed.tensor.DTensor` (without importing torch.distributed otherwise)."""
    if not isinstance(t, torch.Tensor) or not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


@dataclass
class LocalPart:
    """The part of a (possibly sharded) parameter this rank holds."""

    tensor: torch.Tensor  # the local tensor (a plain tensor: writing into it writes the parameter)
    global_shape: tuple[int, ...]
    indices: list[torch.Tensor]  # per dim, the global index of each local position (int64, on tensor's device)
    cuts: list[tuple[int, int, int]]  # (mesh dim, tensor dim, pieces) of every Shard placement


def local_part(p: torch.Tensor, name: str) -> LocalPart | None:
    """This rank's part of `p` (None when the rank holds no part: outside the DTensor's mesh).

    Args:
        p: a parameter or tensor, plain or DTensor.
        name: its name, for error messages.

    Raises:
        ModelError: a placement other than Shard/Replicate (a Partial parameter), or a local shard whose
            shape does not match the placements (a sharding this code does not know).
    """
    if not is_dtensor(p):
        t = p.detach()
        return LocalPart(t, tuple(t.shape), [torch.arange(s, device=t.device) for s in t.shape], [])
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    mesh = p.device_mesh  # type: ignore[attr-defined]
    coord = mesh.get_coordinate()
    if coord is None:
        return None
    local = p.to_local().detach()  # type: ignore[attr-defined]
    shape = tuple(p.shape)
    idx = [torch.arange(s) for s in shape]
    cuts: list[tuple[int, int, int]] = []
    for mesh_dim, pl in enumerate(p.placements):  # type: ignore[attr-defined]
        if isinstance(pl, _StridedShard):
            splitter: Shard | _StridedShard = _StridedShard(0, split_factor=pl.split_factor)
        elif isinstance(pl, Shard):
            splitter = Shard(0)
        elif isinstance(pl, Replicate):
            continue
        else:
            raise ModelError(
                f"'{name}' is a DTensor placed {pl} on mesh dim {mesh_dim}: only Shard and Replicate placements "
                "hold a parameter's values; redistribute it first"
            )
        n = mesh.size(mesh_dim)
        pieces, _ = splitter._split_tensor(idx[pl.dim], n, with_padding=False, contiguous=True)
        k = coord[mesh_dim]
        idx[pl.dim] = pieces[k] if k < len(pieces) else idx[pl.dim][:0]
        cuts.append((mesh_dim, pl.dim, n))
    if [len(i) for i in idx] != list(local.shape):
        raise ModelError(
            f"'{name}': its local shard has shape {tuple(local.shape)}, but its placements {p.placements} on a mesh "  # type: ignore[attr-defined]
            f"of shape {tuple(mesh.shape)} give {tuple(len(i) for i in idx)}: a sharding mutransfer cannot place"
        )
    return LocalPart(local, shape, [i.to(local.device) for i in idx], cuts)


def full_values(p: torch.Tensor) -> torch.Tensor:
    """The full tensor of `p` (gathered from every rank for a DTensor: collective), detached."""
    if is_dtensor(p):
        return p.detach().full_tensor()  # type: ignore[attr-defined]
    return p.detach()


def global_rms(p: torch.Tensor) -> float:
    """Root mean square of all of `p`'s values, in float64 (a DTensor's over every shard: collective).

    A DTensor's sum of squares is its local one summed over the mesh dims that shard it (replicas are
    counted once): one all-reduce per sharding mesh dim, no redistribution of the values.
    """
    if not is_dtensor(p):
        return float(p.detach().to(torch.float64).pow(2).mean().sqrt())
    from torch.distributed.tensor import Replicate

    local = p.to_local().detach()  # type: ignore[attr-defined]
    total = local.to(torch.float64).pow(2).sum().reshape(1)
    mesh = p.device_mesh  # type: ignore[attr-defined]
    if mesh.get_coordinate() is None:
        return float("nan")
    for mesh_dim, pl in enumerate(p.placements):  # type: ignore[attr-defined]
        if not isinstance(pl, Replicate):
            torch.distributed.all_reduce(total, group=mesh.get_group(mesh_dim))
    numel = p.numel()
    return float((total / max(numel, 1)).sqrt()) if numel else 0.0


_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)
_HOOK_FLAGS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
_DISTRIBUTED_ATTRS = ("_is_fsdp_managed_module", "_fsdp_use_orig_params")


def _from_distributed(obj: object) -> bool:
    fn = getattr(obj, "func", obj)  # functools.partial
    fn = getattr(fn, "__func__", fn)  # bound method
    return str(getattr(fn, "__module__", "") or "").startswith("torch.distributed")


def _distributed_attr(key: str, value: object) -> bool:
    """An attribute torch.distributed set on a module (FSDP2's flags and its composable-API state)."""
    return (
        key in _DISTRIBUTED_ATTRS
        or key.startswith("__composable_api_state_key")
        or type(value).__module__.startswith("torch.distributed")
    )


def _plain_class(cls: type) -> type:
    """The user's class under the classes torch.distributed puts in front of it (FSDP2's ``FSDP<Class>``)."""
    while cls.__module__.startswith("torch.distributed"):
        bases = [b for b in cls.__bases__ if not b.__module__.startswith("torch.distributed")]
        if not bases:
            break
        cls = bases[-1]
    return cls


def is_sharded(model: nn.Module) -> bool:
    """Whether any parameter of `model` is a DTensor (FSDP2, tensor parallel)."""
    return any(is_dtensor(p) for p in model.parameters())


def gathered_copy(model: nn.Module, device: torch.device | str = "cpu") -> nn.Module:
    """A plain copy of a sharded model: the user's classes, full tensors on `device`, no distributed hooks.

    Collective: every parameter that is a DTensor is all-gathered (`full_tensor`), so every rank must call
    it, in the same order, and every rank gets the full model. Parameters shared between modules (tied
    embeddings) stay shared. Hooks and attributes torch.distributed installed (FSDP2's class and forward
    hooks, tensor parallel's input/output redistribution) are left out; everything else of each module's
    state is shared with the original (shallow), so treat the copy as read-only or deep-copy it.
    """
    tensors: dict[int, torch.Tensor] = {}
    modules: dict[int, nn.Module] = {}

    def tensor(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in tensors:
            full = full_values(t)
            full = full.to(device) if is_dtensor(t) else full.to(device, copy=True)
            tensors[id(t)] = nn.Parameter(full, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else full
        return tensors[id(t)]

    def clone(m: nn.Module) -> nn.Module:
        if id(m) in modules:
            return modules[id(m)]
        cls: Any = _plain_class(type(m))
        new = cls.__new__(cls)
        state = {k: v for k, v in m.__dict__.items() if not _distributed_attr(k, v)}
        state["_parameters"] = {k: None if v is None else tensor(v) for k, v in m._parameters.items()}
        state["_buffers"] = {k: None if v is None else tensor(v) for k, v in m._buffers.items()}
        for attr in _HOOK_DICTS:
            if attr in m.__dict__:
                state[attr] = type(m.__dict__[attr])(
                    (k, h) for k, h in m.__dict__[attr].items() if not _from_distributed(h)
                )
        for attr in _HOOK_FLAGS:
            if attr in m.__dict__:
                kept = {k for d in _HOOK_DICTS if d in state for k in state[d]}
                state[attr] = type(m.__dict__[attr])((k, v) for k, v in m.__dict__[attr].items() if k in kept)
        modules[id(m)] = new
        state["_modules"] = {k: None if v is None else clone(v) for k, v in m._modules.items()}
        new.__dict__.update(state)
        return new

    with torch.no_grad():
        return clone(model)
