"""Parameters that may be DTensors (FSDP2 `fully_shard`, tensor parallel): their local shard and where it sits.

`local_part(p)` gives the tensor a rank holds and, per dim, the global index of each of its positions,
so that code written for whole tensors (an init draw, a row range) can act on a shard. Sharding
follows torch's own split of each placement (`Shard`: `torch.chunk`; `_StridedShard`: FSDP2 over
tensor parallel), checked against the local tensor's shape. Nothing here communicates except
`full_values` and `global_rms`, which are collective: every rank of the mesh must call them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ModelError

__all__ = ["LocalPart", "full_values", "global_rms", "is_dtensor", "local_part"]


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
    """Root mean square of all of `p`'s values, in float64 (a DTensor's over every shard: collective)."""
    if is_dtensor(p):
        return float(p.detach().to(torch.float64).pow(2).mean().full_tensor().sqrt())  # type: ignore[attr-defined]
    return float(p.detach().to(torch.float64).pow(2).mean().sqrt())
