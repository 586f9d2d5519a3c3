"""`mutransfer report RUN`: report.html, one PNG per hyperparameter, summary.json, transferred.json.

The figures are drawn in `plots`, the numbers gathered in `summary` (from `analysis` and
`statistics`), the sentences written in `verdict`; this module lays them out as HTML (every
value escaped) and writes the files.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

from .._core.atomic import write_atomically
from .analysis import (
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
from .plots import LINESTYLES, axis_lines, cell_of, curves, plot_hparam, varying
from .runner import Sweep
from .space import Choice, LogUniform
from .statistics import CONFIDENCE, Optimum, Verdict, unit, value_at
from .storage import mask_url
from .summary import TRANSFER_RUNS, head_to_head_line, load_transfer, plain, summarize, transfer_where, verdict_lines
from .verdict import LABEL, axis_name

__all__ = [
    "LABEL",
    "LINESTYLES",
    "TRANSFER_RUNS",
    "axis_lines",
    "cell_of",
    "curves",
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
    """'Trained on: cpu (CUDA_VISIBLE_DEVICES=0), fp32: 8 trials, 12 s; …' (escaped), or ''."""
    if not placed:
        return ""
    return (
        "Trained on: "
        + "; ".join(f"{html.escape(k)}: {int(v['trials'])} trials, {v['seconds']:.0f} s" for k, v in placed.items())
        + "."
    )


def _optimum_rows(sweep: Sweep, results: list[TrialResult]) -> str:
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
        depth = "" if d is None else f"<td>{d}</td>"
        values = "".join(f"<td>{_fmt(b.params[k]) if b else '—'}</td>" for k in cfg.space)
        loss = f"{b.loss:.4f}" if b else "—"
        if cfg.axes:
            setting = {**cfg.proxy_extra, **dict(extra)}
            depth += "<td>" + ", ".join(f"{k} {v}" for k, v in setting.items()) + "</td>"
        rows.append(
            f"<tr><td>{LABEL[p]}</td><td>{w}</td>{depth}{values}<td>{loss}</td><td>{n}</td><td>{nd}</td>"
            f"<td>{nf}</td><td>{npr}</td></tr>"
        )
    return "".join(rows)


def _drift_rows(sweep: Sweep, results: list[TrialResult]) -> str:
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
                across = "" if label is None else f"<td>{label}</td>"
                rows.append(
                    f"<tr><td>{LABEL[p]}</td><td>{html.escape(n)}</td>{across}"
                    f"<td>{'—' if d is None else f'{d:+.2f}{unit}'}</td>"
                    f"<td>{'—' if steps is None else f'{steps:.0f}'}</td></tr>"
                )
                known = known or d is not None
    return "".join(rows) if known else ""  # one width and depth: nothing drifts, no table


def _bigger_is_better_html(sweep: Sweep, results: list[TrialResult]) -> str:
    """Wider is better (at each depth), and deeper is better (at each width) in a sweep over depths."""
    cfg = sweep.config

    def item(p: str, verdict: bool | None, cells: list[tuple[int, int | None]], what: str) -> str:
        losses = ", ".join(f"{b.loss:.3f}" for w, d in cells if (b := best(results, p, w, d)))
        answer = "yes" if verdict else ("no" if verdict is not None else "—")
        return f"<li>{LABEL[p]}: {answer} (best loss by {what}: {losses})</li>"

    if cfg.depths is None:
        if len(cfg.widths) < 2:
            return ""
        wider = "".join(
            item(p, wider_is_better(sweep, results, p), [(w, None) for w in cfg.widths], "width")
            for p in cfg.parametrizations
        )
        return f"<h2>Wider is better (at each width's optimum)</h2><ul>{wider}</ul>"
    out = ""
    if len(cfg.widths) > 1:
        wider = "".join(
            item(p, wider_is_better(sweep, results, p, d), [(w, d) for w in cfg.widths], f"width at depth {d}")
            for d in cfg.depths
            for p in cfg.parametrizations
        )
        out += f"<h2>Wider is better (at each width's optimum)</h2><ul>{wider}</ul>"
    if len(cfg.depths) > 1:
        deeper = "".join(
            item(p, deeper_is_better(sweep, results, p, w), [(w, d) for d in cfg.depths], f"depth at width {w}")
            for w in cfg.widths
            for p in cfg.parametrizations
        )
        out += f"<h2>Deeper is better (at each depth's optimum)</h2><ul>{deeper}</ul>"
    return out


def _transfer_html(sweep: Sweep, summary: dict) -> str:
    t = load_transfer(sweep)
    if t is None:
        return ""
    cells = []
    for p, label in TRANSFER_RUNS:
        if p in t:
            loss = "diverged" if t[p]["loss"] is None else f"{t[p]['loss']:.4f}"
            cells.append(f"<tr><td>{label}</td><td>{_fmt(t[p]['hparams'].get('lr', '—'))}</td><td>{loss}</td></tr>")
    return (
        f"<h2>Transfer from {transfer_where(t, 'proxy')} to {transfer_where(t, 'target')}</h2>"
        + _table("<th>run</th><th>lr</th><th>training loss</th>", "".join(cells))
        + compute_html(summary["cost"], t)
    )


def compute_html(cost: dict, transfer: dict) -> str:
    """The compute paragraph: CPU seconds of training, and how many target runs each amount is.

    Args:
        cost: summary.json's "cost" (`analysis.costs`).
        transfer: transfer.json's content.

    Returns:
        An HTML paragraph, or "" when no target run was costed.
    """
    if "proxy_over_target" not in cost:
        return ""
    where = html.escape(transfer_where(transfer, "target"))
    return (
        "<p>Compute, in CPU seconds of training (process time summed over all seeds; on GPUs, wall "
        f"seconds): one µP target run at {where} took {cost['target_cpu_seconds']:.0f} CPU s. Tuning at the "
        f"proxy (the µP trials at the proxy only) took {cost['proxy_cpu_seconds']:.0f} CPU s, as much as "
        f"{cost['proxy_over_target']:.2g} target runs; the whole sweep (every width, µP and SP, the checks "
        f"included) took {cost['sweep_cpu_seconds']:.0f} CPU s, as much as {cost['sweep_over_target']:.2g} "
        "target runs.</p>"
    )


def _table(head: str, rows: str) -> str:
    """A table with a header row, or "" without rows (no empty table in the report)."""
    return f"<table><tr>{head}</tr>{rows}</table>" if rows else ""


def _interval_text(iv, fmt) -> str:
    return "—" if iv is None else f"{fmt(iv[0])} … {fmt(iv[1])}"


def _verdict_rows(sweep: Sweep, judged: dict[str, dict[str, Verdict]]) -> str:
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
                    rows.append(
                        f"<tr><td>{LABEL[p]}</td><td>{html.escape(name)}</td><td>{axis_name(axis)} {o.at}</td>"
                        f"<td>{shown}</td><td>{ci}</td><td>{mv}</td><td>{mv_ci}</td><td>{rg}</td>"
                        f"<td>{rg_ci}</td><td>{edge}</td></tr>"
                    )
    return "".join(rows)


def _failure_rows(results: list[TrialResult]) -> str:
    rows = []
    for r in results:
        if r.failed:
            where = f"width {r.width}" + ("" if r.depth is None else f", depth {r.depth}")
            params = ", ".join(f"{k}={_fmt(v)}" for k, v in r.params.items())
            rows.append(
                f"<tr><td>{LABEL[r.parametrization]}</td><td>{where}</td><td>{r.number}</td>"
                f"<td>{html.escape(params)}</td><td style='text-align:left'>{html.escape(r.error)}</td></tr>"
            )
    return "".join(rows)


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
        png = out / f"loss_vs_{name}.png"
        plot_hparam(sweep, results, name, png, fitted)
        images.append(png.name)
        for axis in cfg.axes:
            if len(cfg.axes[axis]) > 1:
                import matplotlib.pyplot as plt

                png = out / f"loss_vs_{name}_by_{axis}.png"
                plot_hparam(
                    sweep,
                    results,
                    name,
                    png,
                    fitted,
                    axis_lines(sweep, axis, plt.get_cmap("plasma")),
                    f" across {axis} (width {cfg.proxy_width})",
                )
                images.append(png.name)

    transferred = summary["transferred_hparams"]
    write_atomically(out / "transferred.json", json.dumps(plain(transferred), indent=1, allow_nan=False))
    write_atomically(out / "summary.json", json.dumps(plain(summary), indent=1, allow_nan=False))

    depths = cfg.depths is not None
    depth_head = ("<th>depth</th>" if depths else "") + ("<th>batch size / steps</th>" if cfg.axes else "")
    across_head = "<th>across</th>" if depths else ""
    head = "".join(f"<th>best {html.escape(k)}</th>" for k in cfg.space)
    scope = f"widths {', '.join(map(str, cfg.widths))} (µP base width {cfg.base_width})" + (
        f", depths {', '.join(map(str, cfg.depths))} (µP base depth {cfg.base_depth})" if cfg.depths else ""
    )
    proxy = f"width {cfg.proxy_width}" + (f" and depth {cfg.proxy_depth}" if depths else "")
    curve = " and ".join(axis for axis, varies in zip(("width", "depth"), varying(sweep)) if varies)
    verdict = "".join(f"<li>{html.escape(line)}</li>" for line in summary["verdicts"])
    h2h = head_to_head_line(summary["head_to_head"])
    if h2h:
        verdict += f"<li>{html.escape(h2h)}</li>"
    c = summary["counts"]
    count_text = "; ".join(
        f"{LABEL[p]}: {c[p]['completed']} completed, {c[p]['diverged']} diverged, "
        f"{c[p]['failed']} failed, {c[p]['pruned']} pruned"
        for p in cfg.parametrizations
    )
    failures = _failure_rows(results)
    failure_html = (
        (
            f"<h2>Failed trials</h2><p>The objective raised; tracebacks are in <code>failures/</code> in the "
            f"run directory. <code>mutransfer sweep CONFIG --retry-failed</code> reruns them.</p><table><tr>"
            f"<th>parametrization</th><th>where</th><th>trial</th><th>hyperparameters</th><th>error</th></tr>"
            f"{failures}</table>"
        )
        if failures
        else ""
    )
    seeds = len(cfg.seeds)
    uncertainty = (
        f"{round(100 * CONFIDENCE)}% bootstrap interval over the {seeds} seeds"
        if seeds > 1
        else "interval (with one seed it spans only the grid's resolution; add seeds for noise)"
    )
    verdict_rows = _verdict_rows(sweep, judged)
    verdict_html = (
        f"""<h2>Optimum, move from the proxy and regret</h2>
<p>Move: the optimum's shift from the proxy's. Regret: the loss with the proxy's best HPs minus that
{curve}'s own best, relative to it. Transferred when every optimum is located (not on a grid edge, beside an
unevaluated point or on a flat curve) and, everywhere, the proxy's HPs do not diverge, the regret is not
significantly above 2%, and either the regret's interval lies below 2% or the move's within ±1 octave (one grid
step for a uniform HP). Intervals are {round(100 * CONFIDENCE)}%, centred on the estimate; log-scaled HPs in
log2.</p>"""
        + _table(
            "<th>parametrization</th><th>hyperparameter</th><th>where</th><th>fitted optimum</th><th>interval</th>"
            "<th>move</th><th>interval</th><th>regret</th><th>interval</th><th>note</th>",
            verdict_rows,
        )
        if verdict_rows
        else ""
    )
    drift_rows = _drift_rows(sweep, results)
    drift_html = (
        f"<h2>Drift of the best grid point across {'widths and depths' if depths else 'widths'}</h2>"
        + _table(
            f"<th>parametrization</th><th>hyperparameter</th>{across_head}"
            f"<th>{'smallest → largest' if depths else 'smallest → largest width'}</th>"
            "<th>largest move (grid steps)</th>",
            drift_rows,
        )
        if drift_rows
        else ""
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>µTransfer sweep: {html.escape(cfg.name)}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}
th{{background:#f3f3f3}}img{{max-width:100%;border:1px solid #eee}}pre{{background:#f6f8fa;padding:1em}}
.verdict{{background:#f6f8fa;border-left:4px solid #555;padding:.5em 1em}}</style></head>
<body><h1>µTransfer sweep: {html.escape(cfg.name)}</h1>
<div class="verdict"><b>Verdict</b><ul>{verdict}</ul></div>
<p>Objective <code>{html.escape(cfg.objective)}</code>, {scope}, sampler {cfg.sampler}, seeds {cfg.seeds},
{summary["trials"]} trials ({count_text}),
{summary["sweep_seconds"]:.0f} s of training. Storage: <code>{html.escape(mask_url(sweep.url))}</code>.
{_placement_text(summary["placements"])}</p>
<h2>Training loss against each hyperparameter</h2>
{"".join(f'<p><img src="{i}" alt="{i}"></p>' for i in images)}
<p>One curve per {curve}, the mean over seeds; a vertical bar is the range over seeds; ★ marks each curve's
optimum fitted below grid resolution (a parabola through the best point and its neighbours, in log2 for a
log-scaled HP), the horizontal bar its {uncertainty}; a red-edged ★ sits on the grid's edge.</p>
{verdict_html}
<h2>Best trial per {"width and depth" if depths else "width"}</h2>
<table><tr><th>parametrization</th><th>width</th>{depth_head}{head}<th>loss</th><th>trials</th><th>diverged</th><th>failed</th><th>pruned</th></tr>{_optimum_rows(sweep, results)}</table>
{drift_html}
{_bigger_is_better_html(sweep, results)}
{failure_html}
<h2>Transferred hyperparameters</h2>
<p>µP optimum at the proxy {proxy} (also in <code>transferred.json</code>):</p>
<pre>{html.escape(json.dumps(transferred, indent=1))}</pre>
{_transfer_html(sweep, summary)}
</body></html>"""
    path = out / "report.html"
    write_atomically(path, page)
    return path
