"""`mutransfer report RUN`: report.html, one PNG per hyperparameter, transferred.json.

Each PNG shows training loss against one hyperparameter, one curve per width, µP and SP side by
side (TP5 Fig. 1 style), with each width's optimum marked. For a sweep over several HPs the
curve is the profile: the best loss over the other HPs at each value.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Optional

from .analysis import (TrialResult, best, drift, load_results, max_drift_steps, transferred_hparams,
                       wider_is_better)
from .runner import Sweep
from .space import Choice, LogUniform
from .storage import mask_url

LABEL = {"mup": "µP", "sp": "SP (standard)"}


def _fmt(v) -> str:
    if isinstance(v, float):
        if v > 0 and abs(math.log2(v) - round(math.log2(v))) < 1e-9:
            return f"2^{round(math.log2(v))}"
        return f"{v:.4g}"
    return str(v)


def plot_hparam(sweep: Sweep, results: list[TrialResult], name: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    dim = sweep.config.space[name]
    params = sweep.config.parametrizations
    widths = sweep.config.widths
    cmap = plt.get_cmap("viridis")
    color = {w: cmap(0.1 + 0.8 * i / max(1, len(widths) - 1)) for i, w in enumerate(widths)}
    fig, axes = plt.subplots(1, len(params), figsize=(5.2 * len(params), 4.2), sharey=True, squeeze=False)
    finite = [r.loss for r in results if not r.diverged]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    choices = list(dim.values) if isinstance(dim, Choice) else None

    def x_of(v):
        if choices is not None:
            return choices.index(v)
        return math.log2(v) if isinstance(dim, LogUniform) else v

    for ax, p in zip(axes[0], params):
        for w in widths:
            cell = [r for r in results if r.parametrization == p and r.width == w]
            profile: dict = {}
            for r in cell:
                x = x_of(r.params[name])
                if not r.diverged and (x not in profile or r.loss < profile[x]):
                    profile[x] = r.loss
            xs = sorted(profile)
            ax.plot(xs, [profile[x] for x in xs], "-o", ms=3, color=color[w], label=f"width {w}")
            div = sorted({x_of(r.params[name]) for r in cell if r.diverged} - set(profile))
            if div:
                ax.plot(div, [hi] * len(div), "x", color=color[w], ms=6)
            b = best(results, p, w)
            if b is not None:
                ax.plot([x_of(b.params[name])], [b.loss], "*", ms=14, color=color[w], markeredgecolor="black",
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

    transferred = transferred_hparams(sweep, results)
    summary = {
        "name": cfg.name, "objective": cfg.objective, "widths": cfg.widths, "proxy_width": min(cfg.widths),
        "transferred_hparams": transferred,
        "optima": {p: {str(w): (None if (b := best(results, p, w)) is None else {"loss": b.loss, **b.params})
                       for w in cfg.widths} for p in cfg.parametrizations},
        "drift": {p: {n: {"octaves" if isinstance(cfg.space[n], LogUniform) else "value": drift(sweep, results, p, n),
                          "max_grid_steps": max_drift_steps(sweep, results, p, n)} for n in cfg.space}
                  for p in cfg.parametrizations},
        "wider_is_better": {p: wider_is_better(sweep, results, p) for p in cfg.parametrizations},
        "trials": len(results), "diverged": sum(r.diverged for r in results),
        "sweep_seconds": sum(r.seconds for r in results),
    }
    (out / "transferred.json").write_text(json.dumps(transferred, indent=1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))

    rows = []
    for p in cfg.parametrizations:
        for w in cfg.widths:
            b = best(results, p, w)
            n = sum(1 for r in results if r.parametrization == p and r.width == w)
            nd = sum(1 for r in results if r.parametrization == p and r.width == w and r.diverged)
            cells = "".join(f"<td>{_fmt(b.params[k]) if b else '—'}</td>" for k in cfg.space)
            rows.append(f"<tr><td>{LABEL[p]}</td><td>{w}</td>{cells}<td>{b.loss:.4f}</td><td>{n}</td><td>{nd}</td></tr>"
                        if b else f"<tr><td>{LABEL[p]}</td><td>{w}</td>{cells}<td>—</td><td>{n}</td><td>{nd}</td></tr>")
    drift_rows = []
    for p in cfg.parametrizations:
        for n in cfg.space:
            d, steps = drift(sweep, results, p, n), max_drift_steps(sweep, results, p, n)
            unit = " octaves" if isinstance(cfg.space[n], LogUniform) else ""
            drift_rows.append(f"<tr><td>{LABEL[p]}</td><td>{html.escape(n)}</td>"
                              f"<td>{'—' if d is None else f'{d:+.2f}{unit}'}</td>"
                              f"<td>{'—' if steps is None else f'{steps:.0f}'}</td></tr>")
    wib = "".join(f"<li>{LABEL[p]}: {'yes' if v else ('no' if v is not None else '—')} "
                  f"(best loss by width: {', '.join(f'{best(results, p, w).loss:.3f}' for w in cfg.widths if best(results, p, w))})</li>"
                  for p, v in summary["wider_is_better"].items())
    head = "".join(f"<th>best {html.escape(k)}</th>" for k in cfg.space)
    transfer_html = ""
    transfer_path = sweep.run_dir / "transfer.json"
    if transfer_path.is_file():  # written by `mutransfer transfer`
        t = json.loads(transfer_path.read_text())
        cells = []
        for p, label in (("mup", "µP target, µP proxy optimum"), ("sp", "SP target, SP proxy optimum")):
            if p in t:
                loss = "diverged" if t[p]["loss"] is None else f"{t[p]['loss']:.4f}"
                cells.append(f"<tr><td>{label}</td><td>{_fmt(t[p]['hparams'].get('lr', '—'))}</td><td>{loss}</td></tr>")
        ratio = f"<p>Sweep compute over one target run: {t['cost_ratio']:.1f}×.</p>" if "cost_ratio" in t else ""
        transfer_html = (f"<h2>Transfer from width {t['proxy_width']} to width {t['target_width']}</h2>"
                         f"<table><tr><th>run</th><th>lr</th><th>training loss</th></tr>{''.join(cells)}</table>{ratio}")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>µTransfer sweep: {html.escape(cfg.name)}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}
th{{background:#f3f3f3}}img{{max-width:100%;border:1px solid #eee}}pre{{background:#f6f8fa;padding:1em}}</style></head>
<body><h1>µTransfer sweep: {html.escape(cfg.name)}</h1>
<p>Objective <code>{html.escape(cfg.objective)}</code>, widths {', '.join(map(str, cfg.widths))} (µP base width
{cfg.base_width}), sampler {cfg.sampler}, seeds {cfg.seeds}, {summary['trials']} trials ({summary['diverged']} diverged),
{summary['sweep_seconds']:.0f} s of training. Storage: <code>{html.escape(mask_url(sweep.url))}</code>.</p>
<h2>Training loss against each hyperparameter</h2>
{''.join(f'<p><img src="{i}" alt="{i}"></p>' for i in images)}
<p>One curve per width; ★ marks each width's optimum. Under µP the optima line up: tune the small model, reuse
the HPs on the large one. Under SP they move with width.</p>
<h2>Optimum per width</h2>
<table><tr><th>parametrization</th><th>width</th>{head}<th>loss</th><th>trials</th><th>diverged</th></tr>{''.join(rows)}</table>
<h2>Drift of the optimum across widths</h2>
<table><tr><th>parametrization</th><th>hyperparameter</th><th>smallest → largest width</th><th>largest move (grid steps)</th></tr>{''.join(drift_rows)}</table>
<h2>Wider is better (at each width's optimum)</h2><ul>{wib}</ul>
<h2>Transferred hyperparameters</h2>
<p>µP optimum at the proxy width {min(cfg.widths)} (also in <code>transferred.json</code>):</p>
<pre>{html.escape(json.dumps(transferred, indent=1))}</pre>
{transfer_html}
</body></html>"""
    path = out / "report.html"
    path.write_text(page)
    return path
