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

from .analysis import (
    TrialResult,
    best,
    costs,
    counts,
    deeper_is_better,
    drift,
    head_to_head,
    in_cell,
    load_results,
    max_drift_steps,
    placements,
    transferred_hparams,
    verdicts,
    wider_is_better,
)
from .analysis import axes as verdict_axes
from .runner import Sweep
from .space import Choice, LogUniform
from .storage import mask_url
from .verdict import CONFIDENCE, Verdict, axis_name, describe, describe_optima, judge, unit, value_at

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

# The two target runs of `transfer`, in the order they are shown.
TRANSFER_RUNS = (("mup", "µP target, µP proxy optimum"), ("sp", "SP target, SP proxy optimum"))


def transfer_where(out: dict, which: str) -> str:
    """'width 32' or 'width 32, depth 2' (and the target's batch size and steps when given): the
    "proxy" or "target" of a transfer result."""
    depth = out.get(f"{which}_depth")
    where = f"width {out[f'{which}_width']}" + ("" if depth is None else f", depth {depth}")
    if which == "target":
        where += "".join(f", {k.replace('_', ' ')} {out[k]}" for k in ("batch_size", "steps") if k in out)
    return where


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


def curves(sweep: Sweep) -> list[tuple[int, int | None, str]]:
    """(width, depth, legend label) of each plotted curve: one per width, per depth, or per both."""
    cfg = sweep.config
    by_width, by_depth = _varying(sweep)
    out = []
    for w in cfg.widths:
        for d in cfg.depths or [None]:
            label = ", ".join(([f"width {w}"] if by_width else []) + ([f"depth {d}"] if by_depth else []))
            out.append((w, d, label))
    return out


def _styles(sweep: Sweep, cmap) -> dict[tuple[int, int | None], tuple]:
    """(color, linestyle) per curve: color by width (by depth when only depth varies), dashes by depth."""
    cfg = sweep.config
    depths = cfg.depths or [None]
    by_width, by_depth = _varying(sweep)
    colored = cfg.widths if by_width else depths
    color = {v: cmap(0.1 + 0.8 * i / max(1, len(colored) - 1)) for i, v in enumerate(colored)}
    dashed = by_width and by_depth
    return {
        (w, d): (color[w if by_width else d], LINESTYLES[depths.index(d) % len(LINESTYLES)] if dashed else "-")
        for w in cfg.widths
        for d in depths
    }


def cell_of(sweep: Sweep, axis: str, at: int) -> tuple:
    """(width, depth, extra) of the cell at value `at` along `axis` (the others at the proxy)."""
    cfg = sweep.config
    if axis == "width":
        return at, cfg.proxy_depth, ()
    if axis == "depth":
        return min(cfg.widths), at, ()
    return min(cfg.widths), cfg.proxy_depth, () if at == cfg.axes[axis][0] else ((axis, at),)


def axis_lines(sweep: Sweep, axis: str, cmap) -> list[tuple[tuple, str, tuple]]:
    """The curves along a further batch-size or horizon axis: one per value, at the proxy width and depth."""
    cfg = sweep.config
    values = cfg.axes[axis]
    return [
        (
            (min(cfg.widths), cfg.proxy_depth, () if v == values[0] else ((axis, v),)),
            f"{axis} {v}",
            (cmap(0.1 + 0.8 * i / max(1, len(values) - 1)), "-"),
        )
        for i, v in enumerate(values)
    ]


def plot_hparam(
    sweep: Sweep,
    results: list[TrialResult],
    name: str,
    path: Path,
    fitted: dict | None = None,
    lines: list[tuple[tuple, str, tuple]] | None = None,
    title: str = "",
) -> None:
    """`fitted`: {(parametrization, width, depth, extra): verdict.Optimum} of HP `name`, drawn as a
    star at the fitted optimum with its interval as a bar (else the best trial is starred).
    `lines`: [((width, depth, extra), label, (color, linestyle))], default one per width/depth."""
    fitted = fitted or {}
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    dim = sweep.config.space[name]
    params = sweep.config.parametrizations
    if lines is None:
        style = _styles(sweep, plt.get_cmap("viridis"))
        lines = [((w, d, ()), label, style[(w, d)]) for w, d, label in curves(sweep)]
    keys = {key for key, _, _ in lines}
    results = [r for r in results if (r.width, r.depth, r.extra) in keys]
    fig, axes = plt.subplots(1, len(params), figsize=(5.2 * len(params), 4.8), sharey=True, squeeze=False)
    choices = list(dim.values) if isinstance(dim, Choice) else None
    # The y-range of what is drawn: each curve's profile over the other HPs (per cell, the best loss
    # at each value of this HP), so a secondary HP's curves are not squashed by the lr's range.
    drawn: dict = {}
    for r in results:
        if r.ok:
            key = (r.parametrization, r.width, r.depth, r.extra, r.params[name])
            drawn[key] = min(drawn.get(key, math.inf), r.loss)
    finite = list(drawn.values())
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)

    def x_of(v):
        if choices is not None:
            return choices.index(v)
        return math.log2(v) if isinstance(dim, LogUniform) else v

    for ax, p in zip(axes[0], params):
        for (w, d, extra), label, (color, dashes) in lines:
            cell = in_cell(results, p, w, d, extra)
            profile: dict = {}
            for r in cell:
                x = x_of(r.params[name])
                if r.ok and (x not in profile or r.loss < profile[x]):
                    profile[x] = r.loss
            xs = sorted(profile)
            ax.plot(xs, [profile[x] for x in xs], marker="o", linestyle=dashes, ms=3, color=color, label=label)
            spread = [
                (x, r)
                for r in cell
                for x in [x_of(r.params[name])]
                if r.ok and len(r.losses) > 1 and profile.get(x) == r.loss
            ]
            if spread:  # seed-to-seed range of each plotted point
                ax.vlines(
                    [x for x, _ in spread],
                    [min(r.losses) for _, r in spread],
                    [max(r.losses) for _, r in spread],
                    color=color,
                    lw=1,
                    alpha=0.7,
                )
            div = sorted({x_of(r.params[name]) for r in cell if r.diverged} - set(profile))
            if div:
                ax.plot(div, [hi] * len(div), "x", color=color, ms=6)
            failed = sorted({x_of(r.params[name]) for r in cell if r.failed} - set(profile))
            if failed:
                ax.plot(failed, [hi] * len(failed), "v", color="red", ms=7, markeredgecolor=color)
            pruned = [
                (x, r.pruned_loss if math.isfinite(r.pruned_loss) else hi)
                for r in cell
                if r.pruned
                for x in [x_of(r.params[name])]
                if x not in profile
            ]
            if pruned:  # at the last loss reported before pruning (an earlier step), kept inside the axes
                ax.plot(
                    [x for x, _ in pruned],
                    [min(v, hi + 0.04 * (hi - lo)) for _, v in pruned],
                    "s",
                    color="grey",
                    ms=4,
                    markeredgecolor=color,
                    alpha=0.8,
                )
            o = fitted.get((p, w, d, extra))
            if o is not None and choices is None:
                if o.x_interval is not None:
                    ax.hlines(o.loss, o.x_interval[0], o.x_interval[1], color=color, lw=3, alpha=0.6, zorder=4)
                ax.plot(
                    [o.x], [o.loss], "*", ms=14, color=color, markeredgecolor="red" if o.edge else "black", zorder=5
                )
            elif (b := best(results, p, w, d, extra)) is not None:
                ax.plot([x_of(b.params[name])], [b.loss], "*", ms=14, color=color, markeredgecolor="black", zorder=5)
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
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="lower center",
        ncol=min(6, max(1, len(labels))),
        fontsize=8,
        title=f"★ fitted optimum (bar: its {round(100 * CONFIDENCE)}% interval)   | range over seeds   "
        f"× diverged   ▼ failed   ■ pruned (last reported loss)",
        title_fontsize=8,
        frameon=False,
    )
    fig.suptitle(f"{sweep.config.name}: training loss vs {name}{title}", fontsize=12)
    fig.tight_layout(rect=(0, 0.08 + 0.03 * ((len(labels) - 1) // 6), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


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


def _load_transfer(sweep: Sweep) -> dict | None:
    path = sweep.run_dir / "transfer.json"  # written by `mutransfer transfer`
    return json.loads(path.read_text()) if path.is_file() else None


def verdict_lines(sweep: Sweep, judged: dict[str, dict[str, Verdict]]) -> list[str]:
    """One sentence per (parametrization, axis), µP first: the verdicts at the top of the report."""
    lines = []
    for p in sorted(judged, key=lambda p: p != "mup"):
        for axis, v in judged[p].items():
            lines.append(describe(v, f"{LABEL[p].split(' ')[0]} across {axis_name(axis, plural=True)}"))
    return lines


def head_to_head_line(h: dict | None) -> str | None:
    """TP5 Fig. 1's promise, measured: µP with the proxy's HPs against SP re-tuned at the largest width."""
    if h is None:
        return None
    if h["mup_transferred"] is None:
        what = "was pruned (worse early on than that width's finished trials)" if h.get("mup_pruned") else "diverged"
        return (
            f"At width {h['width']}, µP with the HPs tuned at width {h['proxy_width']} {what}; SP re-tuned "
            f"there reaches {h['sp_retuned']:.4g}."
        )
    rel, iv = h["relative"], h.get("relative_interval")
    lo, hi = iv if iv is not None else (rel, rel)
    if rel is None:
        judgement = "no relative difference: SP's loss is 0"
    elif hi < -0.01:
        judgement = "µP is better"
    elif hi <= 0.01:
        judgement = "µP is as good (within 1%) or better"
    elif lo > 0.01:
        judgement = "SP re-tuned at the large width is better: at this scale µP does not pay off"
    else:
        judgement = "within the noise the two cannot be told apart: add seeds"
    ci = "" if iv is None else f", 90% CI {100 * iv[0]:+.1f}% … {100 * iv[1]:+.1f}%"
    return (
        f"At width {h['width']}, µP with the HPs tuned at width {h['proxy_width']} reaches "
        f"{h['mup_transferred']:.4f}; SP re-tuned at width {h['width']} reaches {h['sp_retuned']:.4f} "
        f"({'' if rel is None else f'{100 * rel:+.1f}%{ci}: '}{judgement})."
    )


def _plain(value):
    """JSON for pipelines: NaN and ±inf become null (a diverged loss, an unknown ratio); grid values
    lose their float noise (0.19999999999999998 → 0.2)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return float(f"{value:.12g}") if math.isfinite(value) else None
    return value


def summarize(sweep: Sweep, results: list[TrialResult], judged: dict | None = None) -> dict:
    """summary.json: the verdict line, per parametrization and axis the optima with intervals, drift
    with interval, transferred, regret and trial counts (`verdicts`); the grid optima per cell and
    their drift, bigger-is-better checks, the head-to-head at the largest width, the transferred HPs
    and the cost."""
    cfg = sweep.config
    ps = cfg.parametrizations
    judged = verdicts(sweep, results) if judged is None else judged
    lines = verdict_lines(sweep, judged)
    for p in ps:
        if verdict_axes(sweep) and not judged[p]:
            c = counts(results, p)
            lines.append(
                f"{LABEL[p].split(' ')[0]}: no verdict: no completed trial at the proxy "
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
        describe_optima(v, LABEL[p].split(" ")[0])
        for p in cfg.parametrizations
        if (
            v := judge(
                p,
                "width",
                [(min(cfg.widths), in_cell(results, p, min(cfg.widths), cfg.proxy_depth))],
                cfg.space,
                len(cfg.seeds),
            )
        )
        is not None
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
        "proxy_width": min(cfg.widths),
    }
    if cfg.depths is not None:
        summary.update(depths=cfg.depths, base_depth=cfg.base_depth, proxy_depth=cfg.proxy_depth)
    summary["analysis"] = {p: {axis: v.as_dict() for axis, v in judged[p].items()} for p in ps}
    summary["head_to_head"] = h2h
    summary["transferred_hparams"] = transferred_hparams(sweep, results)
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
    summary.update(
        trials=len(results),
        diverged=c["diverged"],
        failed=c["failed"],
        pruned=c["pruned"],
        counts={p: counts(results, p) for p in ps},
        sweep_seconds=sum(r.seconds for r in results),
        cost=costs(sweep, results, _load_transfer(sweep)),
    )
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
        }
        for r in results
    ]
    return summary


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
        lines = ([("width", d, f"widths at depth {d}") for d in cfg.depths] if len(cfg.widths) > 1 else []) + (
            [("depth", w, f"depths at width {w}") for w in cfg.widths] if len(cfg.depths) > 1 else []
        )
    rows = []
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
    return "".join(rows)


def _bigger_is_better_html(sweep: Sweep, results: list[TrialResult]) -> str:
    """Wider is better (at each depth), and deeper is better (at each width) in a sweep over depths."""
    cfg = sweep.config

    def item(p: str, verdict: bool | None, cells: list[tuple[int, int | None]], what: str) -> str:
        losses = ", ".join(f"{b.loss:.3f}" for w, d in cells if (b := best(results, p, w, d)))
        answer = "yes" if verdict else ("no" if verdict is not None else "—")
        return f"<li>{LABEL[p]}: {answer} (best loss by {what}: {losses})</li>"

    if cfg.depths is None:
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
    t = _load_transfer(sweep)
    if t is None:
        return ""
    cells = []
    for p, label in TRANSFER_RUNS:
        if p in t:
            loss = "diverged" if t[p]["loss"] is None else f"{t[p]['loss']:.4f}"
            cells.append(f"<tr><td>{label}</td><td>{_fmt(t[p]['hparams'].get('lr', '—'))}</td><td>{loss}</td></tr>")
    cost = summary["cost"]
    ratio = ""
    if "proxy_over_target" in cost:
        ratio = (
            f"<p>Compute: tuning at the proxy (µP, {cost['proxy_cpu_seconds']:.3g} CPU s) cost "
            f"{cost['proxy_over_target']:.3g}× one target run ({cost['target_cpu_seconds']:.3g} CPU s); "
            f"the whole sweep, checks at every width included, {cost['sweep_over_target']:.3g}×.</p>"
        )
    return (
        f"<h2>Transfer from {transfer_where(t, 'proxy')} to {transfer_where(t, 'target')}</h2>"
        f"<table><tr><th>run</th><th>lr</th><th>training loss</th></tr>{''.join(cells)}</table>{ratio}"
    )


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
    """Write the report into `out_dir` (default: the run directory); returns report.html's path."""
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
        fitted = {}
        for p, by_axis in judged.items():
            for axis, v in by_axis.items():
                for o in v.hps[name].optima:
                    fitted.setdefault((p, *cell_of(sweep, axis, o.at)), o)
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
                    f" across {axis} (width {min(cfg.widths)})",
                )
                images.append(png.name)

    transferred = summary["transferred_hparams"]
    (out / "transferred.json").write_text(json.dumps(_plain(transferred), indent=1, allow_nan=False))
    (out / "summary.json").write_text(json.dumps(_plain(summary), indent=1, allow_nan=False))

    depths = cfg.depths is not None
    depth_head = ("<th>depth</th>" if depths else "") + ("<th>batch size / steps</th>" if cfg.axes else "")
    across_head = "<th>across</th>" if depths else ""
    head = "".join(f"<th>best {html.escape(k)}</th>" for k in cfg.space)
    scope = f"widths {', '.join(map(str, cfg.widths))} (µP base width {cfg.base_width})" + (
        f", depths {', '.join(map(str, cfg.depths))} (µP base depth {cfg.base_depth})" if depths else ""
    )
    proxy = f"width {min(cfg.widths)}" + (f" and depth {cfg.proxy_depth}" if depths else "")
    curve = " and ".join(axis for axis, varies in zip(("width", "depth"), _varying(sweep)) if varies)
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
<h2>Optimum, move from the proxy and regret</h2>
<p>Move: the optimum's shift from the proxy's. Regret: the loss with the proxy's best HPs minus that
{curve}'s own best, relative to it. Transferred when every optimum is located (not on a grid edge, beside an
unevaluated point or on a flat curve) and, everywhere, the proxy's HPs do not diverge, the regret is not
significantly above 2%, and either the regret's interval lies below 2% or the move's within ±1 octave (one grid
step for a uniform HP). Intervals are {round(100 * CONFIDENCE)}%; log-scaled HPs in log2.</p>
<table><tr><th>parametrization</th><th>hyperparameter</th><th>where</th><th>fitted optimum</th><th>interval</th>
<th>move</th><th>interval</th><th>regret</th><th>interval</th><th>note</th></tr>{_verdict_rows(sweep, judged)}</table>
<h2>Best trial per {"width and depth" if depths else "width"}</h2>
<table><tr><th>parametrization</th><th>width</th>{depth_head}{head}<th>loss</th><th>trials</th><th>diverged</th><th>failed</th><th>pruned</th></tr>{_optimum_rows(sweep, results)}</table>
<h2>Drift of the best grid point across {"widths and depths" if depths else "widths"}</h2>
<table><tr><th>parametrization</th><th>hyperparameter</th>{across_head}<th>{"smallest → largest" if depths else "smallest → largest width"}</th><th>largest move (grid steps)</th></tr>{_drift_rows(sweep, results)}</table>
{_bigger_is_better_html(sweep, results)}
{failure_html}
<h2>Transferred hyperparameters</h2>
<p>µP optimum at the proxy {proxy} (also in <code>transferred.json</code>):</p>
<pre>{html.escape(json.dumps(transferred, indent=1))}</pre>
{_transfer_html(sweep, summary)}
</body></html>"""
    path = out / "report.html"
    path.write_text(page)
    return path
