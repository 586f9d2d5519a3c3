"""Folding for `export`: find each µP forward constant of a model and move it into a weight.

`Folder` takes the constants out of a plain copy one at a time (output and input multipliers,
branch multipliers, attention logit scales) and puts each where a probe forward shows it belongs;
see `export` for the rules and `export_check` for the comparisons.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import scaled_forward
from ..errors import ExportError, MuPWarning
from .attention import MuMultiheadAttention, mha_in_projections, mup_logit_scale
from .branches import branch_end
from .depth import BRANCH_ATTR, block_pattern, branch_outputs
from .export_check import copied, hf_configs, relative_error
from .naming import canonical_name
from .observe import call_model

__all__ = ["Folder"]

_QUERY_NAMES = ("q_proj", "query", "to_q", "wq", "q", "w_q", "q_lin", "query_proj", "q_attn")
_KEY_NAMES = ("k_proj", "key", "to_k", "wk", "k", "w_k", "k_lin", "key_proj")
_QUERY_NORM_NAMES = ("q_norm", "q_layernorm", "query_layernorm", "q_ln", "norm_q")
_FUSED_NAMES = ("qkv", "c_attn", "wqkv", "qkv_proj", "to_qkv", "in_proj", "query_key_value", "Wqkv")
_ATTRS = (scaled_forward.INPUT_ATTR, scaled_forward.OUTPUT_ATTR, scaled_forward.SDPA_ATTR)


@dataclass
class _Constant:
    module: str
    kind: str  # "output", "input", "attention", "branch"
    factor: float
    remove: Callable[[], None]  # takes it out of the plain model's forward


class Folder:
    """Takes the µP constants out of `plain` one at a time and folds each into its weights,
    choosing where by comparing with `reference` (the µP model, zeros filled) on probe forwards:
    while one is moved, the others are still in place, so each comparison tests that one alone."""

    def __init__(self, reference: nn.Module, plain: nn.Module, inputs: Any, spec, rtol: float):
        self.reference, self.plain, self.inputs, self.spec, self.rtol = reference, plain, inputs, spec, rtol
        self.modules = dict(plain.named_modules())
        self.ref_modules = dict(reference.named_modules())
        self.applied: dict[int, float] = {}  # id(parameter) → factor folded into it so far
        self.applied_by: dict[int, str] = {}  # id(parameter) → the module whose output constant that was
        self._branch_ends: dict[int, list[str | None]] | None = None  # see _helper_ends
        self.owners: dict[int, list[str]] = {}
        for mname, m in plain.named_modules(remove_duplicate=False):
            for pname, p in m.named_parameters(recurse=False, remove_duplicate=False):
                self.owners.setdefault(id(p), []).append(f"{mname}.{pname}" if mname else pname)

    def fold(self, untie: bool) -> None:
        """Take every µP constant out of the plain copy and fold each into weights, checked one at a time.

        Args:
            untie: give a tied readout its own weight when no norm can absorb its multiplier.

        Raises:
            ExportError: a constant has no place to go, or no candidate keeps the module's output.
        """
        constants = self._constants()
        calls = self._calls()
        for c in constants:  # output constants first: they may scale a weight that readouts share
            if c.kind == "output":
                c.remove()
                if c.factor != 1.0:
                    self._fold_output(c, calls)
        order = {"branch": 0, "attention": 1, "input": 2}
        rest = [c for c in constants if c.kind != "output"] + self._readers_of_scaled_weights(constants, calls)
        for c in sorted(rest, key=lambda c: order[c.kind]):
            c.remove()
            if c.kind == "input":  # even at ×1: its weight may now carry another module's factor
                self._fold_readout(c, untie)
            elif c.factor == 1.0:
                continue
            elif c.kind == "branch":
                self._fold_branch(c, calls)
            else:
                self._fold_attention(c, calls)
        for module in self.modules.values():  # every constant gone: the user's own classes again
            parent = type(module).__dict__.get("_mutransfer_parent")
            if parent is not None and not any(a in module.__dict__ for a in _ATTRS):
                module.__class__ = parent

    def _readers_of_scaled_weights(self, constants: list[_Constant], calls) -> list[_Constant]:
        """Modules that ran and share a weight an output constant was folded into, with no constant
        of their own (a tied readout whose multiplier came out as 1): each must undo that factor."""
        own = {c.module for c in constants if c.kind in ("output", "input")}
        out = []
        for name, module in self.modules.items():
            w = module._parameters.get("weight")
            if w is not None and id(w) in self.applied and name in calls and name not in own:
                out.append(_Constant(name, "input", 1.0, lambda: None))
        return out

    # ---- the constants, and how to take each out

    def _constants(self) -> list[_Constant]:
        found: list[_Constant] = []
        heads = {a.module: a for a in self.spec.attention}

        def pop(module, attr):
            return lambda: module.__dict__.pop(attr, None)

        for name, module in self.modules.items():
            cname = canonical_name(name)
            if "_mutransfer_parent" in type(module).__dict__:
                for attr, kind in zip(_ATTRS, ("input", "output", "attention")):
                    if attr in module.__dict__:
                        if kind == "output" and not _is_layer(module):
                            kind = "branch"
                        found.append(_Constant(name, kind, float(module.__dict__[attr]), pop(module, attr)))
            if isinstance(module, MuMultiheadAttention):  # its q rows, exactly
                cfg = module.__dict__.pop("_mutransfer_attn")
                module.__class__ = nn.MultiheadAttention  # type: ignore[assignment]
                self._scale_mha_query(module, mup_logit_scale(cfg, module.head_dim) * math.sqrt(module.head_dim))
            elif "_mutransfer_attn" in module.__dict__:  # the attn_scale helper
                cfg = module.__dict__["_mutransfer_attn"]
                d = heads[cname].d if cname in heads else None
                if d is None:
                    raise ExportError(
                        f"export: attention module '{cname}' uses mt.attn_scale but its head dim was not "
                        "recorded by parametrize; parametrize it with example_inputs="
                    )
                found.append(
                    _Constant(
                        name, "attention", mup_logit_scale(cfg, d) * math.sqrt(d), pop(module, "_mutransfer_attn")
                    )
                )
            if BRANCH_ATTR in module.__dict__:
                found.append(_Constant(name, "branch", float(module.__dict__[BRANCH_ATTR]), pop(module, BRANCH_ATTR)))
        for a in self.spec.attention:
            if a.how.startswith("attribute "):
                attr = a.how[len("attribute ") :]
                name, module = self._module(a.module)
                if a.attribute_value is None:
                    raise ExportError(
                        f"export: attention module '{a.module}' holds µP's logit scale in its attribute "
                        f"'{attr}', whose own value was not recorded (parametrized by an older version); "
                        "parametrize the model again"
                    )
                found.append(
                    _Constant(
                        name,
                        "attention",
                        a.target / a.before,
                        functools.partial(setattr, module, attr, a.attribute_value),
                    )
                )
        return found

    def _module(self, name: str) -> tuple[str, nn.Module]:
        for n, m in self.modules.items():
            if canonical_name(n) == name:
                return n, m
        raise ExportError(f"export: no module '{name}' in the model")

    def _scale_mha_query(self, module: nn.MultiheadAttention, c: float) -> None:
        (w_q, b_q), _, _ = mha_in_projections(module)  # views into in_proj_weight/bias when fused
        w_q.mul_(c)
        if b_q is not None:
            b_q.mul_(c)

    # ---- where each constant goes

    def _scale(
        self, module: nn.Module, c: float, part: tuple[int, torch.Tensor] | None = None, bias: bool = True
    ) -> Callable[[], None]:
        """Multiply a layer's weight (and bias) by c, or the rows (dim, indices) of them; returns the
        undo. Refuses a parameter that other modules share (it would change them too)."""
        touched: list[tuple[nn.Parameter, int | None, torch.Tensor | None]] = []
        for pname in ("weight", "bias") if bias else ("weight",):
            p = module._parameters.get(pname)
            if p is None:
                continue
            if len(self.owners.get(id(p), [])) > 1:
                raise _Shared(self.owners[id(p)])
            if part is None:
                p.mul_(c)
                touched.append((p, None, None))
            else:
                along, index = part
                along = 0 if p.dim() == 1 else along
                p.index_copy_(along, index, p.index_select(along, index) * c)
                touched.append((p, along, index))

        def undo() -> None:
            for p, dim, index in touched:
                if dim is None or index is None:
                    p.div_(c)
                else:
                    p.index_copy_(dim, index, p.index_select(dim, index) / c)

        return undo

    def _scale_raw(self, p: torch.Tensor, c: float) -> Callable[[], None]:
        """Multiply one parameter by c (a module that is not a layer); returns the undo."""
        if len(self.owners.get(id(p), [])) > 1:
            raise _Shared(self.owners[id(p)])
        p.mul_(c)

        def undo() -> None:
            p.div_(c)

        return undo

    def _fold_output(self, c: _Constant, calls) -> None:
        module = self.modules[c.module]
        if c.module not in calls:  # its forward never runs (the parent uses its weight directly)
            warnings.warn(
                f"export: '{canonical_name(c.module)}' ({_class_name(module)}) carries a µP output "
                f"multiplier ×{c.factor:.6g}, but its forward does not run on the probe (its parameters are "
                "used directly by another module), so the multiplier had no effect on the µP model; the "
                "export leaves it out",
                MuPWarning,
                stacklevel=4,
            )
            return
        for pname in ("weight", "bias"):
            p = module._parameters.get(pname)
            if p is None:
                continue
            if id(p) in self.applied:
                # a weight shared by several lookups (T5's encoder, decoder and `shared` embeddings): each
                # carries the same output constant, and the weight takes it once
                if math.isclose(self.applied[id(p)], c.factor, rel_tol=1e-12):
                    continue
                raise ExportError(
                    f"export: '{canonical_name(c.module)}' multiplies its output by {c.factor:.6g} "
                    f"but shares {pname} with {', '.join(self.owners[id(p)])}, which another module "
                    f"multiplies by {self.applied[id(p)]:.6g}: one weight cannot take both"
                )
            p.mul_(c.factor)
            self.applied[id(p)] = c.factor
            self.applied_by[id(p)] = c.module

    def _fold_branch(self, c: _Constant, calls) -> None:
        """Output × c of a module: into the layer that ends it (found by tracing, else searched).
        A block calling `mt.residual_branch`: into the layers whose outputs it was given."""
        module = self.modules[c.module]
        if "_mutransfer_parent" not in type(self.ref_modules[c.module]).__dict__:  # the helper's multiplier
            ends = self._helper_ends(c.module)
            if ends:
                undos = []
                try:
                    for layer in ends:
                        undos.append(self._scale(layer, c.factor))
                except _Shared:
                    pass
                else:
                    if self._module_matches(c.module, calls):
                        return
                for u in reversed(undos):
                    u()
            return self._greedy(c, calls, "the residual branch multiplier", "the layers that end its branches")
        end = branch_end(module)
        if end is not None:
            try:
                undo = self._scale(module.get_submodule(end), c.factor)  # "" is the module itself
            except _Shared:
                undo = None
            if undo is not None:
                if self._module_matches(c.module, calls):
                    return
                undo()
        self._greedy(
            c,
            calls,
            "the residual branch multiplier",
            "its last layer (a Linear/Conv whose output is the branch's, used by nothing else)",
        )

    def _helper_ends(self, block: str) -> list[nn.Module]:
        """The layers (of `plain`) whose outputs the block passed to `residual_branch` on the probe."""
        if self._branch_ends is None:  # one probe forward serves every block
            made: dict[int, str] = {}
            hooks = [
                m.register_forward_hook(lambda mod, i, o, n=n: made.__setitem__(id(o), n))
                for n, m in self.reference.named_modules()
                if _is_layer(m)
            ]
            try:
                with branch_outputs() as seen:
                    call_model(self.reference, self.inputs)
            finally:
                for h in hooks:
                    h.remove()
            self._branch_ends = {}
            for b, out in seen:
                self._branch_ends.setdefault(id(b), []).append(made.get(id(out)))
        names = self._branch_ends.get(id(self.ref_modules[block]), [])
        if not names or None in names:
            return []
        return [self.modules[n] for n in dict.fromkeys(names)]

    def _greedy(self, c: _Constant, calls, what: str, where: str) -> None:
        """Fold c into layers of the module, last run first, keeping each that brings the module's output
        closer (a block scaling two branches needs two); done when it matches. Layers at the same place
        in repeated blocks (``experts.*.down``: a router's experts, whose weighted sum is the output) are
        tried together first — no one of them alone moves the output by half — then one at a time."""
        module = self.modules[c.module]
        error = self._module_error(c.module, calls)
        groups: dict[str, list[nn.Module]] = {}
        # "last" is the forward's order (the probe's first calls), not the order the modules were registered
        # in: Phi-3 registers o_proj before qkv_proj, and scaling qkv_proj first half-matched and stuck
        when = {n: i for i, n in enumerate(calls)}
        prefix = f"{c.module}." if c.module else ""
        ordered = sorted(_layers(module), key=lambda nl: when.get(prefix + nl[0], -1))
        for name, layer in ordered:
            head, _, last = name.rpartition(".")  # block indices starred, the layer's own name kept:
            key = f"{block_pattern(head)}.{last}" if head else last  # experts.*.2, not experts.*.*
            groups.setdefault(key, []).append(layer)
            groups[key] = groups.pop(key)  # ordered by the last member
        units: list[list[nn.Module | _RawParameter]] = []  # tried in order
        for members in reversed(list(groups.values())):
            if len(members) > 1:
                units.append(list[nn.Module | _RawParameter](members))
            units += [[m] for m in reversed(members)]
        # then the raw parameters of modules that are not layers (Mixtral's experts: 3-d gate_up_proj and
        # down_proj used by a grouped matmul), one at a time, last first
        raw = [
            q
            for m in module.modules()
            if not _is_layer(m) and not list(m.children())
            for q in m._parameters.values()
            if q is not None
        ]
        units += [[_RawParameter(q)] for q in reversed(raw)]
        for unit in units:
            undos = []
            try:
                for layer in unit:
                    undos.append(
                        self._scale_raw(layer.p, c.factor)
                        if isinstance(layer, _RawParameter)
                        else self._scale(layer, c.factor)
                    )
            except _Shared:
                for u in reversed(undos):
                    u()
                continue
            now = self._module_error(c.module, calls)
            if now <= self.rtol:
                return
            if now < 0.5 * error:
                error = now
            else:
                for u in reversed(undos):
                    u()
        raise ExportError(
            f"export: {what} of '{canonical_name(c.module)}' ({_class_name(module)}, ×{c.factor:.6g}) "
            f"cannot be folded into {where}: no layer of it takes the factor with the module's output "
            "unchanged; the model cannot be made plain"
        )

    def _fold_attention(self, c: _Constant, calls) -> None:
        """The ratio of µP's logit scale to the plain one: into q (or k) — its projection, the q
        rows of a fused projection, or the query norm's gain."""
        module = self.modules[c.module]
        heads = {a.module: a.d for a in self.spec.attention}
        for layer, part in _query_candidates(module, heads.get(canonical_name(c.module))):
            try:
                undo = self._scale(layer, c.factor, part)
            except _Shared:
                continue
            if self._module_matches(c.module, calls):
                return
            undo()
        raise ExportError(
            f"export: attention module '{canonical_name(c.module)}' ({_class_name(module)}) needs its "
            f"logits ×{c.factor:.6g} (µP's scale over the plain one) and no query or key projection, "
            "fused qkv projection or query norm inside it takes the factor with the module's output "
            "unchanged; compute q with a Linear inside the attention module (or keep the model in µP "
            "and save it with its spec)"
        )

    def _fold_readout(self, c: _Constant, untie: bool) -> None:
        """Input × c of a readout: into its weight; a tied weight keeps its tie through the norm
        before the readout, or is untied on request."""
        module = self.modules[c.module]
        weight = module._parameters.get("weight")
        if weight is None:
            raise ExportError(
                f"export: readout '{canonical_name(c.module)}' ({_class_name(module)}) has no weight "
                "parameter to take its multiplier"
            )
        # a factor another module's output constant put into a shared weight is undone here; this module's own
        # output constant (a layer with constants on both sides: u-µP's branch end) stays: it acts after the input's
        own = self.applied_by.get(id(weight)) == c.module
        need = c.factor / (1.0 if own else self.applied.get(id(weight), 1.0))
        if need == 1.0:
            return
        if len(self.owners[id(weight)]) == 1:
            weight.mul_(need)
            return
        for norm in self._norms_before(c.module, weight.shape[-1]):
            try:
                undo = self._scale(norm, need)
            except _Shared:
                continue
            if (
                relative_error(call_model(self.plain, self.inputs), call_model(self.reference, self.inputs))
                <= self.rtol
            ):
                return
            undo()
        if untie:
            module.weight = nn.Parameter(weight.detach() * need, requires_grad=weight.requires_grad)
            for cfg in hf_configs(self.plain):
                cfg.tie_word_embeddings = False
            return
        raise ExportError(
            f"export: readout '{canonical_name(c.module)}' shares its weight with "
            f"{', '.join(o for o in self.owners[id(weight)] if not o.startswith(c.module + '.'))} and "
            f"needs ×{need:.6g} on its input; no affine norm right before it can take that factor "
            "(none, or its output is used elsewhere). Pass untie=True to give the readout its own "
            "weight (a Hugging Face config gets tie_word_embeddings=False)"
        )

    def _norms_before(self, readout: str, features: int) -> list[nn.Module]:
        """Norm-like modules (a 1-D weight of the readout's fan_in) run before the readout, last first."""
        order: list[str] = []
        hooks = [
            m.register_forward_hook(lambda mod, i, o, n=n: order.append(n)) for n, m in self.plain.named_modules() if n
        ]
        try:
            call_model(self.plain, self.inputs)
        finally:
            for h in hooks:
                h.remove()
        if readout not in order:
            return []
        before = order[: order.index(readout)]
        out = []
        for n in reversed(before):
            m = self.modules[n]
            w = m._parameters.get("weight")
            if w is not None and w.dim() == 1 and w.shape[0] == features and m not in out:
                out.append(m)
        return out

    # ---- comparing

    def _calls(self) -> dict[str, tuple]:
        """The (args, kwargs) of each module's first call on the probe, from the reference model."""
        calls: dict[str, tuple] = {}

        def hook(module, args, kwargs, name):
            if name not in calls:  # a copy: a KV cache among them is filled as the forward goes on
                calls[name] = copied((args, kwargs))

        handles = [
            m.register_forward_pre_hook(lambda mod, a, k, n=n: hook(mod, a, k, n), with_kwargs=True)
            for n, m in self.reference.named_modules()
        ]
        try:
            call_model(self.reference, self.inputs)
        finally:
            for h in handles:
                h.remove()
        return calls

    def _module_error(self, name: str, calls) -> float:
        if name not in calls:
            raise ExportError(
                f"export: module '{canonical_name(name)}' did not run on the probe forward, so where its "
                "µP constant can be folded cannot be checked; pass example_inputs= that reach it"
            )
        args, kwargs = copied(calls[name])
        mine = self.modules[name](*args, **kwargs)
        args, kwargs = copied(calls[name])
        return relative_error(mine, self.ref_modules[name](*args, **kwargs))

    def _module_matches(self, name: str, calls) -> bool:
        return self._module_error(name, calls) <= self.rtol


class _Shared(Exception):
    def __init__(self, owners):
        super().__init__(", ".join(owners))


def _class_name(module: nn.Module) -> str:
    """The user's class name (not mutransfer's MuScaled subclass)."""
    return type(module).__dict__.get("_mutransfer_parent", type(module)).__name__


@dataclass
class _RawParameter:
    """A parameter of a module that is not a layer, as one unit `_greedy` may scale."""

    p: torch.Tensor


def _is_layer(module: nn.Module) -> bool:
    return not list(module.children()) and "weight" in module._parameters


def _layers(module: nn.Module):
    return [(n, m) for n, m in module.named_modules() if _is_layer(m)]


def _query_candidates(module: nn.Module, head_dim: int | None) -> list[tuple[nn.Module, tuple | None]]:
    """Where a logit factor may go, most likely first: the query projection, the key projection,
    the q rows of a fused projection (either weight layout; q, k, v in thirds or interleaved per
    head as GPT-NeoX), the query norm, any other layer."""
    layers = _layers(module)
    last = lambda n: n.rsplit(".", 1)[-1]  # noqa: E731
    out: list = []
    for names in (_QUERY_NAMES, _KEY_NAMES):
        out += [(m, None) for n, m in layers if last(n) in names]
    for n, m in layers:
        if last(n) in _FUSED_NAMES:
            w = m._parameters["weight"]
            for dim in dict.fromkeys((0, w.dim() - 1)):
                n_out = w.shape[dim]
                if n_out % 3 == 0:
                    out.append((m, (dim, torch.arange(n_out // 3, device=w.device))))
                    if head_dim and n_out % (3 * head_dim) == 0:
                        rows = torch.arange(n_out, device=w.device).view(-1, 3, head_dim)[:, 0].reshape(-1)
                        out.append((m, (dim, rows)))
    out += [(m, None) for n, m in layers if last(n) in _QUERY_NORM_NAMES]
    out += [(m, None) for _, m in layers if not any(m is o for o, _ in out)]
    return out
