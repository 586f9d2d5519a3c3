"""Parameter and module names as the user wrote them, through wrappers."""
from __future__ import annotations

__all__ = ["canonical_name", "listed_differences"]

# Name parts that wrappers (torch.compile, FSDP1, activation checkpointing) insert; DDP/DataParallel
# add a leading "module.".
_WRAPPER_PARTS = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")


def canonical_name(name: str) -> str:
    """Strip wrapper prefixes that appear anywhere along a dotted parameter name."""
    out = ".".join(p for p in name.split(".") if p not in _WRAPPER_PARTS)
    while out.startswith("module."):
        out = out[len("module."):]
    return out


def listed_differences(*groups: tuple[str, list[str]]) -> str:
    """'only in A: a, b; only in B: c …' — each non-empty (label, names) group, at most 5 names."""
    return "; ".join(f"{label}: {', '.join(names[:5])}{' …' if len(names) > 5 else ''}"
                     for label, names in groups if names)
