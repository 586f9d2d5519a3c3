"""What `parametrize(zero_init_readout=..., zero_init_query=...)` zeroes: the readout (and its bias),
the query projections (whole tensors, or the query third of a fused qkv / nn.MultiheadAttention
in-projection), as `ZeroPiece`s that `init_weights` re-applies after drawing."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ModelError
from .roles import ParamInfo
from .shapes import canonical_name

__all__ = ["ZeroPiece", "Zeroing", "query_zeroing", "readout_zeroing"]

_QUERY_MODULE_NAMES = ("q_proj", "query", "to_q", "wq", "q", "w_q", "q_lin", "query_proj")
_FUSED_QKV_NAMES = ("qkv", "c_attn", "wqkv", "qkv_proj", "to_qkv", "in_proj", "query_key_value")


@dataclass(frozen=True)
class ZeroPiece:
    """A parameter, or the row range [start, stop) of its dim `dim`, that parametrize zeroes."""

    what: str  # as describe prints it
    param: str  # the canonical parameter name
    dim: int = 0
    start: int = 0
    stop: int | None = None  # None: to the end (the whole parameter when start is 0)

    def tensor(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The parameter or its rows, as a view to zero."""
        p = params[self.param]
        if self.start == 0 and self.stop is None:
            return p
        stop = p.shape[self.dim] if self.stop is None else self.stop
        return p.narrow(self.dim, self.start, stop - self.start)


Zeroing = list[ZeroPiece]


def _param_names(model: nn.Module) -> dict[int, str]:
    names: dict[int, str] = {}
    for n, p in model.named_parameters():
        names.setdefault(id(p), canonical_name(n))
    return names


def readout_zeroing(model, infos: dict[str, ParamInfo], params) -> Zeroing:
    tied = [n for n, i in infos.items() if i.tied_readouts]
    if tied:
        raise ModelError(
            f"zero_init_readout would zero '{tied[0]}', which is tied to the input "
            "embedding; untie the readout or leave zero_init_readout=False"
        )
    names = _param_names(model)
    found: Zeroing = []
    for name, info in infos.items():
        if info.role != "output":
            continue
        found.append(ZeroPiece(name, name))
        for mname, _ in info.usages:
            bias = getattr(model.get_submodule(mname), "bias", None)
            if isinstance(bias, torch.Tensor) and bias.ndim == 1 and id(bias) in names:
                found.append(ZeroPiece(f"{mname}.bias" if mname else "bias", names[id(bias)]))
    if not found:
        raise ModelError("zero_init_readout=True but the model has no output (readout) parameter")
    return found


def query_zeroing(model: nn.Module, which) -> Zeroing:
    """The query weights (whole tensors or the query rows of fused projections) to zero."""
    patterns = None if which is True else ([which] if isinstance(which, str) else list(which))
    names = _param_names(model)
    found: Zeroing = []
    for mname, module in model.named_modules():
        cname = canonical_name(mname)
        leaf = cname.rsplit(".", 1)[-1].lower()
        weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
        if patterns is not None:
            if not any(fnmatch.fnmatchcase(cname, p) for p in patterns):
                continue
            fused = False
        elif isinstance(module, nn.MultiheadAttention):
            if not module._qkv_same_embed_dim:
                found.append(ZeroPiece(f"{cname}.q_proj_weight", names[id(module.q_proj_weight)]))
                continue
            weight, bias, fused = module.in_proj_weight, module.in_proj_bias, True
        elif leaf in _QUERY_MODULE_NAMES and isinstance(module, nn.Linear):
            fused = False
        elif leaf in _FUSED_QKV_NAMES and isinstance(weight, torch.Tensor):
            fused = True
        else:
            continue
        if not isinstance(weight, torch.Tensor) or id(weight) not in names:
            raise ModelError(f"zero_init_query: module '{cname}' has no weight to zero")
        if not fused:
            found.append(ZeroPiece(cname, names[id(weight)]))
            if isinstance(bias, torch.Tensor) and id(bias) in names:
                found.append(ZeroPiece(f"{cname}.bias", names[id(bias)]))
            continue
        transposed = type(module).__name__ == "Conv1D"  # (in, 3·out) layout
        n = (weight.shape[1] if transposed else weight.shape[0]) // 3
        found.append(ZeroPiece(f"{cname} (query third)", names[id(weight)], 1 if transposed else 0, 0, n))
        if isinstance(bias, torch.Tensor) and id(bias) in names:
            found.append(ZeroPiece(f"{cname}.bias (query third)", names[id(bias)], 0, 0, n))
    if not found:
        raise ModelError(
            "zero_init_query: no query projection found; pass the query weights' module "
            "names as a pattern, e.g. zero_init_query='*.attn.q_proj'"
        )
    return found
