"""summary.json: every number of the report in one file, and the sentences built from it.

`summarize` gathers the verdicts (`analysis.verdicts`), the grid optima per cell and their
drift, the wider/deeper-is-better checks, the head-to-head at the largest width, the transferred
hyperparameters and the compute; `verdict_lines` and `head_to_head_line` state them.
"""

from __future__ import annotations

import json
import math

from ..config.config import TRANSFERRING, transferred_parametrization
from ..config.space import LogUniform
from ..engine.runner import Sweep
from .analysis import (
    TrialResult,
    best,
    costs,
    counts,
    deeper_is_better,
    drift,
    head_to_head,
    max_drift_steps,
    placements,
    proxy_verdict,
    transferred_hparams,
    verdicts,
    wider_is_better,
)
from .analysis import axes as verdict_axes
from .forecasts import forecast
from .statistics import CONFIDENCE, Verdict
from .trajectory import PROXY_FILE, noise_scale_file, write_proxy_trajectory
from .verdict import axis_name, optima_sentence, short_label, verdict_sentence

__all__ = [
    "TRANSFER_RUNS",
    "head_to_head_line",
    "load_transfer",
    "plain",
    "summarize",
    "summary_text",
    "transfer_where",
    "verdict_lines",
]

TRANSFER_RUNS = (
    ("mup", "µP target, µP proxy optimum"),
    ("u-mup", "u-µP target, u-µP proxy optimum"),
    ("sp", "SP target, SP proxy optimum"),
)


def transfer_where(out: dict, which: str) -> str:
    """'width 32' or 'width 32, depth 2' (and the target's batch size and steps when given): the
    "proxy" or "target" of a transfer result."""
    depth = out.get(f"{which}_depth")
    where = f"width {out[f'{which}_width']}" + ("" if depth is None else f", depth {depth}")
    if which == "target":
        where += "".join(f", {k.replace('_', ' ')} {out[k]}" for k in ("batch_size", "steps") if k in out)
    return where


def _cell_optimum(b: TrialResult | None) -> dict | None:
    return None if b is None else {"loss": b.loss, **b.params}


def _drift_entry(sweep: Sweep, results: list[TrialResult], p: str, along: str) -> dict:
    """{hp: {"octaves"|"value": drift, "max_grid_steps": ...}} along one axis, at the proxy."""
    space = sweep.config.space
    return {
        n: {
            "octaves" if isinstance(space[n], LogUniform) else "value": drift(sweep, results, p, n, along),
            "max_grid_steps": max_drift_steps(sweep, results, p, n, along),
        }
        for n in space
    }


def load_transfer(sweep: Sweep) -> dict | None:
    path = sweep.run_dir / "transfer.json"  # written by `mutransfer transfer`
    return json.loads(path.read_text()) if path.is_file() else None


def verdict_lines(sweep: Sweep, judged: dict[str, dict[str, Verdict]]) -> list[str]:
    """One sentence per (parametrization, axis), µP first, then u-µP (`config.TRANSFERRING`), then the rest in
    the config's order: the verdicts at the top of the report."""
    lines = []
    for p in sorted(judged, key=lambda p: TRANSFERRING.index(p) if p in TRANSFERRING else len(TRANSFERRING)):
        for axis, v in judged[p].items():
            lines.append(verdict_sentence(v, f"{short_label(p)} across {axis_name(axis, plural=True)}"))
    return lines


def head_to_head_line(h: dict | None) -> str | None:
    """TP5 Fig. 1's promise, measured: µP (u-µP in a sweep without µP: h["parametrization"]) with the proxy's HPs
    against SP re-tuned at the largest width."""
    if h is None:
        return None
    mup = short_label(h.get("parametrization", "mup"))
    if h["mup_transferred"] is None:
        what = "was pruned (worse early on than that width's finished trials)" if h.get("mup_pruned") else "diverged"
        return (
            f"At width {h['width']}, {mup} with the HPs tuned at width {h['proxy_width']} {what}; SP re-tuned "
            f"there reaches {h['sp_retuned']:.4g}."
        )
    rel, iv = h["relative"], h.get("relative_interval")
    lo, hi = iv if iv is not None else (rel, rel)
    if rel is None:
        judgement = "no relative difference: SP's loss is 0"
    elif hi < -0.01:
        judgement = f"{mup} is better"
    elif hi <= 0.01:
        judgement = f"{mup} is as good (within 1%) or better"
    elif lo > 0.01:
        judgement = f"SP re-tuned at the large width is better: at this scale {mup} does not pay off"
    else:
        judgement = "within the noise the two cannot be told apart: add seeds"
    ci = "" if iv is None else f", 90% CI {100 * iv[0]:+.1f}% … {100 * iv[1]:+.1f}%"
    return (
        f"At width {h['width']}, {mup} with the HPs tuned at width {h['proxy_width']} reaches "
        f"{h['mup_transferred']:.4f}; SP re-tuned at width {h['width']} reaches {h['sp_retuned']:.4f} "
        f"({'' if rel is None else f'{100 * rel:+.1f}%{ci}: '}{judgement})."
    )


def plain(value):
    """JSON for pipelines: NaN and ±inf become null (a diverged loss, an unknown ratio); grid values
    lose their float noise (0.19999999999999998 → 0.2)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float):
        return float(f"{value:.12g}") if math.isfinite(value) else None
    return value


def summarize(sweep: Sweep, results: list[TrialResult], judged: dict | None = None) -> dict:
    """summary.json: the verdict line, per parametrization and axis the optima with intervals, drift
    with interval, transferred, regret and trial counts (`verdicts`); the grid optima per cell and
    their drift, bigger-is-better checks, the head-to-head at the largest width, the transferred HPs
    and the cost.

    Args:
        sweep: the sweep.
        results: its trials (`analysis.load_results`).
        judged: `analysis.verdicts(sweep, results)` when already computed.

    Returns:
        The content of summary.json (NaN and infinities still in; `plain` makes it JSON).
    """
    cfg = sweep.config
    ps = cfg.parametrizations
    judged = verdicts(sweep, results) if judged is None else judged
    lines = verdict_lines(sweep, judged)
    for p in ps:
        if verdict_axes(sweep) and not judged[p]:
            c = counts(results, p)
            lines.append(
                f"{short_label(p)}: no verdict: no completed trial at the proxy "
                f"({c['diverged']} diverged, {c['failed']} failed, {c['pruned']} pruned); "
                f"fix the objective or the ranges and rerun"
            )
    done, total = sweep.finished(), sweep.total_trials()
    if done < total:
        lines.insert(
            0,
            f"The sweep is unfinished ({done} of {total} trials done): every verdict below is "
            f"provisional; finish it with `mutransfer sweep` and report again.",
        )
    lines = lines or [
        "No transfer verdict: every trial ran at one width and depth, so this sweep tunes at that scale; "
        "sweep several widths (or depths, batch sizes, horizons) to check a transfer."
    ] + [
        optima_sentence(v, short_label(p))
        for p in cfg.parametrizations
        if (v := proxy_verdict(sweep, results, p)) is not None
    ]
    h2h = head_to_head(sweep, results)
    summary = {
        "name": cfg.name,
        "objective": cfg.objective,
        "verdict": " ".join(lines[:1]),
        "verdicts": lines,
        "transferred": {p: all(v.transferred for v in judged[p].values()) if judged[p] else None for p in ps},
        "confidence": CONFIDENCE,
        "seeds": cfg.seeds,
        "widths": cfg.widths,
        "proxy_width": cfg.proxy_width,
    }
    if cfg.depths is not None:
        summary.update(depths=cfg.depths, base_depth=cfg.base_depth, proxy_depth=cfg.proxy_depth)
    summary["analysis"] = {p: {axis: v.as_dict() for axis, v in judged[p].items()} for p in ps}
    summary["head_to_head"] = h2h
    summary["transferred_hparams"] = transferred_hparams(sweep, results)
    recorded = write_proxy_trajectory(sweep, results, say=lambda line: None)  # from the trials (a cluster sweep's too)
    summary["proxy_trajectory"] = PROXY_FILE if recorded is not None and recorded.get("file") else None
    noise = noise_scale_file(sweep.run_dir)  # the critical batch estimate `mutransfer transfer --batch-size` uses
    summary["noise_scale"] = (
        None
        if noise is None
        else {k: noise[k] for k in ("b_simple", "interval", "reason", "small", "big", "batches", "width")}
    )
    if cfg.depths is None:
        summary["optima"] = {p: {str(w): _cell_optimum(best(results, p, w)) for w in cfg.widths} for p in ps}
    else:
        summary["optima"] = {
            p: {str(w): {str(d): _cell_optimum(best(results, p, w, d)) for d in cfg.depths} for w in cfg.widths}
            for p in ps
        }
    summary["drift"] = {p: _drift_entry(sweep, results, p, "width") for p in ps}
    if cfg.depths is not None:
        summary["depth_drift"] = {p: _drift_entry(sweep, results, p, "depth") for p in ps}
    summary["wider_is_better"] = {p: wider_is_better(sweep, results, p) for p in ps}
    if cfg.depths is not None:
        summary["deeper_is_better"] = {p: deeper_is_better(sweep, results, p) for p in ps}
    c = counts(results)
    transfer = load_transfer(sweep)  # read once: the cost and the forecast both use it
    summary.update(
        trials=len(results),
        diverged=c["diverged"],
        failed=c["failed"],
        pruned=c["pruned"],
        counts={p: counts(results, p) for p in ps},
        sweep_seconds=sum(r.seconds for r in results),
        cost=costs(sweep, results, transfer),
    )
    summary["failures"] = [  # why each failed trial failed ("worker died N times" for a crashing point)
        {
            "parametrization": r.parametrization,
            "width": r.width,
            "number": r.number,
            "params": r.params,
            "error": r.error,
        }
        for r in results
        if r.failed
    ]
    summary["forecast"] = _forecast_entry(sweep, results, transfer)
    summary["precision"] = cfg.precision
    summary["placements"] = placements(results)
    summary["trial_list"] = [
        {
            "parametrization": r.parametrization,
            "width": r.width,
            "depth": r.depth,
            **{axis: value for axis, value in r.extra},
            "number": r.number,
            "params": r.params,
            "loss": r.loss,
            "outcome": ("pruned" if r.pruned else "failed" if r.failed else "diverged" if r.diverged else "complete"),
            "device": r.device or None,
            "cuda_visible_devices": r.cuda_visible_devices,
            "precision": r.precision or None,
            "seconds": r.seconds,
            "flops": r.flops if math.isfinite(r.flops) else None,
        }
        for r in results
    ]
    return summary


def _forecast_entry(sweep: Sweep, results: list[TrialResult], transfer: dict | None) -> dict | None:
    """The forecast the report shows (the transferred parametrization's: µP's, else u-µP's): transfer.json's (at
    the trained target, with its actual loss), else `mt.sweep.forecast` at the config's target_width (or the
    largest swept width: the law and its held-out check); None without µP or u-µP trials or when the config's
    target is refused (`mutransfer forecast` says why)."""
    if transfer is not None and transfer.get("forecast") is not None:
        return transfer["forecast"]
    if sweep.config.transferred is None:
        return None
    try:
        return forecast(sweep, parametrization=sweep.config.transferred, results=results).as_dict()
    except ValueError:
        return None


def summary_text(summary: dict, report: str | None = None) -> str:
    """What `mutransfer report` prints: the verdict sentences, the transferred hyperparameters, the path.

    Args:
        summary: the content of summary.json (`summarize`).
        report: report.html's path, printed last (None: left out).

    Returns:
        Lines of text, every sentence and number read from `summary`.
    """
    lines = ["Verdict:"] + [f"  {line}" for line in summary["verdicts"]]
    h2h = head_to_head_line(summary.get("head_to_head"))
    if h2h:
        lines.append(f"  {h2h}")
    hps = summary.get("transferred_hparams")
    where = f"width {summary['proxy_width']}" + (
        f", depth {summary['proxy_depth']}" if summary.get("proxy_depth") is not None else ""
    )
    # the transferred parametrization (µP, else u-µP), read off the parametrizations summary.json is keyed by
    mup = short_label(transferred_parametrization(summary.get("counts", {})) or "mup")
    if hps:
        lines += ["", f"Transferred hyperparameters (the {mup} proxy's best trial, {where}; also in transferred.json):"]
        width = max(len(k) for k in hps)
        lines += [f"  {k:<{width}} = {_value(v)}" for k, v in hps.items()]
    else:
        lines += ["", f"No transferred hyperparameters: no completed {mup} trial at the proxy ({where})."]
    if report is not None:
        lines += ["", f"report: {report}"]
    return "\n".join(lines)


def _value(v) -> str:
    """A hyperparameter as the user would type it: 0.015625 (2^-6), 150, "adamw"."""
    if isinstance(v, float):
        log = math.log2(v) if v > 0 else math.nan
        exact = math.isfinite(log) and abs(log - round(log)) < 1e-9 and abs(log) > 3
        return f"{v:.6g}" + (f" (2^{round(log)})" if exact else "")
    return json.dumps(v) if isinstance(v, (str, bool)) else str(v)
