"""Finite networks → their infinite-width limits: the RMS gap at growing widths and its fitted slope.

One run, one table, for every feature-learning limit of `mt.limits` (theory: slope −½):
- the π-limit (`PiLimit`) of 2- and 3-hidden-layer relu MLPs against finite π-nets (`PiNet` +
  `train_pi`), widths 256 … 8192, minibatch SGD;
- the µP limit of a 1-hidden-layer tanh net under Adam (TP4b) and under SGD with momentum
  (`MuPLimit`) against `train_finite`, widths 256 … 16384;
- word2vec's µP limit (`Word2VecLimit`) against finite µP skip-gram nets on a small random corpus,
  widths 256 … 4096 (logits);
- the limit of a traced module (`FeatureLimit`, no closed form) against the finite µP networks
  of the same module (`mt.limits.finite.train_mup`: `mt.parametrize` + SGD on `mt.param_groups`),
  widths 256 … 4096 × 16 seeds, full-batch SGD: a 2-hidden-layer tanh MLP with LayerNorm, a residual MLP (2 blocks x + W₂ tanh(W₁ LN(x))) and a 3-hidden-layer
  relu MLP without norms (two hidden matrices in a row), a causal self-attention block on sequences of 4
  positions (SDPA, 2 heads, µP's 1/d logits), and the LayerNorm MLP under Adam (TP4b); below the table,
  how far the seed mean at the widest is from the limit, in combined standard errors.
The gap is the RMS over seeds and evaluation points of f_width − f_∞; the limits of the
1-hidden-layer nets are exact (quadrature) or Monte Carlo with a standard error far below the gaps.

    .venv/bin/python benchmarks/limits_convergence.py          # 255 s on a 2-core CPU (measured)
    .venv/bin/python benchmarks/limits_convergence.py --quick  # 23 s (measured, shared CPU)

--quick: the same steps at small widths (64, 256, 1024; FeatureLimit 256, 1024) with 8 seeds each, so
that its slopes still estimate −½ (tests/test_scripts.py checks them); its attention row takes Ż's
expectations by Stein's lemma (`derivatives="stein"`, 2^15 particles) instead of autograd.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

from mutransfer import limits as L


def data(n: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    return x, torch.sin(2 * x[:, 0]) + x[:, 1], torch.randn(16, d, generator=g, dtype=torch.float64)


def rms_gap(preds, limit) -> float:
    return math.sqrt(sum(float(((p - limit) ** 2).mean()) for p in preds) / len(preds))


def pi_case(depth: int, widths, seeds: int, steps: int):
    x, y, xe = data(32, 8, 0)
    fit = dict(steps=steps, lr=0.5, batch_size=8)
    limit = L.PiLimit(depth, 8, seed=1).fit(x, y, **fit).predict(xe)
    gaps = []
    for width in widths:
        preds = []
        for s in range(seeds):
            net = L.finite.train_pi(
                L.finite.PiNet(8, width, depth, 8, seed=1, omega_seed=1000 * width + s), x, y, **fit
            )
            with torch.no_grad():
                preds.append(net(xe)[:, 0])
        gaps.append(rms_gap(preds, limit))
    return gaps, float(limit.pow(2).mean().sqrt())


def one_layer_case(widths, seeds: int, steps: int, samples: int, **opt):
    x, y, xe = data(16, 8, 0)
    lr = 0.02 if opt.get("optimizer") == "adam" else 0.05
    limit = L.MuPLimit("tanh", method="monte_carlo", samples=samples, **opt).fit(x, y, steps, lr).predict(xe)
    gaps = []
    for width in widths:
        preds = []
        for s in range(seeds):
            torch.manual_seed(s)
            net = L.finite.train_finite(L.finite.OneHiddenLayer(8, width, activation="tanh"), x, y, steps, lr, **opt)
            with torch.no_grad():
                preds.append(net(xe)[:, 0])
        gaps.append(rms_gap(preds, limit))
    return gaps, float(limit.pow(2).mean().sqrt())


def word2vec_case(widths, seeds: int):
    vocab = 40
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (3000,), generator=g)
    batches = L.word2vec.skipgram_batches(tokens, vocab, epochs=1, batch_size=256, window=2, negatives=3, seed=0)
    limit = L.Word2VecLimit(vocab).fit(batches, lr=2.0).logits()
    gaps = []
    for width in widths:
        preds = []
        for s in range(seeds):
            net = L.word2vec.SkipGram(vocab, width, dtype=torch.float64, seed=s)
            L.word2vec.train_skipgram(net, batches, lr=2.0)
            with torch.no_grad():
                preds.append(net.logits())
        gaps.append(rms_gap(preds, limit))
    return gaps, float(limit.pow(2).mean().sqrt())


FEATURE_LN = "FeatureLimit, 2-hidden-layer tanh MLP with LayerNorm (5 SGD steps)"
FEATURE_RES = "FeatureLimit, residual MLP, 2 blocks x + W2 tanh(W1 LN(x)) (4 SGD steps)"
FEATURE_RELU = "FeatureLimit, 3-hidden-layer relu MLP, no norm (5 SGD steps at lr 0.5)"
FEATURE_ATTN = "FeatureLimit, one causal self-attention block (2 heads, 4 positions, mean pool; 4 SGD steps)"
FEATURE_ADAM = "FeatureLimit, 2-hidden-layer tanh MLP with LayerNorm, Adam (5 steps at lr 0.02)"


def ln_mlp(n: int, d: int = 4) -> nn.Module:
    """The 2-hidden-layer tanh MLP with LayerNorm (also benchmarks/feature_limit_cost.py's, d = 8)."""
    return nn.Sequential(
        nn.Linear(d, n),
        nn.LayerNorm(n),
        nn.Tanh(),
        nn.Linear(n, n),
        nn.LayerNorm(n),
        nn.Tanh(),
        nn.Linear(n, 1, bias=False),
    ).double()


def deep_relu(n: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(4, n), nn.ReLU(), nn.Linear(n, n), nn.ReLU(), nn.Linear(n, n), nn.ReLU(), nn.Linear(n, 1, bias=False)
    ).double()


class _Block(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(n), nn.Linear(n, n), nn.Linear(n, n)

    def forward(self, h):
        return h + self.down(torch.tanh(self.up(self.norm(h))))


class ResMLP(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.inp, self.out = nn.Linear(4, n), nn.Linear(n, 1, bias=False)
        self.blocks = nn.ModuleList([_Block(n) for _ in range(2)])

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


class AttentionBlock(nn.Module):
    """One pre-norm transformer block on sequences (N, T, d): token embedding, LayerNorm, causal
    multi-head self-attention (SDPA, or q·kᵀ → softmax → ·v written out), a residual, LayerNorm, tanh,
    pooled over positions (mean, or the first token), readout."""

    def __init__(
        self,
        n: int,
        d: int = 4,
        heads: int = 2,
        k: int = 1,
        written: bool = False,
        pool: str = "mean",
        positions: int = 4,
    ):
        super().__init__()
        self.n_head, self.head_dim, self.written, self.pool = heads, n // heads, written, pool
        self.inp, self.ln1, self.ln2 = nn.Linear(d, n), nn.LayerNorm(n), nn.LayerNorm(n)
        self.q, self.k, self.v, self.o = (nn.Linear(n, n, bias=False) for _ in range(4))
        self.out = nn.Linear(n, k, bias=False)
        self.register_buffer("mask", torch.ones(positions, positions, dtype=torch.bool).tril())  # causal

    def forward(self, x):
        h = self.inp(x)
        a = self.ln1(h)
        b, t, c = a.shape
        q, k, v = (m(a).view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for m in (self.q, self.k, self.v))
        if self.written:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            att = att.masked_fill(~self.mask, float("-inf"))
            y = att.softmax(dim=-1) @ v
        else:
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.o(y.transpose(1, 2).reshape(b, t, c))
        h = torch.tanh(self.ln2(h))
        return self.out(h.mean(1) if self.pool == "mean" else h[:, 0])


def attention_block(n: int, **kw) -> nn.Module:
    return AttentionBlock(n, **kw).double()


def sequence_data(n: int, t: int, d: int, seed: int):
    """Sequences (n, t, d) with a target that needs the positions mixed (the mean over the causal
    prefix of feature 0, squashed, plus the last token's feature 1), standardised; 8 test sequences."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n + 8, t, d, generator=g, dtype=torch.float64)
    y = torch.sin(2 * x[:, :, 0].mean(1)) + x[:, -1, 1]
    y = (y - y[:n].mean()) / y[:n].std()
    return x[:n], y[:n], x[n:]


Z_AT_WIDEST: dict[str, float] = {}  # FeatureLimit rows: |seed mean − limit| at the widest, in standard errors


def feature_case(
    name: str,
    make,
    widths,
    seeds: int,
    steps: int,
    particles: int,
    lr: float = 0.1,
    sequences: bool = False,
    optimizer: str = "sgd",
    derivatives: str | None = None,
):
    if sequences:
        x, y, xe = sequence_data(8, 4, 4, 0)
    else:
        x, y, xe = data(8, 4, 0)
        y = y / y.std()
    torch.manual_seed(0)
    base = make(16)
    lim = L.FeatureLimit(make(widths[0]), base=base, particles=particles, groups=8, seed=1, example_input=x)
    fit = dict(steps=steps, lr=lr, optimizer=optimizer, derivatives=derivatives)
    limit, se = lim.fit(x, y, **fit).predict(xe, return_error=True)
    limit, se = limit[:, 0], se[:, 0]
    gaps = []
    for width in widths:
        preds = []
        for s in range(seeds):
            torch.manual_seed(100 + s)
            net = L.finite.train_mup(make(width), base, x, y, steps, lr, optimizer=optimizer)  # full batch
            with torch.no_grad():
                preds.append(net(xe)[:, 0])
        gaps.append(rms_gap(preds, limit))
    f = torch.stack(preds)
    if seeds > 1:
        noise = (f.var(0) / seeds + se**2).sqrt()
        Z_AT_WIDEST[name] = float(((f.mean(0) - limit).abs() / noise).max())
    return gaps, float(limit.pow(2).mean().sqrt())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument(
        "--quick", action="store_true", help="small widths, 8 seeds (a smoke test whose slopes still mean something)"
    )
    ap.add_argument("--only", default="", help="run only the rows whose name contains this text")
    args = ap.parse_args(argv)
    pi_widths = [256, 1024, 4096, 8192] if not args.quick else [64, 256, 1024]
    one_widths = [256, 1024, 4096, 16384] if not args.quick else [64, 256, 1024]
    w2v_widths = [256, 1024, 4096] if not args.quick else [64, 256, 1024]
    seeds = 8 if args.quick else args.seeds
    samples = 2**16 if args.quick else 2**18  # Monte Carlo neurons of the 1-hidden-layer limits
    feature_widths = [256, 1024, 4096] if not args.quick else [256, 1024]
    feature_seeds, particles = (8, 2**13) if args.quick else (16, 2**15)
    cases = [
        (
            "π-limit, 2 hidden layers (rank 8, 20 steps of batch 8)",
            pi_widths,
            lambda: pi_case(2, pi_widths, seeds, 20),
        ),
        (
            "π-limit, 3 hidden layers (rank 8, 20 steps of batch 8)",
            pi_widths,
            lambda: pi_case(3, pi_widths, seeds, 20),
        ),
        (
            "µP limit, 1 hidden layer, Adam (40 steps)",
            one_widths,
            lambda: one_layer_case(one_widths, seeds, 40, samples, optimizer="adam"),
        ),
        (
            "µP limit, 1 hidden layer, SGD + Nesterov momentum 0.9 (40 steps)",
            one_widths,
            lambda: one_layer_case(one_widths, seeds, 40, samples, momentum=0.9, nesterov=True),
        ),
        ("word2vec µP limit (logits; V = 40, 1 epoch)", w2v_widths, lambda: word2vec_case(w2v_widths, seeds)),
        (
            FEATURE_LN,
            feature_widths,
            lambda: feature_case(FEATURE_LN, ln_mlp, feature_widths, feature_seeds, 5, particles),
        ),
        (
            FEATURE_RES,
            feature_widths,
            lambda: feature_case(
                FEATURE_RES,
                lambda n: ResMLP(n).double(),
                feature_widths,
                feature_seeds,
                4,
                particles,
            ),
        ),
        (
            FEATURE_RELU,
            feature_widths,
            lambda: feature_case(FEATURE_RELU, deep_relu, feature_widths, feature_seeds, 5, particles, lr=0.5),
        ),
        (
            FEATURE_ATTN,
            feature_widths,
            lambda: feature_case(
                FEATURE_ATTN,
                attention_block,
                feature_widths,
                feature_seeds,
                4,
                2**15 if args.quick else particles,
                lr=0.5,
                sequences=True,
                derivatives="stein" if args.quick else None,  # --quick: seconds instead of minutes
            ),
        ),
        (
            FEATURE_ADAM,
            feature_widths,
            lambda: feature_case(
                FEATURE_ADAM, ln_mlp, feature_widths, feature_seeds, 5, particles, 0.02, optimizer="adam"
            ),
        ),
    ]
    print("| limit | widths | RMS gap finite − limit | RMS of the limit | fitted slope | seconds |")
    print("|---|---|---|---|---|---|")
    for name, widths, run in cases:
        if args.only and args.only not in name:
            continue
        start = time.perf_counter()
        gaps, size = run()
        slope = L.finite.fitted_slope(widths, gaps)
        print(
            f"| {name} | {', '.join(map(str, widths))} | {', '.join(f'{g:.2e}' for g in gaps)} | {size:.2f} | "
            f"{slope:+.2f} | {time.perf_counter() - start:.0f} |",
            flush=True,
        )
    for name, z in Z_AT_WIDEST.items():
        print(f"{name}: seed mean at width {feature_widths[-1]} within {z:.1f} combined standard errors of the limit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
