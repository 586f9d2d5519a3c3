"""Offline data for the recipes: Gaussian inputs, random images, and bytes of real text.

The text comes from the docstrings of Python's own standard library, so it exists on every
machine that runs Python and needs no download.
"""

from __future__ import annotations

import importlib
import inspect
from functools import lru_cache

import torch

__all__ = ["gaussian_batches", "image_batches", "stdlib_text", "text_batches"]

_DOC_MODULES = (
    "collections",
    "itertools",
    "functools",
    "json",
    "re",
    "string",
    "textwrap",
    "argparse",
    "pathlib",
    "statistics",
    "fractions",
    "decimal",
    "heapq",
    "bisect",
    "difflib",
    "calendar",
    "csv",
    "logging",
    "inspect",
    "dataclasses",
    "unittest",
    "subprocess",
    "shutil",
)


@lru_cache(maxsize=1)
def stdlib_text() -> bytes:
    """Docstrings of a fixed list of standard-library modules and their public members, as UTF-8.

    Submodules are left out: a package gains one as an attribute only once something imports it
    (``logging.handlers``, ``json.tool``), so with them the text — and every recipe:gpt loss —
    depended on what the process had imported before (a sweep worker, with Optuna loaded, trained on
    other text than a fresh interpreter)."""
    parts = []
    for name in _DOC_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        parts.append(module.__doc__ or "")
        for attr in sorted(dir(module)):
            if attr.startswith("_"):
                continue
            member = getattr(module, attr, None)
            if inspect.ismodule(member):
                continue
            doc = getattr(member, "__doc__", None)
            if isinstance(doc, str) and len(doc) > 80:
                parts.append(doc)
    return "\n\n".join(p.strip() for p in parts if p).encode("utf-8")


def text_batches(n_batches: int, batch: int, seq: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Next-byte prediction batches (inputs, targets), each (batch, seq) of byte ids, from `stdlib_text`."""
    data = torch.frombuffer(bytearray(stdlib_text()), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[s : s + seq] for s in starts])
        y = torch.stack([data[s + 1 : s + seq + 1] for s in starts])
        out.append((x, y))
    return out


def gaussian_batches(n_batches: int, batch: int, d_in: int, n_classes: int, seed: int = 0):
    """Gaussian inputs with random class labels."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, d_in, generator=g), torch.randint(0, n_classes, (batch,), generator=g))
        for _ in range(n_batches)
    ]


def image_batches(n_batches: int, batch: int, channels: int, size: int, n_classes: int, seed: int = 0):
    """Random images (batch, channels, size, size) with random class labels."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, channels, size, size, generator=g), torch.randint(0, n_classes, (batch,), generator=g))
        for _ in range(n_batches)
    ]
