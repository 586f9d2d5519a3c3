"""The one global change mutransfer makes: ``F.scaled_dot_product_attention`` wrapped once.

A module whose forward calls SDPA and keeps its logit scale nowhere it can be set from outside
gets its correction (µP's scale over the module's own) through this wrapper: the module's
µP subclass (see `scaled_forward`) pushes the correction while its forward runs, and the wrapper
multiplies the ``scale`` of every SDPA call made meanwhile. Outside such a forward the wrapper
calls PyTorch unchanged.
"""

from __future__ import annotations

import contextlib
import math

import torch.nn.functional as F

__all__ = ["correcting", "install_wrapper", "mup_sdpa", "torch_sdpa"]

_ACTIVE: list[float] = []  # corrections of the µP attention modules being run, innermost last
torch_sdpa = F.scaled_dot_product_attention


def mup_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
    if _ACTIVE:
        user = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
        scale = user * _ACTIVE[-1]
    return torch_sdpa(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kwargs
    )


def install_wrapper() -> None:
    if F.scaled_dot_product_attention is not mup_sdpa:
        F.scaled_dot_product_attention = mup_sdpa


@contextlib.contextmanager
def correcting(correction: float):
    """SDPA calls inside this block have their logit scale multiplied by `correction`."""
    _ACTIVE.append(correction)
    try:
        yield
    finally:
        _ACTIVE.pop()
