"""report.html's template (Jinja2, autoescaped) and the safe file names of the report's figures.

Every value on the page comes from data a user or an attacker may choose — hyperparameter names,
choice values, the sweep's name, the objective, error messages, paths — so the page is rendered by
Jinja2 with autoescaping on: no value reaches the HTML unescaped, in text or in an attribute. The
template takes plain values (strings, numbers, lists of table rows); nothing is marked safe.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

__all__ = ["figure_name", "render_page"]

_SAFE = re.compile(r"[A-Za-z0-9_-]{1,60}")


def figure_name(hparam: str, suffix: str = "") -> str:
    """The PNG file name of a hyperparameter's figure: ``loss_vs_{hparam}{suffix}.png`` when the name
    is made of letters, digits, ``_`` and ``-`` (at most 60); otherwise its slug (other characters
    as ``_``, cut to 40) and 8 hex digits of the name's SHA-256, so that ``/``, ``<``, ``..`` or a
    long name never reach the file system and two names never share a file. The page shows the name.

    Args:
        hparam: the hyperparameter's name, as in ``[space]``.
        suffix: appended before ``.png`` (e.g. ``_by_batch_size``).

    Returns:
        A file name without a directory part.
    """
    if _SAFE.fullmatch(hparam):
        return f"loss_vs_{hparam}{suffix}.png"
    slug = re.sub(r"[^A-Za-z0-9_-]", "_", hparam)[:40]
    digest = hashlib.sha256(hparam.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"loss_vs_{slug}-{digest}{suffix}.png"


_TEMPLATE = """<!doctype html>
{%- macro table(head, rows) -%}
{%- if rows -%}
<table><tr>{% for h in head %}<th>{{ h }}</th>{% endfor %}</tr>
{%- for row in rows %}<tr>{% for cell in row %}<td>{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</table>
{%- endif -%}
{%- endmacro %}
<html><head><meta charset="utf-8"><title>µTransfer sweep: {{ name }}</title>
<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee}pre{background:#f6f8fa;padding:1em}
.failures td:last-child,.alarms td:last-child{text-align:left}
.verdict{background:#f6f8fa;border-left:4px solid #555;padding:.5em 1em}</style></head>
<body><h1>µTransfer sweep: {{ name }}</h1>
<div class="verdict"><b>Verdict</b><ul>{% for line in verdicts %}<li>{{ line }}</li>{% endfor %}</ul></div>
<p>Objective <code>{{ objective }}</code>, {{ scope }}, sampler {{ sampler }}, seeds {{ seeds }},
{{ trials }} trials ({{ counts }}),
{{ seconds }} s of training. Storage: <code>{{ storage }}</code>.
{{ placements }}</p>
<h2>Training loss against each hyperparameter</h2>
{% for image in images %}<p><img src="{{ image.file }}" alt="{{ image.alt }}"></p>
{% endfor -%}
<p>One curve per {{ curve }}, the mean over seeds; a vertical bar is the range over seeds; ★ marks each curve's
optimum fitted below grid resolution (a parabola through the best point and its neighbours, in log2 for a
log-scaled HP), the horizontal bar its {{ uncertainty }}; a red-edged ★ sits on the grid's edge.</p>
{% if verdict_rows -%}
<h2>Optimum, move from the proxy and regret</h2>
<p>Move: the optimum's shift from the proxy's. Regret: the loss with the proxy's best HPs minus that
{{ curve }}'s own best, relative to it. Transferred when every optimum is located (not on a grid edge, beside an
unevaluated point or on a flat curve) and, everywhere, the proxy's HPs do not diverge, the regret is not
significantly above 2%, and either the regret's interval lies below 2% or the move's within ±1 octave (one grid
step for a uniform HP). Intervals are {{ confidence }}%, centred on the estimate; log-scaled HPs in
log2.</p>
{{ table(["parametrization", "hyperparameter", "where", "fitted optimum", "interval", "move", "interval", "regret",
          "interval", "note"], verdict_rows) }}
{% endif -%}
<h2>Best trial per {{ "width and depth" if depths else "width" }}</h2>
{{ table(optimum_head, optimum_rows) }}
{% if drift_rows -%}
<h2>Drift of the best grid point across {{ "widths and depths" if depths else "widths" }}</h2>
{{ table(drift_head, drift_rows) }}
{% endif -%}
{% for heading, items in bigger -%}
<h2>{{ heading }}</h2><ul>{% for item in items %}<li>{{ item }}</li>{% endfor %}</ul>
{% endfor -%}
{% if failure_rows -%}
<h2>Failed trials</h2><p>The objective raised; tracebacks are in <code>failures/</code> in the
run directory. <code>mutransfer sweep CONFIG --retry-failed</code> reruns them.</p>
<div class="failures">{{ table(["parametrization", "where", "trial", "hyperparameters", "error"], failure_rows) }}</div>
{% endif -%}
<h2>Transferred hyperparameters</h2>
<p>{{ label }} optimum at the proxy {{ proxy }} (also in <code>transferred.json</code>):</p>
<pre>{{ transferred }}</pre>
{% if transfer -%}
<h2>Transfer from {{ transfer.proxy }} to {{ transfer.target }}</h2>
{{ table(["run", "lr", "training loss"], transfer.rows) }}
{% if transfer.compute %}<p>{{ transfer.compute }}</p>{% endif %}
{% if transfer.flops %}<p>FLOPs (matmuls, counted by sampling each run's optimizer steps): {{ transfer.flops }}.</p>{% endif %}
{% if transfer.rule_rows -%}
<h3>Hyperparameters at the target's batch size and horizon</h3>
<p>Each step, in order: measured on this sweep where it swept that batch size or horizon, else by rule
(<code>mt.transfer_hparams</code>).</p>
{{ table(["run", "hyperparameter", "from", "to", "interval of to", "rule", "regime", "source"], transfer.rule_rows) }}
{% endif -%}
{% if transfer.monitor -%}
<h3>{{ label }} monitor on the target</h3>
<p>{{ transfer.monitor.line }}</p>
{% if transfer.monitor.figure %}<p><img src="{{ transfer.monitor.figure }}" alt="{{ label }} monitor: the target's activation and update sizes against the proxy's, scaled to the target's width"></p>
<p>Per role, the geometric mean over its layers of each layer's output RMS and of its update ‖ΔW‖ per step (RMS), on
the sampled steps; dashed, the proxy's values at the same steps, scaled to the target's widths by {{ label }}'s rules (what the
monitor's alarms compare against; files <code>target_trajectory.json</code>, <code>proxy_trajectory.json</code>).</p>
{% endif -%}
{% if transfer.monitor.watched -%}
{% if transfer.monitor.alarm_rows -%}
<div class="alarms">{{ table(["step", "layer", "quantity", "measured", label + " expects", "likely cause and fix"],
                             transfer.monitor.alarm_rows) }}</div>
{%- else %}<p>No alarm.</p>
{%- endif %}
{% endif -%}
{% endif -%}
{% endif -%}
{% if forecast -%}
<h2>Forecast of the target's loss</h2>
<p>{{ forecast.line }}</p>
{% if forecast.flops %}<p>Cost, in FLOPs: {{ forecast.flops }}.</p>{% endif %}
{% if forecast.figure %}<p><img src="{{ forecast.figure }}" alt="training loss at the transferred hyperparameters against width, the law fitted to it with its band, the held-out largest proxy and the target"></p>{% endif %}
{% if forecast.rows -%}
<p>The ladder: {{ forecast.source }}.</p>
{{ table(["width", "mean loss", "per seed", "trial"], forecast.rows) }}
{% endif -%}
{% for note in forecast.notes %}<p>Note: {{ note }}</p>{% endfor %}
{% endif -%}
</body></html>
"""


def render_page(**values: Any) -> str:
    """report.html from the template, every value autoescaped.

    Args:
        **values: the template's variables (see `report.write_report`), plain values only.

    Returns:
        The page's text.
    """
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.from_string(_TEMPLATE).render(**values)
