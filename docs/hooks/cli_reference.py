"""mkdocs hook: replace `<!-- cli-reference -->` in a page with every `mutransfer` subcommand's help.

The text is each parser's own `format_help()`, so the page cannot drift from the command.
Add to mkdocs.yml: `hooks: [docs/hooks/cli_reference.py]`.
"""

from __future__ import annotations

import argparse
import os

MARKER = "<!-- cli-reference -->"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subparsers here; no public accessor exists
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def reference() -> str:
    """The Markdown of the whole command line: `mutransfer --help`, then one section per subcommand."""
    from mutransfer.cli import build_parser

    os.environ.setdefault("COLUMNS", "100")  # argparse wraps at the terminal's width: fix it
    parser = build_parser()
    parts = ["## `mutransfer`", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, sub in _subcommands(parser).items():
        parts += [f"## `mutransfer {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def on_page_markdown(markdown: str, **kwargs) -> str:
    """mkdocs event: expand the marker wherever a page holds it."""
    return markdown.replace(MARKER, reference()) if MARKER in markdown else markdown
