"""What `parametrize` checks before it changes a model: the safety net of issue 29.

`attention_suspects` (modules that may compute attention, found without running the model: a probe
that cannot run must not leave them at an assumed scale), `warn_unused` (multipliers and options that
act on nothing), `not_a_random_scale` (parameters whose values are not a random init and so keep
them), `check_class_forward` (a forward constant must be able to run).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable

import torch
from torch import nn

from ..errors import ModelError, MuPWarning
from ..rules import TunableMultipliers
from .attention import function_source
from .naming import canonical_name
from .roles import ParamInfo

__all__ = ["attention_suspects", "check_class_forward", "not_a_random_scale", "rms", "warn_unused"]


def rms(t: torch.Tensor) -> float:
    """Root mean square of a tensor's values, in float64."""
    return float(t.detach().to(torch.float64).pow(2).mean().sqrt())


_ATTENTION_WORDS = ("scaled_dot_product_attention", "softmax", "attn_scale(", "attn_logits(")


def attention_suspects(model: nn.Module) -> list[str]:
    """Modules that may compute attention, found without running the model: torch's MultiheadAttention,
    a `scaling` attribute, or a forward (of the class or any base class) calling softmax or SDPA."""
    out = []
    for mname, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention) or isinstance(getattr(module, "scaling", None), float):
            out.append(canonical_name(mname) or "<model>")
            continue
        for cls in type(module).__mro__:
            forward = cls.__dict__.get("forward")
            if forward is None or getattr(forward, "__module__", "").startswith("torch."):
                continue
            source = function_source(forward)
            if not source:
                continue
            if any(w in source for w in _ATTENTION_WORDS):
                out.append(canonical_name(mname) or "<model>")
                break
    return out


def warn_unused(
    infos: dict[str, ParamInfo],
    tunable: TunableMultipliers,
    has_attention: bool,
    attn_base_head_dim: int | None,
    residual_branches: Iterable[str] | None,
    deeper: bool,
) -> None:
    """A MuPWarning for every multiplier or option of parametrize that acts on nothing of this model."""
    roles = {i.role for i in infos.values()}
    unused = []
    if tunable.output != 1.0 and "output" not in roles and not any(i.tied_readouts for i in infos.values()):
        unused.append(f"output_mult={tunable.output:g}: no parameter has the output (readout) role")
    if tunable.embedding != 1.0 and not any(i.role == "input" and i.layout is not None for i in infos.values()):
        unused.append(f"embedding_mult={tunable.embedding:g}: no embedding or input layer has the input role")
    if tunable.attention != 1.0 and not has_attention:
        unused.append(f"attn_mult={tunable.attention:g}: no attention module was found (or attention=False)")
    if attn_base_head_dim is not None and not has_attention:
        unused.append(f"attn_base_head_dim={attn_base_head_dim}: no attention module was found (or attention=False)")
    for what, table in (("init_mult", tunable.init), ("lr_mult", tunable.lr)):
        unused += [f"{what}['{r}']={v:g}: no parameter has the role '{r}'" for r, v in table.items() if r not in roles]
    if residual_branches is not None and not deeper:
        unused.append("residual_branches=: the model has as many blocks as the base, so no depth scaling applies")
    for message in unused:
        warnings.warn(
            f"parametrize: {message}, so it does nothing here; drop it, or check the roles with mt.describe(model)",
            MuPWarning,
            stacklevel=3,
        )


def not_a_random_scale(info: ParamInfo, p: torch.Tensor, base_p: torch.Tensor) -> str | None:
    """Why the values of a parameter µP keeps at the base's init scale are not a random init whose scale
    follows width (so rescaling them by rms(base)/rms(model) would change what they mean), else None.

    Observed on the values: constant (ones, zeros, 1e-5 layer scales); the base's values found again in
    the model's (structured: log(1..n) decays, rows repeated); not centred on zero (log-decays, time-step
    biases: a width-scaled init is symmetric around 0); or, for a parameter no layer's fan_in scales
    (not a Linear/Conv bias), an rms that does not differ from the base's beyond sampling noise.
    """
    x, b = p.detach().to(torch.float64).flatten(), base_p.detach().to(torch.float64).flatten()
    if x.numel() < 2 or bool((x == x[0]).all()):
        return "constant"
    if base_p.shape != p.shape and all(s0 <= s for s0, s in zip(base_p.shape, p.shape)):
        corner = p.detach()[tuple(slice(0, s0) for s0 in base_p.shape)]
        if torch.equal(corner.to(base_p.dtype), base_p.detach()):
            return "structured (the base's values are part of the model's)"
    if float(x.mean().abs()) > 3.0 * float(x.std()) / x.numel() ** 0.5 + 1e-12 and float(x.mean().abs()) > 0.5 * float(
        x.std()
    ):
        return "not centred on zero"
    if info.module_fan_in_mult != 1.0:
        return None  # a layer's bias: its init may follow the layer's fan_in, as PyTorch's does
    # log(rms_base/rms_model) against its sampling noise: var(log rms) ≈ var(x²)/(4 n mean(x²)²)
    noise = sum(float(t.pow(2).var()) / (4 * t.numel() * float(t.pow(2).mean()) ** 2) for t in (x, b) if t.numel() > 1)
    ratio = abs(math.log(rms(base_p) / rms(p))) if rms(base_p) > 0 else math.inf
    return "no width dependence beyond noise" if ratio <= 3.0 * noise**0.5 else None


def check_class_forward(model: nn.Module, names: list[str]) -> None:
    """A forward constant is installed by switching the module's class; a forward set on the instance
    (a closure, a bound method of another object) would run instead and the constant would not be in
    effect, while `describe` and the spec said it was. Refused, naming the module."""
    for mname in dict.fromkeys(names):
        if "forward" in model.get_submodule(mname).__dict__:  # "" is the model itself
            raise ModelError(
                f"'{mname or '<model>'}' needs a µP forward constant, but its forward is a function set on the "
                f"instance (module.forward = ...), which would run instead of the constant's; define forward as a "
                f"method of its class (or set it after parametrize on a wrapper module around it)"
            )
