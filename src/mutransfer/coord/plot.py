"""Plot of a coordinate check: one log-log panel per step, failing modules highlighted."""

from __future__ import annotations

import os
from typing import Any

from .._core.atomic import atomic_path

__all__ = ["plot_result"]


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "plotting needs matplotlib, a dependency of mutransfer that is missing here: pip install matplotlib"
        ) from None
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_result(result: Any, path: str | os.PathLike, max_legend: int = 12) -> None:
    """Draw a `CoordCheckResult` (its trends, steps and verdict; duck-typed, so that this module
    does not import the report that calls it) to `path`."""
    plt = _matplotlib()
    from matplotlib.lines import Line2D

    panels = [("size", 0, "size at init (step 0)")]
    panels += [("change", t, f"change after step {t}") for t in range(1, result.steps + 1)]
    failing = result.failing_modules()
    failing = [m for m in failing if m.startswith("(model")] + [m for m in failing if not m.startswith("(model")]
    modules = sorted({t.module for t in result.trends})
    # Always shown in colour: the model output (logits) and attention logits, failing or not.
    key = [m for m in modules if m not in failing and (m.startswith("(model") or m.endswith("[attn logits]"))]
    colors = plt.get_cmap("tab10" if len(failing + key) <= 10 else "tab20").colors
    color_of = {m: colors[i % len(colors)] for i, m in enumerate(failing + key)}
    by_panel: dict[tuple[str, int], list] = {}
    for t in result.step_trends:
        by_panel.setdefault((t.quantity, t.step), []).append(t)

    n = len(panels)
    cols = min(n, 5)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 3.2 * rows + 0.9), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (quantity, step, title) in zip(axes.flat, panels):
        trends = by_panel.get((quantity, step), [])
        for t in sorted(trends, key=lambda t: t.module in color_of):
            if t.module in failing:
                ax.plot(
                    t.widths,
                    t.means,
                    "-o",
                    color=color_of[t.module],
                    lw=2.2,
                    ms=4,
                    zorder=4,
                    alpha=1.0 if not t.passed else 0.55,
                )
            elif t.module in color_of:
                ax.plot(t.widths, t.means, "--", color=color_of[t.module], lw=1.4, zorder=3)
            else:
                ax.plot(t.widths, t.means, "-", color="#8aa4c8", lw=0.8, alpha=0.6, zorder=2)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(result.widths)
        ax.set_xticklabels([str(w) for w in result.widths], fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(result.axis, fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(True, which="major", alpha=0.3)
    for r in range(rows):
        axes[r][0].set_ylabel("mean |coordinate|", fontsize=8)

    verdict = "PASS" if result.passed else "FAIL"
    fig.suptitle(
        f"Coordinate check {verdict} — {result.parametrization}, {result.optimizer} lr={result.lr:g}, "
        f"{result.seeds} seeds; rule: growth ≤ {result.max_growth:g}× per 16× {result.axis}",
        color="#1a7f37" if result.passed else "#c62828",
        fontsize=11,
    )
    handles = [
        Line2D([], [], color=color_of[m], lw=2.2, marker="o", ms=4, label=f"{m} (fails)") for m in failing[:max_legend]
    ]
    if len(failing) > max_legend:
        handles.append(Line2D([], [], color="none", label=f"… {len(failing) - max_legend} more failing"))
    handles += [Line2D([], [], color=color_of[m], lw=1.4, ls="--", label=f"{m} (within the rule)") for m in key]
    n_ok = len(set(modules) - set(failing) - set(key))
    handles.append(Line2D([], [], color="#8aa4c8", lw=0.8, label=f"{n_ok} other modules within the rule"))
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=8, frameon=False)
    legend_rows = (len(handles) + 3) // 4
    fig.tight_layout(rect=(0, 0.04 + 0.035 * legend_rows, 1, 0.95))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
