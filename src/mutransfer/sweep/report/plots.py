"""The report's figures: training loss against each hyperparameter, one curve per width (per depth
in a sweep over depths; per width and depth when both vary), µP and SP side by side (TP5 Fig. 1
style). For a sweep over several HPs a curve is the profile: the best loss over the other HPs at
each value. Each curve's fitted optimum (the number the verdict quotes) is a ★ with its interval
as a bar; the best grid point is an open circle.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..._core.atomic import atomic_path
from ..analysis.analysis import TrialResult, best, in_cell
from ..analysis.statistics import CONFIDENCE
from ..analysis.verdict import LABEL
from ..config.space import Choice, LogUniform
from ..engine.runner import Sweep

__all__ = [
    "FORECAST_FIGURE",
    "LINESTYLES",
    "MONITOR_FIGURE",
    "axis_lines",
    "cell_of",
    "curves",
    "loss_axis_top",
    "monitor_curves",
    "plot_forecast",
    "plot_hparam",
    "plot_monitor",
    "varying",
]

LINESTYLES = ("-", "--", ":", "-.")
FORECAST_FIGURE = "forecast.png"


def varying(sweep: Sweep) -> tuple[bool, bool]:
    """(by width, by depth): which axes the curves are drawn along (width when neither varies)."""
    cfg = sweep.config
    by_depth = cfg.depths is not None and len(cfg.depths) > 1
    return len(cfg.widths) > 1 or not by_depth, by_depth


def curves(sweep: Sweep) -> list[tuple[int, int | None, str]]:
    """(width, depth, legend label) of each plotted curve: one per width, per depth, or per both."""
    cfg = sweep.config
    by_width, by_depth = varying(sweep)
    out: list[tuple[int, int | None, str]] = []
    depths: list[int | None] = list(cfg.depths) if cfg.depths else [None]
    for w in cfg.widths:
        for d in depths:
            label = ", ".join(([f"width {w}"] if by_width else []) + ([f"depth {d}"] if by_depth else []))
            out.append((w, d, label))
    return out


def _styles(sweep: Sweep, cmap) -> dict[tuple[int, int | None], tuple]:
    """(color, linestyle) per curve: color by width (by depth when only depth varies), dashes by depth."""
    cfg = sweep.config
    depths: list[int | None] = list(cfg.depths) if cfg.depths else [None]
    by_width, by_depth = varying(sweep)
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
        return cfg.proxy_width, at, ()
    return cfg.proxy_width, cfg.proxy_depth, () if at == cfg.axes[axis][0] else ((axis, at),)


def axis_lines(sweep: Sweep, axis: str, cmap) -> list[tuple[tuple, str, tuple]]:
    """The curves along a further batch-size or horizon axis: one per value, at the proxy width and depth."""
    cfg = sweep.config
    values = cfg.axes[axis]
    return [
        (
            (cfg.proxy_width, cfg.proxy_depth, () if v == values[0] else ((axis, v),)),
            f"{axis} {v}",
            (cmap(0.1 + 0.8 * i / max(1, len(values) - 1)), "-"),
        )
        for i, v in enumerate(values)
    ]


def loss_axis_top(losses: list[float]) -> tuple[float, int]:
    """The top of a loss plot's y-axis and how many losses lie above it: the largest loss, unless some lie
    far above the rest — beyond the minimum + 4 × (median − minimum), where a blow-up (a loss of 287 beside
    curves between 1.2 and 2.5) would flatten every curve; those are counted, for the plot to say so."""
    if not losses:
        return 1.0, 0
    ordered = sorted(losses)
    lo, hi, median = ordered[0], ordered[-1], ordered[len(ordered) // 2]
    cap = lo + 4 * (median - lo)
    if median <= lo or hi <= cap:
        return hi, 0
    return cap, sum(v > cap for v in ordered)


def _markers(confidence: float) -> dict:
    """The legend entry of each kind of marker (grey: the curves' colours say which curve)."""
    from matplotlib.lines import Line2D

    grey = "0.35"
    return {
        "fitted": Line2D(
            [],
            [],
            marker="*",
            ms=11,
            color=grey,
            mec="black",
            ls="-",
            lw=2.5,
            label=f"fitted optimum (the verdict's number), bar: its {round(100 * confidence)}% interval",
        ),
        "edge": Line2D([], [], marker="*", ms=11, color=grey, mec="red", ls="none", label="optimum on the grid's edge"),
        "grid": Line2D([], [], marker="o", ms=8, mfc="none", mec=grey, ls="none", label="best grid point"),
        "spread": Line2D([], [], marker="|", ms=10, color=grey, ls="none", label="range over seeds"),
        "diverged": Line2D([], [], marker="x", ms=6, color=grey, ls="none", label="diverged"),
        "failed": Line2D([], [], marker="v", ms=6, color="red", ls="none", label="failed"),
        "pruned": Line2D([], [], marker="s", ms=4, color="grey", ls="none", label="pruned (last reported loss)"),
    }


def plot_hparam(
    sweep: Sweep,
    results: list[TrialResult],
    name: str,
    path: Path,
    fitted: dict | None = None,
    lines: list[tuple[tuple, str, tuple]] | None = None,
    title: str = "",
) -> None:
    """Draw training loss against HP `name`, one panel per parametrization, and save it as a PNG.

    Args:
        sweep: the sweep.
        results: its trials (`analysis.load_results`).
        name: the hyperparameter on the x axis.
        path: the PNG to write.
        fitted: {(parametrization, width, depth, extra): `statistics.Optimum`} of HP `name`: a ★
            at the fitted optimum with its interval as a bar, and an open circle at the best grid
            point where it differs; a cell without one gets the circle only.
        lines: [((width, depth, extra), label, (color, linestyle))]; default one per width/depth.
        title: appended to the figure's title.
    """
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

    seen: set[str] = set()  # the kinds of marker drawn, each explained once in the legend
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
            b = best(results, p, w, d, extra)
            if o is not None and choices is None:
                if o.x_interval is not None:  # the interval of the fitted optimum, drawn under its star
                    lo_x, hi_x = o.x_interval
                    ax.errorbar(
                        [o.x],
                        [o.loss],
                        xerr=[[o.x - lo_x], [hi_x - o.x]],
                        fmt="none",
                        ecolor=color,
                        elinewidth=2.5,
                        capsize=5,
                        capthick=2,
                        zorder=4,
                    )
                ax.plot(
                    [o.x], [o.loss], "*", ms=13, color=color, markeredgecolor="red" if o.edge else "black", zorder=6
                )
                seen.add("fitted")
                seen.update({"edge"} if o.edge else set())
                if b is not None and abs(x_of(b.params[name]) - o.x) > 1e-9:
                    ax.plot([x_of(b.params[name])], [b.loss], "o", ms=9, mfc="none", mec=color, mew=1.5, zorder=5)
                    seen.add("grid")
            elif b is not None:
                ax.plot([x_of(b.params[name])], [b.loss], "o", ms=9, mfc="none", mec=color, mew=1.5, zorder=5)
                seen.add("grid")
            seen.update(
                kind
                for kind, drawn_ in (("spread", spread), ("diverged", div), ("failed", failed), ("pruned", pruned))
                if drawn_
            )
        ax.set_title(LABEL[p], fontsize=12)
        if choices is not None:
            ax.set_xticks(range(len(choices)))
            ax.set_xticklabels([str(c) for c in choices])
            ax.set_xlabel(name)
        else:
            ax.set_xlabel(f"log2 {name}" if isinstance(dim, LogUniform) else name)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("training loss")
    top, above = loss_axis_top(finite)
    span = max(top - lo, 1e-9)
    axes[0][0].set_ylim(lo - 0.05 * span, top + 0.08 * span)
    if above:  # said on the plot, never silently cut: a blow-up far above the rest would flatten every curve
        axes[0][-1].text(
            0.98,
            0.97,
            f"{above} point{'s' if above > 1 else ''} above the range (up to {hi:.4g})",
            transform=axes[0][-1].transAxes,
            ha="right",
            va="top",
            fontsize=8,
            color="0.35",
        )
    handles, labels = axes[0][-1].get_legend_handles_labels()
    handles += [marker for kind, marker in _markers(CONFIDENCE).items() if kind in seen]
    labels += [marker.get_label() for kind, marker in _markers(CONFIDENCE).items() if kind in seen]
    fig.suptitle(f"{sweep.config.name}: training loss vs {name}{title}", fontsize=12)
    fig.tight_layout()
    # Below the panels, outside them; bbox_inches="tight" grows the canvas so nothing is clipped.
    fig.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(2 * len(params), max(1, len(labels))),
        fontsize=8,
        frameon=False,
    )
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)


# ----------------------------------------------------------------------------- the µP monitor

MONITOR_FIGURE = "monitor_target_vs_proxy.png"
_MONITOR_PANELS = (("act_rms", "activation RMS"), ("dw_rms", "‖ΔW‖ RMS (update per step)"))
_ROLE_ORDER = ("input", "hidden", "output", "vector", "scalar", "attention")


def _role_of(layer: str, layers: dict) -> str:
    """A trajectory layer's role, as the monitor logs it: the model's output is "output", a module holding no
    parameter of its own (an attention call) "attention"."""
    if layer == "(model output)":
        return "output"
    meta = layers.get(layer)
    return meta["role"] if meta else "attention"


def _geomean(values: list[float]) -> float:
    vs = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vs) / len(vs)) if vs else math.nan


def monitor_curves(target: dict, proxy: dict | None) -> dict[str, dict[str, dict[str, list]]]:
    """Per role and quantity (`act_rms`, `dw_rms`): the target's values by step and the proxy's at the same
    steps, µP-scaled to the target's widths (`monitor.predictions.scaled_proxy`, the alarms' scaling); the
    geometric mean over the role's layers that both runs hold (every layer of the target without a proxy).

    Returns:
        role → quantity → ``{"step": [...], "target": [...], "proxy": [...]}`` (proxy NaN where absent).
    """
    from ...monitor.predictions import scaled_proxy

    layers = target.get("layers", {})
    by_step = {int(r["step"]): r for r in (proxy or {}).get("steps", [])}
    out: dict[str, dict[str, dict[str, list]]] = {}
    for record in target.get("steps", []):
        p = by_step.get(int(record["step"]))
        expected = (
            scaled_proxy(record, p, layers, proxy.get("layers", {}), target["formulation"])
            if p is not None and proxy is not None
            else {}
        )
        for k, _ in _MONITOR_PANELS:
            per_role: dict[str, tuple[list, list]] = {}
            for layer, q in record["layers"].items():
                if q.get(k) is None or (expected and k not in expected.get(layer, {})):
                    continue
                t, e = per_role.setdefault(_role_of(layer, layers), ([], []))
                t.append(q[k])
                e.append(expected.get(layer, {}).get(k))
            for role, (t, e) in per_role.items():
                c = out.setdefault(role, {}).setdefault(k, {"step": [], "target": [], "proxy": []})
                c["step"].append(int(record["step"]))
                c["target"].append(_geomean(t))
                c["proxy"].append(_geomean(e))
    return out


def _minor_label(v: float, ax) -> str:
    """A log axis's minor tick label: 2, 3 and 5 × 10^k when the axis spans less than a decade (its major
    ticks alone may be one or none), else none."""
    lo, hi = ax.get_ylim()
    if not (v > 0 and lo > 0 and hi / lo < 10):
        return ""
    mantissa = round(v / 10 ** math.floor(math.log10(v)), 6)
    return f"{v:.2g}" if mantissa in (2.0, 3.0, 5.0) else ""


def plot_monitor(target: dict, proxy: dict | None, path: Path, target_label: str, proxy_label: str) -> bool:
    """The report's monitor figure: per role (rows), activation RMS and ‖ΔW‖ RMS against the step (columns),
    the target's solid, the proxy's µP-scaled to the target's widths dashed (`monitor_curves`), and a wider
    proxy's (the proxy's ``"wider"`` entry: the finite-width trend the alarms' band spans) dotted.

    Args:
        target: the target's trajectory (`Monitor.trajectory`).
        proxy: the proxy's, or None (the target alone).
        path: the PNG to write (atomically).
        target_label: e.g. "target (width 256)".
        proxy_label: e.g. "proxy (width 32), µP-scaled to width 256".

    Returns:
        False (and no file) when the target's trajectory holds no sample to draw.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    data = monitor_curves(target, proxy)
    wider = (proxy or {}).get("wider")
    wider_data = monitor_curves(target, wider) if wider else {}
    wider_label = f"µP proxy (width {wider.get('width', '?')}), scaled likewise" if wider else ""
    roles = [r for r in _ROLE_ORDER if r in data] + sorted(r for r in data if r not in _ROLE_ORDER)
    if not roles:
        return False
    fig, axes = plt.subplots(len(roles), 2, figsize=(10, 2.4 * len(roles) + 0.6), squeeze=False)
    for i, role in enumerate(roles):
        for j, (k, label) in enumerate(_MONITOR_PANELS):
            ax = axes[i][j]
            c = data[role].get(k)
            if c is None:
                ax.text(0.5, 0.5, "not measured for this role", ha="center", va="center", transform=ax.transAxes)
                ax.set_axis_off()
                continue
            ax.plot(c["step"], c["target"], "-o", ms=3, color="tab:blue", label=target_label)
            if any(math.isfinite(v) for v in c["proxy"]):
                ax.plot(c["step"], c["proxy"], "--s", ms=3, color="tab:orange", label=proxy_label)
            w = wider_data.get(role, {}).get(k)
            if w is not None and any(math.isfinite(v) for v in w["proxy"]):
                ax.plot(w["step"], w["proxy"], ":^", ms=3, color="tab:green", label=wider_label)
            ax.set_yscale("log")
            # plain tick labels: matplotlib's default 10^x mathtext on log axes took ~5 s per figure
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.2g}"))
            ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _, ax=ax: _minor_label(v, ax)))
            ax.set_title(f"{role}: {label}", fontsize=10)
            ax.set_xlabel("step")
            ax.set_ylabel(label.split(" (")[0])
            ax.grid(True, alpha=0.3)
    fig.suptitle("µP monitor: target against the proxy (geometric mean over each role's layers)", fontsize=11)
    fig.tight_layout()
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(3, len(labels)),
        fontsize=9,
        frameon=False,
    )
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def plot_forecast(fc: dict, path: Path) -> bool:
    """The report's forecast figure: the loss at the transferred hyperparameters against width (log axes), each
    swept width's seeds and their mean, the law's median with its 90 % band extended to the target, the held-out
    largest proxy with the interval the law fitted without it gave, the target's forecast interval, and its
    actual loss once trained.

    Args:
        fc: a forecast (`mt.sweep.forecast(...).as_dict()`, transfer.json's "forecast").
        path: the PNG to write (atomically).

    Returns:
        False (and no file) when the forecast has no point to draw.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    band = fc.get("band")
    axis = (band or {}).get("axis", "width")
    other = "depth" if axis == "width" else "width"
    at = fc.get(other)  # the band's other coordinate: the target's
    points = [p for p in fc.get("points", []) if at is None or p[other] == at] or fc.get("points", [])
    if not points:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for p in points:
        ax.plot([p[axis]] * len(p["losses"]), p["losses"], ".", color="tab:blue", alpha=0.45, ms=6)
    held = fc.get("held_out")
    fit = [p for p in points if not (held and p["width"] == held["width"] and p["depth"] == held["depth"])]
    ax.plot(
        [p[axis] for p in fit],
        [p["loss"] for p in fit],
        "o",
        color="tab:blue",
        ms=7,
        label="proxies: mean over seeds (dots: each seed)",
    )
    if band:
        ax.fill_between(
            band["values"],
            band["low"],
            band["high"],
            color="tab:blue",
            alpha=0.15,
            label=f"law, {round(100 * fc.get('confidence', CONFIDENCE))}% band (fit on every proxy)",
        )
        ax.plot(band["values"], band["median"], "-", color="tab:blue", lw=1.5)
    if held and (at is None or held[other] == at):
        lo, hi = held["interval"]
        ax.errorbar(
            [held[axis]],
            [held["loss"]],
            yerr=[[held["loss"] - lo], [hi - held["loss"]]],
            fmt="none",
            ecolor="tab:orange",
            capsize=5,
            lw=2,
            label="held-out: the law fitted without it",
        )
        ax.plot(
            [held[axis]],
            [held["measured"]],
            "D",
            mfc="white",
            mec="tab:orange",
            mew=2,
            ms=8,
            label=f"held-out largest proxy, measured ({'inside' if held['inside'] else 'OUTSIDE'})",
        )
    if fc.get("loss") is not None and fc.get("interval"):
        lo, hi = fc["interval"]
        ax.errorbar(
            [fc[axis]],
            [fc["loss"]],
            yerr=[[fc["loss"] - lo], [hi - fc["loss"]]],
            fmt="s",
            color="tab:green",
            capsize=6,
            lw=2,
            ms=7,
            label=f"forecast at {axis} {fc[axis]}",
        )
    actual = (fc.get("actual") or {}).get("loss")
    if actual is not None:
        ax.plot(
            [fc[axis]],
            [actual],
            "*",
            color="tab:red",
            ms=15,
            label=f"target trained: {actual:.4g} ({'inside' if fc['actual']['inside'] else 'OUTSIDE'})",
        )
    ax.set_xscale("log", base=2)
    values = [v for p in points for v in p["losses"]] + ([] if band is None else band["low"])
    values += [] if fc.get("interval") is None else list(fc["interval"])
    if min(values) > 0:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel(axis)
    ax.set_ylabel("training loss at the transferred hyperparameters")
    where = "" if at is None else f", {other} {at}"
    title = f"Forecast{where}: " + (fc["law"] if fc.get("reason") is None else "no forecast")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return True
