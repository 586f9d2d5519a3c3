"""The inputs and targets every limit takes: a torch tensor or a numpy array, as float64 (n, d) / (n, k).

The bottom floor of `limits/` for arrays: the kernels (`_kernels`), the traced modules (`_traced`) and the
feature-learning limits all read their inputs through it, so none of them imports another for it.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["ArrayLike", "as_inputs", "as_targets"]

ArrayLike = torch.Tensor | np.ndarray


def as_inputs(x: ArrayLike, name: str) -> torch.Tensor:
    """(n, d) float64 tensor; a 1-D array is one feature per point."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor or numpy array, got {type(x).__name__}")
    x = x.detach().to(torch.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (n, d), got {tuple(x.shape)}")
    return x


def as_targets(y: ArrayLike, n: int, name: str = "y") -> torch.Tensor:
    """(n, k) float64 targets for n inputs; a 1-D array is one output per point."""
    if not isinstance(y, torch.Tensor):
        try:
            y = torch.as_tensor(y)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be a torch tensor or numpy array, got {type(y).__name__}") from err
    y = y.detach().to(torch.float64)
    y = y[:, None] if y.ndim == 1 else y
    if y.ndim != 2 or y.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},) or ({n}, k) to match x's {n} rows, got {tuple(y.shape)}")
    return y
