"""`mutransfer report RUN`: report.html, one PNG per hyperparameter, transferred.json.

Each PNG shows training loss against one hyperparameter, one curve per width (per depth in a
sweep over depths; per width and depth when both vary), µP and SP side by side (TP5 Fig. 1
style), with each curve's optimum marked. For a sweep over several HPs the curve is the
profile: the best loss over the other HPs at each value.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Optional

from .analysis import (TrialResult, best, deeper_is_better, drift, load_results, max_drift_steps,
                       transferred_hparams, wider_is_better)
from .runner import Sweep
from .space import Choice, LogUniform
from .storage import mask_url
from .transfer import TRANSFER_RUNS, transfer_where

LABEL = {"mup": "µP", "sp": "SP (standard)"}
LINESTYLES = ("-", "--", ":", "-.")


def _fmt(v) -> str:
    if isinstance(v, float):
        if v > 0 and abs(math.log2(v) - round(math.log2(v))) < 1e-9:
            return f"2^{round(math.log2(v))}"
        return f"{v:.4g}"
    return str(v)


def _varying(sweep: Sweep) -> tuple[bool, bool]:
    """(by width, by depth): which axes the curves are drawn along (width when neither varies)."""
    cfg = sweep.config
    by_depth = cfg.depths is not None and len(cfg.depths) > 1
    return len(cfg.widths) > 1 or not by_depth, by_depth


def curves(sweep: Sweep) -> list[tuple[int, Optional[int], str]]:
    """(width, depth, legend label) of each plotted curve: one per width, per depth, or per both."""
    cfg = sweep.config
    by_width, by_depth = _varying(sweep)
    out = []
    for w in cfg.widths:
        for d in cfg.depths or [None]:
            label = ", ".join(([f"width {w}"] if by_width else []) + ([f"depth {d}"] if by_depth else []))
            out.append((w, d, label))
    return out


def _styles(sweep: Sweep, cmap) -> dict[tuple[int, Optional[int]], tuple]:
    """(color, linestyle) per curve: color by width (by depth when only depth varies), dashes by depth."""
    cfg = sweep.config
    depths = cfg.depths or [None]
    by_width, by_depth = _varying(sweep)
    colored = cfg.widths if by_width else depths
    color = {v: cmap(0.1 + 0.8 * i / max(1, len(colored) - 1)) for i, v in enumerate(colored)}
    dashed = by_width and by_depth
    return {(w, d): (color[w if by_width else d], LINESTYLES[depths.index(d) % len(LINESTYLES)] if dashed else "-")
            for w in cfg.widths for d in depths}


def plot_hparam(sweep: Sweep, results: list[TrialResult], name: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    dim = sweep.config.space[name]
    params = sweep.config.parametrizations
    style = _styles(sweep, plt.get_cmap("viridis"))
    fig, axes = plt.subplots(1, len(params), figsize=(5.2 * len(params), 4.2), sharey=True, squeeze=False)
    finite = [r.loss for r in results if not r.diverged]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    choices = list(dim.values) if isinstance(dim, Choice) else None

    def x_of(v):
        if choices is not None:
            return choices.index(v)
        return math.log2(v) if isinstance(dim, LogUniform) else v

    for ax, p in zip(axes[0], params):
        for w, d, label in curves(sweep):
            color, dashes = style[(w, d)]
            cell = [r for r in results if r.parametrization == p and r.width == w and r.depth == d]
            profile: dict = {}
            for r in cell:
                x = x_of(r.params[name])
                if not r.diverged and (x not in profile or r.loss < profile[x]):
                    profile[x] = r.loss
            xs = sorted(profile)
            ax.plot(xs, [profile[x] for x in xs], marker="o", linestyle=dashes, ms=3, color=color, label=label)
            div = sorted({x_of(r.params[name]) for r in cell if r.diverged} - set(profile))
            if div:
                ax.plot(div, [hi] * len(div), "x", color=color, ms=6)
            b = best(results, p, w, d)
            if b is not None:
                ax.plot([x_of(b.params[name])], [b.loss], "*", ms=14, color=color, markeredgecolor="black",
                        zorder=5)
        ax.set_title(LABEL[p], fontsize=12)
        if choices is not None:
            ax.set_xticks(range(len(choices)))
            ax.set_xticklabels([str(c) for c in choices])
            ax.set_xlabel(name)
        else:
            ax.set_xlabel(f"log2 {name}" if isinstance(dim, LogUniform) else name)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("training loss")
    span = hi - lo
    axes[0][0].set_ylim(lo - 0.05 * span, lo + min(span, 3 * max(span / 3, 1e-9)) + 0.08 * span)
    axes[0][-1].legend(title="★ optimum, × diverged", fontsize=8, title_fontsize=8, loc="upper right")
    fig.suptitle(f"{sweep.config.name}: training loss vs {name}", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cell_optimum(b: Optional[TrialResult]) -> Optional[dict]:
    return None if b is None else {"loss": b.loss, **b.params}


def _drift_entry(sweep: Sweep, results: list[TrialResult], p: str, along: str) -> dict:
    """{hp: {"octaves"|"value": drift, "max_grid_steps": ...}} along one axis, at the proxy."""
    space = sweep.config.space
    return {n: {"octaves" if isinstance(space[n], LogUniform) else "value": drift(sweep, results, p, n, along),
                "max_grid_steps": max_drift_steps(sweep, results, p, n, along)} for n in space}


def summarize(sweep: Sweep, results: list[TrialResult]) -> dict:
    """summary.json: optima per cell, drift (at the proxy depth along width, at the proxy width
    along depth), bigger-is-better checks, the transferred HPs and the sweep's cost."""
    cfg = sweep.config
    ps = cfg.parametrizations
    summary = {"name": cfg.name, "objective": cfg.objective, "widths": cfg.widths, "proxy_width": min(cfg.widths)}
    if cfg.depths is not None:
        summary.update(depths=cfg.depths, base_depth=cfg.base_depth, proxy_depth=cfg.proxy_depth)
    summary["transferred_hparams"] = transferred_hparams(sweep, results)
    if cfg.depths is None:
        summary["optima"] = {p: {str(w): _cell_optimum(best(results, p, w)) for w in cfg.widths} for p in ps}
    else:
        summary["optima"] = {p: {str(w): {str(d): _cell_optimum(best(results, p, w, d)) for d in cfg.depths}
                                 for w in cfg.widths} for p in ps}
    summary["drift"] = {p: _drift_entry(sweep, results, p, "width") for p in ps}
    if cfg.depths is not None:
        summary["depth_drift"] = {p: _drift_entry(sweep, results, p, "depth") for p in ps}
    summary["wider_is_better"] = {p: wider_is_better(sweep, results, p) for p in ps}
    if cfg.depths is not None:
        summary["deeper_is_better"] = {p: deeper_is_better(sweep, results, p) for p in ps}
    summary.update(trials=len(results), diverged=sum(r.diverged for r in results),
                   sweep_seconds=sum(r.seconds for r in results))
    return summary


def _optimum_rows(sweep: Sweep, results: list[TrialResult]) -> str:
    cfg = sweep.config
    rows = []
    for p, w, d in cfg.cells:
        b = best(results, p, w, d)
        cell = [r for r in results if r.parametrization == p and r.width == w and r.depth == d]
        n, nd = len(cell), sum(r.diverged for r in cell)
        depth = "" if d is None else f"<td>{d}</td>"
        values = "".join(f"<td>{_fmt(b.params[k]) if b else '—'}</td>" for k in cfg.space)
        loss = f"{b.loss:.4f}" if b else "—"
        rows.append(f"<tr><td>{LABEL[p]}</td><td>{w}</td>{depth}{values}<td>{loss}</td><td>{n}</td><td>{nd}</td></tr>")
    return "".join(rows)


def _drift_rows(sweep: Sweep, results: list[TrialResult]) -> str:
    """One row per (parametrization, HP) without depths; with depths, one per axis and held value."""
    cfg = sweep.config
    if cfg.depths is None:
        lines = [("width", None, None)]
    else:
        lines = ([("width", d, f"widths at depth {d}") for d in cfg.depths] if len(cfg.widths) > 1 else []) + \
                ([("depth", w, f"depths at width {w}") for w in cfg.widths] if len(cfg.depths) > 1 else [])
    rows = []
    for p in cfg.parametrizations:
        for n in cfg.space:
            for along, at, label in lines:
                d, steps = drift(sweep, results, p, n, along, at), max_drift_steps(sweep, results, p, n, along, at)
                unit = " octaves" if isinstance(cfg.space[n], LogUniform) else ""
                across = "" if label is None else f"<td>{label}</td>"
                rows.append(f"<tr><td>{LABEL[p]}</td><td>{html.escape(n)}</td>{across}"
                            f"<td>{'—' if d is None else f'{d:+.2f}{unit}'}</td>"
                            f"<td>{'—' if steps is None else f'{steps:.0f}'}</td></tr>")
    return "".join(rows)


def _bigger_is_better_html(sweep: Sweep, results: list[TrialResult]) -> str:
    """Wider is better (at each depth), and deeper is better (at each width) in a sweep over depths."""
    cfg = sweep.config

    def item(p: str, verdict: Optional[bool], cells: list[tuple[int, Optional[int]]], what: str) -> str:
        losses = ", ".join(f"{b.loss:.3f}" for w, d in cells if (b := best(results, p, w, d)))
        answer = "yes" if verdict else ("no" if verdict is not None else "—")
        return f"<li>{LABEL[p]}: {answer} (best loss by {what}: {losses})</li>"

    if cfg.depths is None:
        wider = "".join(item(p, wider_is_better(sweep, results, p), [(w, None) for w in cfg.widths], "width")
                        for p in cfg.parametrizations)
        return f"<h2>Wider is better (at each width's optimum)</h2><ul>{wider}</ul>"
    out = ""
    if len(cfg.widths) > 1:
        wider = "".join(item(p, wider_is_better(sweep, results, p, d), [(w, d) for w in cfg.widths],
                             f"width at depth {d}") for d in cfg.depths for p in cfg.parametrizations)
        out += f"<h2>Wider is better (at each width's optimum)</h2><ul>{wider}</ul>"
    if len(cfg.depths) > 1:
        deeper = "".join(item(p, deeper_is_better(sweep, results, p, w), [(w, d) for d in cfg.depths],
                              f"depth at width {w}") for w in cfg.widths for p in cfg.parametrizations)
        out += f"<h2>Deeper is better (at each depth's optimum)</h2><ul>{deeper}</ul>"
    return out


def _transfer_html(sweep: Sweep) -> str:
    path = sweep.run_dir / "transfer.json"
    if not path.is_file():  # written by `mutransfer transfer`
        return ""
    t = json.loads(path.read_text())
    cells = []
    for p, label in TRANSFER_RUNS:
        if p in t:
            loss = "diverged" if t[p]["loss"] is None else f"{t[p]['loss']:.4f}"
            cells.append(f"<tr><td>{label}</td><td>{_fmt(t[p]['hparams'].get('lr', '—'))}</td><td>{loss}</td></tr>")
    ratio = f"<p>Sweep compute over one target run: {t['cost_ratio']:.1f}×.</p>" if "cost_ratio" in t else ""
    return (f"<h2>Transfer from {transfer_where(t, 'proxy')} to {transfer_where(t, 'target')}</h2>"
            f"<table><tr><th>run</th><th>lr</th><th>training loss</th></tr>{''.join(cells)}</table>{ratio}")


def write_report(sweep: Sweep, out_dir: Optional[Path] = None) -> Path:
    """Write the report into `out_dir` (default: the run directory); returns report.html's path."""
    out = Path(out_dir or sweep.run_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = load_results(sweep)
    if not results:
        raise ValueError(f"{sweep.run_dir}: no finished trials yet; run the sweep first")
    cfg = sweep.config
    images = []
    for name in cfg.space:
        png = out / f"loss_vs_{name}.png"
        plot_hparam(sweep, results, name, png)
        images.append(png.name)

    summary = summarize(sweep, results)
    transferred = summary["transferred_hparams"]
    (out / "transferred.json").write_text(json.dumps(transferred, indent=1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))

    depths = cfg.depths is not None
    depth_head = "<th>depth</th>" if depths else ""
    across_head = "<th>across</th>" if depths else ""
    head = "".join(f"<th>best {html.escape(k)}</th>" for k in cfg.space)
    scope = (f"widths {', '.join(map(str, cfg.widths))} (µP base width {cfg.base_width})"
             + (f", depths {', '.join(map(str, cfg.depths))} (µP base depth {cfg.base_depth})" if depths else ""))
    proxy = f"width {min(cfg.widths)}" + (f" and depth {cfg.proxy_depth}" if depths else "")
    curve = " and ".join(axis for axis, varies in zip(("width", "depth"), _varying(sweep)) if varies)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>µTransfer sweep: {html.escape(cfg.name)}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}
th{{background:#f3f3f3}}img{{max-width:100%;border:1px solid #eee}}pre{{background:#f6f8fa;padding:1em}}</style></head>
<body><h1>µTransfer sweep: {html.escape(cfg.name)}</h1>
<p>Objective <code>{html.escape(cfg.objective)}</code>, {scope}, sampler {cfg.sampler}, seeds {cfg.seeds},
{summary['trials']} trials ({summary['diverged']} diverged),
{summary['sweep_seconds']:.0f} s of training. Storage: <code>{html.escape(mask_url(sweep.url))}</code>.</p>
<h2>Training loss against each hyperparameter</h2>
{''.join(f'<p><img src="{i}" alt="{i}"></p>' for i in images)}
<p>One curve per {curve}; ★ marks each curve's optimum. Under µP the optima line up: tune the small model, reuse
the HPs on the large one. Under SP they move with {'width and depth' if depths else 'width'}.</p>
<h2>Optimum per {'width and depth' if depths else 'width'}</h2>
<table><tr><th>parametrization</th><th>width</th>{depth_head}{head}<th>loss</th><th>trials</th><th>diverged</th></tr>{_optimum_rows(sweep, results)}</table>
<h2>Drift of the optimum across {'widths and depths' if depths else 'widths'}</h2>
<table><tr><th>parametrization</th><th>hyperparameter</th>{across_head}<th>{'smallest → largest' if depths else 'smallest → largest width'}</th><th>largest move (grid steps)</th></tr>{_drift_rows(sweep, results)}</table>
{_bigger_is_better_html(sweep, results)}
<h2>Transferred hyperparameters</h2>
<p>µP optimum at the proxy {proxy} (also in <code>transferred.json</code>):</p>
<pre>{html.escape(json.dumps(transferred, indent=1))}</pre>
{_transfer_html(sweep)}
</body></html>"""
    path = out / "report.html"
    path.write_text(page)
    return path
