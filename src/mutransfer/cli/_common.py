"""What the commands share: exit codes, parsing --device / --devices, opening a run directory."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def device(text: str, what: str = "--device"):
    """--device as a torch.device (auto: CUDA when present); a usage error naming the option when bad."""
    from .._core.devices import resolve_device

    try:
        return resolve_device(text, what)
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None


def devices(text: str, what: str = "--device"):
    """--device of a sweep: "auto", "cpu" or comma-separated GPU ids (a list of ints, each checked to be
    visible without initialising CUDA); a usage error naming the option otherwise."""
    if text in ("auto", "cpu"):
        return text
    try:
        ids = [int(i) for i in text.replace(" ", "").split(",") if i]
    except ValueError:
        ids = []
    if not ids or any(i < 0 for i in ids):
        raise UsageError(f"{what} must be 'auto', 'cpu' or comma-separated GPU ids such as 0,1; got '{text}'")
    for i in ids:
        device(f"cuda:{i}", what)
    return ids


def existing_file(path: str, what: str) -> Path:
    """`path` as a Path; a usage error naming it when there is no such file."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{what} {p} not found")
    return p


def open_sweep(args):
    from ..sweep import Sweep

    try:
        return Sweep(args.run, storage=args.storage)
    except ValueError as e:
        raise UsageError(str(e)) from None
