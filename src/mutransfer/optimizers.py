"""Optimizer classes the library needs and torch does not ship in the form µP needs.

- `Lion` (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): torch has none.
- `Adafactor`: torch.optim.Adafactor with its relative-step cap 1/√t scaled per group, so
  that µP's ratios between groups survive the cap (see the class).
- `MuonWithAdamW`: torch.optim.Muon over the hidden matrices and torch.optim.AdamW over every
  other parameter, driven as one optimizer (one step, one state_dict, schedulers see every group).

They are plain `torch.optim.Optimizer`s: nothing here knows about µP beyond the per-group factor
key that `optim.param_groups` writes (`LR_FACTOR_KEY`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim import Optimizer

from .errors import OptimizerError

__all__ = ["LR_FACTOR_KEY", "Adafactor", "Lion", "MuonWithAdamW"]

LR_FACTOR_KEY = "mup_lr_factor"  # a group's lr relative to the base lr (written by optim.param_groups)


def _closure_loss(closure: Callable[[], Any] | None):
    """The loss of a `step(closure)` call: the closure re-evaluated with grad on (None without one)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class Lion(Optimizer):
    """Lion: ``p ← p·(1 − lr·wd) − lr·sign(β₁·m + (1 − β₁)·g)``, then ``m ← β₂·m + (1 − β₂)·g``.

    Every entry of the step is exactly ±lr (0 where the interpolation is 0), so its lr scales like
    Adam's under µP and it has no ε. Weight decay is decoupled, lr·wd per step, as in the paper.
    Typical lr: 3–10× smaller than AdamW's; typical wd: 3–10× larger.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        maximize: bool = False,
    ):
        if not isinstance(lr, (int, float)) or lr < 0:
            raise OptimizerError(f"Lion: lr must be a non-negative number, got {lr!r}")
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2 and all(0.0 <= b < 1.0 for b in betas)):
            raise OptimizerError(f"Lion: betas must be two numbers in [0, 1), got {betas!r}")
        if weight_decay < 0:
            raise OptimizerError(f"Lion: weight_decay must be >= 0, got {weight_decay!r}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay, maximize=maximize))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        loss = _closure_loss(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad.neg() if group["maximize"] else p.grad for p in params]
            if any(g.is_sparse for g in grads):
                raise RuntimeError("Lion does not support sparse gradients")
            moms = []
            for p in params:
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                moms.append(state["exp_avg"])
            lr, (beta1, beta2), wd = group["lr"], group["betas"], group["weight_decay"]
            if wd != 0:
                torch._foreach_mul_(params, 1.0 - lr * wd)
            direction = torch._foreach_mul(moms, beta1)
            torch._foreach_add_(direction, grads, alpha=1.0 - beta1)
            torch._foreach_sign_(direction)
            torch._foreach_add_(params, direction, alpha=-lr)
            torch._foreach_lerp_(moms, grads, 1.0 - beta2)
        return loss


class Adafactor(torch.optim.Adafactor):
    """torch.optim.Adafactor whose relative-step cap is scaled by each group's µP lr factor.

    torch's step is ``α_t = max(ε₂, RMS(W))·ρ_t`` with ``ρ_t = min(lr, 1/√t)``. The cap 1/√t is one
    number for every group: once 1/√t falls below a group's lr (after 1/lr² steps: 10⁴ at lr 1e-2),
    every such group steps alike and µP's ratios between groups flatten. Here the cap of a group
    whose lr carries µP's factor f (``LR_FACTOR_KEY``) is f/√t, i.e. ``ρ_t = f·min(lr_base, 1/√t)``:
    the base model's schedule scaled by f. Weight decay stays lr·wd per step as torch's.

    Groups without the key (or f = 1) run exactly as torch.optim.Adafactor. A group with f > 1
    (narrower than the base model) cannot exceed torch's 1/√t; it then steps as torch's would.
    """

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        changed = []
        for group in self.param_groups:
            f = group.get(LR_FACTOR_KEY, 1.0)
            if f == 1.0 or not group["params"]:
                continue
            state = self.state.get(group["params"][0], {})
            t = float(state["step"]) + 1.0 if "step" in state else 1.0
            lr = group["lr"]
            capped = min(lr, f / math.sqrt(t))
            if capped < lr:
                changed.append((group, lr, group["weight_decay"]))
                group["weight_decay"] = group["weight_decay"] * lr / capped if capped > 0 else 0.0
                group["lr"] = capped
        try:
            return super().step(closure)
        finally:
            for group, lr, wd in changed:
                group["lr"], group["weight_decay"] = lr, wd


class MuonWithAdamW(Optimizer):
    """torch.optim.Muon over the hidden matrices and torch.optim.AdamW over the rest, as one.

    `param_groups` lists the Muon groups first, then the AdamW groups (the same dicts the two
    optimizers hold, so a scheduler that sets a group's lr sets it where it acts). `step`,
    `zero_grad`, `state_dict` and `load_state_dict` cover both; `muon` and `adamw` are the two
    optimizers themselves. Either may be None when the model has no parameter for it.
    """

    def __init__(self, muon: Optimizer | None, adamw: Optimizer | None):
        parts = [o for o in (muon, adamw) if o is not None]
        if not parts:
            raise OptimizerError("MuonWithAdamW needs at least one of muon and adamw")
        self.muon, self.adamw = muon, adamw
        self._parts = parts
        super().__init__([g for o in parts for g in o.param_groups], {})
        # Optimizer.__init__ appended the very dicts the parts hold; keep it that way.
        self.param_groups = [g for o in parts for g in o.param_groups]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        loss = _closure_loss(closure)
        for o in self._parts:
            o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self._parts:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {
            "muon": None if self.muon is None else self.muon.state_dict(),
            "adamw": None if self.adamw is None else self.adamw.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or set(state_dict) != {"muon", "adamw"}:
            raise OptimizerError(
                "MuonWithAdamW.load_state_dict takes the dict its state_dict() returns (keys 'muon' and 'adamw')"
            )
        for key, o in (("muon", self.muon), ("adamw", self.adamw)):
            if (o is None) != (state_dict[key] is None):
                raise OptimizerError(
                    f"MuonWithAdamW.load_state_dict: the saved state has "
                    f"{'no' if state_dict[key] is None else 'a'} {key} part and this optimizer "
                    f"{'has' if o is not None else 'has none'}"
                )
            if o is not None:
                o.load_state_dict(state_dict[key])
        self.param_groups = [g for o in self._parts for g in o.param_groups]

    @property
    def state(self):  # the parts' states, read-only view for tools that inspect optimizer.state
        merged = {}
        for o in self._parts:
            merged.update(o.state)
        return merged

    @state.setter
    def state(self, value) -> None:  # Optimizer.__init__ assigns an empty state; the parts hold the real one
        pass

    def __repr__(self) -> str:
        return f"MuonWithAdamW(\n  muon={self.muon!r},\n  adamw={self.adamw!r}\n)"
