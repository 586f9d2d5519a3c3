"""Row ranges of fused projections, for the recorder: where a projection's output is split.

A fused in-projection computes several things in one matrix product (an SSM's
``in_proj`` gives z, x, B, C and dt; a fused ``qkv`` gives q, k and v), and the forward then
splits its output along the last dim. The pieces may scale differently with width: B and C
of a Mamba-2 block have ``ngroups·d_state`` rows at every width while z and x grow. To give
each piece its own role, the recorder follows a projection's output (``linear(x, W)``,
``x @ W``) along its last dim through ``split`` / ``chunk`` / ``tensor_split`` / ``narrow``,
slices of the last dim and unary elementwise functions, and records, per weight, the row
offsets where it was cut (`Observation.row_cuts`). Comparing the pieces at two widths says
which are fixed-size (`row_roles`).
"""

from __future__ import annotations

import itertools
import weakref

import torch

from .observation import Observation
from .op_tables import SAME_SHAPE, SPLIT, tensors_in

__all__ = ["RowTrails"]

_Trail = tuple[str, int, int, int, int]  # (parameter, its row dim, first row, end row, the tensor dim holding them)


class RowTrails:
    """Which rows of which weight a dim of each tensor holds (see the module docstring)."""

    obs: Observation
    params: dict[int, str]

    def init_row_trails(self) -> None:
        """Empty bookkeeping (called by the recorder's ``__init__``)."""
        self.row_of: dict[int, tuple[weakref.ref, _Trail]] = {}
        self.cols_of: dict[int, tuple[weakref.ref, tuple[int, ...]]] = {}  # a concatenation → its pieces' sizes

    def _p(self, t):  # the recorder's parameter provenance
        raise NotImplementedError

    def _rows(self, t) -> _Trail | None:
        if not isinstance(t, torch.Tensor):
            return None
        entry = self.row_of.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def _set_rows(self, t, trail: _Trail) -> None:
        axis = trail[4]
        if isinstance(t, torch.Tensor) and 0 <= axis < t.ndim and t.shape[axis] == trail[3] - trail[2]:
            try:
                self.row_of[id(t)] = (weakref.ref(t), trail)
            except TypeError:
                pass

    def _cut(self, trail: _Trail, start: int, stop: int) -> _Trail:
        name, dim, first, _, axis = trail
        cuts = self.obs.row_cuts.setdefault(name, (dim, set()))[1]
        cuts.update({first + start, first + stop})
        return (name, dim, first + start, first + stop, axis)

    def _track_columns(self, name: str, args, kwargs, out) -> None:
        """The reverse fusion: inputs concatenated along the last dim, then contracted with a weight."""
        if name in ("cat", "concat", "concatenate") and isinstance(out, torch.Tensor) and args:
            parts = args[0] if isinstance(args[0], (list, tuple)) else ()
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if len(parts) > 1 and all(isinstance(t, torch.Tensor) and t.ndim == out.ndim for t in parts):
                if int(dim) % out.ndim == out.ndim - 1:
                    try:
                        self.cols_of[id(out)] = (weakref.ref(out), tuple(int(t.shape[-1]) for t in parts))
                    except TypeError:
                        pass
            return
        if name != "linear" or not args:
            return
        entry = self.cols_of.get(id(args[0]))
        w = args[1] if len(args) > 1 else kwargs.get("weight")
        pw = self._p(w)
        if entry is None or entry[0]() is not args[0] or pw is None or len(pw[1]) != 2 or len(pw[1][1]) != 1:
            return
        cuts = set(itertools.accumulate(entry[1]))
        self.obs.col_cuts.setdefault(pw[0], (pw[1][1][0], set()))[1].update(cuts | {0})

    def _track_rows(self, name: str, args, kwargs, out) -> None:
        self._track_columns(name, args, kwargs, out)
        if name in ("linear", "matmul", "mm"):
            w = (
                (args[1] if len(args) > 1 else kwargs.get("weight"))
                if name == "linear"
                else (args[1] if len(args) > 1 else None)
            )
            pw = self._p(w)
            if pw is None or len(pw[1]) != 2 or not isinstance(out, torch.Tensor):
                return
            rows = pw[1][0] if name == "linear" else pw[1][1]  # the weight dim that becomes the output's last dim
            if len(rows) == 1 and out.ndim >= 1:
                self._set_rows(out, (pw[0], rows[0], 0, int(out.shape[-1]), out.ndim - 1))
            return
        first = args[0] if args else None
        trail = self._rows(first)
        if trail is None or not isinstance(first, torch.Tensor):
            return
        ndim, axis = first.ndim, trail[4]
        if name in SAME_SHAPE:
            if isinstance(out, torch.Tensor) and out.shape == first.shape:
                self._set_rows(out, trail)
        elif name in ("transpose", "swapaxes", "swapdims") and isinstance(out, torch.Tensor):
            i = int(args[1] if len(args) > 1 else kwargs["dim0"]) % ndim
            j = int(args[2] if len(args) > 2 else kwargs["dim1"]) % ndim
            self._set_rows(out, trail[:4] + ({i: j, j: i}.get(axis, axis),))
        elif name in ("conv1d", "conv2d", "conv3d") and axis == 1 and isinstance(out, torch.Tensor):
            groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)
            if int(groups) == first.shape[1] == out.shape[1]:  # depthwise: channel i of the output is channel i's
                self._set_rows(out, trail)
        elif name in SPLIT:
            self._split(name, trail, first, args, kwargs, out)
        elif name == "getitem" and isinstance(out, torch.Tensor):
            self._slice(trail, first, args[1] if len(args) > 1 else None, out)

    def _split(self, name: str, trail: _Trail, first: torch.Tensor, args, kwargs, out) -> None:
        dim = kwargs.get("dim", args[2] if len(args) > 2 and name != "narrow" else None)
        if name == "narrow":
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
        axis = trail[4]
        if (0 if dim is None else int(dim)) % first.ndim != axis:
            return
        start = int(args[2] if len(args) > 2 else kwargs.get("start", 0)) if name == "narrow" else 0
        for piece in tensors_in(out):
            size = int(piece.shape[axis])
            self._set_rows(piece, self._cut(trail, start, start + size))
            start += size

    def _slice(self, trail: _Trail, first: torch.Tensor, index, out: torch.Tensor) -> None:
        """Plain slices (no ints, None or tensors) keep every dim; a slice of the rows' dim cuts them."""
        idx = index if isinstance(index, tuple) else (index,)
        if sum(i is Ellipsis for i in idx) > 1 or not all(isinstance(i, slice) or i is Ellipsis for i in idx):
            return
        if Ellipsis in idx:
            k = idx.index(Ellipsis)
            idx = idx[:k] + (slice(None),) * (first.ndim - len(idx) + 1) + idx[k + 1 :]
        idx = idx + (slice(None),) * (first.ndim - len(idx))
        if len(idx) != first.ndim or out.ndim != first.ndim:
            return
        axis = trail[4]
        part = idx[axis]
        if part.step not in (None, 1):
            return
        start, stop, _ = part.indices(int(first.shape[axis]))
        if (start, stop) == (0, int(first.shape[axis])):
            self._set_rows(out, trail)
        elif stop > start:
            self._set_rows(out, self._cut(trail, start, stop))


def row_pieces(n: int, cuts: set[int] | tuple[int, ...]) -> list[tuple[int, int]]:
    """The pieces [start, stop) a dim of size `n` falls into at the given cuts."""
    bounds = sorted({0, n} | {c for c in cuts if 0 < c < n})
    return list(itertools.pairwise(bounds))
