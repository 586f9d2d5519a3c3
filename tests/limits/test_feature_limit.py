"""`FeatureLimit`, the µP limit of a traced module by the master theorem on particles: against
`MuPLimit` on one hidden layer, against the NNGP kernel at init, against finite µP networks of a
LayerNorm MLP and a residual MLP (`mt.parametrize` at widths 256 and 1024 here; to 4096 × 16 seeds in
benchmarks/limits_convergence.py), and its errors."""

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mutransfer as mt
from model_helpers import exact_rms, limit_data
from mutransfer.limits import finite

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from limits_convergence import ln_mlp  # the convergence table's LayerNorm MLP, d = 4

D = 4


def _data(n=8, n_test=6, seed=5):
    return limit_data(n, n_test, seed, D)


def _one_hidden(width, act):
    """f = Σ_α W_α φ(u_α·x), u ~ N(0, I/d), W ~ N(0, 1) at base width 1: µP with base width 1 is
    MuPLimit's network, f = (1/n) Σ v φ(u·x) with lr·n on u and v."""
    m = nn.Sequential(nn.Linear(D, width, bias=False), act(), nn.Linear(width, 1, bias=False)).double()
    exact_rms(m[0].weight, 1 / math.sqrt(D))
    exact_rms(m[2].weight, 1.0)
    return m


@pytest.mark.parametrize("act,name", [(nn.Tanh, "tanh"), (nn.ReLU, "relu")])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_one_hidden_layer_equals_mup_limit(act, name, momentum):
    x, y, xt = _data(6, 5)
    lim = mt.limits.FeatureLimit(_one_hidden(1024, act), base=_one_hidden(1, act), particles=2**14, groups=8, seed=1)
    f, se = lim.fit(x, y, steps=8, lr=0.5, momentum=momentum).predict(xt, return_error=True)
    ref = mt.limits.MuPLimit(name, method="monte_carlo", momentum=momentum, samples=2**14, groups=8, seed=2)
    g, se2 = ref.fit(x, y, 8, 0.5).predict(xt, return_error=True)
    z = (f[:, 0] - g) / (se[:, 0] ** 2 + se2**2).sqrt()
    assert f.shape == (5, 1) and float(g.abs().max()) > 0.2  # it moved
    assert float(z.abs().max()) < 4.0, z  # measured: ≤ 1.9


def _mlp(width, seed=0, gaussian=False, bias=True):
    torch.manual_seed(seed)
    m = nn.Sequential(
        nn.Linear(D, width, bias=bias),
        nn.Tanh(),
        nn.Linear(width, width, bias=bias),
        nn.Tanh(),
        nn.Linear(width, 1, bias=False),
    ).double()
    if gaussian:
        for i, v in ((0, 1.5 / D), (2, 1.5 / 16)):
            exact_rms(m[i].weight, math.sqrt(v))
    return m


def test_at_init_f_is_zero_and_the_features_are_the_nngp_kernel():
    x, _, _ = _data(6)
    lim = mt.limits.FeatureLimit(
        _mlp(256, gaussian=True, bias=False), base=_mlp(16, gaussian=True, bias=False), particles=2**14, groups=8
    )
    assert float(lim.predict(x).abs().max()) < 1e-12  # the readout's init contributes nothing in the limit
    k = lim.features(x, layer="2")  # E[Z^{h(x)} Z^{h(x')}] at the second Linear's output
    sub = nn.Sequential(nn.Linear(D, 8, bias=False), nn.Tanh(), nn.Linear(8, 8, bias=False)).double()
    ref = mt.limits.nngp(sub, x, weight_var=1.5)
    assert k.shape == (6, 6)
    assert float((k - ref).abs().max()) < 0.03 * float(ref.abs().max()), (k, ref)  # measured: 0.6 %


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(n), nn.Linear(n, n), nn.Linear(n, n)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(self.ln(x))))


class ResMLP(nn.Module):
    def __init__(self, n, depth=2):
        super().__init__()
        self.inp, self.out = nn.Linear(D, n), nn.Linear(n, 1, bias=False)
        self.blocks = nn.ModuleList([Block(n) for _ in range(depth)])

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


def _finite_against_limit(
    make, steps=5, lr=0.1, seeds=6, particles=2**13, momentum=0.0, batch_size=None, widths=(256, 1024, 4096)
):
    """Per-seed RMS gap of finite µP nets to the limit at `widths`, its fitted slope, and the largest
    |seed mean − limit| in combined standard errors at the widest (a width-4096 net costs ~16 of
    width 1024: the suite checks some models to 1024 only; benchmarks/limits_convergence.py to 4096
    with 16 seeds)."""
    x, y, xt = _data(8, 8)
    torch.manual_seed(0)
    base = make(16).double()
    torch.manual_seed(1)
    lim = mt.limits.FeatureLimit(make(256).double(), base=base, particles=particles, groups=8)
    f, se = lim.fit(x, y, steps=steps, lr=lr, momentum=momentum, batch_size=batch_size).predict(xt, return_error=True)
    f, se = f[:, 0], se[:, 0]
    gaps = []
    for w in widths:
        fs = []
        for s in range(seeds):
            torch.manual_seed(100 + s)
            m = finite.train_mup(make(w).double(), base, x, y, steps, lr, batch_size, lim.seed, momentum=momentum)
            with torch.no_grad():
                fs.append(m(xt)[:, 0])
        fw = torch.stack(fs)
        gaps.append(float((fw - f).pow(2).mean().sqrt()))
    z = (fw.mean(0) - f) / (fw.var(0) / seeds + se**2).sqrt()
    return lim, gaps, finite.fitted_slope(widths, gaps), float(z.abs().max()), float(f.pow(2).mean().sqrt())


@pytest.mark.slow
def test_layernorm_mlp_finite_networks_approach_the_limit():
    _, gaps, slope, z, rms = _finite_against_limit(ln_mlp)  # to 4096: 256 → 1024 alone reads −0.12
    assert rms > 0.2  # the limit learned something
    assert gaps[-1] < gaps[0]
    assert -0.9 < slope < -0.25, (gaps, slope)  # width^-1/2 (to 4096: −0.38, 0.059 / 0.050 / 0.020)
    assert z < 4.0, z  # the seed mean at the widest is within its noise of the limit


@pytest.mark.slow
def test_momentum_and_minibatches_through_hidden_matrices():
    _, gaps, slope, z, rms = _finite_against_limit(ln_mlp, steps=6, momentum=0.9, batch_size=4, widths=(256, 1024))
    assert rms > 0.2
    assert -0.9 < slope < -0.25, (gaps, slope)  # measured to 4096: −0.58
    assert z < 4.0, z  # measured at 4096: 1.6


@pytest.mark.slow
def test_residual_mlp_finite_networks_approach_the_limit():
    lim, gaps, slope, z, rms = _finite_against_limit(ResMLP, steps=4, widths=(256, 1024))
    assert rms > 0.2
    assert -0.9 < slope < -0.1, (gaps, slope)  # measured to 4096: −0.45 (0.071 / 0.050 / 0.020)
    assert z < 4.0, z
    x, _, _ = _data(5)
    k = lim.features(x, layer="blocks.1")
    assert k.shape == (5, 5) and torch.allclose(k, k.T)


def _deep_relu(n):
    """3 hidden layers, 2 hidden matrices in a row, no norm: the deep relu MLP of `PiLimit`'s family,
    but with nn.Linear's own i.i.d. (uniform) init and plain SGD (`PiLimit` is the limit of π-nets: π-init and
    projected gradients, another network, so the two limits are not compared)."""
    return nn.Sequential(
        nn.Linear(D, n), nn.ReLU(), nn.Linear(n, n), nn.ReLU(), nn.Linear(n, n), nn.ReLU(), nn.Linear(n, 1, bias=False)
    )


@pytest.mark.slow
def test_deep_relu_mlp_finite_networks_approach_the_limit():
    _, gaps, slope, z, rms = _finite_against_limit(_deep_relu, steps=5, lr=0.5, seeds=4, widths=(256, 1024))
    assert rms > 0.2  # measured: 0.24
    assert -0.9 < slope < -0.25, (gaps, slope)  # measured −0.37 (0.015 / 0.009); to 4096 × 16 seeds: −0.54
    assert z < 4.0, z  # measured 1.2; at 4096 × 16 seeds with 2¹⁵ particles: 1.2


def test_the_basis_is_the_given_vectors_times_the_transform_after_a_fit():
    """Family keeps Q = V·M (the Ż path differentiates through V). A block that repeats what the
    family holds (step 0's forward repeats the init forward) has a residual of pure rounding: judged
    against its own largest eigenvalue it kept every noise direction at 1/√λ ≈ 1e16, and V·M missed Q
    by O(1) (6.5–9.8 measured) while predictions moved by 0.1 standard error."""
    x, y, _ = _data(8)
    torch.manual_seed(0)
    lim = mt.limits.FeatureLimit(ln_mlp(256).double(), base=ln_mlp(16).double(), particles=2**11, groups=4)
    lim.fit(x, y, steps=3, lr=0.1, batch_size=4)
    for m in lim._program.matrices.values():
        for fam in (m.fwd, m.bwd):
            q = torch.cat(fam.q, 2)
            vm = torch.einsum("gpi,gik->gpk", torch.cat([v.detach() for v in fam.v], 2), fam.m)
            assert float((vm - q).abs().max()) < 1e-8
            assert float(fam.m.abs().max()) < 1e8  # no rounding-noise direction normalized to unit length


def test_rmsnorm_and_elementwise_functions_run():
    class Net(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(D, n), nn.Linear(n, n), nn.Linear(n, 2)
            self.norm = nn.RMSNorm(n)

        def forward(self, x):
            h = F.gelu(self.a(x))
            h = self.norm(h * torch.sigmoid(h) + 0.5 * h)
            return self.c(F.silu(self.b(h)) - h)

    x, _, xt = _data(6)
    y = torch.randn(6, 2, dtype=torch.float64)
    torch.manual_seed(0)
    lim = mt.limits.FeatureLimit(Net(256).double(), base=Net(16).double(), particles=2**11, groups=4)
    f, se = lim.fit(x, y, steps=3, lr=0.1, batch_size=4, momentum=0.5).predict(xt, return_error=True)
    assert f.shape == se.shape == (6, 2) and torch.isfinite(f).all() and float(se.max()) > 0
    many = torch.randn(300, D, dtype=torch.float64)  # more than fit on 512 particles at once: in chunks
    assert lim.predict(many).shape == (300, 2)


def _bad(layer):
    class Net(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.a, self.b = nn.Linear(D, n), nn.Linear(n, 1)
            self.mid = layer(n)

        def forward(self, x):
            return self.b(self.mid(self.a(x)))

    return Net


def test_an_op_that_mixes_particles_is_an_error_naming_the_node():
    class Softmax(nn.Module):
        def __init__(self, n):
            super().__init__()

        def forward(self, h):
            return F.softmax(h, dim=-1)

    net = _bad(Softmax)
    with pytest.raises(ValueError, match=r"not elementwise.*graph node 'softmax'"):
        mt.limits.FeatureLimit(net(64).double(), base=net(16).double())

    class Conv(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.conv = nn.Conv1d(1, 1, 3, padding=1)

        def forward(self, h):
            return self.conv(h.unsqueeze(1)).squeeze(1)

    net = _bad(Conv)
    with pytest.raises(ValueError, match=r"graph node '(unsqueeze|mid_conv)'"):
        mt.limits.FeatureLimit(net(64).double(), base=net(16).double())


def test_other_optimizers_and_losses_are_refused():
    lim = mt.limits.FeatureLimit(_mlp(256), base=_mlp(16), particles=64, groups=2)
    x, y, _ = _data(4)
    with pytest.raises(ValueError, match="optimizer must be 'sgd' or 'adam'"):
        lim.fit(x, y, optimizer="lion")
    with pytest.raises(ValueError, match="derivatives='autograd' cannot take Adam's limit"):
        lim.fit(x, y, optimizer="adam", derivatives="autograd")
    with pytest.raises(ValueError, match="loss='ce'"):
        lim.fit(x, y, loss="ce")
    with pytest.raises(ValueError, match=r"shape \(N, 4\)"):
        lim.predict(torch.zeros(3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="1 target"):
        lim.fit(x, torch.zeros(4, 2))
    with pytest.raises(ValueError, match=r"particles per group \(32\) must be at least twice"):
        lim.fit(x, y, steps=5)


def test_a_width_dependent_constant_is_an_error_naming_the_parameter():
    two = nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1, bias=False))
    with pytest.raises(ValueError, match=r"grow in one ratio.*found 64 \(base 16\), 64 \(base 32\)"):
        mt.limits.FeatureLimit(_mlp(64), base=two.double())  # a base at the model's own width is no base
    big, small = _mlp(256), _mlp(16)
    with torch.no_grad():  # a constant hidden bias of 1/width: parametrize keeps it, and it has no limit
        big[2].bias.fill_(1 / 256)
        small[2].bias.fill_(1 / 16)
    with pytest.raises(ValueError, match=r"parameter '2.bias' \(vector\).*width-independent"):
        mt.limits.FeatureLimit(big, base=small)


def test_without_a_base_the_model_is_its_own_base():
    """FeatureLimit(model) is the limit of µP relative to `model`: the same limit as FeatureLimit(wider,
    base=model) — one program, constants read off other samples of the same laws."""
    torch.manual_seed(3)
    model, wider = _mlp(256), _mlp(1024)
    x, y, x_test = _data(6, 4)
    runs = []
    for lim in (
        mt.limits.FeatureLimit(model, particles=2**11, groups=4, seed=2),
        mt.limits.FeatureLimit(wider, base=model, particles=2**11, groups=4, seed=2),
    ):
        assert lim.width in (256, 1024) and lim.base_width == 256
        runs.append(lim.fit(x, y, steps=3, lr=0.5).predict(x_test, return_error=True))
    (f1, se1), (f2, se2) = runs
    assert f1.abs().max() > 0.05  # it learned something
    assert ((f1 - f2).abs() / (se1**2 + se2**2).sqrt()).max() < 4.0
    with pytest.raises(ValueError, match="calls no nn.Linear"):
        mt.limits.FeatureLimit(nn.Sequential(nn.Tanh()))
