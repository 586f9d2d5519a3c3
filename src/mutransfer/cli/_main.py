"""`main` and the parser: the subcommands come from one module per command group."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import UsageError
from . import _common, _coord, _export, _results, _sweep

EXIT_USAGE, EXIT_INTERRUPTED = _common.EXIT_USAGE, _common.EXIT_INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `mutransfer` command.

    Args:
        argv: the arguments after the program name; None: `sys.argv[1:]`.

    Returns:
        The exit code: 0 success or pass, 1 a check failed, 2 bad arguments, 130 Ctrl-C.
    """
    parser = build_parser()
    args = parser.parse_args(argv)  # exits with 2 on unknown flags
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.handler(args)
    except UsageError as e:
        print(f"mutransfer {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM in `sweep` and `worker` (see sweep.interrupts)
        if argv is None:  # the command itself, about to exit: a second Ctrl-C must not add a traceback.
            # Called in-process (main([...]): tests, scripts), SIGINT is left as it was: an ignored
            # SIGINT would be inherited by every process started afterwards.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(_interrupted_line(args, e), file=sys.stderr)
        return 128 + int(getattr(e, "signum", signal.SIGINT))  # 130 Ctrl-C, 143 SIGTERM


def _interrupted_line(args, e: KeyboardInterrupt) -> str:
    """'interrupted: N trials done, rerun to resume' for a sweep (N: finished trials of the whole
    sweep; 'terminated: …' after SIGTERM), plain 'interrupted' for the other commands."""
    word = "terminated" if getattr(e, "signum", signal.SIGINT) == signal.SIGTERM else "interrupted"
    finished = getattr(e, "finished", None)  # a SweepInterrupted from run_sweep counts them
    if finished is None:
        run = {
            "sweep": lambda: Path(args.run) if args.run else Path("runs") / Path(args.config).stem,
            "demo": lambda: Path(args.out) / "run",
            "worker": lambda: Path(args.run),
        }.get(args.command)
        if run is None:
            return word
        finished = 0
        if (run() / "config.toml").is_file():
            try:
                from ..sweep import Sweep

                finished = Sweep(run(), storage=getattr(args, "storage", None)).finished()
            except Exception:  # the count is a courtesy; the line must be printed whatever happens
                pass
    return f"{word}: {finished} trials done, rerun to resume"


def _version() -> str:
    from .. import __version__  # the package's own string: importlib.metadata would cost 0.1 s per call

    return __version__


def build_parser() -> argparse.ArgumentParser:
    """The `mutransfer` parser with every subcommand (imports nothing heavy: `--help` answers at once)."""
    p = argparse.ArgumentParser(prog="mutransfer", description="µP and µTransfer for PyTorch")
    p.add_argument("--version", action="version", version=f"mutransfer {_version()}", help="print the version and exit")
    sub = p.add_subparsers(dest="command")
    for group in (_coord, _sweep, _results, _export):  # the order `mutransfer --help` lists them in
        group.add_parsers(sub)
    return p
