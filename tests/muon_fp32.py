"""Muon's Newton–Schulz iteration in float32 on CPU, for the tests (imported by tests/conftest.py).

Muon's iteration runs in bfloat16 (torch.optim._muon), which this CPU emulates: a 256×256 matmul
took 96 ms in bfloat16 against 5.8 ms in float32 (one thread, 2-core CPU), so one Muon step at
width 256 cost ~1.4 s per matrix and the Muon tests most of the suite's time. On CPU the tests run
the same quintic iteration in float32; tests/core/test_optimizers.py checks that both give the same
orthogonalised update to bfloat16's precision. MUTRANSFER_TEST_MUON_BF16=1 keeps torch's own.
"""

from __future__ import annotations

import os

import torch


def newton_schulz_fp32(grad: torch.Tensor, coefficients, steps: int, eps: float) -> torch.Tensor:
    """Muon's quintic Newton–Schulz orthogonalisation of `grad`, computed in float32."""
    a, b, c = coefficients
    wide = grad.size(0) > grad.size(1)
    x = (grad.T if wide else grad).float()
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if wide else x).to(grad.dtype)


MUON_BF16 = None
if hasattr(torch.optim, "Muon"):
    import torch.optim._muon as _muon

    MUON_BF16 = _muon._zeropower_via_newtonschulz
    if os.environ.get("MUTRANSFER_TEST_MUON_BF16") != "1":
        _muon._zeropower_via_newtonschulz = lambda g, coef, steps, eps: (
            newton_schulz_fp32(g, coef, steps, eps) if g.device.type == "cpu" else MUON_BF16(g, coef, steps, eps)
        )
