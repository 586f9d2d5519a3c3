"""mkdocs hook: the sweep config reference, rendered from the config schema (`mutransfer.sweep.config.schema`).

docs/config_reference.md holds the marker ``<!-- config-reference -->``; at build time it is
replaced by the tables `reference_markdown()` renders, so the page cannot drift from the keys the
config accepts. Enabled in mkdocs.yml with ``hooks: [docs/hooks/config_reference.py]``.
"""

from __future__ import annotations

MARKER = "<!-- config-reference -->"


def render(markdown: str) -> str:
    """`markdown` with the marker replaced by the config reference (unchanged without the marker)."""
    if MARKER not in markdown:
        return markdown
    from mutransfer.sweep.config.schema import reference_markdown

    return markdown.replace(MARKER, reference_markdown())


def on_page_markdown(markdown: str, page, config, files) -> str:
    """mkdocs' hook: called with each page's Markdown before it is rendered."""
    return render(markdown)
