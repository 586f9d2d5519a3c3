"""MkDocs hook: the rule tables of docs/rules.md, generated from `mutransfer.rules` at build time.

A marker ``<!-- rules-tables:NAME -->`` on a page is replaced by the table NAME (``table3``,
``table8``, ``optimizers``, ``depth``, ``umup``); ``<!-- rules-tables -->`` by all of them. The page can
therefore never disagree with the data the library runs on. Enable it in mkdocs.yml with
``hooks: [docs/hooks/rules_tables.py]``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

_SRC = Path(__file__).resolve().parents[2] / "src"
if _SRC.is_dir() and str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))  # document the checkout being built, not another installed copy

from mutransfer import rules  # noqa: E402  (after the path above)

_MARKER = re.compile(r"<!-- rules-tables(?::(\w+))? -->")
_WIDTH_COLUMNS = {
    "init": "init std",
    "forward": "forward multiplier",
    "sgd_lr": "SGD lr",
    "adam_lr": "Adam lr",
    "adam_eps": "Adam ε",
    "spectral_lr": "spectral lr (Muon)",
    "adafactor_lr": "relative lr (Adafactor)",
}
_DEPTH_COLUMNS = {k: v for k, v in _WIDTH_COLUMNS.items() if k != "forward"}


def _power(base: str, e: float) -> str:
    e = abs(e)
    if e == 1:
        return base
    if e == 0.5:
        return f"√{base}"
    return f"{base}^{e:g}"


def width_factor(exponents: tuple[float, float], names: tuple[str, str] = ("m_in", "m_out")) -> str:
    """A pair of exponents of (m_in, m_out) (or of `names`) as a factor: (-1, 1) → "×m_out/m_in"."""
    up = [_power(n, e) for n, e in zip(names, exponents) if e > 0]
    down = [_power(n, e) for n, e in zip(names, exponents) if e < 0]
    num = "·".join(up) or "1"
    if not down:
        return f"×{num}"
    return f"×{num}/{'·'.join(down)}"


def depth_exponent(pair: tuple[float, float]) -> str:
    """(c, k), the exponent c + k·α of m_L, as a factor: (-1, 2) → "×m_L^(2α−1)"."""
    c, k = pair
    if k == 0:
        return "×1" if c == 0 else f"×m_L^{c:g}"
    alpha = ("" if abs(k) == 1 else f"{abs(k):g}") + "α"
    if c == 0:
        return f"×m_L^{'-' if k < 0 else ''}{alpha}"
    return f"×m_L^({'-' if k < 0 else ''}{alpha}{'−' if c < 0 else '+'}{abs(c):g})"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def width_table(formulation: str) -> str:
    """The width rules of one formulation, one row per role."""
    table = rules.formulation_rules(formulation)
    rows = [[f"`{role}`"] + [width_factor(getattr(table[role], c)) for c in _WIDTH_COLUMNS] for role in rules.ROLES]
    return _table(["role", *_WIDTH_COLUMNS.values()], rows)


def umup_table() -> str:
    """u-µP's rules (`rules.UMUP`), factors of the absolute fans, one row per row name."""
    names = ("fan_in", "fan_out")
    rows = [
        [f"`{row}`"] + [width_factor(getattr(rule, c), names) for c in _WIDTH_COLUMNS]
        for row, rule in rules.UMUP.items()
    ]
    return _table(["row", *_WIDTH_COLUMNS.values()], rows)


def optimizers_table() -> str:
    """Which columns each optimizer name reads."""
    rows = []
    for name, rule in rules.OPTIMIZERS.items():
        eps = ", ".join(f"`{e}`" for e in rule.eps) or "—"
        rows.append([f"`{name}`", rule.kind, f"`{rule.lr}`", eps, rule.partner or "", rule.note])
    return _table(["optimizer", "update kind", "lr column", "ε columns", "partner", "note"], rows)


def depth_table() -> str:
    """The depth rules per position of a parameter, after the branch multiplier's sentence."""
    rows = [
        [f"`{where}`"] + [depth_exponent(getattr(rule, c)) for c in _DEPTH_COLUMNS]
        for where, rule in rules.DEPTH_RULES.items()
    ]
    branch = depth_exponent(rules.BRANCH_MULTIPLIER)
    return f"Every residual branch's output: {branch} (`BRANCH_MULTIPLIER`).\n\n" + _table(
        ["where", *_DEPTH_COLUMNS.values()], rows
    )


TABLES = {
    "table3": lambda: width_table(rules.NO_MULTIPLIERS),
    "table8": lambda: width_table(rules.READOUT_MULTIPLIER),
    "optimizers": optimizers_table,
    "depth": depth_table,
    "umup": umup_table,
}


def render(markdown: str) -> str:
    """`markdown` with every rules-tables marker replaced by its table."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "\n\n".join(make() for make in TABLES.values())
        if name not in TABLES:
            raise ValueError(f"unknown rules table {name!r} in a rules-tables marker; use one of {', '.join(TABLES)}")
        return TABLES[name]()

    return _MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs event: replace the markers on any page that has them."""
    return render(markdown) if "<!-- rules-tables" in markdown else markdown
