"""One run's FLOPs at a width (and depth) the sweep did not train, from the FLOPs its trials counted."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..config.config import short_label
from ..engine.runner import Sweep
from .analysis import TrialResult, costs, in_cell
from .loss_law import span

__all__ = ["target_flops"]


def target_flops(
    sweep: Sweep, results: list[TrialResult], width: int, depth: int | None = None
) -> dict[str, Any] | None:
    """One run's FLOPs at (`width`, `depth`), estimated from the FLOPs the sweep's µP trials counted (the
    transferred parametrization's, `SweepConfig.transferred`: µP's, else u-µP's; an SP-only sweep's SP trials).

    At a fixed batch and horizon a model's matmul FLOPs are a polynomial in width — quadratic (the hidden
    matmuls), linear (a readout or attention scores over a fixed length), and a constant for matmuls that do
    not grow — times the number of blocks in depth. The per-seed counts of the cells (the median over each
    cell's completed trials) are fitted by least squares on relative error: 1, w, w² with three widths or
    more, w and w² with two (× 1, d in a sweep over depths); `misfit` is the largest relative residual.

    Args:
        sweep: the sweep.
        results: its trials.
        width: the run's width.
        depth: its depth (sweeps over depths).

    Returns:
        ``{"target", "fit", "misfit", "proxy_flops", "sweep_flops"}`` (the last two: what tuning and the whole
        sweep counted), or None when no trial recorded its FLOPs. "target" is None (and "fit" says why) when
        the widths (depths) the counts span cannot reach the run.
    """
    cfg = sweep.config
    parametrization = cfg.transferred or cfg.parametrizations[0]
    cost = costs(sweep, results)
    if cost["sweep_flops"] is None:
        return None
    out: dict[str, Any] = {
        "target": None,
        "fit": "",
        "misfit": None,
        "proxy_flops": cost["proxy_flops"],
        "sweep_flops": cost["sweep_flops"],
    }
    cells = []
    for w in cfg.widths:
        for d in list(cfg.depths) if cfg.depths is not None else [None]:
            per_seed = [  # training alone: the noise-scale measurement runs in the proxy cell only
                (r.flops - (r.flops_measurement if math.isfinite(r.flops_measurement) else 0.0)) / len(r.losses)
                for r in in_cell(results, parametrization, w, d)
                if r.ok and math.isfinite(r.flops) and r.losses
            ]
            if per_seed:
                cells.append((w, d, float(np.median(per_seed))))
    if cells and all(f == 0 for _, _, f in cells):
        out.update(target=0.0, fit="no FLOPs counted at any width (no torch matmul, convolution or attention)")
        return out
    cells = [c for c in cells if c[2] > 0]
    widths = sorted({w for w, _, _ in cells})
    depths = sorted({d for _, d, _ in cells if d is not None})
    if not cells:
        out["fit"] = f"no completed {short_label(parametrization)} trial recorded its FLOPs"
        return out
    if len(widths) < 2 and width not in widths:
        out["fit"] = "the counts span one width: no law in width"
        return out
    if depth is not None and len(depths) < 2 and depth not in depths:
        out["fit"] = "the counts span one depth: no law in depth"
        return out
    powers = [0, 1, 2] if len(widths) >= 3 else [1, 2] if len(widths) == 2 else [0]
    in_depth = depth is not None and len(depths) >= 2
    columns = [(p, q) for p in powers for q in ([0, 1] if in_depth else [0])]

    def row(w: float, d: float | None) -> np.ndarray:
        return np.array([w**p * ((d or 1.0) ** q) for p, q in columns], dtype=float)

    X = np.stack([row(w, d) for w, d, _ in cells])
    y = np.array([f for _, _, f in cells])
    coef = np.linalg.lstsq(X / y[:, None], np.ones(len(y)), rcond=None)[0]  # least squares on relative error
    fitted = X @ coef
    out["target"] = float(row(width, depth) @ coef)
    out["misfit"] = float(np.max(np.abs(fitted / y - 1)))
    names = {0: "1", 1: "w", 2: "w²"}
    terms = ", ".join(names[p] + ("·d" if q else "") for p, q in columns)
    out["fit"] = f"a sum of {terms} fitted to the per-seed training counts at widths {span(widths)}" + (
        f" × depths {span(depths)}" if in_depth else ""
    )
    return out
