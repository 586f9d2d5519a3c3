"""Giving the C heap's free pages back to the operating system between the limit's steps.

A step of the limit allocates and frees thousands of (groups, particles, batch) tensors (the Ż
partials' reverse passes, the Gram–Schmidt temporaries, the backward pass) between the state it
keeps (the families' bases, the autograd graph of every earlier step). glibc's malloc serves
tensors below its mmap threshold from its heap, and the threshold rises to the largest block freed
(up to 32 MB): after the first steps nearly every tensor comes from the heap, and the pages of the
ones freed stay with the process, fragmented between long-lived blocks. Measured (issue 45, 20
full-batch steps on 16 inputs, 2¹⁴ particles): 1.05 GB of live allocations at the peak, 3.78 GB
resident. `release()` after each step returns those pages (glibc's `malloc_trim(0)`; the
benchmark's peak 3.62–3.71 → 1.42 GB, the same time); where the C library has no `malloc_trim`
(macOS, musl) it does nothing. A fixed low mmap threshold returns them too, but at a page fault
per page of every tensor: 3.2× slower (33.3 s against 10.3 s for 10 of those steps at 8192
particles). See docs/limits/feature_learning.md (Cost).
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable

__all__ = ["release"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError):  # no glibc (musl), or no symbol table to search
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release() -> None:
    """Return the C heap's free pages to the operating system (`malloc_trim(0)` where glibc has it)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
