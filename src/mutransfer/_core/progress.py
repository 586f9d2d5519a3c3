"""A dependency-free progress bar on stderr (one line, redrawn; plain lines when not a terminal)."""

from __future__ import annotations

import sys
import time

__all__ = ["Progress"]


class Progress:
    def __init__(self, total: int, label: str, enabled: bool = True, width: int = 24):
        self.total, self.label, self.enabled, self.width = max(total, 1), label, enabled, width
        self.done, self.start, self.note = 0, time.perf_counter(), ""
        self.tty = sys.stderr.isatty()

    def update(self, note: str) -> None:
        self.note = note
        if self.tty:
            self._draw()

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._draw()

    def _draw(self) -> None:
        if not self.enabled:
            return
        filled = int(self.width * self.done / self.total)
        elapsed = time.perf_counter() - self.start
        eta = f", ~{elapsed / self.done * (self.total - self.done):.0f}s left" if self.done else ""
        line = (
            f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
            f"{elapsed:.0f}s{eta}  {self.note}"
        )
        if self.tty:
            sys.stderr.write("\r" + line[:150].ljust(150))
        else:  # not a terminal (a log file): one line per finished item
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()
