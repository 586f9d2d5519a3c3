"""What the monitor measures at a sampled step: hooks armed for one forward and one optimizer step,
update sizes (RMS and a warm-started power-iteration estimate of the spectral norm), gradient norms,
and activation / attention-logit / output-logit sizes on a slice of the captured micro-batch.

Nothing here runs on steps that are not sampled: `StepProbe` registers its hooks when armed and
removes them as soon as they fired.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._core.naming import canonical_name
from ..coord.measure import MODEL_OUTPUT, ActivationMeter
from ..coord.result import ATTN_SUFFIX

__all__ = ["StepProbe", "activation_sizes", "rms", "spectral_norm"]


def rms(t: torch.Tensor) -> float:
    """Root mean square of the entries of `t` (0 for an empty tensor)."""
    return float(t.detach().float().pow(2).mean().sqrt()) if t.numel() else 0.0


def spectral_norm(
    mat: torch.Tensor, vec: torch.Tensor | None = None, iters: int = 3
) -> tuple[float, torch.Tensor | None]:
    """An estimate of ‖mat‖₂ (as a (rows, -1) matrix) by power iteration, warm-started from `vec`.

    Args:
        mat: a tensor of at least 2 dims (a 1-D one gives its Euclidean norm).
        vec: the right singular vector estimate of an earlier call on the same layer, or None.
        iters: power iterations (each one product with mat and one with matᵀ).

    Returns:
        (the estimate, a lower bound that tightens with `iters`; the vector to warm-start the next call).
    """
    m = mat.detach().float()
    if m.ndim < 2:
        return float(m.norm()), None
    m = m.reshape(m.shape[0], -1)
    if vec is None or vec.shape[0] != m.shape[1] or vec.device != m.device:
        g = torch.Generator(device="cpu").manual_seed(0)
        vec = torch.randn(m.shape[1], generator=g).to(m.device)
    v = vec / vec.norm().clamp_min(1e-30)
    sigma = 0.0
    for _ in range(max(1, iters)):
        u = m @ v
        sigma = float(u.norm())
        if sigma == 0.0:
            return 0.0, vec
        v = m.T @ (u / sigma)
        v = v / v.norm().clamp_min(1e-30)
    return sigma, v


def _slice(x: Any, rows: int) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach()[:rows] if x.ndim else x.detach()
    if isinstance(x, (tuple, list)):
        return type(x)(_slice(v, rows) for v in x)
    if isinstance(x, dict):
        return {k: _slice(v, rows) for k, v in x.items()}
    return x


class StepProbe:
    """Hooks armed for the next forward (its inputs, sliced to `rows` rows) and the next optimizer step
    (gradient norms before it, the update ΔW of each parameter after it); each removes itself once run.

    Under `torch.optim.AdamW` ΔW is the optimizer's update without the decoupled weight decay
    (W_after − W_before·(1 − lr·wd)): the decay is lr·wd·W, set by the weight-decay policy and the weights'
    own scale, not by the lr rules the update sizes are compared with — under u-µP, whose weights have unit
    RMS, it would otherwise outweigh a hidden layer's Adam update at the default weight decay."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, names: dict[int, str], rows: int):
        self.model, self.optimizer, self.names, self.rows = model, optimizer, names, rows
        self.inputs: tuple[tuple, dict] | None = None
        self.grad_norms: dict[str, float] = {}
        self.deltas: dict[str, torch.Tensor] = {}
        self.stepped = False
        self._before: dict[str, torch.Tensor] = {}
        self._fwd: Any = None
        self._opt: list[Any] = []

    def arm(self) -> None:
        """Register the hooks (a no-op when armed already)."""
        if self._fwd is not None or self._opt:
            return
        self.inputs, self.grad_norms, self.deltas, self.stepped = None, {}, {}, False
        self._fwd = self.model.register_forward_pre_hook(self._capture, with_kwargs=True)
        self._opt = [
            self.optimizer.register_step_pre_hook(self._pre_step),
            self.optimizer.register_step_post_hook(self._post_step),
        ]

    def disarm(self) -> None:
        """Remove every hook still registered."""
        if self._fwd is not None:
            self._fwd.remove()
            self._fwd = None
        for h in self._opt:
            h.remove()
        self._opt = []
        self._before = {}

    def _capture(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.inputs is None:
            self.inputs = (_slice(args, self.rows), _slice(kwargs, self.rows))
        if self._fwd is not None:
            self._fwd.remove()
            self._fwd = None

    def _params(self):
        decoupled = isinstance(self.optimizer, torch.optim.AdamW)
        for g in self.optimizer.param_groups:
            decay = float(g["lr"]) * float(g.get("weight_decay", 0.0)) if decoupled else 0.0
            for p in g["params"]:
                name = self.names.get(id(p))
                if name is not None:
                    yield name, p, decay

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.stepped:
            return
        with torch.no_grad():
            for name, p, decay in self._params():
                if p.grad is not None:
                    self.grad_norms[name] = float(p.grad.detach().float().norm())
                before = p.detach().clone()
                self._before[name] = before.mul_(1.0 - decay) if decay else before  # the decayed start

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.stepped:
            return
        with torch.no_grad():
            for name, p, _ in self._params():
                before = self._before.get(name)
                if before is not None:
                    self.deltas[name] = p.detach() - before
        self.stepped = True  # the hooks stay until `disarm` (torch iterates them while this one runs)
        self._before = {}


def activation_sizes(model: nn.Module, inputs: tuple[tuple, dict]) -> tuple[dict[str, dict[str, float]], list[Any]]:
    """Output RMS of every module on one no-grad forward of `inputs` (dropout off, buffers restored),
    attention logits' RMS and max per attention module, the model output's RMS; and the attention calls
    the recorder saw (module, head dim, logit scale).

    Returns:
        (label → {"act_rms": …} or {"attn_logit_rms": …, "attn_logit_max": …}; the `AttentionCall`s).
        Labels are canonical module names; the model output is ``"(model output)"``.
    """
    args, kwargs = inputs
    meter = ActivationMeter(model)
    try:
        batch: Any = kwargs if kwargs and not args else (args if len(args) != 1 else args[0])
        if kwargs and args:
            batch = args  # positional and keyword inputs together: measure the positional call
        captured = meter.measure(batch)
    finally:
        meter.close()
    out: dict[str, dict[str, float]] = {}
    for label, h in captured.items():
        if label.endswith(ATTN_SUFFIX):
            mod = label[: -len(ATTN_SUFFIX)]
            key = MODEL_OUTPUT if mod == MODEL_OUTPUT else canonical_name(mod)
            x = h[torch.isfinite(h)]
            out.setdefault(key, {}).update(
                attn_logit_rms=rms(x), attn_logit_max=float(x.abs().max()) if x.numel() else 0.0
            )
        else:
            key = MODEL_OUTPUT if label == MODEL_OUTPUT else canonical_name(label)
            out.setdefault(key, {})["act_rms"] = rms(h)
    return out, meter.attention_calls
