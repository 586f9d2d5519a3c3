"""What a probe forward records: each parameter's uses, each attention call, and the run itself.

Made by `recorder` (the `TorchFunctionMode`), read by `roles`, `attention`, `parametrize` and
`describe`. Plain data: nothing here runs the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AttentionCall", "Dims", "Observation", "Use"]

Dims = tuple[tuple[int, ...], ...]  # per tensor dim: the parameter dims it came from


@dataclass(frozen=True)
class Use:
    """One observed use of a parameter."""

    module: str  # the module whose forward made the call ("" for the model itself)
    op: str  # "contraction", "lookup" (embedding), "gather" (rows by index), "elementwise"
    fan_in: tuple[int, ...]
    fan_out: tuple[int, ...]
    what: str = ""  # the torch function, for messages


@dataclass(frozen=True)
class AttentionCall:
    """One attention computation seen on the probe forward."""

    module: str  # the innermost module running it
    kind: str  # "sdpa", "eager" (matmul → softmax) or "mha" (nn.MultiheadAttention)
    head_dim: int
    scale: float  # the constant multiplying q·kᵀ (after any normalisation of q and k)
    query: str | None = None  # the module whose output q is a linear function of (None: not a module's output)
    key: str | None = None  # the same for k


@dataclass
class Observation:
    """Everything one probe forward recorded (empty, with `error` set, when the forward could not run)."""

    uses: dict[str, list[Use]] = field(default_factory=dict)  # canonical parameter name → uses
    attention: list[AttentionCall] = field(default_factory=list)
    # module → the constant its (first) input carries from the forward code, where it is not 1
    # (T5 multiplies the decoder output by d_model^-½ before its tied readout)
    input_scales: dict[str, float] = field(default_factory=dict)
    # module → (constant, first consumer): a constant the forward multiplies onto the module's output
    # before another module (or the model's output, consumer "") receives it — Gemma's embedding × √hidden
    carried_constants: dict[str, tuple[float, str]] = field(default_factory=dict)
    # module → constant on its (first) input that does not come from any module's output (made from raw parameters)
    unplaced_constants: dict[str, float] = field(default_factory=dict)
    unreadable_constants: bool = False  # a one-element meta tensor multiplied something: its value is unknown
    inner_constants: set[str] = field(default_factory=set)  # modules whose output left them with a constant on it
    logit_origins: set[str] = field(default_factory=set)  # modules whose output becomes q or k of an attention
    output_uses: dict[str, int] = field(default_factory=dict)  # module → ops (and module calls) its output went into
    # modules whose (first) input is an attention's probabilities (dropout on them, for example)
    prob_modules: set[str] = field(default_factory=set)
    called: set[str] = field(default_factory=set)  # modules whose forward ran
    # weight → (its row dim, row offsets where the forward cut its product's output): a fused projection
    # whose output is split into pieces (z, x, B, C, dt of an SSM's in_proj; q, k, v of a fused qkv)
    row_cuts: dict[str, tuple[int, set[int]]] = field(default_factory=dict)
    # weight → (its fan_in dim, offsets where its input was concatenated from pieces): the reverse fusion
    col_cuts: dict[str, tuple[int, set[int]]] = field(default_factory=dict)
    error: str | None = None  # why the forward could not run (then nothing was observed)
    inputs: Any = None  # the inputs it ran on

    @property
    def ran(self) -> bool:
        """Whether the probe forward ran (then the record is complete)."""
        return self.error is None

    def attention_by_module(self) -> dict[str, list[AttentionCall]]:
        """The attention calls grouped by the module that ran them, in call order."""
        out: dict[str, list[AttentionCall]] = {}
        for call in self.attention:
            out.setdefault(call.module, []).append(call)
        return out
