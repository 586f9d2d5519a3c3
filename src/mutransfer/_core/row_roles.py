"""Roles per row range of fused projections, and what µP needs for them.

A fused in-projection's output is split into pieces (`row_trails` records the cuts on a probe
forward). Pieces that grow with width are what the weight's role says; a piece that keeps its
size while the input grows (B and C of a Mamba-2 ``in_proj``: ``ngroups·d_state`` rows at every
width) maps a width-sized input to a fixed-size output, so by µP's rules its rows are
output-like: the readout's init, not the hidden one. The growth of each piece is measured by
comparing the cuts the base model's probe recorded (kept in the width shapes) with those of the
model's own probe (`measure_pieces`); at base width there is nothing to compare and nothing to
change. The reverse fusion (a fixed-size input concatenated beside a width-sized one into one
projection's columns) is found the same way (`column_roles`) and only reported.

What µP needs for such rows is derived from the rules (data, `rules.py`) by the abc-symmetry:
what matters is the *effective* weight, forward constant × stored value. ``init_ratio`` is the
rows' effective init (init × forward) over the weight's; a forward multiplier ``a`` on the rows
would make an entrywise (Adam-like) step ``a·lr``. `row_plan` gives both. For the tables the
library has (TP5 Tables 3 and 8) ``a`` is exactly 1 (output and hidden weights both step by
lr/m_in under Adam), so the rows need only their init rescaled: no forward multiplier, nothing
to fold at export, and the rows keep the weight's optimizer group.

The rows keep the group's lr under SGD and Muon too, by measurement, not by the tables' readout
row (``sgd_lr`` 1/m_in). The table assumes the readout's output gradient is Θ(1); B and C gate
each other (y = Σ_n C_n h_n with h ∝ B), so at init each one's gradient carries the other's
Θ(1/√m) and a width-sized sum of uncorrelated Θ(1/m) terms. Measured on `ToyMamba2`
(tests/mechanisms_rows.py; widths 64 → 512, 8 steps, 2 seeds, 2-core CPU): with SGD (lr 0.3) the
change of B had slope +0.35 with the whole weight hidden (check FAIL), −0.12 with the rows' init
alone (PASS) and −1.1 with the readout's SGD lr on the rows as well (FAIL, vanishes); with Muon
(lr 0.02) +0.44 (FAIL) before and −0.08 (PASS) after.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..rules import Rule, factor
from .row_trails import row_pieces

__all__ = ["RowRole", "assign_row_roles", "measure_pieces", "piece_role", "row_plan", "rows_of"]

_ROLE = {(True, True): "hidden", (True, False): "output", (False, True): "input", (False, False): "scalar"}


@dataclass(frozen=True)
class RowRole:
    """A row range [start, stop) of a weight's row dim `dim` whose role differs from the weight's."""

    dim: int
    start: int
    stop: int
    role: str
    init_ratio: float = 1.0  # its effective init over the weight's (applied to the rows by parametrize)

    def __str__(self) -> str:
        return f"rows {self.start}:{self.stop} {self.role}"


def _pieces_of(which: str, info, shapes, seen, params: dict):
    """(measured pieces, the model's cuts) of one weight's rows or columns, from the base's probe (in the
    shapes) and the model's own; None at base width (nothing to compare, and nothing µP changes there)."""
    base_cuts = getattr(shapes, f"{which}_cuts", {}).get(info.base_name)
    model_cuts = getattr(seen, f"{which}_cuts", {}).get(info.name) if seen is not None and seen.ran else None
    if base_cuts is None or model_cuts is None or base_cuts[0] != model_cuts[0]:
        return None
    dim = base_cuts[0]
    base_n, model_n = shapes.params[info.base_name].base[dim], params[info.name].shape[dim]
    if base_n == model_n:
        return None
    pieces = measure_pieces(base_cuts, model_cuts, base_n, model_n)
    if pieces is None or all(pieces[2]) or not any(pieces[2]):
        return None
    return pieces, model_cuts


def measure_pieces(base_cuts, other_cuts, base_n: int, other_n: int):
    """(row dim, base piece sizes, which pieces grow) of one weight from the cuts at two widths, or
    None when the two forwards cut it differently (then nothing is claimed)."""
    dim, cuts = base_cuts
    odim, ocuts = other_cuts
    base_p = row_pieces(base_n, set(cuts))
    other_p = row_pieces(other_n, set(ocuts))
    if dim != odim or len(base_p) != len(other_p) or len(base_p) < 2:
        return None
    sizes = tuple(b - a for a, b in base_p)
    grows = tuple((b - a) != (d - c) for (a, b), (c, d) in zip(base_p, other_p))
    return dim, sizes, grows


def piece_role(fan_in_grows: bool, piece_grows: bool) -> str:
    """The role of a piece of rows: its fan_in is the weight's, its fan_out the piece."""
    return _ROLE[(fan_in_grows, piece_grows)]


def rows_of(pieces, weight_role: str, fan_in_grows: bool, model_cuts, model_n: int) -> list[tuple[int, int, int, str]]:
    """(dim, start, stop, role) of the row ranges whose role differs from `weight_role`, in the model's rows.

    `pieces` is `measure_pieces`'s triple; the model's own cuts (from its probe) place the ranges,
    else the base sizes are scaled (growing pieces share the growth of the whole dim)."""
    dim, sizes, grows = pieces
    if model_cuts is not None and model_cuts[0] == dim and len(row_pieces(model_n, model_cuts[1])) == len(sizes):
        ranges = row_pieces(model_n, model_cuts[1])
    else:
        fixed = sum(s for s, g in zip(sizes, grows) if not g)
        growing = sum(s for s, g in zip(sizes, grows) if g)
        ratio = (model_n - fixed) / growing if growing else 1.0
        start, ranges = 0, []
        for s, g in zip(sizes, grows):
            n = round(s * ratio) if g else s
            ranges.append((start, start + n))
            start += n
    out = []
    for (a, b), g in zip(ranges, grows):
        role = piece_role(fan_in_grows, g)
        if role != weight_role:
            out.append((dim, a, b, role))
    return out


def _effective(rule: Rule, column: str, m_in: float, m_out: float, forward_power: int) -> float:
    return factor(getattr(rule, column), m_in, m_out) * factor(rule.forward, m_in, m_out) ** forward_power


def row_plan(rules: dict[str, Rule], weight_role: str, row_role: str, m_in: float, m_out: float) -> tuple[float, float]:
    """(init ratio, forward multiplier a) that give rows of `row_role` inside a weight of `weight_role`
    µP's effective init and entrywise lr under the weight's own group (see the module docstring)."""
    w, r = rules[weight_role], rules[row_role]
    a = _effective(r, "adam_lr", m_in, 1.0, 1) / _effective(w, "adam_lr", m_in, m_out, 1)
    init = _effective(r, "init", m_in, 1.0, 1) / _effective(w, "init", m_in, m_out, 1) / a
    return init, a


def _cut_along(kind: str, info, shapes, seen, params: dict):
    """(pieces, the model's cuts, the cut fan dims, the other fan dims) of a weight measured as cut
    into pieces along its rows (kind "row": its fan-out) or columns ("col": its fan-in); None when
    it was not, its role came from ``roles=``, or the cut is not along that one fan dim."""
    measured = _pieces_of(kind, info, shapes, seen, params)
    out_i, in_i = (1, 0) if kind == "row" else (0, 1)  # the layout's index of the cut fan dim, of the other
    along_dims, across_dims = (
        (info.fan_out_dims, info.fan_in_dims) if kind == "row" else (info.fan_in_dims, info.fan_out_dims)
    )
    if measured is None or info.source == "override" or (info.layout is None and not along_dims):
        return None
    pieces, model_cuts = measured
    along = along_dims or (info.layout[out_i],)
    across = across_dims or (info.layout[in_i],)
    if tuple(along) != (pieces[0],):
        return None
    return pieces, model_cuts, along, across


def assign_row_roles(infos: dict, shapes, seen, rules: dict[str, Rule], params: dict) -> list[str]:
    """Set ``info.row_roles`` (a tuple of `RowRole`) on every weight some of whose measured pieces have
    another role than the weight; returns the names. A role set by ``roles=`` is left whole."""
    found = []
    for name, info in infos.items():
        measured = _cut_along("row", info, shapes, seen, params)
        if measured is None:
            continue
        pieces, model_cuts, fan_out, fan_in = measured
        width = shapes.params[info.base_name].width
        fan_in_grows = any(width[d] for d in fan_in)
        ranges = rows_of(pieces, info.role, fan_in_grows, model_cuts, params[name].shape[pieces[0]])
        if not ranges:
            continue
        growing = sum(s for s, g in zip(pieces[1], pieces[2]) if g)
        fixed = sum(s for s, g in zip(pieces[1], pieces[2]) if not g)
        if growing and len(fan_out) == 1:  # the growing rows' ratio, not the fused dim's (diluted by fixed rows)
            info.m_out = float((params[name].shape[pieces[0]] - fixed) / growing)
        info.row_roles = tuple(
            RowRole(d, a, b, role, row_plan(rules, info.role, role, info.m_in, info.m_out)[0])
            for d, a, b, role in ranges
        )
        found.append(name)
    return found


def column_roles(infos: dict, shapes, seen, params: dict) -> dict[str, list[tuple[int, int, str]]]:
    """The reverse fusion: weight → (start, stop, role) of its column ranges whose role differs from the
    weight's (a fixed-size input concatenated to a width-sized one: input-like columns of a hidden weight).
    Not compensated yet; `parametrize` warns, naming them. A role set by ``roles=`` is left whole."""
    out = {}
    for name, info in infos.items():
        measured = _cut_along("col", info, shapes, seen, params)
        if measured is None:
            continue
        pieces, model_cuts, _, fan_out = measured
        fan_out_grows = any(shapes.params[info.base_name].width[d] for d in fan_out)
        ranges = rows_of(pieces, "", True, model_cuts, params[name].shape[pieces[0]])  # every range, role aside
        found = [
            (a, b, role)
            for (_, a, b, _), g in zip(ranges, pieces[2])
            if (role := piece_role(g, fan_out_grows)) != info.role
        ]
        if found:
            out[name] = found
    return out
