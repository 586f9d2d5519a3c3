"""Parameter and module names as the user wrote them, through wrappers."""

from __future__ import annotations

__all__ = ["DDP_ATTR", "WRAPPER_ATTRS", "canonical_name", "listed_differences"]

# Attributes under which wrappers keep the user's model — torch.compile, FSDP1, activation
# checkpointing — and so name parts they insert; DDP/DataParallel keep it under "module" and add a
# leading "module.". The one list of them (`spec` walks through the same attributes).
WRAPPER_ATTRS = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
DDP_ATTR = "module"


def canonical_name(name: str) -> str:
    """Strip wrapper prefixes that appear anywhere along a dotted parameter name."""
    out = ".".join(p for p in name.split(".") if p not in WRAPPER_ATTRS)
    while out.startswith(DDP_ATTR + "."):
        out = out[len(DDP_ATTR) + 1 :]
    return out


def listed_differences(*groups: tuple[str, list[str]]) -> str:
    """'only in A: a, b; only in B: c …' — each non-empty (label, names) group, at most 5 names."""
    return "; ".join(
        f"{label}: {', '.join(names[:5])}{' …' if len(names) > 5 else ''}" for label, names in groups if names
    )
