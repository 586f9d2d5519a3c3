"""word2vec (skip-gram with negative sampling) and its exact µP limit (Tensor Programs IV, §word2vec).

The finite model of width n has word embeddings U ∈ R^{V×n} and context embeddings C ∈ R^{V×n},
every entry N(0, σ²) at init, and the logit of a (word w, context c) pair is

    s(w, c) = c_n · U_w · C_c,      c_n = 1/n (µP)  or  1/√n (NTK parametrization).

Loss (SGNS) on a batch of B positive pairs (wᵢ, cᵢ), each with K negative contexts c'ᵢₖ drawn from
the unigram distribution to the power ¾:

    L = (1/B) Σᵢ [ −log σ(s(wᵢ, cᵢ)) − Σₖ log σ(−s(wᵢ, c'ᵢₖ)) ].

Optimizer: plain SGD on U and C with learning rate η·n in µP (η in the NTK parametrization).

Derivation of the µP limit. Write G ∈ R^{V×V} for ∂L/∂s summed per (word, context) entry,
G_{wc} = (1/B) Σ_{pairs (w,c)} (σ(s) − 1[positive]). The SGD step is

    U_w ← U_w − η n · c_n Σ_c G_{wc} C_c = U_w − η Σ_c G_{wc} C_c,
    C_c ← C_c − η Σ_w G_{wc} U_w          (both from the old values),

so each coordinate α's state x_α = (U_{·α}, C_{·α}) ∈ R^{2V} moves by the same linear map,
x_α ← A x_α with A = [[I, −ηG], [−ηGᵀ, I]], and x_α = M_t x_α(0) with M_t = A_t ⋯ A_1. The logit
is an average over the n coordinates, s(w, c) = (1/n) Σ_α U_{wα} C_{cα}, and G depends on the
coordinates only through the logits; as n → ∞ the law of large numbers makes the logits
deterministic, G_t and M_t deterministic, and

    s_∞(w, c) = E[u_w v_c] = (M_t Σ₀ M_tᵀ)_{w, V+c},     Σ₀ = σ² I_{2V}.

Any matrix E_t with E_t E_tᵀ = M_t Σ₀ M_tᵀ represents the limit, and E_t = M_t E_0 with E_0 E_0ᵀ =
σ² I: take E_0 = σ I_{2V}, whose rows are the embeddings of a width-2V network U₀ = [σI, 0],
C₀ = [0, σI] with logits U_w · C_c (no 1/n) trained by SGD at learning rate η — the same step,
with the same G because its logits are exactly the limit's. `Word2VecLimit` runs that network in
float64 (cost per step ∝ B(K+1)·2V); `width` > 2V with a random orthonormal E_0 gives the same
limit (a check of exactness). The word–word kernel of the limit is E[u_w u_w'] = (E_t E_tᵀ)_{ww'}.

At finite width every quantity is an average over n i.i.d. coordinates, so the finite µP net
differs from the limit by O(n^{-1/2}).

The NTK limit (c_n = 1/√n, lr η) moves every embedding coordinate by O(1/√n): the embeddings stay
at their i.i.d. Gaussian init and their word–word kernel is σ² I — every pair of distinct words
has cosine similarity exactly 0, so any embedding-based evaluation is at chance
(`ntk_limit_similarity`).

Evaluation of the embeddings by the vocabulary's morphology: `_word2vec_eval`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ._checks import integer, positive

__all__ = [
    "SkipGram",
    "Word2VecLimit",
    "cosine_similarity",
    "ntk_limit_similarity",
    "skipgram_batches",
    "train_skipgram",
]

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _token_ids(tokens, vocab_size: int) -> torch.Tensor:
    if isinstance(tokens, (str, bytes)):
        raise TypeError("tokens must be a sequence of integer token ids (map words to ids first), got a string")
    t = torch.as_tensor(tokens if isinstance(tokens, torch.Tensor) else list(tokens))
    if t.ndim != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise TypeError(
            f"tokens must be a 1-D sequence of integer token ids, got dtype {t.dtype}, shape {tuple(t.shape)}"
        )
    t = t.long()
    if len(t) and (int(t.min()) < 0 or int(t.max()) >= vocab_size):
        raise ValueError(
            f"tokens must be ids in [0, vocab_size={vocab_size}), got range [{int(t.min())}, {int(t.max())}]"
        )
    return t


def skipgram_batches(
    tokens,
    vocab_size: int,
    *,
    epochs: int = 1,
    batch_size: int = 512,
    window: int = 2,
    negatives: int = 5,
    seed: int = 0,
    subsample: float | None = None,
    power: float = 0.75,
) -> list[Batch]:
    """The SGNS minibatches `(words, contexts, negative_contexts)` of shapes (B,), (B,), (B, K),
    a deterministic function of `seed`: made once and shared by the finite nets and the limit so
    that all of them see the same data order and the same negative samples.

    Every epoch: optional subsampling (a token with frequency f is kept with probability
    min(1, √(subsample/f)), drawn afresh per epoch), all (word, context) pairs within `window`
    positions on either side, shuffled and cut into batches of `batch_size` (the last one may be
    smaller); each pair gets `negatives` contexts drawn from the unigram distribution ^ `power`.
    """
    vocab_size = integer(vocab_size, "vocab_size")
    t = _token_ids(tokens, vocab_size)
    epochs = integer(epochs, "epochs")
    batch_size = integer(batch_size, "batch_size")
    window = integer(window, "window")
    negatives = integer(negatives, "negatives", 0)
    if subsample is not None:
        subsample = positive(subsample, "subsample")
    if len(t) <= 1:
        raise ValueError(f"tokens must hold at least 2 token ids to make (word, context) pairs, got {len(t)}")
    counts = torch.bincount(t, minlength=vocab_size).double()
    noise = counts ** positive(power, "power") if power != 0 else (counts > 0).double()
    noise = noise / noise.sum()
    freq = counts / counts.sum()
    g = torch.Generator().manual_seed(int(seed))
    out: list[Batch] = []
    for _ in range(epochs):
        seq = t
        if subsample is not None:
            keep_p = torch.clamp((subsample / freq[seq]).sqrt(), max=1.0)
            seq = seq[torch.rand(len(seq), generator=g, dtype=torch.float64) < keep_p]
        ws, cs = [], []
        for off in range(1, window + 1):
            if off >= len(seq):
                break
            ws += [seq[:-off], seq[off:]]
            cs += [seq[off:], seq[:-off]]
        if not ws:
            continue
        w, c = torch.cat(ws), torch.cat(cs)
        perm = torch.randperm(len(w), generator=g)
        w, c = w[perm], c[perm]
        neg = (
            torch.multinomial(noise, len(w) * negatives, replacement=True, generator=g).view(len(w), negatives)
            if negatives
            else torch.empty(len(w), 0, dtype=torch.long)
        )
        for s in range(0, len(w), batch_size):
            out.append((w[s : s + batch_size], c[s : s + batch_size], neg[s : s + batch_size]))
    return out


def _check_batches(batches, vocab_size: int) -> list[Batch]:
    if isinstance(batches, torch.Tensor) or not isinstance(batches, (list, tuple)):
        raise TypeError(
            "batches must be the list of (words, contexts, negatives) made by skipgram_batches, "
            f"got {type(batches).__name__}"
        )
    for i, b in enumerate(batches):
        if not (isinstance(b, (tuple, list)) and len(b) == 3 and all(isinstance(x, torch.Tensor) for x in b)):
            raise TypeError(
                f"batches[{i}] must be a (words, contexts, negatives) tuple of tensors as made by skipgram_batches"
            )
        w, c, n = b
        if w.ndim != 1 or c.shape != w.shape or n.ndim != 2 or n.shape[0] != w.shape[0]:
            raise ValueError(
                f"batches[{i}] has shapes {tuple(w.shape)}, {tuple(c.shape)}, {tuple(n.shape)}; "
                "expected (B,), (B,), (B, K)"
            )
        hi = max(int(x.max()) for x in b if x.numel()) if w.numel() else 0
        if hi >= vocab_size:
            raise ValueError(f"batches[{i}] holds token id {hi} ≥ the model's vocab_size {vocab_size}")
    return list(batches)


def _sgns_step(U: torch.Tensor, C: torch.Tensor, batch: Batch, scale: float, alpha: float) -> float:
    """One SGD step on the SGNS loss with logits scale·U_w·C_c; each row moves by −alpha·(∂L/∂s)·(the
    other row) (alpha = lr·scale), all from the old values. Returns the batch loss before the step."""
    w, c, neg = batch
    B = len(w)
    if B == 0:
        return 0.0
    ctx = torch.cat([c[:, None], neg], 1)  # (B, K+1): positive first
    uw, cx = U[w], C[ctx]  # (B, n), (B, K+1, n)
    s = scale * torch.bmm(cx, uw[:, :, None])[..., 0]  # (B, K+1)
    sign = torch.ones_like(s)
    sign[:, 0] = -1.0
    loss = float(nn.functional.softplus(sign * s).sum() / B)
    g = torch.sigmoid(s) / B  # ∂L/∂s: σ(s) − 1[positive]
    g[:, 0] -= 1.0 / B
    grad_u = torch.bmm(g[:, None], cx)[:, 0]  # (B, n) = Σ_k g C_ctx
    # Σ over the batch of g·U_w onto the context rows: a sparse (V × B) matrix times U_w
    idx = torch.stack([ctx.reshape(-1), torch.arange(B).repeat_interleave(ctx.shape[1])])
    grad_c = torch.sparse.mm(
        torch.sparse_coo_tensor(idx, g.reshape(-1), (C.shape[0], B), check_invariants=False).coalesce(), uw
    )
    U.index_add_(0, w, grad_u, alpha=-alpha)
    C.add_(grad_c, alpha=-alpha)
    return loss


def _logits(U: torch.Tensor, C: torch.Tensor, scale: float, w, c) -> torch.Tensor:
    """scale·U_w·C_c (float64) for index tensors w, c of one shape, or the full (V, V) matrix when both are None."""
    if w is None and c is None:
        return (scale * U @ C.T).double()
    if w is None or c is None:
        raise ValueError("give both w and c (index tensors of one shape) or neither for the full matrix")
    w, c = torch.as_tensor(w).long(), torch.as_tensor(c).long()
    return (scale * (U[w] * C[c]).sum(-1)).double()


def cosine_similarity(embeddings: torch.Tensor) -> torch.Tensor:
    """The (V, V) cosine-similarity matrix of the rows of `embeddings`, in float64."""
    e = torch.as_tensor(embeddings).detach().to(torch.float64)
    if e.ndim != 2:
        raise ValueError(f"embeddings must be a (V, dim) matrix, got shape {tuple(e.shape)}")
    e = e / e.norm(dim=1, keepdim=True).clamp_min(1e-300)
    return e @ e.T


class SkipGram(nn.Module):
    """A finite word2vec (SGNS) model: logits c_n · U_w · C_c with U, C ~ N(0, σ²) entrywise,
    c_n = 1/n for ``parametrization="mup"`` and 1/√n for ``"ntk"``. Train it with `train_skipgram`,
    which sets the parametrization's learning rate (η·n in µP, η in NTK)."""

    def __init__(
        self,
        vocab_size: int,
        width: int,
        parametrization: str = "mup",
        sigma: float = 1.0,
        dtype: torch.dtype = torch.float32,
        seed: int | None = None,
    ):
        super().__init__()
        vocab_size = integer(vocab_size, "vocab_size")
        width = integer(width, "width")
        if parametrization not in ("mup", "ntk"):
            raise ValueError(f"parametrization must be 'mup' or 'ntk', got {parametrization!r}")
        sigma = positive(sigma, "sigma")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        g = torch.Generator().manual_seed(int(seed)) if seed is not None else None
        self.U = nn.Parameter(
            sigma * torch.randn(vocab_size, width, generator=g, dtype=torch.float64).to(dtype), requires_grad=False
        )
        self.C = nn.Parameter(
            sigma * torch.randn(vocab_size, width, generator=g, dtype=torch.float64).to(dtype), requires_grad=False
        )
        self.vocab_size, self.width, self.sigma = vocab_size, width, sigma
        self.parametrization = parametrization
        self.scale = 1.0 / width if parametrization == "mup" else 1.0 / math.sqrt(width)

    def lr_multiplier(self) -> float:
        """The factor on η: n in µP, 1 in the NTK parametrization."""
        return float(self.width) if self.parametrization == "mup" else 1.0

    def logits(self, w=None, c=None) -> torch.Tensor:
        """s(w, c) for index tensors w, c of the same shape, or the full (V, V) matrix when both are None."""
        with torch.no_grad():
            return _logits(self.U, self.C, self.scale, w, c)

    forward = logits

    @property
    def embeddings(self) -> torch.Tensor:
        """The word embeddings U (V, n)."""
        return self.U.detach()

    def similarity(self) -> torch.Tensor:
        """Cosine similarity of the word embeddings, (V, V) float64."""
        return cosine_similarity(self.U)


def train_skipgram(model: SkipGram, batches: Sequence[Batch], lr: float) -> list[float]:
    """SGD on the SGNS loss over `batches` (from `skipgram_batches`) at learning rate η = `lr` times
    the parametrization's multiplier (n in µP, 1 in NTK), on U and C. Updates the model in place and
    returns the loss of every batch (before its step)."""
    if not isinstance(model, SkipGram):
        raise TypeError(f"model must be a SkipGram, got {type(model).__name__}")
    lr = positive(lr, "lr")
    batches = _check_batches(batches, model.vocab_size)
    alpha = lr * model.lr_multiplier() * model.scale
    with torch.no_grad():
        return [_sgns_step(model.U.data, model.C.data, b, model.scale, alpha) for b in batches]


class Word2VecLimit:
    """The exact infinite-width µP limit of `SkipGram(..., parametrization="mup", sigma)` trained by
    `train_skipgram(model, batches, lr)` (see the module docstring for the derivation).

    It is the width-`width` network (default 2V) with orthonormal-row init σ·E₀ — E₀ = I_{2V}
    (U₀ = [σI, 0], C₀ = [0, σI]) by default, or the first 2V rows of a random orthogonal matrix
    (seeded by `seed`) when `width` > 2V — and logits U_w·C_c without the 1/n, trained by SGD at
    learning rate η, in float64. Its logits are the limit's s_∞(w, c) = E[u_w v_c] and its
    `kernel()` the limit's E[u_w u_w'].

    Args:
        vocab_size: V, the number of token ids.
        sigma: σ, the std of every embedding entry at init.
        width: the representation's width, ≥ 2V (default 2V; wider gives the same limit).
        seed: the random orthonormal init's seed when `width` > 2V.
        dtype: the representation's dtype.
    """

    def __init__(
        self,
        vocab_size: int,
        sigma: float = 1.0,
        width: int | None = None,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ):
        self.vocab_size = integer(vocab_size, "vocab_size")
        self.sigma = positive(sigma, "sigma")
        V = self.vocab_size
        if width is None:
            width = 2 * V
        width = integer(width, "width")
        if width < 2 * V:
            raise ValueError(f"width must be ≥ 2·vocab_size = {2 * V} (the limit lives in R^(2V)), got {width}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.width, self.seed, self.dtype = width, seed, dtype
        self.losses: list[float] = []
        self._init()

    def _init(self) -> None:
        V, n = self.vocab_size, self.width
        if n == 2 * V:
            e0 = torch.eye(n, dtype=torch.float64)
        else:
            g = torch.Generator().manual_seed(int(self.seed))
            q, r = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
            e0 = (q * torch.sign(torch.diagonal(r)))[: 2 * V]
        e0 = (self.sigma * e0).to(self.dtype)
        self.U, self.C = e0[:V].clone(), e0[V:].clone()

    def fit(self, batches: Sequence[Batch], lr: float) -> Word2VecLimit:
        """Train from the init on all of `batches`; refitting restarts from the init.

        Args:
            batches: (words, contexts, negatives) batches from `skipgram_batches`.
            lr: η, the finite µP nets' η (their SGD lr is η·n).

        Returns:
            self, fitted.
        """
        lr = positive(lr, "lr")
        batches = _check_batches(batches, self.vocab_size)
        self._init()
        self.losses = [_sgns_step(self.U, self.C, b, 1.0, lr) for b in batches]
        return self

    def logits(self, w=None, c=None) -> torch.Tensor:
        """s_∞(w, c) = E[u_w v_c] for index tensors of one shape, or the full (V, V) matrix."""
        return _logits(self.U, self.C, 1.0, w, c)

    @property
    def embeddings(self) -> torch.Tensor:
        """A finite representation of the word embeddings (V, width): its Gram matrix is E[u_w u_w']."""
        return self.U

    def kernel(self) -> torch.Tensor:
        """The limit's word–word kernel.

        Returns:
            E[u_w u_w'], (V, V) float64.
        """
        return (self.U @ self.U.T).double()

    def similarity(self) -> torch.Tensor:
        """Cosine similarity of the limit's word embeddings, E[u_w u_w'] normalised, (V, V) float64."""
        return cosine_similarity(self.U)


def ntk_limit_similarity(vocab_size: int) -> torch.Tensor:
    """The NTK limit's word–word cosine similarity: the identity (its embeddings never move, and
    distinct words' i.i.d. Gaussian embeddings are orthogonal as n → ∞)."""
    return torch.eye(integer(vocab_size, "vocab_size"), dtype=torch.float64)
