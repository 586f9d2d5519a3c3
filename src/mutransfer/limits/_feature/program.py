"""The limit's forward and backward passes on particles, op by op (see `family` for the hidden
matrices and `scaling` for the constants).

Per-particle state: an input layer's rows u_α ∈ R^d and every width-sized bias or norm gain are
(G, P, …) tensors, updated exactly; the readout's a = n·W is (G, P, k) and f = E[Z^x a]; the
readout bias is (G, k). The backward pass is written as the program's own ops so that every
gradient vector stays a differentiable function of the Ẑ leaves: gradients are in n-scaled units
(ĝ = n·∂L/∂h, Θ(1)); elementwise ops by autograd with create_graph, LayerNorm / RMSNorm by their
VJP with the width means detached, hidden matrices by W_tᵀ (`family.HiddenMatrix.backward`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from .family import HiddenMatrix
from .memory import release
from .ops import Op
from .scaling import ParamLaw

__all__ = ["Program"]


def _e(a: torch.Tensor) -> torch.Tensor:
    """E[a] over the particles of each group (dim 1), detached, keeping the dim."""
    return a.detach().mean(1, keepdim=True)


class Program:
    """The state of the limit (G groups × P particles) and one pass of it."""

    def __init__(self, ops: list[Op], laws: dict[str, ParamLaw], groups: int, particles: int, seed: int):
        self.ops, self.laws, self.G, self.P = ops, laws, groups, particles
        self.gen = torch.Generator().manual_seed(seed)
        self.dtype = torch.float64
        self.params: dict[str, torch.Tensor] = {}
        self.initial: dict[str, torch.Tensor] = {}
        self.buffers: dict[str, torch.Tensor] = {}
        self.matrices: dict[str, HiddenMatrix] = {}
        for op in ops:
            for key, name in op.params.items():
                law = laws[name]
                if law.role == "hidden":
                    self.matrices[name] = HiddenMatrix(law.var, law.kappa, self.gen)
                    continue
                if law.role == "output_bias":
                    assert law.value is not None
                    value = law.value.to(self.dtype).expand(groups, -1).clone()
                else:
                    param = getattr(op.module, key)
                    shape = (groups, particles) + ((param.shape[1],) if param.dim() == 2 else ())
                    if law.role == "output":  # W is (k, n): a per particle is (k,)
                        shape = (groups, particles, param.shape[0])
                    value = law.sample(shape, self.gen, self.dtype)
                self.params[name] = value
                self.initial[name] = value
        self.step = 0

    # ------------------------------------------------------------------ forward

    def forward(
        self, x: torch.Tensor, mode: str, lr: float = 0.0, momentum: float = 0.0, control: dict | None = None
    ) -> tuple[dict[fx.Node, Any], dict[fx.Node, torch.Tensor]]:
        """Values of every node on inputs x (B, d): mode "init" (the network at init: Ẑ only, initial
        parameters), "train" or "eval" (current parameters). `control`: readout node → E[Z^{x₀} a₀]
        on the same inputs, subtracted from the readout (zero in expectation; see `limit`). Returns
        the values and, per readout node, its raw E[Z^x a] before bias and control."""
        vals: dict[fx.Node, Any] = {}
        raw: dict[fx.Node, torch.Tensor] = {}
        p = self.initial if mode == "init" else self.params
        for op in self.ops:
            node = op.node
            if op.rule == "placeholder":
                vals[node] = x
            elif op.rule == "output":
                vals[node] = vals[node.args[0]]  # type: ignore[index]
            elif op.rule in ("input", "hidden", "readout", "norm"):
                v = vals[node.args[0]]  # type: ignore[index]
                w = op.params.get("weight", "")
                b = p[op.params["bias"]] if "bias" in op.params else None
                if op.rule == "input":
                    out = torch.einsum("bd,gpd->gpb", v, p[w])
                elif op.rule == "hidden":
                    out = self.matrices[w].forward(v, self.step, lr, momentum, initial=mode == "init")
                elif op.rule == "readout":
                    with torch.no_grad():
                        r = torch.einsum("gpb,gpk->gbk", v, p[w]) / self.P
                    raw[node] = r
                    out = r - control[node] if control is not None else r
                    if b is not None:
                        out = out + b.unsqueeze(1)
                    out = out.detach().requires_grad_(mode == "train")
                    b = None
                else:
                    out = self._norm(op, v, p)
                vals[node] = out if b is None else out + b.unsqueeze(2)
            elif op.rule == "finite":
                args = [vals[a] for a in op.inputs]
                dims = tuple(0 if isinstance(a, torch.Tensor) else None for a in args)
                vals[node] = torch.func.vmap(op.fn, in_dims=dims, randomness="error")(*args)  # type: ignore[arg-type]
            else:
                assert op.fn is not None
                vals[node] = op.fn(*[vals[a] for a in op.inputs])
        return vals, raw

    def _norm(self, op: Op, v: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        m = op.module
        eps = getattr(m, "eps", None)
        eps = torch.finfo(self.dtype).eps if eps is None else float(eps)
        if type(m).__name__ == "LayerNorm":
            c = v - _e(v)
            s = (_e(c * c) + eps).sqrt()
        else:
            c = v
            s = (_e(v * v) + eps).sqrt()
        xhat = c / s
        return xhat * p[op.params["weight"]].unsqueeze(2) if "weight" in op.params else xhat

    # ------------------------------------------------------------------ backward and update

    def train_step(self, x: torch.Tensor, y: torch.Tensor, lr: float, momentum: float, control: dict) -> None:
        """One SGD step on the batch (x, y): loss (1/B) Σ ½‖f − y‖² per group."""
        vals, _ = self.forward(x, "train", lr, momentum, control)
        out_node = self.ops[-1].node
        out = vals[out_node]
        with torch.no_grad():
            chi = (out - y.to(out.dtype).reshape(out.shape[1:])) / x.shape[0]  # ∂L/∂f, per group
        readouts = [op for op in self.ops if op.rule == "readout"]
        leaves = [vals[op.node] for op in readouts]
        cot_f = torch.autograd.grad(out, leaves, chi, allow_unused=True)
        cot: dict[fx.Node, torch.Tensor] = {}
        grads: dict[str, torch.Tensor] = {}
        history: list[tuple[str, torch.Tensor, torch.Tensor]] = []

        def add(node: Any, g: torch.Tensor | None) -> None:
            if g is not None:
                cot[node] = cot[node] + g if node in cot else g

        for op, c in zip(readouts, cot_f, strict=True):
            if c is None:
                continue
            v = vals[op.node.args[0]]  # type: ignore[index]
            a = self.params[op.params["weight"]]
            add(op.node.args[0], torch.einsum("gpk,gbk->gpb", a, c))
            grads[op.params["weight"]] = torch.einsum("gpb,gbk->gpk", v, c)
            if "bias" in op.params:
                grads[op.params["bias"]] = c.sum(1)
        for op in reversed(self.ops):
            node = op.node
            if node not in cot or op.kind != "width":
                continue
            g = cot.pop(node)
            if "bias" in op.params and op.rule != "norm":
                grads[op.params["bias"]] = g.sum(2)
            if op.rule == "input":  # ĝ times what the layer reads (x after any op on the inputs: x * 8.0)
                grads[op.params["weight"]] = torch.einsum("gpb,bd->gpd", g, vals[node.args[0]])  # type: ignore[index]
            elif op.rule == "hidden":
                history.append((op.params["weight"], g, vals[node.args[0]]))  # type: ignore[index]
                add(node.args[0], self.matrices[op.params["weight"]].backward(g, self.step, lr, momentum))
            elif op.rule == "norm":
                add(node.args[0], self._norm_vjp(op, vals[node.args[0]], g, grads))  # type: ignore[index]
            elif op.rule == "elementwise":
                for src, ga in self._vjp(op, vals, g).items():
                    add(src, ga)
        self._update(grads, history, lr, momentum)

    def _vjp(self, op: Op, vals: dict[fx.Node, Any], g: torch.Tensor) -> dict[fx.Node, torch.Tensor | None]:
        """The cotangent of each width input node of an elementwise op (a node used twice: once, summed)."""
        nodes = list(dict.fromkeys(a for a in op.inputs if isinstance(vals[a], torch.Tensor) and vals[a].dim() == 3))
        if not nodes:
            return {}
        # recompute the op, inputs that depend on no leaf made local leaves, so that the VJP is a
        # differentiable function of the inputs and of the cotangent
        local = {a: vals[a] if vals[a].requires_grad else vals[a].detach().requires_grad_(True) for a in nodes}
        assert op.fn is not None
        out = op.fn(*[local.get(a, vals[a]) for a in op.inputs])
        gs = torch.autograd.grad(
            out, [local[a] for a in nodes], g, create_graph=True, retain_graph=True, allow_unused=True
        )
        return dict(zip(nodes, gs, strict=True))

    def _norm_vjp(self, op: Op, v: torch.Tensor, g: torch.Tensor, grads: dict[str, torch.Tensor]) -> torch.Tensor:
        m = op.module
        eps = getattr(m, "eps", None)
        eps = torch.finfo(self.dtype).eps if eps is None else float(eps)
        ln = type(m).__name__ == "LayerNorm"
        c = v - _e(v) if ln else v
        s = (_e(c * c) + eps).sqrt()
        xhat = c / s
        if "bias" in op.params:
            grads[op.params["bias"]] = g.sum(2)
        if "weight" in op.params:
            grads[op.params["weight"]] = (g * xhat).sum(2)
            g = g * self.params[op.params["weight"]].unsqueeze(2)
        dx = g - _e(g) if ln else g
        return (dx - xhat * _e(g * xhat)) / s

    def _update(self, grads: dict[str, torch.Tensor], history: list, lr: float, momentum: float) -> None:
        """torch.optim.SGD on the scaled gradients: b ← μb + g (b = g at the first step), p ← p − lr·κ·b."""
        for name, g in grads.items():
            law = self.laws[name]
            buf = g if name not in self.buffers or not momentum else momentum * self.buffers[name] + g
            self.buffers[name] = buf
            self.params[name] = self.params[name] - lr * law.kappa * buf
        for name, g, v in history:
            self.matrices[name].history.append((self.step, g, v))
        self.step += 1
        release()  # the step's freed temporaries: their pages back to the OS (see `memory`)
