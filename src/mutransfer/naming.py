"""Parameter and module names as the user wrote them, through wrappers."""
from __future__ import annotations

# Name parts that wrappers (torch.compile, FSDP1, activation checkpointing) insert; DDP/DataParallel
# add a leading "module.".
_WRAPPER_PARTS = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")


def canonical_name(name: str) -> str:
    """Strip wrapper prefixes that appear anywhere along a dotted parameter name."""
    out = ".".join(p for p in name.split(".") if p not in _WRAPPER_PARTS)
    while out.startswith("module."):
        out = out[len("module."):]
    return out
