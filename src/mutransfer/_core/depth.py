"""Depth: the repeated residual blocks of a model, their base count L₀, and the `residual_branch` helper.

**Blocks** are found from parameter names: a prefix followed by the indices 0, 1, …, n-1
(``blocks.0.*`` … ``blocks.7.*``: an ``nn.ModuleList`` or ``nn.Sequential``) whose blocks all
hold the same parameter names and shapes. A block container whose count differs between the
base model and the target is a *depth container*, with multiplier m_L = L/L₀. Parameters of
block i of the target are read against block i mod L₀ of the base (all base blocks are alike).

How a block's residual branches are found (fx, else a probe forward) is `branches`'.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch import nn

from ..errors import ModelError

__all__ = [
    "BRANCH_ATTR",
    "DepthMap",
    "block_containers",
    "block_pattern",
    "branch_outputs",
    "in_numbered_block",
    "join_name",
    "outermost",
    "residual_branch",
    "split_block",
    "traced_helper",
]

BRANCH_ATTR = "_mutransfer_branch_mult"
# id(block) of blocks whose forward, while fx traced it, called `residual_branch` (read by `traced_helper`)
_TRACED_HELPER: set[int] = set()


# --------------------------------------------------------------------------- blocks


def block_containers(shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Prefix → number of blocks, for every run of identical indexed blocks in `shapes` (name → shape)."""
    groups: dict[str, dict[int, dict[str, tuple]]] = {}
    for name, shape in shapes.items():
        parts = name.split(".")
        for k, part in enumerate(parts[:-1]):
            if part.isdigit():
                prefix, rest = ".".join(parts[:k]), ".".join(parts[k + 1 :])
                groups.setdefault(prefix, {}).setdefault(int(part), {})[rest] = tuple(shape)
    out = {}
    for prefix, blocks in groups.items():
        if sorted(blocks) != list(range(len(blocks))):
            continue
        first = blocks[0]
        if all(b == first for b in blocks.values()):
            out[prefix] = len(blocks)
    return out


def split_block(name: str, prefix: str) -> tuple[int, str] | None:
    """(index, rest) when `name` is inside block container `prefix`, else None."""
    head = f"{prefix}." if prefix else ""
    if not name.startswith(head):
        return None
    idx, _, rest = name[len(head) :].partition(".")
    return (int(idx), rest) if idx.isdigit() else None


def block_pattern(name: str) -> str:
    """The name with every block index as "*": "blocks.3.attn" → "blocks.*.attn"."""
    return ".".join("*" if p.isdigit() else p for p in name.split("."))


def in_numbered_block(name: str) -> bool:
    """Whether the name lies inside an indexed block (a part that is a number)."""
    return any(p.isdigit() for p in name.split("."))


def join_name(*parts: str | int) -> str:
    """Dotted name of the non-empty parts: join_name("blocks", 3, "") == "blocks.3"."""
    return ".".join(str(p) for p in parts if p != "")


def outermost(prefixes: Iterable[str]) -> list[str]:
    """The containers not nested inside another one (a nested container repeats per block)."""
    prefixes = list(prefixes)
    return [p for p in prefixes if not any(q != p and split_block(p, q) is not None for q in prefixes)]


@dataclass
class DepthMap:
    """Depth containers between a base and another model: prefix → (L₀, L).

    `renamed` holds stacks of blocks that get no depth rule (u-µP: a plain stack, with no residual stream;
    a single block): their names still map onto the base's (block i → block i mod L₀), but `locate` and
    `multiplier` do not see them, so their parameters are outside any depth container.
    """

    containers: dict[str, tuple[int, int]] = field(default_factory=dict)
    renamed: dict[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def between(
        cls,
        base: Mapping[str, Sequence[int]],
        other: Mapping[str, Sequence[int]],
        base_depth: Mapping[str, int] | None = None,
    ) -> DepthMap:
        """Containers whose block count differs between `base` and `other` (name → shape maps).

        `base_depth` ({prefix: L₀}) declares the base depth explicitly, e.g. when the base
        model given has the target's depth (shapes only) but the HPs were tuned shallower.
        """
        b, o = block_containers(base), block_containers(other)
        found = {p: (b[p], o[p]) for p in b if p in o and b[p] != o[p]}
        found = {p: found[p] for p in outermost(found)}
        for prefix, l0 in (base_depth or {}).items():
            if prefix not in o:
                raise ModelError(
                    f"base_depth names '{prefix}', which is not a container of repeated "
                    f"blocks in the model (found: {', '.join(sorted(o)) or 'none'})"
                )
            if isinstance(l0, bool) or not isinstance(l0, int) or l0 < 1:
                raise ModelError(f"base_depth['{prefix}'] must be a positive integer, got {l0!r}")
            found[prefix] = (l0, o[prefix])
        return cls({p: v for p, v in found.items() if v[0] != v[1]})

    def locate(self, name: str) -> tuple[str, int, str] | None:
        """(container, block index, rest) of a parameter or module name, or None outside blocks."""
        return _locate(self.containers, name)

    def without_depth_rule(self, prefixes: Iterable[str]) -> DepthMap:
        """This map with the containers `prefixes` moved to `renamed` (names mapped, no depth rule)."""
        moved = {p: self.containers[p] for p in prefixes}
        kept = {p: v for p, v in self.containers.items() if p not in moved}
        return DepthMap(kept, {**self.renamed, **moved})

    def _reindex(self, name: str, side: int) -> str:
        every = {**self.renamed, **self.containers}
        hit = _locate(every, name)
        if hit is None:
            return name
        prefix, i, rest = hit
        return join_name(prefix, i % every[prefix][side], rest)

    def to_base(self, name: str) -> str:
        """The base model's name for `name` of the other model (block i → block i mod L₀)."""
        return self._reindex(name, 0)

    def from_base(self, name: str) -> str:
        """The other model's name for a base name (block i → block i mod L)."""
        return self._reindex(name, 1)

    def multiplier(self, name: str) -> float:
        """m_L = L/L₀ of the container holding `name`, 1.0 outside depth containers."""
        hit = self.locate(name)
        if hit is None:
            return 1.0
        l0, l = self.containers[hit[0]]
        return l / l0

    def normalized(self, name: str) -> str:
        """`name` with its block index replaced by '*' (the same for every block)."""
        hit = _locate({**self.renamed, **self.containers}, name)
        return name if hit is None else join_name(hit[0], "*", hit[2])


def _locate(containers: Mapping[str, Any], name: str) -> tuple[str, int, str] | None:
    """(container, block index, rest) of `name` in the innermost of `containers` holding it, or None."""
    for prefix in sorted(containers, key=len, reverse=True):
        hit = split_block(name, prefix)
        if hit is not None:
            return prefix, hit[0], hit[1]
    return None


# --------------------------------------------------------------------------- branches


_BRANCH_OUTPUTS: list | None = None  # (block, branch output) of each call, while `branch_outputs` records


@contextlib.contextmanager
def branch_outputs() -> Iterator[list[Any]]:
    """Record the branch outputs passed to `residual_branch` during a forward (for `export`)."""
    global _BRANCH_OUTPUTS
    _BRANCH_OUTPUTS, outer = [], _BRANCH_OUTPUTS
    try:
        yield _BRANCH_OUTPUTS
    finally:
        _BRANCH_OUTPUTS = outer


def residual_branch(block: nn.Module, out: Any) -> Any:
    """Scale a residual branch's output by its block's depth multiplier m_L^-α.

    Write ``x = x + mt.residual_branch(self, self.mlp(x))`` in a block whose branches
    mutransfer cannot find by tracing. Returns `out` unchanged on a model that is not
    parametrized across depth, so the same code serves both.
    """
    if isinstance(out, torch.fx.Proxy):
        _TRACED_HELPER.add(id(block))
        return out
    if _BRANCH_OUTPUTS is not None:
        _BRANCH_OUTPUTS.append((block, out))
    c = block.__dict__.get(BRANCH_ATTR, 1.0)
    return out if c == 1.0 else out * c


def traced_helper(block: nn.Module, clear: bool = False) -> bool:
    """Whether `block`'s forward called `residual_branch` while torch.fx traced it; `clear` forgets it
    (before a new trace, and once read)."""
    seen = id(block) in _TRACED_HELPER
    if clear:
        _TRACED_HELPER.discard(id(block))
    return seen
