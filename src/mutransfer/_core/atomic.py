"""Writing files atomically: a reader (a browser, `cat`, another process polling) sees the old file
or the new one, never an empty or half-written one, and a process killed mid-write leaves the
old file in place.

Every file the library writes (summary.json, transferred.json, report.html, the PNGs, run.json,
config copies, coordinate-check results) goes through `write_atomically` or `atomic_path`: the
content goes to a temporary file in the same directory (same file system, so the rename is
atomic), is fsynced, and `os.replace`s the target.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "write_atomically"]

_UMASK = os.umask(0o022)  # read once (setting it is the only way to read it), then put back
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix: matplotlib picks the format from it) to write
    to; on a clean exit it is fsynced and moved onto `path`, on an exception it is removed.

    Args:
        path: the file to (re)write.

    Yields:
        The temporary path to write the content to.
    """
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # the content on disk before the name points at it
            os.fsync(f.fileno())
        with contextlib.suppress(OSError):  # the umask's mode, as open() gives, not mkstemp's 0600
            os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_atomically(path: str | os.PathLike, data: str | bytes, encoding: str = "utf-8") -> Path:
    """Write `data` to `path` so that a concurrent reader sees the old file or the new, never half.

    Args:
        path: the file to (re)write.
        data: text (written in `encoding`) or bytes.
        encoding: the text's encoding.

    Returns:
        `path` as a Path.
    """
    with atomic_path(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding=encoding)
    return Path(path)
