"""The µP constants of the limit, observed on the parametrized model, never assumed.

`mt.parametrize(model, base=base)` and `mt.param_groups(model, lr, "sgd")` give every parameter
its init and learning rate at the model's width n; a copy of the base parametrized the same way
gives them at the base width n₀. The limit needs each one in its width-free, scaled form:

| role | scaled init (entries) | SGD lr in the limit, per unit of `lr` |
|---|---|---|
| input weight (finite → width), width-sized biases, norm gains | rms², the law of one entry | κ = lr_p / n |
| hidden weight (width → width) | σ² = n·rms² | κ = lr_p |
| readout weight (width → finite), a = n·W | n²·rms², the law of one entry of a | κ = lr_p·n |
| readout bias (finite) | its value | κ = lr_p |

(the gradient of a width-sized parameter is Θ(1/n), of a hidden matrix ĝ xᵀ/n, of the readout
χ x; see `program`). Each scaled constant must be the same at n₀ and n — that is what µP means
here — else a ValueError names the parameter. The law of a per-particle init (input rows, biases,
gains, the readout's a₀) matters exactly, so it is read off the values too: constant, Gaussian or
uniform (by the likelihood ratio of the two on the entries of both widths), else an error.

This module imports the package's public face (`mt.parametrize`, `mt.param_groups`) at call
time: the limit is defined as the limit of what those functions produce.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "AttentionLaw",
    "ParamLaw",
    "adam_factors",
    "first_width",
    "mup_adam",
    "mup_sgd",
    "observe",
    "same_width",
    "sgd_factors",
    "widened",
    "widths",
]

ROLES = ("input", "vector", "hidden", "output", "output_bias")
_EXPONENT = {"input": -1, "vector": -1, "hidden": 0, "output": 1, "output_bias": 0}  # κ = lr·n^e
# Adam (TP4b): invariant to scaling a gradient and ε together, so each parameter's step is Adam's on its
# Θ(1) scaled gradient (n·∂L/∂p for a width-sized one, γ = Σ ĝ xᵀ for a hidden matrix) with ε̃ = ε·n^f;
# the step of u, of a gain, of an entry of n·W_readout is lr·n^e·ψ, of a hidden matrix's entry lr·n^e·ψ/n
_ADAM_EXPONENT = {"input": 0, "vector": 0, "hidden": 1, "output": 1, "output_bias": 0}  # κ̃ = lr·n^e
_ADAM_EPS_EXPONENT = {"input": 1, "vector": 1, "hidden": 1, "output": 0, "output_bias": 0}  # ε̃ = ε·n^f
_INIT_EXPONENT = {"input": 0, "vector": 0, "hidden": 1, "output": 2, "output_bias": 0}  # rms²·n^e


@dataclass
class ParamLaw:
    """One parameter in the limit: its role, lr factor κ (per unit of the base lr), and init law."""

    role: str
    kappa: float
    var: float  # scaled variance (σ² for a hidden matrix)
    family: str  # "normal", "uniform", "constant" or "value" (a finite parameter: `value`)
    mean: float = 0.0
    value: torch.Tensor | None = None
    adam_kappa: float = 0.0  # Adam: κ̃ per unit of the base lr (see _ADAM_EXPONENT)
    adam_eps: float = 0.0  # Adam: ε̃ per unit of the base ε
    adam_error: str = ""  # why Adam's constants are not width-independent, if they are not

    def sample(self, shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
        """Independent draws of one scaled entry, of `shape`."""
        if self.family == "constant":
            return torch.full(shape, self.mean, dtype=dtype)
        if self.family == "uniform":
            r = math.sqrt(3.0 * self.var)
            return (torch.rand(shape, generator=generator, dtype=dtype) * 2 - 1) * r
        return torch.randn(shape, generator=generator, dtype=dtype) * math.sqrt(self.var)


def same_width(model: nn.Module, base: nn.Module) -> bool:
    """Whether `base` is `model` or has its parameters at the same shapes (a base at the model's own
    width: `FeatureLimit` then takes the model as its own base)."""
    if base is model:
        return True
    bp = {name: tuple(p.shape) for name, p in base.named_parameters()}
    mp = {name: tuple(p.shape) for name, p in model.named_parameters()}
    return bool(mp) and mp == bp


def widths(model: nn.Module, base: nn.Module) -> tuple[int, int]:
    """(n, n₀): the width of `model` and of `base`: the smallest dim that differs between them; every
    other such dim must differ in the same ratio (r·n and r·n₀: fused qkv's 3n, an MLP's 4n)."""
    bp = dict(base.named_parameters())
    pairs: set[tuple[int, int]] = set()
    for name, p in model.named_parameters():
        if name not in bp:
            raise ValueError(f"parameter {name!r} of model is not in base; base must be the same architecture")
        if p.dim() != bp[name].dim():
            raise ValueError(f"parameter {name!r} has {p.dim()} dims in model and {bp[name].dim()} in base")
        pairs |= {(a, b) for a, b in zip(p.shape, bp[name].shape, strict=True) if a != b}
    found = ", ".join(f"{a} (base {b})" for a, b in sorted(pairs)) or "none"
    if not pairs:
        raise ValueError(
            "FeatureLimit needs a width that differs between model and base; found none. Build base at a smaller "
            "width of the same architecture"
        )
    n, n0 = min(pairs)
    if any(a * n0 != b * n for a, b in pairs):
        raise ValueError(
            f"FeatureLimit needs every dim that differs between model and base to grow in one ratio (a width n and "
            f"multiples r·n); found {found}. Build base at a smaller width of the same architecture"
        )
    if n <= n0:
        raise ValueError(f"model's width {n} must be larger than base's {n0} (the limit is read from the two)")
    return n, n0


def mup_sgd(
    model: nn.Module, base: nn.Module, lr: float, delta: nn.Module | None = None, example: Any = None
) -> list[dict[str, Any]]:
    """`mt.parametrize(model, base=base, delta=delta)` (in place) and its SGD groups
    `mt.param_groups(model, lr, "sgd")`: the µP network the limit is the limit of, and its learning
    rates, as the package's public face makes them (the one place `limits/` calls it). `example`: an
    input for parametrize's probe forwards (a sequence model's (N, T, d))."""
    import mutransfer as mt  # the public face: the limit is the limit of what it produces

    _parametrize(model, base, delta, example)
    groups = mt.param_groups(model, lr, "sgd")
    assert isinstance(groups, list)  # SGD's groups are plain dicts
    return groups


def _parametrize(model: nn.Module, base: nn.Module, delta: nn.Module | None, example: Any) -> None:
    """`mt.parametrize(model, base=base, delta=delta)`, with `example` as its probe input when given."""
    import mutransfer as mt  # the public face, as in `mup_sgd`

    if example is None:
        mt.parametrize(model, base=base, delta=delta)
    else:
        mt.parametrize(model, base=base, delta=delta, example_inputs=(example,))


def adam_factors(model: nn.Module) -> dict[int, tuple[float, float]]:
    """Each parameter's Adam (lr, ε) factors, ``id(parameter) → (lr, ε)``, from
    ``mt.param_groups(model, lr=1, "adam", eps=1)`` on a model the library already parametrized."""
    import mutransfer as mt  # the public face, as in `mup_sgd`

    groups = mt.param_groups(model, 1.0, "adam", eps=1.0)
    assert isinstance(groups, list)  # Adam's groups are plain dicts
    return {id(p): (float(g["lr"]), float(g["eps"])) for g in groups for p in g["params"]}


def mup_adam(model: nn.Module, base: nn.Module, lr: float, eps: float, example: Any = None) -> list[dict[str, Any]]:
    """`mt.parametrize(model, base=base)` (in place) and its Adam groups `mt.param_groups(model, lr,
    "adam", eps=eps)`: the finite µP network of the limit's `fit(optimizer="adam")`."""
    import mutransfer as mt  # the public face, as in `mup_sgd`

    _parametrize(model, base, None, example)  # no SGD groups built only to be dropped
    groups = mt.param_groups(model, lr, "adam", eps=eps)
    assert isinstance(groups, list)
    return groups


def sgd_factors(model: nn.Module) -> dict[int, float]:
    """Each parameter's SGD factor, ``id(parameter) → lr``, from ``mt.param_groups(model, lr=1, "sgd")`` on a
    model the library already parametrized (the finite nets the limits compare with read it here)."""
    import mutransfer as mt  # the public face, as in `mup_sgd`

    groups = mt.param_groups(model, 1.0, "sgd")
    assert isinstance(groups, list)  # SGD's groups are plain dicts
    return {id(p): float(g["lr"]) for g in groups for p in g["params"]}


def _parametrized(
    model: nn.Module, base: nn.Module, example: Any
) -> tuple[nn.Module, nn.Module, dict, dict, dict, dict]:
    big, small = copy.deepcopy(model), copy.deepcopy(base)
    lrs, adams = [], []
    for m, delta in ((big, None), (small, model)):
        by_id = {}
        x = None if example is None else example.to(next(m.parameters()).dtype)
        for g in mup_sgd(m, base, 1.0, delta, x):
            for p in g["params"]:
                by_id[id(p)] = float(g["lr"])
        lrs.append({name: by_id[id(p)] for name, p in m.named_parameters()})
        adam = adam_factors(m)
        adams.append({name: adam[id(p)] for name, p in m.named_parameters()})
    return big, small, lrs[0], lrs[1], adams[0], adams[1]


def _family(name: str, x: torch.Tensor) -> tuple[str, float, float]:
    """(family, mean, variance) of the entries of x (already scaled)."""
    x = x.detach().double().flatten()
    if x.numel() == 0 or float(x.max() - x.min()) <= 1e-12 * max(1.0, float(x.abs().max())):
        return "constant", float(x[0]) if x.numel() else 0.0, 0.0
    n = x.numel()
    mean, var = float(x.mean()), float(x.pow(2).mean())
    if abs(mean) > 6 * math.sqrt(var / n):
        raise ValueError(
            f"parameter {name!r}: its init is random but not centred (mean {mean:.3g}, rms {math.sqrt(var):.3g}); "
            "FeatureLimit supports constant inits and centred Gaussian or uniform ones"
        )
    # Gaussian or uniform: the log-likelihood ratio of the two fitted laws (σ² = mean x²; the uniform's
    # half-width = max |x|); at least 10 nats (odds e¹⁰) either way, else the sample cannot tell
    r = float(x.abs().max())
    llr = n * (math.log(2 * r) - 0.5 * math.log(2 * math.pi * math.e * var))  # > 0: Gaussian
    if llr >= 10.0:
        return "normal", 0.0, var
    if llr <= -10.0:
        return "uniform", 0.0, var
    raise ValueError(
        f"parameter {name!r}: its {n} init entries cannot tell a Gaussian from a uniform law (log-likelihood "
        f"ratio {llr:.1f} nats, 10 needed), and the limit needs the law of one entry: pass a wider model "
        "(its values are only read)"
    )


def _scaled_var(p: torch.Tensor, n: int, exponent: int) -> tuple[float, float]:
    """rms²·n^exponent of a parameter, and the sampling variance of that estimate."""
    x = p.detach().double().flatten() * math.sqrt(float(n) ** exponent)
    v = float(x.pow(2).mean())
    return v, max(0.0, float(x.pow(4).mean()) - v * v) / max(1, x.numel())


@dataclass(frozen=True)
class AttentionLaw:
    """An attention module's logit scale as `mt.parametrize` left it: s at head dim d (width n) and
    s₀ at d₀ (the base), and the module's own scale `before` at width n. In µP c = s·d is the same at
    every width — the limit's logits are c·E_h[Z^q Z^k] — and with 1/√d it grows like √width."""

    module: str
    scale: float
    d: int
    before: float
    scale0: float
    d0: int


def observe(
    model: nn.Module, base: nn.Module, roles: dict[str, str], example: Any = None
) -> tuple[dict[str, ParamLaw], dict[str, AttentionLaw]]:
    """Each parameter's `ParamLaw` from `model` and `base` parametrized by the library (a finite-size
    parameter, e.g. the readout bias, keeps the parametrized model's value in its law), and each
    attention module's `AttentionLaw` (by module name).

    Args:
        model: the plain module at width n.
        base: the same architecture at base width n₀ < n.
        roles: parameter name → role (one of `ROLES`), from how the forward pass uses it.
        example: an input for parametrize's probe forwards (None: parametrize builds one).
    """
    n, n0 = widths(model, base)
    big, small, lr_big, lr_small, adam_big, adam_small = _parametrized(model, base, example)
    specs = [getattr(m, "_mutransfer_spec", None) for m in (big, small)]  # what parametrize measured
    small_att = {a.module: a for a in getattr(specs[1], "attention", [])}
    attention = {
        a.module: AttentionLaw(a.module, a.scale, a.d, a.before, small_att[a.module].scale, small_att[a.module].d)
        for a in getattr(specs[0], "attention", [])
        if a.module in small_att
    }
    pb, ps = dict(big.named_parameters()), dict(small.named_parameters())
    laws = {}
    for name, role in roles.items():
        e, ie = _EXPONENT[role], _INIT_EXPONENT[role]
        k_big, k_small = lr_big[name] * float(n) ** e, lr_small[name] * float(n0) ** e
        if not math.isclose(k_big, k_small, rel_tol=1e-6):
            raise ValueError(
                f"parameter {name!r} ({role}): its SGD lr from mt.param_groups scales as lr·n^{e} = {k_small:.6g} "
                f"at width {n0} but {k_big:.6g} at width {n}; it has no width-independent limit. Was the model "
                "parametrized with custom lr multipliers that depend on width?"
            )
        adam = _adam_law(name, role, adam_big[name], adam_small[name], n, n0)
        if role == "output_bias":
            laws[name] = ParamLaw(role, k_big, 0.0, "value", value=pb[name].detach().clone(), **adam)
            continue
        e_big, e_small = _scaled_var(pb[name], n, ie), _scaled_var(ps[name], n0, ie)
        v_big, v_small = e_big[0], e_small[0]
        if not math.isclose(v_big, v_small, rel_tol=1e-6, abs_tol=1e-300):
            # parametrize kept the user's own init here (not rescaled to the base's rms): two samples
            # of one law, which must agree within their sampling error; the larger one is used
            if abs(v_big - v_small) > 6 * math.sqrt(e_big[1] + e_small[1]) + 1e-12 * v_big:
                raise ValueError(
                    f"parameter {name!r} ({role}): its scaled init rms²·n^{ie} is {v_small:.6g} at width {n0} "
                    f"but {v_big:.6g} at width {n}; the limit needs it width-independent (µP)"
                )
        if role == "hidden":
            laws[name] = ParamLaw(role, k_big, v_big, "normal", **adam)
            continue
        pooled = torch.cat(
            [(pb[name] * math.sqrt(float(n) ** ie)).flatten(), (ps[name] * math.sqrt(float(n0) ** ie)).flatten()]
        )
        family, mean, _ = _family(name, pooled)
        laws[name] = ParamLaw(role, k_big, v_big, family, mean, **adam)
    return laws, attention


def _adam_law(name: str, role: str, big: tuple[float, float], small: tuple[float, float], n: int, n0: int) -> dict:
    """Adam's κ̃ and ε̃ of one parameter from its (lr, ε) factors at widths n and n₀, or why there are none."""
    e, f = _ADAM_EXPONENT[role], _ADAM_EPS_EXPONENT[role]
    k, k0 = big[0] * float(n) ** e, small[0] * float(n0) ** e
    eps, eps0 = big[1] * float(n) ** f, small[1] * float(n0) ** f
    error = ""
    if not math.isclose(k, k0, rel_tol=1e-6) or not math.isclose(eps, eps0, rel_tol=1e-6):
        error = (
            f"parameter {name!r} ({role}): its Adam lr·n^{e} and ε·n^{f} from mt.param_groups(model, lr, 'adam') are "
            f"{k0:.6g}, {eps0:.6g} at width {n0} but {k:.6g}, {eps:.6g} at width {n}; Adam has no width-independent "
            "limit for it"
        )
    return {"adam_kappa": k, "adam_eps": eps, "adam_error": error}


def first_width(gm: Any) -> int:
    """The model's width when no base is given: the output size of the first nn.Linear the traced
    graph calls (the input layer, finite → width); the roles `ops.analyse` then gives with it
    check it (a readout to as many outputs as the width, for one, fails there)."""
    for node in gm.graph.nodes:
        if node.op == "call_module" and type(gm.get_submodule(str(node.target))) is nn.Linear:
            return int(gm.get_submodule(str(node.target)).out_features)
    raise ValueError(
        "FeatureLimit: the model calls no nn.Linear, so its width cannot be read off it; pass base= (the same "
        "architecture at a smaller width)"
    )


def widened(model: nn.Module, layers: dict[str, tuple[str, nn.Module]], seed: int) -> nn.Module:
    """A copy of `model` at twice its width, for a model that is its own base: every width dim of its
    Linear and norm layers doubled (`layers`: qualified name → (rule, module), the rules
    `ops.own_layers` gave them: "input", "hidden", "readout", "norm"), every parameter drawn afresh
    from the law of the model's own entries (constant, Gaussian or uniform, as `_family` reads it)
    at their rms. `mt.parametrize(wide, base=model)` then rescales it as µP says; only the law of
    its entries matters."""
    wide = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    for name, (rule, module) in layers.items():
        new = copy.deepcopy(module)
        if rule == "norm":
            new.normalized_shape = tuple(2 * s for s in module.normalized_shape)  # type: ignore[assignment,union-attr]
        else:
            if rule in ("hidden", "readout"):
                new.in_features = 2 * module.in_features  # type: ignore[assignment,operator]
            if rule in ("input", "hidden"):
                new.out_features = 2 * module.out_features  # type: ignore[assignment,operator]
        for key, p in module.named_parameters(recurse=False):
            shape = tuple(2 * s if (rule == "norm" or (rule, d) in _WIDE_DIMS) else s for d, s in enumerate(p.shape))
            if rule == "readout" and key == "bias":
                shape = tuple(p.shape)
            family, mean, var = _family(f"{name}.{key}", p)
            law = ParamLaw("vector", 0.0, var, family, mean)
            value = law.sample(shape, generator, torch.float64).to(dtype=p.dtype, device=p.device)
            setattr(new, key, nn.Parameter(value, requires_grad=p.requires_grad))
        wide.set_submodule(name, new)
    return wide


# the dims of a Linear's weight (out, in) / bias (out,) that are width-sized, by the Linear's rule
_WIDE_DIMS = {("input", 0), ("hidden", 0), ("hidden", 1), ("readout", 1)}
