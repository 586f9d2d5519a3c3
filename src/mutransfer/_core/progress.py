"""The progress bar of the coordinate check and the sweeps: tqdm's, on stderr.

On a terminal it is tqdm's redrawn bar. In a log file (a Slurm job's output, CI) a redrawn bar
is a run of carriage returns, so there each finished item writes one plain line in tqdm's own
format. tqdm comes with optuna, a dependency already.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

__all__ = ["Progress"]

_FORMAT = "{desc} [{bar:24}] {n_fmt}/{total_fmt} {elapsed}<{remaining}{postfix}"


class Progress:
    """A progress bar on stderr: tqdm's on a terminal, one line per finished item otherwise.

    Args:
        total: the number of items.
        label: the bar's name.
        enabled: draw nothing when False.
    """

    def __init__(self, total: int, label: str, enabled: bool = True):
        self.total, self.label, self.enabled = max(total, 1), label, enabled
        self.tty = sys.stderr.isatty()
        self.note, self._done, self._logged, self._start = "", 0, -1, time.monotonic()
        self._bar = tqdm(
            total=self.total,
            desc=label,
            bar_format=_FORMAT,
            ascii=" #",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=not (enabled and self.tty),
        )

    @property
    def done(self) -> int:
        """Items finished so far (settable: a sweep counts the trials finished by every worker)."""
        return self._done

    @done.setter
    def done(self, n: int) -> None:
        self._done = n
        self._bar.n = n

    def update(self, note: str) -> None:
        """Show `note` (what runs now) beside the bar."""
        self.note = note
        self._bar.set_postfix_str(note, refresh=True)

    def advance(self, n: int = 1) -> None:
        """Count `n` more items done (0: only redraw)."""
        self.done = self._done + n
        self._bar.refresh()
        if self.enabled and not self.tty and self._done != self._logged:  # a log: a line when the count moves
            self._logged = self._done
            line = tqdm.format_meter(
                self._done,
                self.total,
                time.monotonic() - self._start,
                prefix=self.label,
                bar_format=_FORMAT,
                ascii=" #",
                postfix=self.note,
            )
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def write(self, line: str) -> None:
        """Print `line` on stderr, above the bar when one is drawn."""
        if self._bar.disable:
            print(line, file=sys.stderr, flush=True)
        else:
            self._bar.write(line, file=sys.stderr)

    def close(self) -> None:
        """End the bar."""
        self._bar.close()
