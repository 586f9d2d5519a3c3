"""`check`: is a µP model's init µP's? Every parameter's RMS against the one µP gives it.

After `parametrize` (or `init_weights`) each parameter's values have µP's RMS: its law's (read off
the base, × µP's factor), or, without a law, the RMS parametrize left. Code that re-initialises the
model afterwards — its own ``reset_parameters``, torchtitan's ``init_weights``, Hugging Face's
``_init_weights`` (``post_init``, ``from_pretrained`` without weights) — draws the standard
parametrization's init at the target width; a meta-built model after ``to_empty`` holds whatever
the memory held. Both are caught here: a parameter whose RMS is off µP's by more than sampling
error (10 % at least) is named with both numbers. `mt.Monitor` runs the same check when it starts
and raises the alarms at its first sample.

Call it before training: training moves the values (by design) and the check would then flag them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from .init_weights import check_head_splits
from .naming import canonical_name
from .sharding import global_rms
from .spec import MuSpec, require_spec, spec_holder

__all__ = ["CheckFinding", "CheckReport", "check", "init_findings"]

_FLOOR = 0.1  # |log(measured / expected)| always allowed: a 10 % difference in RMS is not a different init


class CheckFinding(NamedTuple):
    """One parameter whose values are not µP's.

    Attributes:
        parameter: the parameter's name in the model.
        what: the quantity ("init rms").
        measured: its value on the model now.
        expected: µP's.
        cause: the likely cause and the fix, in words.
    """

    parameter: str
    what: str
    measured: float
    expected: float
    cause: str

    def __str__(self) -> str:
        return f"{self.parameter}: {self.what} = {self.measured:.4g}, µP's is {self.expected:.4g} — {self.cause}"


@dataclass
class CheckReport:
    """What `check` found: `passed` when no parameter is off µP's init.

    Attributes:
        findings: one `CheckFinding` per parameter off µP's init.
        checked: how many parameters were compared.
        unchecked: parameters with no known µP RMS (parametrized on meta from shapes only), by name.
    """

    findings: list[CheckFinding] = field(default_factory=list)
    checked: int = 0
    unchecked: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when every checked parameter has µP's RMS."""
        return not self.findings

    def __str__(self) -> str:
        head = (
            f"init check: {'passed' if self.passed else 'FAILED'} — {self.checked} parameters compared with µP's RMS"
            + (f", {len(self.unchecked)} with no known µP RMS" if self.unchecked else "")
        )
        lines = [head] + [
            f"  {f.parameter}: {f.what} {f.measured:.4g}, µP's {f.expected:.4g}"
            + (f" (×{f.measured / f.expected:.3g})" if f.expected and math.isfinite(f.measured) else "")
            for f in self.findings
        ]
        causes = list(dict.fromkeys(f.cause for f in self.findings))
        return "\n".join(lines + [f"  cause: {c}" for c in causes])


CAUSE = (
    "not µP's init: the values were drawn again after mt.parametrize (the model's own reset_parameters / "
    "init_weights / Hugging Face _init_weights give the standard parametrization's init), or never drawn (a "
    "meta-built model after to_empty); call mt.init_weights(model) after materialising, instead of the model's own "
    "init"
)


def _tolerance(spec: MuSpec, name: str, numel: int) -> float:
    """Allowed |log(rms / µP's rms)|: 5 standard errors of a sample RMS of `numel` draws, 10 % at least."""
    law = getattr(spec, "init_laws", {}).get(name)
    kurtosis = law.kurtosis if law is not None else 3.0
    se = math.sqrt(max(kurtosis - 1.0, 0.0) / (4.0 * max(numel, 1)))
    return max(_FLOOR, 5.0 * se)


def init_findings(spec: MuSpec, root: nn.Module) -> tuple[list[CheckFinding], int, list[str]]:
    """(findings, parameters compared, parameters with no known µP RMS) of `root`'s values now."""
    expected_by_name = getattr(spec, "init_rms", {})
    findings: list[CheckFinding] = []
    unchecked: list[str] = []
    checked = 0
    seen: set[str] = set()
    for n, p in root.named_parameters():
        name = canonical_name(n)
        if name in seen or name not in spec.params:
            continue
        seen.add(name)
        expected = expected_by_name.get(name)
        if expected is None or p.is_meta:
            unchecked.append(name)
            continue
        checked += 1
        measured = global_rms(p)
        if not math.isfinite(measured):
            findings.append(CheckFinding(name, "init rms", measured, expected, "values not finite: " + CAUSE))
            continue
        if expected == 0.0 or measured == 0.0:
            if expected != measured:
                findings.append(CheckFinding(name, "init rms", measured, expected, CAUSE))
            continue
        if abs(math.log(measured / expected)) > _tolerance(spec, name, p.numel()):
            findings.append(CheckFinding(name, "init rms", measured, expected, CAUSE))
    return findings, checked, unchecked


def check(model: nn.Module) -> CheckReport:
    """Check that a parametrized model holds µP's init: every parameter's RMS against µP's.

    Call it before training (training moves the values). On a sharded model (DTensor parameters)
    every rank must call it: the RMS of a sharded tensor is reduced across ranks. It also refuses a
    tensor-parallel sharding that cuts attention heads.

    Args:
        model: a model put in µP by `mt.parametrize` (then perhaps `mt.init_weights`), possibly wrapped.

    Returns:
        A `CheckReport`: `passed`, and one `CheckFinding` per parameter off µP's RMS (name, RMS found, µP's).

    Raises:
        ModelError: the model was never parametrized, or tensor parallel splits an attention head.
    """
    spec = require_spec(model, "check")
    root = spec_holder(model) or model
    check_head_splits(spec, root)
    with torch.no_grad():
        findings, checked, unchecked = init_findings(spec, root)
    return CheckReport(findings, checked, unchecked)
