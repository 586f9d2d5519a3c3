"""The `mutransfer` command. Exit codes: 0 success/pass, 1 check failed, 2 bad arguments,
130 interrupted (Ctrl-C).

A leaf: nothing in the package imports it. One module per command group (`_coord`: coord-check;
`_sweep`: sweep, worker, status, cancel; `_results`: report, transfer, demo; `_export`: export),
`_main` the parser and `main`; importing it loads no torch, numpy, optuna or matplotlib.
"""

from ._main import build_parser, main

__all__ = ["build_parser", "main"]
