"""Measuring activations for the coordinate check: forward hooks on every module and attention logits.

`ActivationMeter` hooks every module of a model (its output) and records attention logits (through
the recorder's attention callback, and recomputed for ``nn.MultiheadAttention``) on demand: one
`measure(inputs)` is one forward pass without grad, buffers restored. `mean_abs` is the size of a
coordinate that the check compares across widths.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._core import attention as attn
from .._core.naming import canonical_name
from .._core.recorder import recording
from .._core.spec import find_spec
from .result import ATTN_SUFFIX

__all__ = ["MODEL_OUTPUT", "ActivationMeter", "first_float", "mean_abs", "model_args", "model_kwargs"]

MODEL_OUTPUT = "(model output)"


def model_args(inputs: Any) -> tuple[Any, ...]:
    """The positional arguments a batch's inputs stand for (a tuple/list as they are, a dict none, else one)."""
    if isinstance(inputs, dict):
        return ()
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def model_kwargs(inputs: Any) -> dict[str, Any]:
    """The keyword arguments a batch's inputs stand for (a dict as it is, else none)."""
    return dict(inputs) if isinstance(inputs, dict) else {}


def mean_abs(t: torch.Tensor) -> float:
    """The mean absolute coordinate of `t` (as a float; what the check compares across widths)."""
    return float(t.abs().mean()) if t.numel() else 0.0


def first_float(output: Any) -> torch.Tensor | None:
    """The tensor of a module's output that the check follows: its logits when it has them (a
    ``.logits`` attribute or ``["logits"]``), else its last hidden state, else the first floating
    tensor with at least one dim (a scalar, such as the loss in a ``(loss, logits)`` tuple, is
    no coordinate), else a floating scalar."""
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits if logits.is_floating_point() else None
    if isinstance(output, dict) or hasattr(output, "keys"):
        for key in ("logits", "last_hidden_state"):
            v = output.get(key) if hasattr(output, "get") else None
            if isinstance(v, torch.Tensor):
                return v if v.is_floating_point() else None
        values = list(output.values())
    elif isinstance(output, (tuple, list)):
        values = list(output)
    else:
        return None
    floats = [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return next((v for v in floats if v.ndim), floats[0] if floats else None)


def _is_dropout(module: nn.Module) -> bool:
    return isinstance(
        module, (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
    )


def _compensated_outputs(model: nn.Module) -> dict[str, float]:
    """Module → the output multiplier parametrize installed on it to undo a width-dependent constant that
    follows it in the forward (the embedding's × √hidden in the parent's code, an attention's inline 1/√d
    moved onto the query projection). Such an output scales with width on purpose: the check measures it
    without the multiplier (the coordinate µP's rules speak of), and the tensor the constant lands on (the
    next module's output, the attention logits) as it is."""
    spec = find_spec(model)
    wanted = getattr(spec, "compensated", None) or {}
    return {
        name or MODEL_OUTPUT: wanted[canonical_name(name)]
        for name, _ in model.named_modules()
        if canonical_name(name) in wanted
    }


class ActivationMeter:
    """Forward hooks on every module and attention logits recorded (see `observe`), run on demand.

    Measurements run with dropout modules switched off (a random mask would be measured as a change)
    and skip a module whose output is its input (dropout off, ``nn.Identity``): its row would repeat
    the row of the module before it.
    """

    def __init__(self, model: nn.Module, readouts: dict[str, str] | None = None):
        self.model = model
        self.active = False
        self.captured: dict[str, torch.Tensor] = {}
        self.out_dims: dict[str, int] = {}
        self.head_dims: dict[str, int] = {}
        self.readouts = readouts or {}  # label → name of the readout's bias (left out of its output)
        self.prob_modules: set[str] = set()  # modules fed attention probabilities
        self.attention_calls: list = []  # the recorder's `AttentionCall`s of the last `measure`
        self.handles = []
        self.recorder: Any = None  # the recorder of the running `measure` (paused while its hooks copy outputs)
        self.dropouts = [m for m in model.modules() if _is_dropout(m)]
        params = dict(model.named_parameters())
        self.biases = {label: params.get(bias) for label, bias in self.readouts.items()}
        self.compensated = _compensated_outputs(model)
        for name, module in model.named_modules():
            label = name or MODEL_OUTPUT
            self.handles.append(module.register_forward_hook(self._leave(label), always_call=True))
            if isinstance(module, nn.MultiheadAttention):
                self.handles.append(module.register_forward_hook(self._mha(label), with_kwargs=True))

    def _paused(self, hook):
        """`hook` run with the recorder paused: the copies it takes are not the model's forward."""

        def paused(*args):
            recorder = self.recorder
            if recorder is None:
                return hook(*args)
            recorder.paused = True
            try:
                return hook(*args)
            finally:
                recorder.paused = False

        return paused

    def _leave(self, label: str):
        @self._paused
        def hook(mod, args, output):
            if not self.active:
                return
            h = first_float(output)
            if h is not None and any(h is a for a in args):
                return  # a pass-through (dropout off, Identity): the module before it has this row
            if h is not None and label not in self.captured:
                bias = self.biases.get(label)
                if isinstance(bias, torch.Tensor) and bias.ndim == 1 and h.shape[-1:] == bias.shape:
                    h = h - bias  # a readout's bias does not scale with width: measure W·x alone
                c = self.compensated.get(label)
                if c is not None:
                    h = h / c  # see _compensated_outputs
                self.captured[label] = h.detach().float().clone()
                if h.ndim:
                    self.out_dims[label] = int(h.shape[-1])

        return hook

    def _record_logits(self, label: str, q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> None:
        key = label + ATTN_SUFFIX
        if key in self.captured:
            return
        q, k = q.detach().float(), k.detach().float()
        if q.dim() >= 3 and k.dim() >= 3 and q.shape[-3] != k.shape[-3] and q.shape[-3] % k.shape[-3] == 0:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)  # grouped-query attention
        logits = (q @ k.transpose(-2, -1)) * scale
        if causal:
            n, s = logits.shape[-2], logits.shape[-1]
            keep = torch.ones(n, s, dtype=torch.bool, device=logits.device).tril(s - n)
            logits = logits[..., keep]
        self.captured[key] = logits
        self.head_dims[key] = int(q.shape[-1])

    def _on_attention(self, call, q, k, logits, causal, scale: float | None = None) -> None:
        label = (call.module or MODEL_OUTPUT) + ATTN_SUFFIX
        if label in self.captured:
            return
        if q is not None and k is not None:
            # `scale`: what q·kᵀ still needs (SDPA's own); q and k already hold any constant multiplied onto them
            applied = call.scale if scale is None else scale
            self._record_logits(call.module or MODEL_OUTPUT, q, k, applied, causal)
        elif logits is not None:
            x = logits.detach().float()
            x = x[torch.isfinite(x) & (x.abs() < 1e30)]  # masked entries (−inf or dtype min) are not logits
            self.captured[label] = x
            self.head_dims[label] = call.head_dim

    def _mha(self, label: str):
        @self._paused
        def hook(mod: nn.MultiheadAttention, args, kwargs, output):
            if not self.active or label + ATTN_SUFFIX in self.captured:
                return
            names = ("query", "key", "value")
            query, key = [args[i] if i < len(args) else kwargs[names[i]] for i in range(2)]
            (w_q, b_q), (w_k, b_k), _ = attn.mha_in_projections(mod)
            q, k = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k)
            if q.dim() == 2:
                q, k = q.unsqueeze(0), k.unsqueeze(0)
            elif not mod.batch_first:
                q, k = q.transpose(0, 1), k.transpose(0, 1)
            h, hd = mod.num_heads, mod.head_dim
            q = q.reshape(q.shape[0], q.shape[1], h, hd).transpose(1, 2)
            k = k.reshape(k.shape[0], k.shape[1], h, hd).transpose(1, 2)
            cfg = getattr(mod, "_mutransfer_attn", None)
            scale = attn.mup_logit_scale(cfg, hd)
            self._record_logits(label, q, k, scale, bool(kwargs.get("is_causal", False)))

        return hook

    def measure(self, inputs: Any) -> dict[str, torch.Tensor]:
        """One forward pass on `inputs` without grad, dropout off; buffers (BatchNorm statistics) restored."""
        buffers = {n: b.detach().clone() for n, b in self.model.named_buffers()}
        modes = [m.training for m in self.dropouts]
        for m in self.dropouts:
            m.train(False)
        self.captured, self.active = {}, True
        try:
            # the meter reads only the attention calls (and the modules fed their probabilities)
            with (
                torch.no_grad(),
                recording(self.model, on_attention=self._on_attention, attention_only=True) as recorder,
            ):
                self.recorder = recorder
                self.model(*model_args(inputs), **model_kwargs(inputs))
            self.prob_modules |= {m or MODEL_OUTPUT for m in recorder.obs.prob_modules}
            self.attention_calls = list(recorder.obs.attention)
        finally:
            self.active, self.recorder = False, None
            for m, mode in zip(self.dropouts, modes, strict=True):
                m.train(mode)
            with torch.no_grad():
                for n, b in self.model.named_buffers():
                    if n in buffers:
                        b.copy_(buffers[n])
        return self.captured

    def close(self) -> None:
        """Remove the hooks."""
        for h in self.handles:
            h.remove()
