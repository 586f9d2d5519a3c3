"""Monte Carlo kernels of a module as it is: sample finite networks of that exact module in the
NTK parametrization and average. The fallback for ops without an exact rule, and the check for
the exact ones (wide finite networks agree within their standard errors).

Every Linear and Conv gets W ~ N(0, weight_var/fan_in), b ~ N(0, bias_var), and its gradients are
taken with respect to the NTK parametrization's unit-variance weights (a factor weight_var/fan_in
on ⟨∂f/∂W, ∂f/∂W'⟩, bias_var on the bias's). Every other parameter keeps the module's own
init (`reset_parameters()`) and PyTorch's gradient scale; frozen parameters (requires_grad=False)
are not in the NTK. The module runs in eval mode. The
standard error is over samples; a finite width adds its own O(1/width) bias, which it does not
include.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from ._layers import LAYER_TYPES

__all__ = ["layer_factors", "monte_carlo_kernels"]


def layer_factors(model: nn.Module, weight_var: float, bias_var: float) -> dict[str, float]:
    """For every parameter, the factor on its gradient inner products (see module docstring)."""
    factors = {}
    for mname, m in model.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            if isinstance(m, LAYER_TYPES) and pname == "weight":
                factors[full] = weight_var / (p[0].numel())
            elif isinstance(m, LAYER_TYPES) and pname == "bias":
                factors[full] = bias_var
            else:
                factors[full] = 1.0
    return factors


def _resample(model: nn.Module, weight_var: float, bias_var: float, g: torch.Generator) -> list[str]:
    """New weights in place; returns the parameters left with the module's own init."""
    own = []
    with torch.no_grad():
        for mname, m in model.named_modules():
            if isinstance(m, LAYER_TYPES):
                w = m.weight
                w.copy_(
                    (torch.randn(w.shape, generator=g, dtype=w.dtype) * math.sqrt(weight_var / w[0].numel())).to(
                        w.device
                    )
                )
                if m.bias is not None:
                    m.bias.copy_(
                        (torch.randn(m.bias.shape, generator=g, dtype=w.dtype) * math.sqrt(bias_var)).to(w.device)
                    )
            elif any(True for _ in m.parameters(recurse=False)):
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
                own += [f"{mname}.{n}" if mname else n for n, _ in m.named_parameters(recurse=False)]
    return own


def _output(out, n: int) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise ValueError(
            f"the model returns {type(out).__name__}; the kernels need one output tensor (batch "
            "axis first): wrap the model so that forward returns it"
        )
    return out.reshape(n, -1)


def monte_carlo_kernels(
    model: nn.Module,
    x1: torch.Tensor,
    x2: torch.Tensor | None = None,
    weight_var: float = 2.0,
    bias_var: float = 0.0,
    *,
    samples: int = 32,
    ntk: bool = True,
    seed: int = 0,
    chunk: int = 64,
) -> dict:
    """Monte Carlo NNGP and NTK of one output unit (outputs averaged), float64, with standard errors.
    Returns {"nngp", "nngp_se", "ntk", "ntk_se", "own_init"} (ntk entries None when ntk=False)."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 2:
        raise ValueError(f"samples must be an integer ≥ 2, got {samples!r}")
    from torch.func import functional_call, jacrev, vmap

    a = x1.detach().to(torch.float64)
    net = copy.deepcopy(model).to(device=a.device, dtype=torch.float64).eval()  # computed where the inputs are
    g = torch.Generator().manual_seed(seed)  # on the CPU: the same networks on every device
    b = a if x2 is None else x2.detach().to(torch.float64)
    factors = layer_factors(net, weight_var, bias_var)
    ks, ts, own = [], [], []
    for _ in range(samples):
        own = _resample(net, weight_var, bias_var, g)
        with torch.no_grad():
            fa = _output(net(a), len(a))
            fb = fa if x2 is None else _output(net(b), len(b))
        ks.append(fa @ fb.T / fa.shape[1])
        if not ntk:
            continue
        params = {n: p.detach() for n, p in net.named_parameters() if p.requires_grad}

        def f(p, x):
            return _output(functional_call(net, p, (x[None],), strict=False), 1).reshape(-1)

        def jac(x, params=params):
            parts = []
            for s in range(0, len(x), chunk):
                j = vmap(jacrev(f), in_dims=(None, 0))(params, x[s : s + chunk])
                parts.append(
                    torch.cat([t.reshape(t.shape[0], t.shape[1], -1) * math.sqrt(factors[n]) for n, t in j.items()], -1)
                )
            return torch.cat(parts)

        ja = jac(a)
        jb = ja if x2 is None else jac(b)
        ts.append(torch.einsum("iop,jop->ij", ja, jb) / ja.shape[1])

    def stats(xs):
        st = torch.stack(xs)
        return st.mean(0), st.std(0) / math.sqrt(len(xs))

    k, kse = stats(ks)
    t, tse = stats(ts) if ntk else (None, None)
    return {"nngp": k, "nngp_se": kse, "ntk": t, "ntk_se": tse, "own_init": own}
