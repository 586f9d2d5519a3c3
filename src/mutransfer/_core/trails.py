"""What the recorder follows beyond each op: where forward constants come from, and the q·k term of logits.

A mixin under `scales.Scales` (the forward-constant algebra) and `recorder._Recorder` (the op dispatch):

- **origins**: every tensor that is a linear function of one module's output (views, casts, × or ÷ by
  anything, sums of terms from that module) remembers that module. A forward constant arriving at
  another module's input (Gemma's embedding × √hidden) is then recorded against the module whose
  output it multiplies (`Observation.carried_constants`), where `parametrize` can undo its width
  dependence with an output multiplier; the q and k of every attention call name their modules
  (`AttentionCall.query`/`key`), so an inline logit constant can be moved onto the query projection.
- **output uses**: how many ops each module's output went into (a multiplier on a query projection
  whose output feeds anything besides q would change more than q·kᵀ).
- **logit terms** (only while an `on_attention` callback listens): logits as the softmax sees them
  may hold additive terms that are not q·kᵀ (ALiBi inside ``baddbmm``, relative-position biases,
  masks). From the product on, every op applied to the logits is applied to their q·k term too,
  except that an added tensor that is not itself a product of activations is left out.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from .observation import Observation
from .op_tables import CONSTANT_SAME, MATMUL, MATMUL_ADD, add_operands, tensors_in

__all__ = ["Trails"]

_LINEAR_OPS = {"mul", "rmul", "div", "rdiv", "add", "sub", "radd", "rsub", "true_divide"}


class Trails:
    """Origins, output uses and logit terms, for the recorder (see the module docstring)."""

    obs: Observation
    params: dict[int, str]
    probs: dict[int, weakref.ref]
    on_attention: Callable[..., None] | None

    def init_trails(self) -> None:
        """Empty bookkeeping (called by the recorder's ``__init__``)."""
        self.origins: dict[int, tuple[weakref.ref, str]] = {}
        self.logit_sources: dict[int, tuple[weakref.ref, tuple[str | None, str | None]]] = {}
        self.outputs: dict[int, tuple[weakref.ref, str]] = {}  # a module's own output tensor → the module
        self.terms: dict[int, tuple[weakref.ref, torch.Tensor | None]] = {}  # logits → their q·k term (None: itself)

    def _constant(self, t) -> tuple[float, int | None]:  # the recorder's forward-constant algebra
        raise NotImplementedError

    def _module(self) -> str:
        raise NotImplementedError

    # ------------------------------------------------------------ origins of forward constants
    def _origin(self, t) -> str | None:
        if not isinstance(t, torch.Tensor):
            return None
        entry = self.origins.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def _sources(self, t) -> tuple[str | None, str | None]:
        """(origin of q, origin of k) of a logit candidate."""
        entry = self.logit_sources.get(id(t)) if isinstance(t, torch.Tensor) else None
        return entry[1] if entry is not None and entry[0]() is t else (None, None)

    def _set_sources(self, t, sources: tuple[str | None, str | None]) -> None:
        try:
            self.logit_sources[id(t)] = (weakref.ref(t), sources)
        except TypeError:
            pass

    def _set_origin(self, t, module: str) -> None:
        if isinstance(t, torch.Tensor) and id(t) not in self.params:
            try:
                self.origins[id(t)] = (weakref.ref(t), module)
            except TypeError:
                pass

    def _track_origins(self, name: str, args, kwargs, out) -> None:
        """An op linear in its tensor operand (views, casts, × or ÷ by anything) keeps the operand's origin;
        a sum keeps it when every term has that origin. A sum of terms from different modules ends the
        trail: a term carrying a forward constant is recorded there (``emb(ids)·√d + pos(ids)``) and its
        origin goes on, standing for the constant the sum carries."""
        if name not in CONSTANT_SAME and name not in _LINEAR_OPS:
            return
        tensors = tensors_in(list(args) + list(kwargs.values()))
        if name in ("add", "sub", "radd", "rsub"):
            origins = {self._origin(t) for t in tensors}
            single = next(iter(origins)) if len(origins) == 1 else None
            if single is not None:
                origin: str = single
            else:
                carriers = [
                    (t, o)
                    for t in tensors
                    if (o := self._origin(t)) is not None
                    and self._constant(t)[0] != 1.0
                    and self._constant(t)[1] is None
                ]
                for t, o in carriers:
                    self._carried(o, self._module(), self._constant(t)[0])
                if len(carriers) != 1:
                    return
                origin = carriers[0][1]
        else:
            found = [(t, o) for t in tensors if (o := self._origin(t)) is not None]
            if not found:
                return
            shape = out.shape if isinstance(out, torch.Tensor) else None
            origin = max(found, key=lambda f: (self._constant(f[0])[0] != 1.0, f[0].shape == shape))[1]
        for made in tensors_in(out):
            if self._origin(made) is None:
                self._set_origin(made, origin)

    def _track_sources(self, args, kwargs, out) -> None:
        """A logit candidate made from another keeps its (q, k) origins."""
        if not isinstance(out, torch.Tensor) or self._constant(out)[1] is None or self._sources(out) != (None, None):
            return
        for t in tensors_in(list(args) + list(kwargs.values())):
            if (src := self._sources(t)) != (None, None):
                self._set_sources(out, src)
                return

    def _count_output_uses(self, args, kwargs) -> None:
        for t in tensors_in(list(args) + list(kwargs.values())):
            entry = self.outputs.get(id(t))
            if entry is not None and entry[0]() is t:
                self.obs.output_uses[entry[1]] = self.obs.output_uses.get(entry[1], 0) + 1

    def enter_module(self, name: str, args) -> None:
        """At a module's call: the forward constant its first input carries, and where it came from."""
        self.obs.called.add(name)
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if first is None:
            return
        ref = self.probs.get(id(first))
        if ref is not None and ref() is first:
            self.obs.prob_modules.add(name)
        scale, logit_dim = self._constant(first)
        if scale == 1.0 or logit_dim is not None:
            return
        if name not in self.obs.input_scales:
            self.obs.input_scales[name] = scale
        self._carried(self._origin(first), name, scale)

    def leave_module(self, name: str, output) -> None:
        """At a module's return: its output is the origin of what is computed from it (unless it passes a
        tensor through that already has one); the model's own output records the constant it carries."""
        first = next(iter(tensors_in(output)), None) if not isinstance(output, torch.Tensor) else output
        if first is None:
            return
        if name == "":
            scale, logit_dim = self._constant(first)
            if scale != 1.0 and logit_dim is None:
                self._carried(self._origin(first), "", scale)
        if self._origin(first) is None:
            scale, logit_dim = self._constant(first)
            if scale != 1.0 and logit_dim is None:
                self.obs.inner_constants.add(name)  # multiplied inside its own forward (Gemma 3's embedding)
            self._set_origin(first, name)
        try:
            self.outputs[id(first)] = (weakref.ref(first), name)
        except TypeError:
            pass

    def _carried(self, origin: str | None, consumer: str, scale: float) -> None:
        if origin is None:
            self.obs.unplaced_constants.setdefault(consumer, scale)
        elif origin not in self.obs.carried_constants:
            self.obs.carried_constants[origin] = (scale, consumer)

    # ------------------------------------------------------------ the q·k term of eager logits
    def _term(self, t) -> tuple[bool, torch.Tensor | None]:
        """(whether `t` is a tracked logit candidate, its q·k term or None for `t` itself)."""
        if not isinstance(t, torch.Tensor):
            return False, None
        entry = self.terms.get(id(t))
        if entry is None or entry[0]() is not t:
            return False, None
        return True, entry[1]

    def _set_term(self, t, term: torch.Tensor | None) -> None:
        if not isinstance(t, torch.Tensor) or (term is not None and term.shape != t.shape):
            return
        try:
            self.terms[id(t)] = (weakref.ref(t), None if term is t else term)
        except TypeError:
            pass

    def _track_terms(self, func, name: str, args, kwargs, out) -> None:
        if not isinstance(out, torch.Tensor):
            return
        if name in MATMUL or name == "rmatmul" or name in MATMUL_ADD or name == "einsum":
            if self._constant(out)[1] is None:
                return  # not a product of two activations
            term = None
            if name in MATMUL_ADD:
                bias = add_operands(name, args, kwargs)[0]
                beta = kwargs.get("beta", 1.0)
                if isinstance(bias, torch.Tensor) and isinstance(beta, (int, float)) and beta != 0:
                    term = out - beta * bias
            self._set_term(out, term)
            return
        tracked = {id(a): self._term(a) for a in list(args) + list(kwargs.values()) if self._term(a)[0]}
        if not tracked:
            return

        def own(a):
            return tracked[id(a)][1] if tracked[id(a)][1] is not None else a

        if name in ("add", "sub", "radd", "rsub") and args and (len(args) >= 2 or "other" in kwargs):
            a, b = (args[0], args[1]) if len(args) >= 2 else (args[0], kwargs["other"])
            ta, tb = id(a) in tracked, id(b) in tracked
            if ta and tb:
                term = func(own(a), own(b))
            elif ta:
                term = own(a) if name in ("add", "sub", "radd") else -own(a)
            else:
                term = own(b) if name in ("add", "radd", "rsub") else -own(b)
            if term.shape != out.shape:
                term = term.expand(out.shape)
        elif name in CONSTANT_SAME or name in ("mul", "rmul", "div", "rdiv"):
            if all(t is None for _, t in tracked.values()):
                self._set_term(out, None)  # no additive term so far: the term is the tensor itself
                return
            new_args = [own(a) if id(a) in tracked else a for a in args]
            new_kwargs = {k: own(v) if id(v) in tracked else v for k, v in kwargs.items()}
            term = func(*new_args, **new_kwargs)
            if not isinstance(term, torch.Tensor):
                return
        else:
            return
        self._set_term(out, term)

    def _logit_term(self, x: torch.Tensor) -> torch.Tensor:
        """The q·k term of logits `x`, with the entries the softmax never sees (masked in `x`) as NaN."""
        found, term = self._term(x)
        if not found or term is None:
            return x
        keep = torch.isfinite(x) & (x.abs() < 1e30)
        return term.masked_fill(~keep, float("nan"))
