"""The lr of row ranges whose role differs from their weight's (B/C of an SSM's fused in_proj).

`row_roles` gives such rows their own init; their lr comes from the weight's optimizer group.
Which lr they need follows from the rules (`row_roles.lr_mismatches`):

- entrywise updates (Adam and relatives, Lion): the same as the weight's in TP5 Tables 3 and 8
  (hidden and output weights both step by lr/m_in): nothing to do;
- linear updates (SGD, momentum, Nesterov): the step is a fixed linear combination of past
  gradients, so multiplying those rows' gradient by ρ before the step is exactly a per-row lr
  ρ·lr. `param_groups` writes ρ per row range into the group (`ROW_KEY`), and a step pre-hook
  (registered once, process-wide) scales the rows' ``.grad`` before every step of any optimizer
  holding such a group. Weight decay, which torch adds inside the step, is not scaled: the rows
  decay by lr·wd per step as the base model's do ("lr_wd_constant");
- other kinds (Muon's orthogonalised matrix, Adafactor's relative step): one matrix has one step;
  `param_groups` warns, naming the parameter, the rows and the fixes.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..errors import MuPWarning
from ..rules import optimizer_rule
from .row_roles import lr_mismatches
from .spec import MuSpec

__all__ = ["ROW_KEY", "register_row_hook", "row_scales"]

ROW_KEY = "mup_row_grad_scales"  # in an optimizer group of one parameter: [(dim, start, stop, ρ), ...]
_HOOK = None


def row_scales(spec: MuSpec, name: str, who: str) -> list[tuple[int, int, int, float]]:
    """The (dim, start, stop, ρ) gradient scales parameter `name` needs under optimizer `who` (an SGD-like
    optimizer), or [] — warning, for other kinds of update, where one group cannot give its rows their lr."""
    info = spec.params[name]
    ranges = getattr(info, "row_roles", ())  # absent from specs pickled before it existed
    if not ranges:
        return []
    rule = optimizer_rule(who)
    found, wrong = [], []
    for r in ranges:
        ratio = lr_mismatches(spec.rules_table(), info.role, r.role, info.m_in, info.m_out).get(rule.lr)
        if ratio is None:
            continue
        if rule.kind == "linear":
            found.append((r.dim, r.start, r.stop, ratio))
        else:
            wrong.append(f"{r} (µP lr × {ratio:.4g} of the group's)")
    if wrong:
        warnings.warn(
            f"param_groups: '{name}' has {', '.join(wrong)}, but '{who}' steps the whole matrix with one lr, so "
            f"those rows step at the {info.role} rows' lr. Use an entrywise optimizer (Adam, AdamW, Lion) or SGD "
            f"for it, give the rows their own layer, or set the whole weight's role with roles={{'{name}': ...}} "
            "in parametrize",
            MuPWarning,
            stacklevel=4,
        )
    return found


def _scale_rows(optimizer: Any, args: Any, kwargs: Any) -> None:
    for group in optimizer.param_groups:
        scales = group.get(ROW_KEY)
        if not scales:
            continue
        for p in group["params"]:
            if p.grad is None:
                continue
            with torch.no_grad():
                for dim, start, stop, ratio in scales:
                    p.grad.narrow(dim, start, stop - start).mul_(ratio)
    return None


def register_row_hook() -> None:
    """Scale the rows named by `ROW_KEY` groups before every optimizer step (registered once, process-wide)."""
    global _HOOK
    if _HOOK is None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        _HOOK = register_optimizer_step_pre_hook(_scale_rows)
