"""One hidden matrix W₀ (n×n, entries of variance σ²/n) in the limit: the Gaussian families of
W₀x and of W₀ᵀg, the Ż corrections, and the low-rank updates ΔW of SGD.

Tensors are (G, P, B): G independent Monte Carlo groups of P particles, B vectors; E[·] is the
mean over the P particles of a group, and every E used in a value is detached, so particles stay
independent in the autograd graph and per-particle partial derivatives are plain gradients.

**Ẑ.** The vectors W₀ has multiplied span a space with an E-orthonormal basis q₁…q_K, and
ζ_j = Ẑ^{W₀ q_j} are independent N(0, σ²) per particle (autograd leaves). A new vector x splits
into its projection Σ c_j q_j (c_j = E[x q_j]) and a residual r; then Ẑ^{W₀x} = Σ c_j ζ_j + Ẑ^{W₀r}
with Ẑ^{W₀r} fresh: jointly Gaussian with covariance σ²E[x x'] over everything W₀ has seen, i.e.
the conditional law given the earlier ones. The residuals' E-orthonormal directions join the basis.

**Ż.** Ż^{W₀x} = σ² Σ_y Z^y E[∂Z^x/∂Ẑ^{W₀ᵀy}] over the W₀ᵀ family; in the basis (a linear change of
the family's variables) it is σ² Σ_j Z^{q_j} E[∂Z^x/∂ζ_j]. The partials are autograd gradients of
Σ_particles Z^x with respect to the other family's leaves, averaged per group.

**ΔW.** SGD's gradient of W at step s is Σ_i ĝ_{s,i} x_{s,i}ᵀ / n (ĝ = n·∂L/∂(Wx), Θ(1)); with
momentum μ the weights at step t are W₀ − lr·κ Σ_{s<t} m_{t,s} grad_s, m_{t,s} = Σ_{r=s}^{t−1} μ^{r−s}.
So ΔW_t v = −lr·κ Σ_s m_{t,s} Σ_i ĝ_{s,i} E[x_{s,i} v] and ΔW_tᵀ g = −lr·κ Σ_s m_{t,s} Σ_i x_{s,i} E[ĝ_{s,i} g]."""

from __future__ import annotations

import torch

from .adam import OTHER, NonlinearOuter

__all__ = ["Family", "HiddenMatrix", "mean", "partials", "stein"]


def mean(a: torch.Tensor, b: torch.Tensor, per: int | None = None) -> torch.Tensor:
    """(1/per) Σ_particles a_i b_j per group, detached: (G, P, I), (G, P, J) → (G, I, J). With `per`
    the particles of the model's width n (default: a's own), a dim of r·n coordinates held on r·per
    particles gives r·E — the finite network's (1/n) Σ over its r·n coordinates."""
    return torch.einsum("gpi,gpj->gij", a.detach(), b.detach()) / (per or a.shape[1])


def partials(z: torch.Tensor, leaves: list[torch.Tensor], per: int | None = None) -> torch.Tensor:
    """(1/per) Σ_particles ∂z_b/∂leaf_j per group (E[·] for leaves on `per` particles): z (G, P, B) a
    per-particle function of the leaves (G, P', k_i); returns (G, B, Σk_i), zeros where z does not
    depend on a leaf.

    One reverse pass per column b (particles are independent in the graph, so the gradient of
    Σ_particles z_b is every particle's own partial). Plain passes, not `is_grads_batched`: vmapping
    the columns through this graph was slower (a fit of 20 steps of batch 8 on 8192 particles: 17.5 s
    and 1.69 GB batched, 9.3 s and 1.23 GB plain)."""
    g, _, b = z.shape
    out = z.new_zeros(g, b, sum(leaf.shape[2] for leaf in leaves))
    if not leaves or not z.requires_grad:
        return out
    for col in range(b):
        grads = torch.autograd.grad(z[:, :, col].sum(), leaves, retain_graph=True, allow_unused=True)
        out[:, col] = torch.cat(
            [
                leaf.new_zeros(g, leaf.shape[2]) if gr is None else gr.sum(1) / (per or gr.shape[1])
                for gr, leaf in zip(grads, leaves, strict=True)
            ],
            dim=1,
        )
    return out


def stein(z: torch.Tensor, leaves: list[torch.Tensor], per: int) -> torch.Tensor:
    """`partials` by Stein's lemma: for i.i.d. Gaussian leaves E[∂z/∂ζ_j] = E[z ζ_j]/σ², estimated as
    the least-squares coefficients of z on the leaves per group (exact for the part of z linear in
    them, the rest Monte Carlo noise O(P^-½)). No autograd graph is needed, and it is right where
    per-particle derivatives are not: Adam's first step is sign(g), whose derivative is a Dirac mass
    at g = 0 — E[∂z/∂ζ] is finite, every particle's own derivative is 0."""
    g, _, b = z.shape
    if not leaves:
        return z.new_zeros(g, b, 0)
    zeta = leaves[0].detach() if len(leaves) == 1 else torch.cat([leaf.detach() for leaf in leaves], 2)
    zc = z.detach() - z.detach().mean(1, keepdim=True)
    gram = torch.einsum("gpk,gpl->gkl", zeta, zeta)
    coef = torch.linalg.solve(gram, torch.einsum("gpk,gpb->gkb", zeta, zc))  # (G, K, B)
    return coef.transpose(1, 2) * (zeta.shape[1] / per)


class Family:
    """The Gaussian family Ẑ^{Av} of one side A ∈ {W₀, W₀ᵀ} of a hidden matrix (see the module doc).

    The basis is kept twice: its values Q (detached, for the coefficients E[q v]) and, for the
    autograd graph, the vectors v₁…v_m the family was given (with their graphs) and the detached
    transform M with Q = [v₁…v_m]·M. A per-particle function of the basis (the Ż correction) then
    differentiates through the given vectors once, not through the Gram–Schmidt chain that built Q
    (a chain as long as the family: measured 40 % of a fit's time at 6 steps of batch 32)."""

    def __init__(self, sigma2: float, generator: torch.Generator, per: int, out: int, inp: int):
        # per: the particles of width n (E over a dim of r·n coordinates is (1/per)·Σ over its r·per
        # particles); out: the particles of the side this family's Ẑ lives on (the matrix's output
        # for W₀, its input for W₀ᵀ); inp: the particles of the vectors it is given
        self.sigma2, self.generator, self.per, self.out, self.inp = sigma2, generator, per, out, inp
        self.stein = False  # E[∂z/∂ζ] by Stein's lemma (`stein`) instead of per-particle autograd
        self.widths: list[int] = []  # the basis blocks' widths k_j
        self.basis: torch.Tensor | None = None  # E-orthonormal basis Q (G, P, Σk_j), values only, one buffer
        self.v: list[torch.Tensor] = []  # the vectors given to `sample`, with their autograd graph
        self.m: torch.Tensor | None = None  # (G, Σ|v_j|, Σk_j): Q = cat(v)·M, detached
        # leaves: Ẑ of each basis vector, N(0, σ²) per particle. With autograd the leaves themselves
        # (the partials are taken with respect to them); with Stein only the generator's state before
        # each block's draw and its shape, the block drawn again when needed (`leaves`): bit for bit
        # the same numbers, without holding them (half the family's memory)
        self.zeta: list[torch.Tensor] = []
        self.draws: list[tuple[torch.Tensor, tuple[int, int, int]]] = []

    @property
    def q(self) -> list[torch.Tensor]:
        """The basis blocks (views of `basis`)."""
        if self.basis is None:
            return []
        ends = [sum(self.widths[: j + 1]) for j in range(len(self.widths))]
        return [self.basis[:, :, e - k : e] for e, k in zip(ends, self.widths, strict=True)]

    def __len__(self) -> int:
        return len(self.widths)

    def size(self) -> int:
        """The number of basis vectors held."""
        return sum(self.widths)

    def leaves(self) -> torch.Tensor:
        """The leaves of every block, (G, P_out, Σk_j): with Stein drawn again from each block's
        saved generator state (the same numbers as when the block was sampled)."""
        if not self.stein:
            return torch.cat(self.zeta, 2)
        assert self.basis is not None
        g, _, _ = self.basis.shape
        out = torch.empty(g, self.out, self.size(), dtype=self.basis.dtype)
        gen, at = torch.Generator(), 0
        for state, shape in self.draws:
            gen.set_state(state)
            out[:, :, at : at + shape[2]] = torch.randn(shape, generator=gen, dtype=out.dtype)
            at += shape[2]
        return (out.mul_(self.sigma2**0.5)).to(self.basis.device)

    def truncate(self, length: int) -> None:
        """Forget what was added after the family had `length` blocks (a prediction's temporary vectors)."""
        if length < len(self.widths):
            del self.widths[length:]
            keep = self.size()
            self.basis = self.basis[:, :, :keep].clone() if self.basis is not None and keep else None
        del self.zeta[length:], self.draws[length:], self.v[length:]
        if self.m is not None:
            self.m = self.m[:, : sum(v.shape[2] for v in self.v), : self.size()] if self.v else None

    def sample(self, v: torch.Tensor) -> torch.Tensor:
        """Ẑ^{Av} (G, P, B), jointly Gaussian with everything this family holds; v's new directions join it."""
        held = self.size()
        if 2 * (held + v.shape[2]) > v.shape[1]:
            raise ValueError(
                f"particles per group ({v.shape[1]}) must be at least twice the vectors one hidden matrix has "
                f"seen ({held + v.shape[2]}: inputs + steps × batch + predicted inputs), or its Gaussian family "
                "cannot be represented on them; raise particles (or lower groups)"
            )
        g, _, b = v.shape
        r = v.detach()
        coef = v.new_zeros(g, held, b)
        if self.basis is not None:
            q = self.basis
            for _ in range(2):  # Gram–Schmidt twice: orthogonal to float precision
                c = mean(q, r, self.per)
                r = r - torch.einsum("gpk,gkb->gpb", q, c)
                coef = coef + c
            z = torch.einsum("gpk,gkb->gpb", self.leaves(), coef)
            del q
        else:
            z = v.new_zeros(g, self.out, b)
        gram = mean(r, r, self.per)
        gram = (gram + gram.transpose(1, 2)) / 2
        lam, u = torch.linalg.eigh(gram)  # (G, B), (G, B, B)
        # a direction counts if it holds more than 1e-10 of the given vectors' own size: measured
        # against the residual's largest eigenvalue instead, a block that the family already spans
        # (pure rounding left) kept its noise, normalized by 1/√λ ≈ 1e16, and V·M lost Q
        scale = torch.einsum("gpb,gpb->gb", v.detach(), v.detach()).amax(1, keepdim=True) / self.per
        keep = lam > 1e-10 * scale.clamp_min(1e-300)
        root = torch.where(keep, lam.clamp_min(0).sqrt(), torch.zeros_like(lam))
        inv = torch.where(keep, 1.0 / root.clamp_min(1e-300), torch.zeros_like(lam))
        t = u * inv.unsqueeze(1)  # (G, B, B): q_new = r·t, r = v − Q·coef = v − cat(v)·M·coef
        new = torch.einsum("gpb,gbk->gpk", r, t)
        del r
        self.basis = new if self.basis is None else torch.cat([self.basis, new], 2)  # one buffer: no copy per call
        self.widths.append(b)
        del new
        if not self.stein:  # the autograd path differentiates Q through the given vectors (see the class doc)
            rows = sum(w.shape[2] for w in self.v)
            m = v.new_zeros(g, rows + b, held + b)
            if self.m is not None:
                m[:, :rows, :held] = self.m
                m[:, :rows, held:] = -torch.einsum("gik,gkb,gbj->gij", self.m, coef, t)
            m[:, rows:, held:] = t
            self.m = m
            self.v.append(v)
        if self.stein:
            self.draws.append((self.generator.get_state(), (g, self.out, b)))
        xi = torch.randn((g, self.out, b), generator=self.generator, dtype=v.dtype).to(v.device)
        leaf = (xi * self.sigma2**0.5).requires_grad_(not self.stein)
        if not self.stein:
            self.zeta.append(leaf)
        # r = Q_new · (diag(root) uᵀ) on the kept directions
        return z + torch.einsum("gpk,gk,gbk->gpb", leaf, root, u)

    def correction(self, z: torch.Tensor) -> torch.Tensor:
        """Ż of the other side on z: σ² Σ_j q_j E[∂z/∂ζ_j] over this family's basis and leaves (this
        family is W₀ᵀ's for Ż^{W₀x}, W₀'s for Ż^{W₀ᵀg}), q_j differentiable through the given vectors."""
        if self.basis is None:
            return z.new_zeros(z.shape[0], self.inp, z.shape[2])
        if self.stein:  # no graph to keep: the basis itself (the given vectors are not stored)
            d = stein(z, [self.leaves()], self.per)
            return self.sigma2 * torch.einsum("gpk,gbk->gpb", self.basis, d)
        assert self.m is not None
        d = partials(z, self.zeta, self.per)
        return self.sigma2 * torch.einsum("gpi,gib->gpb", torch.cat(self.v, 2), self.m @ d.transpose(1, 2))


class HiddenMatrix:
    """A width × width nn.Linear's weight in the limit: both families and the SGD history."""

    def __init__(self, sigma2: float, kappa: float, generator: torch.Generator, per: int, shape: tuple[int, int]):
        # shape: (out, in) particles (r_out·per, r_in·per for a weight of r_out·n × r_in·n)
        self.kappa, self.per = kappa, per
        self.adam: tuple[tuple[float, float], float, float] | None = None  # (betas, ε̃, κ̃) when trained by Adam
        self.fwd = Family(sigma2, generator, per, shape[0], shape[1])
        self.bwd = Family(sigma2, generator, per, shape[1], shape[0])
        self.history: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (step, ĝ, x)

    def _adam_delta(self, v: torch.Tensor, step: int, lr: float, transpose: bool) -> torch.Tensor:
        """ΔW_t v (or ΔW_tᵀ g) under Adam: the nonlinear outer product of `adam` (see there). A matrix
        called more than once in a step (shared weights) has one gradient for the step: its calls'
        vectors are concatenated (γ = Σ over all of them)."""
        assert self.adam is not None
        steps: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for s, g, x in self.history:
            if s < step:
                steps.setdefault(s, []).append((g, x))
        if not steps:
            return self._zeros(v, transpose)
        betas, eps, kappa = self.adam
        own_parts, other_parts, lengths = [], [], []
        for _, calls in sorted(steps.items()):
            for g, x in calls:
                own_parts.append(x if transpose else g)  # the side whose particles we return
                other_parts.append((g if transpose else x).detach())
            lengths.append(sum(g.shape[2] for g, _ in calls))
        own, other = torch.cat(own_parts, 2), torch.cat(other_parts, 2)
        j = min(other.shape[1], OTHER)  # the expectation over the other side's particles, on the first j
        scale = -lr * kappa * other.shape[1] / (self.per * j)
        return NonlinearOuter.apply(own, other[:, :j], v.detach()[:, :j], lengths, betas, eps, scale)

    def _zeros(self, v: torch.Tensor, transpose: bool) -> torch.Tensor:
        """Zeros on the particles of the side W_t v (W_tᵀ g) lives on."""
        return v.new_zeros(v.shape[0], self.bwd.out if transpose else self.fwd.out, v.shape[2])

    def _delta(self, v: torch.Tensor, step: int, lr: float, momentum: float, transpose: bool) -> torch.Tensor:
        """ΔW_t v (or ΔW_tᵀ g), a sum over the past steps with the factor −lr·κ·m_{t,s} folded into
        the detached coefficients E[·]: one product and one add per step in the autograd graph, whose
        backward passes the gradient on without computing (the Ż partials run back through it once
        per column of every later batch; a scaled subtraction cost two more passes over the particles)."""
        if self.adam is not None:
            return self._adam_delta(v, step, lr, transpose)
        out = None
        for s, g, x in self.history:
            if s >= step:
                continue
            m = sum(momentum**k for k in range(step - s))
            a, b = (g, x) if transpose else (x, g)  # ΔWᵀg: x E[ĝ g]; ΔW v: ĝ E[x v]
            term = torch.einsum("gpi,gij->gpj", b, mean(a, v, self.per) * (-lr * self.kappa * m))
            out = term if out is None else out + term
        return self._zeros(v, transpose) if out is None else out

    def forward(self, v: torch.Tensor, step: int, lr: float, momentum: float, initial: bool = False) -> torch.Tensor:
        """W_t v: Ẑ + Ż + ΔW_t v (only Ẑ for the network at init)."""
        z = self.fwd.sample(v)
        if initial:
            return z
        return z + self.bwd.correction(v) + self._delta(v, step, lr, momentum, transpose=False)

    def backward(self, g: torch.Tensor, step: int, lr: float, momentum: float) -> torch.Tensor:
        """W_tᵀ g: Ẑ + Ż + ΔW_tᵀ g."""
        z = self.bwd.sample(g)
        return z + self.fwd.correction(g) + self._delta(g, step, lr, momentum, transpose=True)
