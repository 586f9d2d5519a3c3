"""`mutransfer report RUN`: report.html, one PNG per hyperparameter, summary.json, transferred.json.

The figures are drawn in `plots`, the numbers gathered in `summary` (from `analysis` and
`statistics`), the sentences written in `verdict`; this module gathers the page's values and
writes the files. The page is rendered by `report_page` (Jinja2, autoescaped: no value from the
data reaches the HTML unescaped), and figure file names are `report_page.figure_name` (safe for
any hyperparameter name).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..._core.atomic import write_atomically
from ...monitor import load_trajectory
from ..analysis.analysis import (
    TrialResult,
    best,
    deeper_is_better,
    drift,
    in_cell,
    load_results,
    max_drift_steps,
    proxy_verdict,
    verdicts,
    wider_is_better,
)
from ..analysis.forecasts import Forecast
from ..analysis.statistics import CONFIDENCE, Optimum, Verdict, unit, value_at
from ..analysis.summary import (
    TRANSFER_RUNS,
    head_to_head_line,
    load_transfer,
    plain,
    summarize,
    transfer_where,
    verdict_lines,
)
from ..analysis.trajectory import monitor_line, proxy_trajectory
from ..analysis.verdict import LABEL, axis_name
from ..config.config import short_label, transferred_parametrization
from ..config.space import Choice, LogUniform
from ..engine.runner import Sweep
from ..engine.storage import mask_url
from .plots import (
    FORECAST_FIGURE,
    LINESTYLES,
    MONITOR_FIGURE,
    axis_lines,
    cell_of,
    curves,
    plot_forecast,
    plot_hparam,
    plot_monitor,
    varying,
)
from .report_page import figure_name, render_page

__all__ = [
    "LABEL",
    "LINESTYLES",
    "TRANSFER_RUNS",
    "axis_lines",
    "cell_of",
    "curves",
    "figure_name",
    "head_to_head_line",
    "plot_hparam",
    "summarize",
    "transfer_where",
    "verdict_lines",
    "write_report",
]


def _fmt(v) -> str:
    if isinstance(v, float):
        if v > 0 and abs(math.log2(v) - round(math.log2(v))) < 1e-9:
            return f"2^{round(math.log2(v))}"
        return f"{v:.4g}"
    return str(v)


def _placement_text(placed: dict) -> str:
    """'Trained on: cpu (CUDA_VISIBLE_DEVICES=0), fp32: 8 trials, 12 s; …', or ''."""
    if not placed:
        return ""
    return (
        "Trained on: "
        + "; ".join(f"{k}: {int(v['trials'])} trials, {v['seconds']:.0f} s" for k, v in placed.items())
        + "."
    )


Rows = list[list[str]]


def _optimum_rows(sweep: Sweep, results: list[TrialResult]) -> Rows:
    cfg = sweep.config
    rows = []
    for p, w, d, extra in cfg.all_cells:
        b = best(results, p, w, d, extra)
        cell = in_cell(results, p, w, d, extra)
        n, nd, nf, npr = (
            len(cell),
            sum(r.diverged for r in cell),
            sum(r.failed for r in cell),
            sum(r.pruned for r in cell),
        )
        depth = [] if d is None else [str(d)]
        values = [_fmt(b.params[k]) if b else "—" for k in cfg.space]
        loss = f"{b.loss:.4f}" if b else "—"
        if cfg.axes:
            setting = {**cfg.proxy_extra, **dict(extra)}
            depth.append(", ".join(f"{k} {v}" for k, v in setting.items()))
        rows.append([LABEL[p], str(w), *depth, *values, loss, str(n), str(nd), str(nf), str(npr)])
    return rows


def _drift_rows(sweep: Sweep, results: list[TrialResult]) -> Rows:
    """One row per (parametrization, HP) without depths; with depths, one per axis and held value."""
    cfg = sweep.config
    if cfg.depths is None:
        lines = [("width", None, None)]
    else:
        lines = ([("width", d, f"widths at depth {d}") for d in cfg.depths] if len(cfg.widths) > 1 else []) + (  # type: ignore[assignment]
            [("depth", w, f"depths at width {w}") for w in cfg.widths] if len(cfg.depths) > 1 else []
        )
    rows, known = [], False
    for p in cfg.parametrizations:
        for n in cfg.space:
            for along, at, label in lines:
                d, steps = drift(sweep, results, p, n, along, at), max_drift_steps(sweep, results, p, n, along, at)
                unit = " octaves" if isinstance(cfg.space[n], LogUniform) else ""
                across: list[str] = [] if label is None else [label]
                rows.append(
                    [
                        LABEL[p],
                        n,
                        *across,
                        "—" if d is None else f"{d:+.2f}{unit}",
                        "—" if steps is None else f"{steps:.0f}",
                    ]
                )
                known = known or d is not None
    return rows if known else []  # one width and depth: nothing drifts, no table


def _bigger_is_better(sweep: Sweep, results: list[TrialResult]) -> list[tuple[str, list[str]]]:
    """Wider is better (at each depth), and deeper is better (at each width) in a sweep over depths."""
    cfg = sweep.config

    def item(p: str, verdict: bool | None, cells: list[tuple[int, int | None]], what: str) -> str:
        losses = ", ".join(f"{b.loss:.3f}" for w, d in cells if (b := best(results, p, w, d)))
        answer = "yes" if verdict else ("no" if verdict is not None else "—")
        return f"{LABEL[p]}: {answer} (best loss by {what}: {losses})"

    wider_head, deeper_head = "Wider is better (at each width's optimum)", "Deeper is better (at each depth's optimum)"
    if cfg.depths is None:
        if len(cfg.widths) < 2:
            return []
        wider = [
            item(p, wider_is_better(sweep, results, p), [(w, None) for w in cfg.widths], "width")
            for p in cfg.parametrizations
        ]
        return [(wider_head, wider)]
    out = []
    if len(cfg.widths) > 1:
        wider = [
            item(p, wider_is_better(sweep, results, p, d), [(w, d) for w in cfg.widths], f"width at depth {d}")
            for d in cfg.depths
            for p in cfg.parametrizations
        ]
        out.append((wider_head, wider))
    if len(cfg.depths) > 1:
        deeper = [
            item(p, deeper_is_better(sweep, results, p, w), [(w, d) for d in cfg.depths], f"depth at width {w}")
            for w in cfg.widths
            for p in cfg.parametrizations
        ]
        out.append((deeper_head, deeper))
    return out


def _transfer(sweep: Sweep, summary: dict, out: Path) -> dict | None:
    """The transfer section's values (from transfer.json), or None before `mutransfer transfer`; the
    monitor's figure written to `out` when the transferred parametrization's target (µP's, else u-µP's) was
    recorded."""
    t = load_transfer(sweep)
    if t is None:
        return None
    rows = []
    for p, label in TRANSFER_RUNS:
        if p in t:
            loss = "diverged" if t[p]["loss"] is None else f"{t[p]['loss']:.4f}"
            rows.append([label, _fmt(t[p]["hparams"].get("lr", "—")), loss])
    return {
        "proxy": transfer_where(t, "proxy"),
        "target": transfer_where(t, "target"),
        "rows": rows,
        "compute": compute_text(summary["cost"], t),
        "flops": flops_text(summary["cost"], t.get("peak"), label=_label(t)),
        "monitor": _monitor_section(sweep, t, out),
        "rule_rows": [
            [
                p,
                r["hparam"],
                _fmt(r["from"]),
                _fmt(r["to"]),
                "—" if r.get("interval") is None else f"[{_fmt(r['interval'][0])}, {_fmt(r['interval'][1])}]",
                r["rule"],
                r["regime"],
                r["source"],
            ]
            for p, steps in t.get("hparam_rules", {}).items()
            for r in steps
        ],
    }


def _label(transfer: dict) -> str:
    """The transferred parametrization's name ("µP", else "u-µP") of a transfer.json (its entries' keys)."""
    return short_label(transferred_parametrization(p for p, _ in TRANSFER_RUNS if p in transfer) or "mup")


def _forecast_section(fc: dict | None, out: Path) -> dict | None:
    """The forecast section: its line, the figure (written to `out`), the ladder's rows and the notes."""
    if fc is None:
        return None
    figure = FORECAST_FIGURE if plot_forecast(fc, out / FORECAST_FIGURE) else None
    rows = [
        [
            str(p["width"]) + ("" if p["depth"] is None else f", depth {p['depth']}"),
            f"{p['loss']:.4f}",
            ", ".join(f"{v:.4f}" for v in p["losses"]),
            str(p.get("trial", "—")),
        ]
        for p in fc.get("points", [])
    ]
    rows += [
        [str(m["width"]) + ("" if m["depth"] is None else f", depth {m['depth']}"), "—", m["why"], "—"]
        for m in fc.get("missing", [])
    ]
    return {
        "line": Forecast.from_dict(fc).line(),
        "flops": ""
        if fc.get("flops") is None
        else forecast_flops_text(fc["flops"], label=short_label(fc.get("parametrization") or "mup")),
        "figure": figure,
        "rows": rows,
        "notes": fc.get("notes", []),
        "source": fc.get("source", ""),
    }


def _monitor_section(sweep: Sweep, t: dict, out: Path) -> dict | None:
    """The monitor's part of the transfer section: its line, the target-vs-proxy figure, the alarms."""
    m = t.get("monitor")
    if m is None:
        return None
    line = monitor_line(t) or ""
    figure = None
    path = sweep.run_dir / m["trajectory"] if m.get("trajectory") else None
    if path is not None and path.is_file():
        target = load_trajectory(path)
        proxy = proxy_trajectory(sweep.run_dir) if m.get("proxy") else None
        where = transfer_where(t, "target")
        proxy_where = transfer_where(t, "proxy")
        mup = _label(t)
        if plot_monitor(
            target,
            proxy,
            out / MONITOR_FIGURE,
            f"{mup} target ({where})",
            f"{mup} proxy ({proxy_where}), scaled by {mup}'s rules to the target",
        ):
            figure = MONITOR_FIGURE
    rows = [
        [str(a["step"]), a["layer"], a["what"], _fmt(a["measured"]), _fmt(a["expected"]), a["cause"]]
        for a in m.get("alarms", [])
    ]
    return {"line": line, "figure": figure, "alarm_rows": rows, "watched": m.get("trajectory") is not None}


def compute_text(cost: dict, transfer: dict) -> str:
    """The compute paragraph: CPU seconds of training, and how many target runs each amount is.

    Args:
        cost: summary.json's "cost" (`analysis.costs`).
        transfer: transfer.json's content.

    Returns:
        The paragraph's text (plain, escaped by the page), or "" when no target run was costed.
    """
    if "proxy_over_target" not in cost:
        return ""
    where = transfer_where(transfer, "target")
    mup = _label(transfer)
    return (
        "Compute, in CPU seconds of training (process time summed over all seeds; on GPUs, wall "
        f"seconds): one {mup} target run at {where} took {cost['target_cpu_seconds']:.0f} CPU s. Tuning at the "
        f"proxy (the {mup} trials at the proxy only) took {cost['proxy_cpu_seconds']:.0f} CPU s, as much as "
        f"{cost['proxy_over_target']:.2g} target runs; the whole sweep (every width, {mup} and SP, the checks "
        f"included) took {cost['sweep_cpu_seconds']:.0f} CPU s, as much as {cost['sweep_over_target']:.2g} "
        "target runs."
    )


def flops_text(cost: dict, peak: dict | None = None, target_run: bool = True, label: str = "µP") -> str:
    """The cost in FLOPs: tuning (the µP trials at the proxy) and the whole sweep, each in target runs, and
    in device-hours at a peak when one is known.

    Args:
        cost: `analysis.costs`' entries (summary.json's "cost", transfer.json's "flops").
        peak: ``{"tflops", "source"}`` (transfer.json's "peak"), or None.
        target_run: end with one target run's FLOPs (when known).
        label: whose trials tuning counted: the transferred parametrization ("µP", else "u-µP").

    Returns:
        One sentence, or "" when no trial recorded its FLOPs.
    """
    proxy, sweep, target = cost.get("proxy_flops"), cost.get("sweep_flops"), cost.get("target_flops")
    if proxy is None and sweep is None:
        return ""
    if not sweep:
        return "FLOPs: none counted (the objective runs no torch matmul, convolution or attention)"

    def runs(flops: float | None) -> str:
        return f" = {flops / target:.3g} target runs" if flops is not None and target else ""

    def hours(flops: float) -> str:
        return f", {flops / (peak['tflops'] * 1e12) / 3600:.3g} device-hours" if peak else ""

    text = "tuning: " + ("—" if proxy is None else f"{proxy:.3g} FLOPs{runs(proxy)}{hours(proxy)}")
    text += f" (the {label} trials at the proxy)"
    if sweep is not None:
        text += f"; the whole sweep: {sweep:.3g} FLOPs{runs(sweep)}{hours(sweep)}"
    if target and target_run:
        text += f"; one target run: {target:.3g} FLOPs{hours(target)}"
    if peak:
        text += f" (device-hours at {peak['tflops']:g} TFLOPS, {peak['source']}: full use, a lower bound)"
    return text


def forecast_flops_text(flops: dict, peak: dict | None = None, label: str = "µP") -> str:
    """A forecast's cost line: one target run's FLOPs estimated from the sweep's counts (`forecasts.target_flops`),
    then tuning and the whole sweep in target runs (`flops_text`).

    Args:
        flops: `Forecast.flops`.
        peak: ``{"tflops", "source"}`` to state device-hours, or None.
        label: whose trials tuning counted (`flops_text`): "µP", or "u-µP" for a forecast of u-µP's.

    Returns:
        One line.
    """
    target = flops["target"]
    cost = {"proxy_flops": flops["proxy_flops"], "sweep_flops": flops["sweep_flops"], "target_flops": target}
    if target is None or flops["misfit"] is None:
        what = "not estimated" if target is None else "0"
        return f"one target run's FLOPs: {what} ({flops['fit']}); " + flops_text(cost, peak, label=label)
    misfit = f"{100 * flops['misfit']:.2g} %"
    hours = "" if peak is None else f", {target / (peak['tflops'] * 1e12) / 3600:.3g} device-hours"
    return f"one target run: about {target:.3g} FLOPs{hours} ({flops['fit']}; misfit {misfit}); " + flops_text(
        cost, peak, target_run=False, label=label
    )


def _interval_text(iv, fmt) -> str:
    return "—" if iv is None else f"{fmt(iv[0])} … {fmt(iv[1])}"


def _verdict_rows(sweep: Sweep, judged: dict[str, dict[str, Verdict]]) -> Rows:
    """Per parametrization, axis, HP and cell: fitted optimum with interval, move, regret, edge."""
    rows = []
    for p, by_axis in judged.items():
        for axis, v in by_axis.items():
            for name, h in v.hps.items():
                for o in h.optima:
                    move = h.moves.get(o.at)
                    a_r = v.regret.get(o.at)
                    value = value_at(h.dim, o.x)
                    log = isinstance(h.dim, LogUniform)
                    shown = _fmt(value) if not isinstance(value, float) else f"{value:.3g}"
                    if log:
                        shown += f" (log2 {o.x:+.2f})"
                    if isinstance(h.dim, Choice):
                        ci = "—"
                    else:
                        ci = _interval_text(o.x_interval, (lambda x: f"{x:+.2f}") if log else (lambda x: f"{x:.4g}"))
                    mv = "proxy" if move is None else f"{move.value:+.2f}{unit(h.dim)}"
                    mv_ci = "" if move is None else _interval_text(move.interval, lambda x: f"{x:+.2f}")
                    if a_r is None:
                        rg = "—"
                    elif math.isinf(a_r[0].value):
                        rg = "diverged"
                    elif math.isfinite(a_r[1].value):
                        rg = f"{100 * a_r[1].value:.2f}%"
                    else:
                        rg = f"{a_r[0].value:+.4g} (loss)"
                    rg_ci = "" if a_r is None else _interval_text(a_r[1].interval, lambda x: f"{100 * x:.2f}%")
                    edge = (
                        "flat: no measurable effect"
                        if o.flat
                        else {
                            -1: "low edge: widen the grid",
                            1: "high edge: widen the grid",
                            -2: "unevaluated point below",
                            2: "unevaluated point above",
                        }.get(o.edge, "")
                    )
                    rows.append([LABEL[p], name, f"{axis_name(axis)} {o.at}", shown, ci, mv, mv_ci, rg, rg_ci, edge])
    return rows


def _failure_rows(results: list[TrialResult]) -> Rows:
    rows = []
    for r in results:
        if r.failed:
            where = f"width {r.width}" + ("" if r.depth is None else f", depth {r.depth}")
            params = ", ".join(f"{k}={_fmt(v)}" for k, v in r.params.items())
            rows.append([LABEL[r.parametrization], where, str(r.number), params, r.error])
    return rows


def write_report(sweep: Sweep, out_dir: Path | None = None) -> Path:
    """Write report.html, its figures, summary.json and transferred.json.

    Args:
        sweep: the sweep (finished or still running).
        out_dir: where to write; default: the run directory.

    Returns:
        report.html's path.

    Raises:
        ValueError: the sweep has no finished trial yet.
    """
    out = Path(out_dir or sweep.run_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = load_results(sweep)
    if not results:
        raise ValueError(f"{sweep.run_dir}: no finished trials yet; run the sweep first")
    cfg = sweep.config
    judged = verdicts(sweep, results)
    summary = summarize(sweep, results, judged)
    images = []
    for name in cfg.space:
        fitted: dict[tuple, Optimum] = {}
        for p, by_axis in judged.items():
            for axis, v in by_axis.items():
                for o in v.hps[name].optima:
                    fitted.setdefault((p, *cell_of(sweep, axis, o.at)), o)
            at_proxy = None if by_axis else proxy_verdict(sweep, results, p)
            if at_proxy is not None:  # a sweep at one scale: the proxy's optima
                key = (p, *cell_of(sweep, "width", cfg.proxy_width))
                fitted[key] = at_proxy.hps[name].optima[0]
        png = out / figure_name(name)
        plot_hparam(sweep, results, name, png, fitted)
        images.append({"file": png.name, "alt": f"training loss against {name}"})
        for axis in cfg.axes:
            if len(cfg.axes[axis]) > 1:
                import matplotlib.pyplot as plt

                png = out / figure_name(name, f"_by_{axis}")
                plot_hparam(
                    sweep,
                    results,
                    name,
                    png,
                    fitted,
                    axis_lines(sweep, axis, plt.get_cmap("plasma")),
                    f" across {axis} (width {cfg.proxy_width})",
                )
                images.append({"file": png.name, "alt": f"training loss against {name} across {axis}"})

    transferred = summary["transferred_hparams"]
    write_atomically(out / "transferred.json", json.dumps(plain(transferred), indent=1, allow_nan=False))
    write_atomically(out / "summary.json", json.dumps(plain(summary), indent=1, allow_nan=False))

    depths = cfg.depths is not None
    scope = f"widths {', '.join(map(str, cfg.widths))} (µP base width {cfg.base_width})" + (
        f", depths {', '.join(map(str, cfg.depths))} (µP base depth {cfg.base_depth})" if cfg.depths else ""
    )
    verdict_lines_ = list(summary["verdicts"])
    h2h = head_to_head_line(summary["head_to_head"])
    if h2h:
        verdict_lines_.append(h2h)
    c = summary["counts"]
    seeds = len(cfg.seeds)
    page = render_page(
        name=cfg.name,
        verdicts=verdict_lines_,
        objective=cfg.objective,
        scope=scope,
        sampler=cfg.sampler,
        seeds=cfg.seeds,
        trials=summary["trials"],
        counts="; ".join(
            f"{LABEL[p]}: {c[p]['completed']} completed, {c[p]['diverged']} diverged, "
            f"{c[p]['failed']} failed, {c[p]['pruned']} pruned"
            for p in cfg.parametrizations
        ),
        seconds=f"{summary['sweep_seconds']:.0f}",
        storage=mask_url(sweep.url),
        placements=_placement_text(summary["placements"]),
        images=images,
        curve=" and ".join(axis for axis, varies in zip(("width", "depth"), varying(sweep)) if varies),
        uncertainty=(
            f"{round(100 * CONFIDENCE)}% bootstrap interval over the {seeds} seeds"
            if seeds > 1
            else "interval (with one seed it spans only the grid's resolution; add seeds for noise)"
        ),
        confidence=round(100 * CONFIDENCE),
        verdict_rows=_verdict_rows(sweep, judged),
        depths=depths,
        optimum_head=[
            "parametrization",
            "width",
            *(["depth"] if depths else []),
            *(["batch size / steps"] if cfg.axes else []),
            *(f"best {k}" for k in cfg.space),
            "loss",
            "trials",
            "diverged",
            "failed",
            "pruned",
        ],
        optimum_rows=_optimum_rows(sweep, results),
        drift_head=[
            "parametrization",
            "hyperparameter",
            *(["across"] if depths else []),
            "smallest → largest" if depths else "smallest → largest width",
            "largest move (grid steps)",
        ],
        drift_rows=_drift_rows(sweep, results),
        bigger=_bigger_is_better(sweep, results),
        failure_rows=_failure_rows(results),
        proxy=f"width {cfg.proxy_width}" + (f" and depth {cfg.proxy_depth}" if depths else ""),
        label=short_label(cfg.transferred or "mup"),
        transferred=json.dumps(transferred, indent=1),
        transfer=_transfer(sweep, summary, out),
        forecast=_forecast_section(summary.get("forecast"), out),
    )
    path = out / "report.html"
    write_atomically(path, page)
    return path
