"""`FeatureLimit`: the µP feature-learning (infinite-width) limit of a traced torch.nn module."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from .._arrays import ArrayLike, as_inputs
from .._checks import integer, positive
from .._mup_limit import sgd_batches
from .memory import release
from .ops import analyse, own_layers, resolve_attention
from .program import Program
from .scaling import first_width, observe, same_width, widened, widths
from .trace import scope_output, trace_module

__all__ = ["FeatureLimit"]


class FeatureLimit:
    """The width → ∞ limit of `mt.parametrize(model, base=base)` trained by SGD, run by the master
    theorem on particles (Tensor Programs IV/V).

    Every width-sized vector is `particles` samples of the law of one coordinate, split into
    `groups` independent Monte Carlo replicas; expectations over the width are particle means
    within a group; predictions are the mean over groups, and their standard error the groups'
    spread / √groups. The µP constants (init variance, lr factor of each parameter) are read off
    the model and base as `mt.parametrize` and `mt.param_groups` set them, and checked to be
    width-independent in their scaled form. The readout's initial weights contribute Θ(n^-½) to f
    and nothing in the limit: f is exactly 0 at init (the Monte Carlo term E[Z^{x₀} a₀], zero in
    expectation, is subtracted as a control variate).

    Supported: nn.Linear (input d → n, hidden r·n → r'·n, readout n → k; biases), elementwise
    functions and modules, residual sums, scalar multiples, nn.LayerNorm / nn.RMSNorm over the
    width, and on sequences (N, T, d) self-attention (SDPA or written out, heads, masks, µP's 1/d
    logit scale as `mt.parametrize` measured it), reshapes into heads, pooling over positions;
    SGD with momentum (torch.optim.SGD semantics) or Adam (TP4b) on (1/B) Σ ½‖f − y‖². Anything
    else raises a ValueError naming the graph node (docs: limits/transformers.md). The finite networks it is the limit of are
    `mt.limits.finite.train_mup(make(width), base, x, y, steps, lr, batch_size, seed)`.

    Args:
        model: the plain module at width n (not parametrized: the limit parametrizes a copy).
        base: the same architecture at a base width n₀ < n (with real values: its init is the one
            µP scales). Without it (or with a base at the model's own width, `base=model`) the
            model is its own base: the limit of µP relative to `model` (at its width the µP
            network is `model` itself), its constants read off `model` (or that base) and a copy
            at twice its width whose entries follow the law of its own.
        particles: Monte Carlo particles in all, a multiple of `groups`.
        groups: independent replicas (≥ 2), for the standard error.
        seed: the Monte Carlo seed (also the minibatch order's).
        example_input: a few rows of the input fit and predict will get — (N, T, d) for a sequence
            model; the width dims are read from the model run on it at two widths (default: a (2, d)
            input for the first nn.Linear's d).

    Example:
        >>> lim = FeatureLimit(model, base=base, particles=2**14, groups=8)
        >>> lim.fit(x, y, steps=20, lr=0.1)          # doctest: +SKIP
        >>> f, se = lim.predict(x_test, return_error=True)  # doctest: +SKIP
    """

    def __init__(
        self,
        model: nn.Module,
        base: nn.Module | None = None,
        *,
        particles: int = 2**14,
        groups: int = 8,
        seed: int = 0,
        example_input: ArrayLike | None = None,
    ):
        if not isinstance(model, nn.Module) or not (base is None or isinstance(base, nn.Module)):
            raise TypeError("model (and base, if given) must be torch.nn.Module instances")
        self.groups = integer(groups, "groups", 2)
        particles = integer(particles, "particles", 2 * self.groups)
        if particles % self.groups:
            raise ValueError(f"particles must be a multiple of groups = {self.groups}, got {particles}")
        self.particles, self.seed = particles, int(seed)
        self._gm = trace_module(model)
        own = model if base is None or same_width(model, base) else None  # a base at the model's width: no base
        if own is not None:  # the model is its own base: µP relative to it, read off it and a copy at 2× its width
            self.width = self.base_width = first_width(self._gm)
            if base is not None:  # the laws are the base's (µP rescales the model's init to it)
                own = base
            other = widened(own, own_layers(self._gm, own, self.width), self.seed)
            pair = (self.width, 2 * self.width)
        else:
            assert base is not None
            self.width, self.base_width = widths(model, base)
            other, pair = base, (self.width, self.base_width)
        self._example = self._example_input(example_input)
        self._ops, roles = analyse(self._gm, trace_module(other), self._example, pair)
        unused = [name for name, _ in model.named_parameters() if name not in roles]
        if unused:
            raise ValueError(f"parameters {unused} are not used by a supported layer of the forward pass")
        if own is not None:
            self.laws, attention = observe(other, own, roles, self._example)
        else:
            assert base is not None
            self.laws, attention = observe(model, base, roles, self._example)
        resolve_attention(self._ops, attention)
        firsts = [op.module for op in self._ops if op.rule == "input"]
        outs = [op.module for op in self._ops if op.rule == "readout"]
        if not firsts or not outs:
            raise ValueError("the model needs an input layer (nn.Linear d → width) and a readout (width → k)")
        out_meta = self._ops[-1].node.args[0].meta["tensor_meta"]  # type: ignore[union-attr]
        self._out_features = math.prod(out_meta.shape[1:])  # outputs per row (positions × k without pooling)
        calls: dict[str, int] = {}  # vectors per input row each hidden matrix multiplies (positions × calls)
        for op in self._ops:
            if op.rule in ("hidden", "mha"):
                shape = op.node.args[0].meta["tensor_meta"].shape  # type: ignore[union-attr]
                for w in (
                    (op.params["weight"],)
                    if op.rule == "hidden"
                    else (op.params["in_proj_weight"], op.params["out_proj.weight"])
                ):
                    calls[w] = calls.get(w, 0) + math.prod(shape[1:-1])
        self._per_row = max(calls.values(), default=0)
        self._lr, self._momentum = 0.0, 0.0
        self._program = self._new_program()

    def _example_input(self, example: ArrayLike | None) -> torch.Tensor:
        """Two rows of the input the limit will get: `example_input`, else (2, d) for the first Linear's d."""
        if example is None:
            first = next(
                (
                    self._gm.get_submodule(str(nd.target))
                    for nd in self._gm.graph.nodes
                    if nd.op == "call_module" and isinstance(self._gm.get_submodule(str(nd.target)), nn.Linear)
                ),
                None,
            )
            if first is None:
                raise ValueError("FeatureLimit: the model calls no nn.Linear (an input layer d → width is needed)")
            g = torch.Generator().manual_seed(self.seed)
            return torch.randn(2, int(first.in_features), generator=g, dtype=torch.float64)  # type: ignore[arg-type]
        if isinstance(example, np.ndarray):
            example = torch.from_numpy(example)
        if not isinstance(example, torch.Tensor) or example.dim() < 2 or len(example) < 1:
            raise ValueError(
                "example_input must be a tensor of at least 2 dims, (N, d) or (N, T, d) for sequences, with N ≥ 1"
            )
        return example[:2].detach().to(torch.float64)

    def _inputs(self, x: ArrayLike, name: str) -> torch.Tensor:
        if isinstance(x, torch.Tensor) and x.dim() > 2:
            xt = x.detach().to(torch.float64)
        else:
            xt = as_inputs(x, name)
        if tuple(xt.shape[1:]) != tuple(self._example.shape[1:]):
            raise ValueError(
                f"{name} must have shape (N, {', '.join(str(d) for d in self._example.shape[1:])}) like the example "
                f"input the limit was built for, got {tuple(xt.shape)}; pass example_input= of that shape"
            )
        return xt

    def _new_program(self) -> Program:
        return Program(self._ops, self.laws, self.groups, self.particles // self.groups, self.width, self.seed)

    def fit(
        self,
        x: ArrayLike,
        y: ArrayLike,
        steps: int = 20,
        lr: float = 0.1,
        optimizer: str = "sgd",
        momentum: float = 0.0,
        batch_size: int | None = None,
        loss: str = "mse",
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        derivatives: str | None = None,
    ) -> FeatureLimit:
        """Train the limit from init: `steps` steps of SGD or Adam at base learning rate `lr`.

        Args:
            x: training inputs (N, d), or (N, T, d) for a sequence model.
            y: targets (N, k) or (N,) for one output (N × the model's outputs per input in all).
            steps: optimizer steps.
            lr: the base learning rate, as `mt.param_groups(model, lr, optimizer)` takes it.
            optimizer: "sgd" (torch.optim.SGD, with `momentum`) or "adam" (torch.optim.Adam with
                `betas` and `eps`; Tensor Programs IVb: a hidden matrix's update is Adam's entrywise
                function of its gradients' history, a nonlinear outer product — see docs).
            momentum: torch.optim.SGD's momentum (no dampening, no Nesterov).
            batch_size: minibatch size (None: full batch); the batch order is drawn from `seed`
                as `mt.limits.finite.sgd_batches` draws it.
            loss: "mse", (1/B) Σ ½‖f − y‖² as `mt.limits.finite.train_mup` trains the finite
                networks this is the limit of.
            betas: Adam's (β₁, β₂).
            eps: Adam's ε at base width (µP's ε of each parameter is read off `mt.param_groups`).
            derivatives: how the Ż terms' expectations E[∂Z/∂Ẑ] are taken: "autograd" (each
                particle's own derivative, by one reverse pass per vector: the most accurate for SGD's
                smooth programs; the default for SGD) or "stein" (Stein's lemma, E[Z ζ]/σ² as least
                squares on the Gaussian leaves: no autograd graph, far less time and memory, more
                Monte Carlo noise; the default — and the only right one — for Adam, whose first step
                sign(g) has a per-particle derivative of 0 and an expectation that is not).

        Returns:
            self.
        """
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam' (torch.optim's semantics), got {optimizer!r}")
        if loss != "mse":
            raise ValueError(f"loss={loss!r} is not supported; FeatureLimit trains on loss='mse'")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        if optimizer == "adam":
            if momentum:
                raise ValueError("momentum is an SGD setting; Adam's is betas=(β₁, β₂)")
            if len(tuple(betas)) != 2 or not all(0.0 <= b < 1.0 for b in betas):
                raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
            eps = positive(eps, "eps")
            errors = [law.adam_error for law in self.laws.values() if law.adam_error]
            if errors:
                raise ValueError(errors[0])
        derivatives = derivatives or ("stein" if optimizer == "adam" else "autograd")
        if derivatives not in ("autograd", "stein"):
            raise ValueError(f"derivatives must be 'autograd' or 'stein', got {derivatives!r}")
        if optimizer == "adam" and derivatives == "autograd":
            raise ValueError(
                "derivatives='autograd' cannot take Adam's limit: its first step sign(g) has a per-particle derivative "
                "of 0 while E[∂Z/∂Ẑ] is not 0 (a Dirac mass at g = 0); use derivatives='stein' (the default for Adam)"
            )
        steps = integer(steps, "steps", 0)
        lr = positive(lr, "lr")
        xt = self._inputs(x, "x")
        yt = torch.as_tensor(y, dtype=torch.float64)
        if yt.shape[0] != xt.shape[0]:
            raise ValueError(f"y has {yt.shape[0]} rows but x has {xt.shape[0]}")
        k = self._out_features
        if yt.numel() != xt.shape[0] * k:
            raise ValueError(
                f"y must hold {k} target(s) per input (the model's outputs per input), got shape {tuple(yt.shape)}"
            )
        per_group, batch = self.particles // self.groups, min(batch_size or len(xt), len(xt))
        seen = (len(xt) + steps * batch) * self._per_row
        if self._program.matrices and 2 * seen > per_group:
            each = f" × {self._per_row} vectors per input (positions × calls)" if self._per_row > 1 else ""
            raise ValueError(
                f"particles per group ({per_group}) must be at least twice the vectors each hidden matrix sees "
                f"(({len(xt)} inputs + {steps} steps × batch {batch}){each} = {seen}); use particles ≥ "
                f"{(2 * seen + 4 * self._per_row) * self.groups} (each input predicted at once needs "
                f"{4 * self._per_row} more per group)"
            )
        self._program = prog = self._new_program()
        if optimizer == "adam":
            prog.use_adam((float(betas[0]), float(betas[1])), eps)
        if derivatives == "stein":
            prog.use_stein()
        self._lr, self._momentum = lr, float(momentum)
        with torch.set_grad_enabled(prog.graph):
            _, raw = prog.forward(xt, "init", keep=set())
            for idx in sgd_batches(len(xt), steps, batch_size, self.seed):
                prog.train_step(xt[idx], yt[idx], lr, self._momentum, {k: v[:, idx] for k, v in raw.items()})
        return self

    def _run(self, x: ArrayLike, keep: set | None = None) -> dict:
        """Values of every node on x (of the nodes in `keep`) with the current state; the families forget x afterwards."""
        xt = self._inputs(x, "x")
        prog = self._program
        mats = list(prog.matrices.values())
        lengths = [(len(m.fwd), len(m.bwd)) for m in mats]
        try:
            with torch.set_grad_enabled(prog.graph):
                _, raw = prog.forward(xt, "init", keep=set())
                vals, _ = prog.forward(xt, "eval", self._lr, self._momentum, raw, keep)
        finally:
            for m, (a, b) in zip(mats, lengths, strict=True):
                m.fwd.truncate(a)
                m.bwd.truncate(b)
            release()
        return vals

    def predict(self, x: ArrayLike, return_error: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The limit's prediction at x: the mean over the Monte Carlo groups.

        Args:
            x: inputs (n, d), or (n, T, d) for a sequence model (the example input's shape).
            return_error: also return the Monte Carlo standard error (std over groups / √groups).

        Returns:
            f of the model's output shape ((n, k), (n,), (n, T, k) …), float64; with `return_error`, (f, se).
        """
        xt = self._inputs(x, "x")
        # each input adds two vectors (at init and now) to a hidden matrix's family for the call:
        # predict in chunks that fit on the particles (points in different chunks are not sampled
        # jointly, which leaves each point's prediction and standard error unchanged)
        held = max([m.fwd.size() for m in self._program.matrices.values()], default=0)
        per_row = max(self._per_row, 1)
        room = (self.particles // self.groups // 2 - held) // (2 * per_row) if self._program.matrices else len(xt)
        if room < 1:
            raise ValueError("no particles left for new inputs: raise particles (see fit)")
        node = self._ops[-1].node
        out = torch.cat([self._run(xt[i : i + room], {node})[node].detach() for i in range(0, len(xt), room)], dim=1)
        f = out.mean(0)
        if not return_error:
            return f
        return f, out.std(0) / math.sqrt(self.groups)

    def features(self, x: ArrayLike, layer: str) -> torch.Tensor:
        """The limit's feature kernel E[Z^{h(x)} Z^{h(x')}] at the output of module `layer`.

        Args:
            x: inputs (n, d), or (n, T, d) for a sequence model.
            layer: a qualified module name whose output is width-sized (e.g. "blocks.1", "2").

        Returns:
            float64, the mean over the Monte Carlo groups: (n, n), or (n, T, n, T) between the tokens of
            a sequence model (the output's dims other than the width, twice).
        """
        node = scope_output(self._gm.graph, layer)
        op = next(o for o in self._ops if o.node is node)
        if op.kind != "width" or op.wdim is None:
            raise ValueError(f"layer {layer!r}'s output is not width-sized; name a module before the readout")
        h = self._run(x)[node].detach().movedim(op.wdim + 1, -1)
        rows = h.shape[1:-1]
        h = h.reshape(h.shape[0], -1, h.shape[-1])
        k = (torch.einsum("gap,gbp->gab", h, h) / h.shape[-1]).mean(0)
        return k.reshape(*rows, *rows)
