"""The π-limit: the exact infinite-width limit of a deep relu MLP in µP, computed in finite memory
(Yang, Santacroce & Hu, ICLR 2022, "Efficient Computation of Deep Nonlinear Infinite-Width Neural
Networks that Learn Features").

The finite π-network (`PiNet`), width n, rank r, L ≥ 2 hidden layers, d inputs, k outputs. Every
hidden layer l owns a fixed random matrix Ωˡ ∈ ℝ^{n×r} with iid N(0, 1) entries; ω_α is row α.
Hidden preactivations are written at the scale n^{-1/2} (as in the authors' code) so that plain SGD
with one learning rate η on every matrix is µP (see "µP" below):

    h¹ = α_in W¹ x,   hˡ = Wˡ relu(hˡ⁻¹)  (2 ≤ l ≤ L),   f = α_out W^{L+1} relu(h^L),

initialised from an r-dimensional state (the same state the limit starts from, drawn from `seed`):

    W¹     = n^{-1/2} Ω¹ A_inᵀ                           A_in ∈ ℝ^{d×r}, columns of unit norm
    Wˡ     = n^{-1}  Ωˡ Aˡᵀ relu(Ωˡ⁻¹ Bˡᵀ)ᵀ               Aˡ, Bˡ ∈ ℝ^{r×r}: rows aᵢ ~ N(0, I/r), bᵢ unit
    W^{L+1} = 0                                            (readout zero, so f ≡ 0 at init)

and trained by *projected* SGD on (1/B) Σ_batch ½‖f − y‖²: the gradient of every hidden matrix
W¹ … W^L is projected onto the column span of its Ω before the step,

    Wˡ ← Wˡ − η · Πˡ ∇_{Wˡ}ℓ,   Πˡ = Ωˡ (ΩˡᵀΩˡ)⁻¹ Ωˡᵀ,      W^{L+1} ← W^{L+1} − η ∇ℓ (not projected)

(learning-rate multipliers η_in, η_out on W¹ and W^{L+1} are allowed; η_in = η_out = 1 by default).

Why the limit has a finite representation. Every update of Wˡ is Ωˡ·(something), and so is its
initial value, so hˡ(x) = n^{-1/2} Ωˡ gˡ(x) for an r-vector gˡ(x) at all times: neuron α of layer l
has preactivation ω_α·gˡ(x) (× n^{-1/2}). Write the hidden matrices as sums of rank-one terms

    Wˡ = n^{-1} Σᵢ (Ωˡ aᵢ) relu(Ωˡ⁻¹ bᵢ)ᵀ,      W^{L+1} = n^{-1/2} Σᵢ aᵢ relu(Ω^L bᵢ)ᵀ,

with unit bᵢ (relu is positively homogeneous, so a row's scale can sit in aᵢ). Then

    gˡ(x) = Σᵢ aᵢ · (1/n) Σ_α relu(ω_α·bᵢ) relu(ω_α·gˡ⁻¹(x))  →  Σᵢ aᵢ V(bᵢ, gˡ⁻¹(x)),

V(b, g) = E_{ω~N(0,I_r)}[relu(ω·b) relu(ω·g)], the arc-cosine V-transform of relu
(`get_activation("relu").phi_moment` with variances |b|², |g|² and covariance b·g), and likewise
f(x) → α_out Σᵢ aᵢ V(bᵢ, g^L(x)), g¹(x) = α_in A_inᵀ x. The state of the limit is A_in and, for each
layer l = 2 … L+1, the rows (aᵢ, bᵢ), Mₗ of them.

The update rule of the limit. Backprop through the finite net gives, for each example of the batch,
∂ℓ/∂hˡ = n^{-1/2} F(ω_α) coordinatewise; the projection replaces it by n^{-1/2} Ωˡ c with
c = (ΩᵀΩ)⁻¹ΩᵀF → E[ω F(ω)], and by Stein's lemma c is exactly the derivative of the limit's forward
map: c = ∂ℓ/∂gˡ, where g ↦ Σᵢ aᵢ V(bᵢ, g) is differentiated with

    ∇_g V(b, g) = E[ω relu(ω·b) 1(ω·g > 0)] = b · E[1(ω·b>0) 1(ω·g>0)] + g · E[relu(ω·b) δ(ω·g)]
               = b (π − θ)/(2π) + g |b| sin θ / (2π |g|),       cos θ = b·g / (|b||g|)

(the first factor is `get_activation("relu").dphi_moment`, the second is `relu_delta_moment` below).
With χ = α_out (f − y)/B per example, δ^{L+1} = χ and δˡ = Σᵢ (aᵢ·δˡ⁺¹) ∇_g V(bᵢ, gˡ) (= ∂ℓ/∂gˡ), one
SGD step of the finite net becomes, as n → ∞, for every example j of the batch:

    layer l = 2 … L+1: append the row  a = −η_l · s_j δˡ_j,   b = ḡˡ⁻¹_j      (s = |gˡ⁻¹(x_j)|, ḡ = g/s)
    layer 1:           A_in ← A_in − η_in α_in Σ_j x_j (δ¹_j)ᵀ

(η_l = η for hidden layers, η·η_out for the readout), all computed at the weights before the step.
The state grows by B rows per layer per step; nothing else is stored. The finite nets converge to
it at rate n^{-1/2} (the finite sums over n neurons and (ΩᵀΩ/n)⁻¹ − I are both O(n^{-1/2})).

µP. Rescale every hidden activation by √n (coordinates Θ(1)): W¹ then has Θ(1) entries and learning
rate η·n, the hidden matrices keep learning rate η, and the readout has learning rate η/n — µP's
SGD table (TP5, Table 3, with the π-init replacing the Gaussian init of the hidden matrices).
Biases and weight decay of the paper are not implemented.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from ._activations import get_activation
from ._arrays import ArrayLike, as_inputs, as_targets
from ._checks import integer, positive
from ._mup_limit import sgd_batches

__all__ = ["PiLimit", "PiNet", "pi_initial_state", "relu_delta_moment", "train_pi"]

_RELU = get_activation("relu")
# relu has closed forms of both moments
_relu_phi = cast(Callable[..., torch.Tensor], _RELU.phi_moment)
_relu_dphi = cast(Callable[..., torch.Tensor], _RELU.dphi_moment)
_TINY = 1e-150  # |g| floor: an all-zero representation gives V = 0 instead of 0/0


def relu_delta_moment(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """E[relu(ω·b) δ(ω·g)] for ω ~ N(0, I), |b| = 1, |g| = s, cos∠(b, g) = q: √(1 − q²) / (2π s)."""
    return torch.sqrt((1 - q * q).clamp_min(0)) / (2 * math.pi * s)


def _check_depth(depth) -> int:
    return integer(
        depth,
        "depth",
        2,
        " (the number of hidden layers of the π-net; for one hidden layer use "
        "MuPLimit, whose limit needs no finite rank)",
    )


def _check_batch(batch_size) -> None:
    if batch_size is not None:
        integer(batch_size, "batch_size", 1, " (or None for full batch)")


def pi_initial_state(d_in: int, depth: int, rank: int, seed: int = 0):
    """The r-dimensional initial state shared by `PiLimit(seed=...)` and `PiNet(seed=...)`:
    A_in (d_in × r, unit columns) and, for each layer l = 2 … depth, (Aˡ, Bˡ) (r × r each, rows of Aˡ
    ~ N(0, I/r), rows of Bˡ unit). The readout starts with no rows (f ≡ 0). float64."""
    g = torch.Generator().manual_seed(seed)
    a_in = torch.randn(d_in, rank, generator=g, dtype=torch.float64)
    a_in = a_in / a_in.norm(dim=0, keepdim=True)
    layers = []
    for _ in range(2, depth + 1):
        a = torch.randn(rank, rank, generator=g, dtype=torch.float64) / math.sqrt(rank)
        b = torch.randn(rank, rank, generator=g, dtype=torch.float64)
        layers.append((a, b / b.norm(dim=1, keepdim=True)))
    return a_in, layers


# ---------------------------------------------------------------------- the limit


class PiLimit:
    """The exact infinite-width limit of `PiNet` trained by `train_pi`: `fit(x, y, steps, lr)`, `predict(x)`.

    Args:
        depth: hidden layers L ≥ 2 (for one hidden layer use `MuPLimit`).
        rank: r, the rank of the π-init and of every update's finite representation.
        input_alpha: α_in, the multiplier on the first layer's output.
        output_alpha: α_out, the multiplier on f.
        seed: the seed of the π-init (`PiNet(..., seed=seed)` starts from the same state).

    Setting (see the module docstring for the derivation). A relu MLP with `depth` = L ≥ 2 hidden
    layers in µP; π-init of rank r = `rank` drawn from `seed` (`pi_initial_state`): unit-column
    first layer, hidden matrices n⁻¹ Ω Aᵀ relu(Ω' Bᵀ)ᵀ, readout zero (f ≡ 0 at init); multipliers
    α_in (`input_alpha`) on the first layer's output and α_out (`output_alpha`) on f; no biases.
    Loss (1/B) Σ_batch ½‖f(x) − y‖²; plain SGD (no momentum, no weight decay) with learning rate
    η = `lr` (times `input_lr_mult` on the first layer and `output_lr_mult` on the readout), the
    hidden matrices' gradients projected onto the span of their Ω (the π-projection); batches from
    `sgd_batches(len(x), steps, batch_size, batch_seed)`, the same as `train_pi`.

    State: `A_in` (d × r) and, per layer l = 2 … L+1, `A[l-2]` (Mₗ × r, readout Mₗ × k) and
    `B[l-2]` (Mₗ × r, unit rows); Mₗ = r + B·t for hidden layers and B·t for the readout after
    t steps. `fit` starts again from the seed's initial state each time (`steps=0`: the limit at init).

    Cost (float64, batch B, T steps, d = d_in, k outputs):
      memory  8·(d·r + (L−1)·2r² + T·B·((2L−1)·r + k)) bytes: B·((2L−1)·r + k) numbers a step;
      time    step t: O(L·B·(r + tB)·r) (B × Mₗ V-transforms and two B×Mₗ×r products per layer),
              O(L·r·B²·T²/2) for T steps; predict on m points O(L·m·(r + TB)·r).
    Measured (2-core CPU shared with another job, torch float64, x ~ N(0, I₆₄), input_alpha = 0.1,
    lr = 0.2): d = 64, r = 100, L = 3, 500 examples, B = 50, 100 steps: fit 12 s (last step 0.07 s),
    state 20.6 MB, predict on 500 points 0.9 s; r = 200, L = 2, full batch of 500, 20 steps: fit 19 s
    (last step 2.6 s), state 51.2 MB, predict 1.0 s.

    Scale: |g¹(x)| ≈ α_in·√r·|x|/√d and the representations grow with depth (|g¹|, |g²|, |g³| up to
    13, 22, 38 on these data with r = 100, α_in = 1), so large ranks need a small α_in or lr: with
    α_in = 1 and lr = 0.05 the limit above diverges within 6 steps.
    """

    def __init__(self, depth: int, rank: int, *, input_alpha: float = 1.0, output_alpha: float = 1.0, seed: int = 0):
        self.depth = _check_depth(depth)
        self.rank = integer(rank, "rank", 1, " (the rank r of the π-limit's finite representation)")
        self.input_alpha = positive(input_alpha, "input_alpha")
        self.output_alpha = positive(output_alpha, "output_alpha")
        self.seed = seed
        self._fitted = False
        self.A_in: torch.Tensor  # set by fit: the input layer's finite representation
        self.A: list[torch.Tensor]  # per layer, the a-vectors of its rows
        self.B: list[torch.Tensor]  # per layer, the b-vectors of its rows

    # ------------------------------------------------------------------ forward / backward

    def _forward(self, x: torch.Tensor):
        """f (m × k) and, per layer l = 1 … L, the representation gˡ, its norm s and direction ḡ."""
        g = self.input_alpha * (x @ self.A_in)
        saved = []
        for a, b in zip(self.A, self.B):
            s = g.norm(dim=1, keepdim=True).clamp_min(_TINY)
            gbar = g / s
            q = gbar @ b.T  # cos∠(bᵢ, g), (m × M)
            saved.append((g, s, gbar, q))
            g = _relu_phi(s.new_ones(()), s * s, s * q) @ a  # Σᵢ aᵢ V(bᵢ, g)
        return self.output_alpha * g, saved

    def _step(self, batch: torch.Tensor, lr: float, input_lr_mult: float, output_lr_mult: float) -> None:
        x, y = self.x[batch], self.y[batch]
        f, saved = self._forward(x)
        delta = self.output_alpha * (f - y) / len(batch)  # ∂ℓ/∂g^{L+1}
        new_rows = []
        for layer in range(self.depth - 1, -1, -1):  # readout first
            g, s, gbar, q = saved[layer]
            mult = lr * (output_lr_mult if layer == self.depth - 1 else 1.0)
            new_rows.append((-mult * s * delta, gbar))  # a = −η s δ, b = ḡ
            gamma = delta @ self.A[layer].T  # aᵢ·δ, (B × M)
            step_moment = _relu_dphi(s.new_ones(()), s * s, s * q)  # E[1(ω·b>0) 1(ω·g>0)]
            delta = (gamma * step_moment) @ self.B[layer] + (gamma * relu_delta_moment(q, s)).sum(
                1, keepdim=True
            ) * g  # Σᵢ (aᵢ·δ) ∇_g V(bᵢ, g)
        self.A_in = self.A_in - lr * input_lr_mult * self.input_alpha * (x.T @ delta)
        for layer, (a_new, b_new) in zip(range(self.depth - 1, -1, -1), new_rows):
            self.A[layer] = torch.cat([self.A[layer], a_new])
            self.B[layer] = torch.cat([self.B[layer], b_new])

    # ------------------------------------------------------------------ public API

    def fit(
        self,
        x: ArrayLike,
        y: ArrayLike,
        steps: int,
        lr: float,
        batch_size: int | None = None,
        batch_seed: int = 0,
        *,
        input_lr_mult: float = 1.0,
        output_lr_mult: float = 1.0,
    ) -> PiLimit:
        """Train the limit from its initial state by plain SGD.

        Args:
            x: training inputs (n, d).
            y: training targets (n,) or (n, k).
            steps: SGD steps (0: the limit at init).
            lr: the learning rate η.
            batch_size: minibatch size (None: full batch); batches from `sgd_batches`.
            batch_seed: the minibatches' seed.
            input_lr_mult: the first layer's lr multiplier.
            output_lr_mult: the readout's lr multiplier.

        Returns:
            self, fitted.
        """
        x = as_inputs(x, "x")
        y = as_targets(y, x.shape[0]).to(x.device)  # computed where x is
        integer(steps, "steps", 0)
        lr = positive(lr, "lr")
        input_lr_mult = positive(input_lr_mult, "input_lr_mult")
        output_lr_mult = positive(output_lr_mult, "output_lr_mult")
        _check_batch(batch_size)
        self.x, self.y, self.d_in, self.d_out = x, y, x.shape[1], y.shape[1]
        a_in, layers = pi_initial_state(self.d_in, self.depth, self.rank, self.seed)  # on the CPU, then moved
        dev = x.device
        self.A_in = a_in.to(dev)
        self.A = [a.to(dev) for a, _ in layers] + [torch.zeros(0, self.d_out, dtype=torch.float64, device=dev)]
        self.B = [b.to(dev) for _, b in layers] + [torch.zeros(0, self.rank, dtype=torch.float64, device=dev)]
        for step, batch in enumerate(sgd_batches(len(x), steps, batch_size, batch_seed, dev), start=1):
            self._step(batch, lr, input_lr_mult, output_lr_mult)
            if not all(bool(torch.isfinite(a[-len(batch) :]).all()) for a in self.A):
                raise ValueError(
                    f"the π-limit diverged at step {step} of {steps} (lr={lr}, input_alpha="
                    f"{self.input_alpha}, rank={self.rank}): its representations grow with the rank "
                    "and the depth, so lower lr or input_alpha"
                )
        self._fitted = True
        return self

    def _inputs(self, x: ArrayLike) -> torch.Tensor:
        if not self._fitted:
            raise ValueError("call fit(x, y, steps, lr) before predict (steps=0 gives the limit at init)")
        x = as_inputs(x, "x").to(self.x.device)  # where the fitted state is
        if x.shape[1] != self.d_in:
            raise ValueError(f"x has {x.shape[1]} features; the limit was fitted on {self.d_in}")
        return x

    def _chunks(self, x: torch.Tensor):
        rows = max(1, 4_000_000 // max(1, max(a.shape[0] for a in self.A)))
        return [x[i : i + rows] for i in range(0, len(x), rows)]

    def predict(self, x: ArrayLike) -> torch.Tensor:
        """The limit's prediction f(x).

        Args:
            x: inputs (m, d).

        Returns:
            f(x), float64: (m,) for one output, (m, k) for several.
        """
        x = self._inputs(x)
        out = torch.cat([self._forward(part)[0] for part in self._chunks(x)])
        return out[:, 0] if self.d_out == 1 else out

    def representations(self, x: ArrayLike) -> list[torch.Tensor]:
        """[g¹(x), …, g^L(x)], each (m × r): neuron α of hidden layer l of the finite net has
        preactivation n^{-1/2} ω_α·gˡ(x) in the limit."""
        x = self._inputs(x)
        parts = [[g for g, _, _, _ in self._forward(part)[1]] for part in self._chunks(x)]
        return [torch.cat([p[layer] for p in parts]) for layer in range(self.depth)]

    def feature_kernel(self, x1: ArrayLike, x2: ArrayLike | None = None, layer: int | None = None):
        """The post-activation kernel of hidden layer `layer` (1 … depth, default the last):
        V(gˡ(x1), gˡ(x2)) = lim relu(hˡ(x1))·relu(hˡ(x2)) of the finite π-net, (m1 × m2)."""
        layer = self.depth if layer is None else layer
        if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer <= self.depth:
            raise ValueError(f"layer must be an integer in 1 … {self.depth}, got {layer!r}")
        g1 = self.representations(x1)[layer - 1]
        g2 = g1 if x2 is None else self.representations(x2)[layer - 1]
        return _relu_phi((g1 * g1).sum(1)[:, None], (g2 * g2).sum(1)[None, :], g1 @ g2.T)

    @property
    def state_size(self) -> int:
        """Numbers held by the state (A_in, every A and B)."""
        return self.A_in.numel() + sum(a.numel() + b.numel() for a, b in zip(self.A, self.B))


# ---------------------------------------------------------------------- the finite π-net


class PiNet(nn.Module):
    """The finite π-network of width n = `width` (see the module docstring): `forward(x)` is (m, d_out).

    Its r-dimensional initial state comes from `seed` (the same as `PiLimit(seed=seed)`); the
    matrices Ω¹ … Ω^L (n × r, iid N(0, 1)) from `omega_seed` (None: torch's global generator).
    Train it with `train_pi`, which projects the hidden gradients. Needs width ≥ rank."""

    def __init__(
        self,
        d_in: int,
        width: int,
        depth: int,
        rank: int,
        d_out: int = 1,
        *,
        input_alpha: float = 1.0,
        output_alpha: float = 1.0,
        seed: int = 0,
        omega_seed: int | None = None,
        dtype: torch.dtype = torch.float64,
    ):
        super().__init__()
        depth = _check_depth(depth)
        integer(d_in, "d_in", 1)
        integer(d_out, "d_out", 1)
        rank = integer(rank, "rank", 1, " (the rank r of the π-net's projections)")
        integer(width, "width", rank, f" (width must be ≥ rank = {rank}, else ΩᵀΩ is singular)")
        self.d_in, self.width, self.depth, self.rank, self.d_out = d_in, width, depth, rank, d_out
        self.input_alpha = positive(input_alpha, "input_alpha")
        self.output_alpha = positive(output_alpha, "output_alpha")
        gen = torch.Generator().manual_seed(omega_seed) if omega_seed is not None else None
        omegas = [torch.randn(width, rank, generator=gen, dtype=torch.float64) for _ in range(depth)]
        a_in, layers = pi_initial_state(d_in, depth, rank, seed)
        weights = [width**-0.5 * omegas[0] @ a_in.T]
        for l, (a, b) in enumerate(layers, start=1):
            weights.append(omegas[l] @ a.T @ torch.relu(omegas[l - 1] @ b.T).T / width)
        weights.append(torch.zeros(d_out, width, dtype=torch.float64))
        self.weights = nn.ParameterList([nn.Parameter(w.to(dtype)) for w in weights])
        for l, om in enumerate(omegas):
            self.register_buffer(f"omega{l + 1}", om.to(dtype))
            self.register_buffer(f"gram_chol{l + 1}", torch.linalg.cholesky(om.T @ om).to(dtype))

    def project(self, layer: int, grad: torch.Tensor) -> torch.Tensor:
        """Πˡ grad = Ωˡ (ΩˡᵀΩˡ)⁻¹ Ωˡᵀ grad for hidden layer `layer` (1 … depth)."""
        om, chol = getattr(self, f"omega{layer}"), getattr(self, f"gram_chol{layer}")
        return om @ torch.cholesky_solve(om.T @ grad, chol)

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Post-activations relu(h¹), …, relu(h^L), each (m × n)."""
        h = self.input_alpha * x @ self.weights[0].T
        out = [torch.relu(h)]
        for w in self.weights[1 : self.depth]:
            out.append(torch.relu(out[-1] @ w.T))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_alpha * self.features(x)[-1] @ self.weights[-1].T


def train_pi(
    net: PiNet,
    x: ArrayLike,
    y: ArrayLike,
    steps: int,
    lr: float,
    batch_size: int | None = None,
    batch_seed: int = 0,
    *,
    input_lr_mult: float = 1.0,
    output_lr_mult: float = 1.0,
) -> PiNet:
    """Projected SGD on (1/B) Σ ½‖f − y‖² (in place; returns `net`): Wˡ ← Wˡ − η Πˡ∇ℓ for the hidden
    matrices (η·`input_lr_mult` for W¹), W^{L+1} ← W^{L+1} − η·`output_lr_mult`·∇ℓ; the batches
    of `sgd_batches`, the same as `PiLimit.fit`."""
    if not isinstance(net, PiNet):
        raise TypeError(f"net must be a PiNet, got {type(net).__name__}")
    x = as_inputs(x, "x")
    if x.shape[1] != net.d_in:
        raise ValueError(f"x has {x.shape[1]} features; the net takes d_in = {net.d_in}")
    y = as_targets(y, x.shape[0])
    if y.shape[1] != net.d_out:
        raise ValueError(f"y has {y.shape[1]} outputs per example; the net has d_out = {net.d_out}")
    integer(steps, "steps", 0)
    lr = positive(lr, "lr")
    input_lr_mult = positive(input_lr_mult, "input_lr_mult")
    output_lr_mult = positive(output_lr_mult, "output_lr_mult")
    _check_batch(batch_size)
    dtype, dev = net.weights[0].dtype, net.weights[0].device
    x, y = x.to(device=dev, dtype=dtype), y.to(device=dev, dtype=dtype)  # where the network is
    rates = [lr * input_lr_mult] + [lr] * (net.depth - 1) + [lr * output_lr_mult]
    for batch in sgd_batches(len(x), steps, batch_size, batch_seed, dev):
        loss = 0.5 * ((net(x[batch]) - y[batch]) ** 2).sum(1).mean()
        grads = torch.autograd.grad(loss, list(net.weights))
        with torch.no_grad():
            for layer, (w, grad, rate) in enumerate(zip(net.weights, grads, rates), start=1):
                if layer <= net.depth:
                    grad = net.project(layer, grad)
                w.sub_(rate * grad)
    return net
