"""Ctrl-C and SIGTERM, handled in one place.

SIGTERM is what `timeout`, `kill`, systemd and batch schedulers send. In a sweep or worker process
it is turned into `Terminated`, a `KeyboardInterrupt`, so that it takes exactly Ctrl-C's path:
the running trial is marked `interrupted` and queued again (`trials.run_trial`), `run_sweep` stops
its local workers and waits for them (`processes.stop_workers`), and the command prints one line
and exits with 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM). A rerun resumes.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from ...errors import Terminated

__all__ = ["exit_code", "interrupts_ignored", "raise_terminated", "terminate_as_interrupt"]


def raise_terminated(signum: int, _frame) -> None:
    """A SIGTERM handler (``signal.signal(signal.SIGTERM, raise_terminated)``): raise `Terminated`.

    Args:
        signum: the signal's number.
        _frame: the interrupted frame (unused).

    Raises:
        Terminated: always.
    """
    raise Terminated(signum)


def exit_code(e: BaseException) -> int:
    """The exit code for an interruption: 128 + its signal's number (130 Ctrl-C, 143 SIGTERM).

    Args:
        e: a KeyboardInterrupt (`Terminated`, `SweepInterrupted` or Ctrl-C's own).

    Returns:
        The code a shell reports for a process ended by that signal.
    """
    return 128 + int(getattr(e, "signum", signal.SIGINT))


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within: SIGTERM raises `Terminated` (a KeyboardInterrupt) in the main thread, as Ctrl-C
    raises KeyboardInterrupt. Outside the main thread (where handlers cannot be set) nothing changes.

    Yields:
        Nothing; SIGTERM's previous handler is back on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def interrupts_ignored() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM (in the main thread) for the duration: the bookkeeping after an
    interruption (marking trials, stopping workers) must not be cut short by a second signal.

    Yields:
        Nothing; the previous handlers are back on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
