"""Kernels of any torch.nn module in the infinite-width limit (mt.limits.nngp(model, ...)):
against neural-tangents' own values, closed forms derived by hand, and Monte Carlo of wide
finite networks of the same module."""

from __future__ import annotations

import math
import pathlib
import time
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mutransfer import limits
from mutransfer.limits import finite
from mutransfer.limits._program import propagate

WV, BV = 2.0, 0.1
REFERENCE = np.load(pathlib.Path(__file__).parent / "data" / "neural_tangents_reference.npz")


# ---- the architectures of tests/data/make_neural_tangents_reference.py, in PyTorch ------------------


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class MLP(nn.Module):
    def __init__(self, w=64):
        super().__init__()
        self.a, self.b, self.c, self.d = nn.Linear(6, w), nn.Linear(w, w), nn.Linear(w, w), nn.Linear(w, 1)

    def forward(self, x):
        return self.d(F.gelu(self.c(torch.erf(self.b(torch.relu(self.a(x)))))))


class Block(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.l1, self.l2 = nn.Linear(w, w), nn.Linear(w, w)

    def forward(self, x):
        return x + self.l2(torch.relu(self.l1(torch.relu(x))))


class ResNet(nn.Module):
    def __init__(self, w=64):
        super().__init__()
        self.inp, self.b1, self.b2, self.out = nn.Linear(6, w), Block(w), Block(w), nn.Linear(w, 1)

    def forward(self, x):
        return self.out(torch.relu(self.b2(self.b1(self.inp(x)))))


class Conv1dNet(nn.Module):
    def __init__(self, w=32):
        super().__init__()
        self.c1, self.c2, self.o = nn.Conv1d(3, w, 3, padding=1), nn.Conv1d(w, w, 3, stride=2), nn.Linear(w, 1)

    def forward(self, x):  # (n, length, channels) as neural-tangents lays it out
        h = torch.relu(self.c2(F.gelu(self.c1(x.transpose(1, 2)))))
        return self.o(h.mean(-1))


def reference_models(w: int = 32):
    return {
        "mlp": MLP(),
        "leaky_abs": nn.Sequential(
            nn.Linear(6, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), Fn(torch.abs), nn.Linear(64, 1)
        ),
        "layernorm": nn.Sequential(
            nn.Linear(6, 64),
            nn.LayerNorm(64, elementwise_affine=False),
            nn.ReLU(),
            nn.Linear(64, 64),
            nn.LayerNorm(64, elementwise_affine=False),
            nn.Linear(64, 1),
        ),
        "resnet": ResNet(),
        "cnn_gap": nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(w, w, 3, padding="same"),
            nn.ReLU(),
            nn.Conv2d(w, w, 3, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(w, 1),
        ),
        "cnn_flatten": nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(w, w, 2, stride=2),
            Fn(torch.erf),
            nn.Flatten(),
            nn.Linear(w * 16, 64),
            nn.ReLU(),
            nn.Linear(64, 1),
        ),
        "cnn_pool": nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1),
            nn.ReLU(),
            nn.AvgPool2d(2),
            nn.Conv2d(w, w, 3, padding=1, padding_mode="circular"),
            nn.ReLU(),
            nn.AvgPool2d(3, stride=1, padding=1),
            nn.Flatten(),
            nn.Linear(w * 16, 1),
        ),
        "conv1d": Conv1dNet(),
        "no_bias": nn.Sequential(
            nn.Conv2d(3, w, 3, bias=False),
            Fn(torch.abs),
            nn.Conv2d(w, w, 1, bias=False),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d((1, 1)),
            nn.Flatten(),
            nn.Linear(w, 1),
        ),
    }


def reference_inputs(name):
    x1, x2 = (torch.from_numpy(REFERENCE[f"{name}_{s}"]) for s in ("x1", "x2"))
    if x1.ndim == 4:  # NHWC → NCHW
        x1, x2 = x1.permute(0, 3, 1, 2), x2.permute(0, 3, 1, 2)
    return x1, x2


# max |ours − neural-tangents'| / max |neural-tangents'| allowed. Measured (float64, 2-core CPU): 3.6e-16
# (layernorm) to 2.5e-15 (mlp NNGP) over the 9 architectures; `pytest -s` prints each.
NT_RTOL = 1e-13


@pytest.mark.parametrize("name", sorted(reference_models()))
def test_matches_neural_tangents(name):
    model = reference_models()[name]
    x1, x2 = reference_inputs(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = limits.model_kernels(model, x1, x2, WV, BV, exact=True)
    assert r.method == "exact" and r.nngp.dtype == torch.float64
    for kind, got in (("nngp", r.nngp), ("ntk", r.ntk)):
        want = torch.from_numpy(REFERENCE[f"{name}_{kind}"])
        assert got.shape == want.shape
        error = float((got - want).abs().max() / want.abs().max())
        print(f"{name} {kind}: relative difference to neural-tangents {error:.2g}")
        assert error <= NT_RTOL, (kind, error)


def test_x2_none_is_the_symmetric_kernel_of_x1_with_itself():
    model = reference_models()["cnn_gap"]
    x1, _ = reference_inputs("cnn_gap")
    k, t = limits.kernels(model, x1, None, WV, BV)
    k2, t2 = limits.kernels(model, x1, x1.clone(), WV, BV)
    torch.testing.assert_close(k, k2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(t, t2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k, k.T, rtol=0, atol=0)


def test_row_chunks_give_the_unchunked_kernel(monkeypatch):
    model = reference_models()["cnn_gap"]
    x1, x2 = reference_inputs("cnn_gap")
    whole = limits.kernels(model, x1, None, WV, BV)
    whole2 = limits.kernels(model, x1, x2, WV, BV)
    monkeypatch.setattr(propagate, "_CHUNK_ELEMENTS", 1)  # one row at a time
    for got, want in (
        (limits.kernels(model, x1, None, WV, BV), whole),
        (limits.kernels(model, x1, x2, WV, BV), whole2),
    ):
        torch.testing.assert_close(got[0], want[0], rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(got[1], want[1], rtol=1e-12, atol=1e-13)


# ---- closed forms by hand -------------------------------------------------------------------------------


def _arccos(a, b, c):
    """E[relu u relu v] and E[1(u>0)1(v>0)] for (u, v) with variances a, b and covariance c."""
    cos = (c / torch.sqrt(a * b)).clamp(-1, 1)
    theta = torch.arccos(cos)
    return (
        torch.sqrt(a * b) * (torch.sin(theta) + (math.pi - theta) * cos) / (2 * math.pi),
        (math.pi - theta) / (2 * math.pi),
    )


def test_residual_relu_block_by_hand():
    """f = v·(h + W2 relu(h)), h = W1 x (no biases): the branch is independent of h, so
    K = σ²(K_h + σ² E[relu relu]), Θ = K + σ²(Θ_h + Θ_branch), Θ_branch = σ²E[relu relu] + σ²E[step step]·K_h."""

    class Net(nn.Module):
        def __init__(self, w=16):
            super().__init__()
            self.w1, self.w2, self.v = (
                nn.Linear(5, w, bias=False),
                nn.Linear(w, w, bias=False),
                nn.Linear(w, 1, bias=False),
            )

        def forward(self, x):
            h = self.w1(x)
            return self.v(h + self.w2(torch.relu(h)))

    x = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    s = 1.7
    kh = s * x @ x.T / 5
    d = kh.diagonal()
    phi, dphi = _arccos(d[:, None], d[None, :], kh)
    k_branch = s * phi
    k_sum = kh + k_branch
    theta_sum = kh + (k_branch + s * dphi * kh)
    k_want = s * k_sum
    t_want = k_want + s * theta_sum
    k, t = limits.kernels(Net(), x, None, s, 0.0)
    torch.testing.assert_close(k, k_want, rtol=1e-13, atol=1e-13)
    # arccos at cos θ = 1 − ε turns one rounding of c/√(ab) into θ ≈ 1e-8 on the diagonal
    torch.testing.assert_close(t, t_want, rtol=1e-8, atol=1e-8)


def test_the_same_tensor_twice_is_correlated_not_independent():
    """h + h = 2h: four times the kernel (neural-tangents' FanInSum would give two)."""

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.o = nn.Linear(3, 8), nn.Linear(8, 1)

        def forward(self, x):
            h = self.a(x)
            return self.o(torch.relu(h) + torch.relu(h))

    class Once(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.o = nn.Linear(3, 8), nn.Linear(8, 1)

        def forward(self, x):
            return self.o(2 * torch.relu(self.a(x)))

    x = torch.randn(5, 3, dtype=torch.float64)
    k2, t2 = limits.kernels(Twice(), x, None, WV, 0.0)
    k1, t1 = limits.kernels(Once(), x, None, WV, 0.0)
    torch.testing.assert_close(k2, k1, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(t2, t1, rtol=1e-13, atol=1e-13)
    k0 = limits.kernels(x, depth=1, weight_var=WV)[0]
    torch.testing.assert_close(k1, 4 * k0, rtol=1e-13, atol=1e-13)


def test_one_by_one_convolution_is_a_dense_layer_per_pixel():
    """A 1×1 conv stack with a Flatten head: the mean over pixels of the MLP kernels of the pixels."""
    w = 8
    model = nn.Sequential(
        nn.Conv2d(3, w, 1), nn.Tanh(), nn.Conv2d(w, w, 1), nn.Tanh(), nn.Flatten(), nn.Linear(w * 4 * 5, 1)
    )
    g = torch.Generator().manual_seed(2)
    x1, x2 = (
        torch.randn(4, 3, 4, 5, generator=g, dtype=torch.float64),
        torch.randn(3, 3, 4, 5, generator=g, dtype=torch.float64),
    )
    k, t = limits.kernels(model, x1, x2, WV, BV)
    per_pixel = [
        limits.kernels(x1[:, :, i, j], x2[:, :, i, j], depth=2, activation="tanh", weight_var=WV, bias_var=BV)
        for i in range(4)
        for j in range(5)
    ]
    # the MLP recursion integrates its diagonal by 1-D quadrature, the traced program by Mehler's series
    torch.testing.assert_close(k, sum(p[0] for p in per_pixel) / 20, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(t, sum(p[1] for p in per_pixel) / 20, rtol=1e-8, atol=1e-9)


def test_global_pooling_of_a_constant_image_is_the_mlp_kernel():
    """Circular 3×3 convolutions keep a constant image constant, so every pair of positions has the
    MLP's kernel and the global mean is that kernel."""
    w = 8
    model = nn.Sequential(
        nn.Conv2d(4, w, 3, padding=1, padding_mode="circular"),
        nn.ReLU(),
        nn.Conv2d(w, w, 3, padding=1, padding_mode="circular"),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(w, 1),
    )
    v = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    images = v[:, :, None, None].expand(5, 4, 6, 6).contiguous()
    k, t = limits.kernels(model, images, None, WV, BV)
    k0, t0 = limits.kernels(v, depth=2, weight_var=WV, bias_var=BV)
    torch.testing.assert_close(k, k0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(t, t0, rtol=1e-12, atol=1e-12)


def test_frozen_parameters_are_not_in_the_ntk():
    """Freezing the first layer removes its own term: Θ = K_out + σ²E[φ'φ']·0 + ... by hand for
    one hidden layer: Θ = K + σ² E[step step] · (what the first layer trained) = K."""
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
    x = torch.randn(4, 3, dtype=torch.float64)
    for p in net[0].parameters():
        p.requires_grad_(False)
    k, t = limits.kernels(net, x, None, WV, BV)
    torch.testing.assert_close(t, k, rtol=1e-13, atol=1e-13)
    net[2].bias.requires_grad_(False)
    _, t = limits.kernels(net, x, None, WV, BV)
    torch.testing.assert_close(t, k - BV, rtol=1e-13, atol=1e-13)


# ---- Monte Carlo of wide finite networks ----------------------------------------------------------------


class ResLN(nn.Module):
    """Residual, LayerNorm (gain frozen), tanh, gelu, biases: exact rules only."""

    def __init__(self, w):
        super().__init__()
        self.a, self.b, self.ln, self.o = nn.Linear(4, w), nn.Linear(w, w), nn.LayerNorm(w), nn.Linear(w, 1)
        self.ln.weight.requires_grad_(False)

    def forward(self, x):
        h = self.a(x)
        h = h + self.b(torch.tanh(self.ln(h)))
        return self.o(F.gelu(h))


class SmallCNN(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.c1, self.c2, self.o = (
            nn.Conv2d(2, w, 3, padding=1),
            nn.Conv2d(w, w, 3, stride=2, padding=1),
            nn.Linear(w, 1),
        )

    def forward(self, x):
        h = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.o(h.mean(dim=(2, 3)))


@pytest.mark.parametrize(
    "make,shape,width,samples",
    [pytest.param(ResLN, (5, 4), 1024, 48, marks=pytest.mark.slow), (SmallCNN, (4, 2, 5, 5), 256, 32)],
)
def test_wide_finite_networks_agree_within_four_standard_errors(make, shape, width, samples):
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    exact = limits.model_kernels(make(8), x, None, WV, BV, exact=True)
    mc = finite.monte_carlo_kernels(make(width), x, None, WV, BV, samples=samples, seed=1)
    for kind in ("nngp", "ntk"):
        z = (getattr(exact, kind) - mc[kind]).abs() / mc[f"{kind}_se"]
        assert z.max() < 4.0, (kind, z.max())


# ---- ops without an exact rule: Monte Carlo, or an error that names them ----------------------------------


class Attention(nn.Module):
    def __init__(self, w=32):
        super().__init__()
        self.inp, self.att, self.out = nn.Linear(4, w), nn.MultiheadAttention(w, 4, batch_first=True), nn.Linear(w, 1)

    def forward(self, x):
        h = self.inp(x)
        a, _ = self.att(h, h, h)
        return self.out((h + a).mean(1))


def test_no_exact_rule_falls_back_to_monte_carlo_and_says_so():
    x = torch.randn(4, 3, 4)
    with pytest.warns(
        limits.KernelWarning, match=r"MultiheadAttention at graph node 'att'.*Monte Carlo estimate over 6"
    ):
        r = limits.model_kernels(Attention(), x, samples=6)
    assert r.method == "monte_carlo" and "att" in r.reason
    assert r.nngp.shape == (4, 4) and r.nngp_std_error.shape == (4, 4) and (r.nngp_std_error > 0).any()
    assert any("att.in_proj_weight" == n for n in r.own_init)
    with pytest.warns(limits.KernelWarning):
        k = limits.nngp(Attention(), x, samples=3)
    assert k.std_error.shape == (4, 4)


def test_exact_only_names_the_op_and_the_node():
    with pytest.raises(ValueError, match=r"MultiheadAttention at graph node 'att'"):
        limits.nngp(Attention(), torch.randn(3, 2, 4), exact=True)

    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.o = nn.Linear(4, 8), nn.Linear(8, 1)

        def forward(self, x):
            h = self.a(x).view(x.shape[0], 2, 4)
            return self.o(h.reshape(x.shape[0], 8))

    with pytest.raises(ValueError, match=r"splits the width.*graph node 'view'"):
        limits.nngp(Heads(), torch.randn(3, 4), exact=True)

    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.o = nn.Linear(4, 8), nn.Linear(4, 8), nn.Linear(8, 1)

        def forward(self, x):
            return self.o(F.silu(self.a(x)) * self.b(x))

    with pytest.raises(ValueError, match=r"product of two width tensors.*graph node 'mul'"):
        limits.nngp(Gated(), torch.randn(3, 4), exact=True)

    with pytest.raises(ValueError, match=r"trained gain"):
        limits.ntk(nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 1)), torch.randn(3, 4), exact=True)
    # the NNGP does not involve the gain's gradient
    limits.nngp(nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 1)), torch.randn(3, 4), exact=True)


def test_bad_calls_are_clear():
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
    with pytest.raises(TypeError, match=r"drop \['depth'\]"):
        limits.nngp(net, torch.randn(2, 3), depth=2)
    with pytest.raises(ValueError, match="weight_var"):
        limits.nngp(net, torch.randn(2, 3), None, -1.0)
    with pytest.raises(ValueError, match="same shape after the batch axis"):
        limits.nngp(net, torch.randn(2, 3), torch.randn(2, 4))


# ---- predictions, inputs, cost -------------------------------------------------------------------------


def test_predictions_accept_a_model():
    g = torch.Generator().manual_seed(5)
    x, y, xt = (
        torch.randn(12, 3, generator=g, dtype=torch.float64),
        torch.randn(12, generator=g, dtype=torch.float64),
        torch.randn(5, 3, generator=g, dtype=torch.float64),
    )
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    mean, var = limits.nngp_predict(net, x, y, xt, weight_var=WV, bias_var=BV, noise_var=1e-3)
    mean0, var0 = limits.nngp_predict(x, y, xt, depth=2, activation="tanh", weight_var=WV, bias_var=BV, noise_var=1e-3)
    torch.testing.assert_close(mean, mean0, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(var, var0, rtol=1e-7, atol=1e-9)
    f = limits.ntk_predict(net, x, y, xt, weight_var=WV, bias_var=BV, t=3.0)
    f0 = limits.ntk_predict(x, y, xt, depth=2, activation="tanh", weight_var=WV, bias_var=BV, t=3.0)
    torch.testing.assert_close(f, f0, rtol=1e-7, atol=1e-9)


def test_input_ops_before_the_first_layer_run_on_the_data():
    """x.flatten(1) * 0.5 before a Linear: the kernel of the MLP on the flattened, halved input."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.o = nn.Linear(12, 8), nn.Linear(8, 1)

        def forward(self, x):
            return self.o(torch.relu(self.a(x.flatten(1) * 0.5)))

    x = torch.randn(4, 3, 4, dtype=torch.float64)
    k, t = limits.kernels(Net(), x, None, WV, BV)
    k0, t0 = limits.kernels(0.5 * x.flatten(1), depth=1, weight_var=WV, bias_var=BV)
    torch.testing.assert_close(k, k0, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(t, t0, rtol=1e-8, atol=1e-8)  # arccos at cos θ = 1 − ε on the diagonal


def test_a_flatten_head_keeps_only_the_diagonal_of_the_spatial_kernel():
    """100 images of 16×16 through convs and Flatten: the full spatial kernel would be 100²·256²
    float64 entries (5 GB) per layer; the diagonal is 100²·256 (20 MB) — seconds, not minutes."""
    w = 8
    model = nn.Sequential(
        nn.Conv2d(3, w, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(w, w, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(w * 256, 1),
    )
    x = torch.randn(100, 3, 16, 16, dtype=torch.float64)
    start = time.perf_counter()
    k, t = limits.kernels(model, x, None, WV, BV)
    assert time.perf_counter() - start < 10
    assert k.shape == (100, 100) and torch.isfinite(t).all()


def test_torch_export_traces_what_fx_cannot():
    """Python control flow on a shape stops torch.fx; torch.export specialises it and the ATen
    graph goes through the same rules."""

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.o = nn.Linear(4, 8), nn.Linear(8, 1)

        def forward(self, x):
            if x.shape[-1] > 3:
                x = x * 0.5
            h = F.gelu(self.a(x)).view(x.shape[0], 8, 1).flatten(1)
            return self.o(h)

    with pytest.raises(Exception):
        torch.fx.symbolic_trace(Branchy())
    x = torch.randn(5, 4, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k, t = limits.kernels(Branchy(), x, None, WV, BV)
    k0, t0 = limits.kernels(0.5 * x, depth=1, activation="gelu", weight_var=WV, bias_var=BV)
    torch.testing.assert_close(k, k0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(t, t0, rtol=1e-12, atol=1e-12)


def test_explicit_padding_equals_the_convolutions_own():
    """F.pad(mode="circular") then an unpadded conv = a conv with padding_mode="circular"."""

    class Padded(nn.Module):
        def __init__(self, w=8):
            super().__init__()
            self.c1, self.c2, self.o = nn.Conv2d(2, w, 3), nn.Conv2d(w, w, 3, padding=1), nn.Linear(w, 1)

        def forward(self, x):
            h = torch.relu(self.c1(F.pad(x, (1, 1, 1, 1), mode="circular")))
            return self.o(torch.relu(self.c2(h)).mean(dim=(2, 3)))

    own = nn.Sequential(
        nn.Conv2d(2, 8, 3, padding=1, padding_mode="circular"),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 1),
    )
    x = torch.randn(3, 2, 5, 5, dtype=torch.float64)
    for got, want in zip(limits.kernels(Padded(), x, None, WV, BV), limits.kernels(own, x, None, WV, BV)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_diagonal_only_where_it_suffices_gives_the_all_full_answer(monkeypatch):
    """One conv output feeds a global mean (needs the full spatial kernel) and a Flatten head
    (needs its diagonal), through a sum with a branch nothing else needs in full: the same
    kernels as keeping everything full."""

    class TwoHeads(nn.Module):
        def __init__(self, w=8):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(2, w, 3, padding=1), nn.Conv2d(2, w, 3, padding=1)
            self.o1, self.o2 = nn.Linear(w, 1), nn.Linear(w * 16, 1)

        def forward(self, x):
            h = self.c1(x)
            s = h + self.c2(x)
            return self.o1(torch.relu(h).mean(dim=(2, 3))) + self.o2(torch.erf(s).view(x.size(0), -1))

    x = torch.randn(3, 2, 4, 4, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exact, no Monte Carlo
        lazy = limits.kernels(TwoHeads(), x, None, WV, BV)
    monkeypatch.setattr(propagate, "needs", lambda gm, requires: {n: True for n in gm.graph.nodes})
    full = limits.kernels(TwoHeads(), x, None, WV, BV)
    for got, want in zip(lazy, full):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_sum_of_independent_pooled_relu_branches():
    """Two conv branches, each relu then a global mean (non-Gaussian, with a mean), summed:
    K = K₁ + K₂ + m₁m₂' + m₂m₁' — the means matter. Against wide finite networks."""

    class TwoBranches(nn.Module):
        def __init__(self, w):
            super().__init__()
            self.c1, self.c2, self.o = nn.Conv2d(2, w, 3, padding=1), nn.Conv2d(2, w, 2), nn.Linear(w, 1)

        def forward(self, x):
            return self.o(torch.relu(self.c1(x)).mean(dim=(2, 3)) + torch.relu(self.c2(x)).mean(dim=(2, 3)))

    x = torch.randn(4, 2, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exact = limits.model_kernels(TwoBranches(8), x, None, WV, BV, exact=True)
    mc = finite.monte_carlo_kernels(TwoBranches(512), x, None, WV, BV, samples=32, seed=2)
    for kind in ("nngp", "ntk"):
        z = (getattr(exact, kind) - mc[kind]).abs() / mc[f"{kind}_se"]
        assert z.max() < 4.0, (kind, z.max())


def test_a_layer_applied_twice_is_not_taken_for_two_independent_layers():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.h, self.o = nn.Linear(3, 8), nn.Linear(8, 8), nn.Linear(8, 1)

        def forward(self, x):
            return self.o(torch.relu(self.h(torch.relu(self.h(torch.relu(self.a(x)))))))

    with pytest.raises(ValueError, match=r"weight used by two layer calls \(first at graph node 'h'\).*node 'h_1'"):
        limits.nngp(Twice(), torch.randn(3, 3), exact=True)
    with pytest.warns(limits.KernelWarning, match="weight sharing"):
        limits.nngp(Twice(), torch.randn(3, 3), samples=3)


def test_output_shapes_squeezed_and_tuples():
    class Squeezed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.o = nn.Linear(3, 8), nn.Linear(8, 1)

        def forward(self, x):
            return self.o(torch.relu(self.a(x))).squeeze(-1)

    class Pair(Squeezed):
        def forward(self, x):
            return self.o(torch.relu(self.a(x))), x

    x = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(limits.nngp(Squeezed(), x, exact=True), limits.nngp(x, depth=1), rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="returns tuple; the kernels need one output tensor"):
        limits.nngp(Pair(), x)


def test_sign_clamp_and_powers_written_as_tensor_ops():
    """sign: E = 1 − 2θ/π and no NTK through it (neural-tangents' Sign); clamp(min=0) is relu
    exactly; clamp(max=0) is −relu(−u); x**2 against the fully-connected recursion."""

    class Net(nn.Module):
        def __init__(self, op):
            super().__init__()
            self.a, self.o, self.op = nn.Linear(3, 8, bias=False), nn.Linear(8, 1, bias=False), op

        def forward(self, x):
            return self.o(self.op(self.a(x)))

    x = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    kh = WV * x @ x.T / 3
    d = kh.diagonal()
    theta = torch.arccos((kh / torch.sqrt(d[:, None] * d[None, :])).clamp(-1, 1))
    k, t = limits.kernels(Net(torch.sign), x, None, WV, 0.0)
    torch.testing.assert_close(k, WV * (1 - 2 * theta / math.pi), rtol=1e-7, atol=1e-7)
    torch.testing.assert_close(t, k, rtol=1e-13, atol=1e-13)  # only the readout trains through a sign
    relu = limits.kernels(x, depth=1, weight_var=WV)
    for op in (lambda h: torch.clamp(h, min=0), lambda h: h.clamp_min(0), lambda h: -torch.clamp(-h, max=0)):
        for got, want in zip(limits.kernels(Net(op), x, None, WV, 0.0), relu):
            torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-8)  # arccos at cos θ = 1 − ε
    square = limits.kernels(x, depth=1, activation=lambda u: u * u, weight_var=WV)
    for op in (lambda h: h**2, torch.square, lambda h: h.pow(2)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = limits.kernels(Net(op), x, None, WV, 0.0)
        for g, w in zip(got, square):
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)
