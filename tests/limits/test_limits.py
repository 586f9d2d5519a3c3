"""Infinite-width limits: kernels (closed forms, quadrature, Monte Carlo, PSD), predictions,
empirical NTK convergence, and the µP limit of a 1-hidden-layer network."""

import math
import warnings

import numpy as np
import pytest
import torch

from mutransfer import limits as L
from mutransfer.limits import finite
from mutransfer.limits._activations import get_activation
from mutransfer.limits._kernels import nngp_diag


def _x(n=6, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64)


def test_depth1_relu_nngp_is_the_arccosine_kernel():
    x = _x().numpy()
    d, wv = x.shape[1], 1.7
    norms = np.linalg.norm(x, axis=1)
    cos = np.clip(x @ x.T / np.outer(norms, norms), -1, 1)
    theta = np.arccos(cos)
    arccos1 = np.outer(norms, norms) / np.pi * (np.sin(theta) + (np.pi - theta) * np.cos(theta))  # Cho & Saul, n=1
    expected = wv * (wv / d) * arccos1 / 2  # E[relu(u)relu(v)] = k₁/2 for u, v with covariance xᵀy·wv/d
    got = L.nngp(torch.from_numpy(x), depth=1, weight_var=wv).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize("name, fn", [("erf", torch.erf), ("relu", torch.relu)])
def test_closed_forms_match_the_numerical_integration(name, fn):
    """A callable goes through Mehler's series (smooth) or 2-D quadrature (kinks): vs the closed form."""
    x = _x(5, 4)
    k, t = L.kernels(x, depth=3, activation=name, bias_var=0.1)
    kn, tn = L.kernels(x, depth=3, activation=fn, bias_var=0.1, quad_order=200)
    # relu's kink (and its derivative's jump) converge slowly under quadrature: loose bounds there
    rtol, rtol_ntk = (1e-9, 1e-9) if name == "erf" else (5e-3, 5e-2)
    torch.testing.assert_close(kn, k, rtol=rtol, atol=0)
    torch.testing.assert_close(tn, t, rtol=rtol_ntk, atol=0)


def test_series_and_quadrature_agree_for_smooth_activations():
    from mutransfer.limits._gaussian import expect_2d, hermite_coefficients, mehler

    a = torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64)
    b = torch.tensor([2.0, 0.2, 1.0, 4.0], dtype=torch.float64)
    rho = torch.linspace(-0.95, 0.999, 12, dtype=torch.float64).reshape(3, 4)
    c = rho * (a[:, None] * b[None, :]).sqrt()
    for f in (torch.tanh, torch.nn.functional.gelu, torch.sigmoid):
        series = mehler(hermite_coefficients(f, a, 160), hermite_coefficients(f, b, 160), rho)
        quad = expect_2d(f, f, a[:, None], b[None, :], c, 200)
        torch.testing.assert_close(series, quad, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("activation", ["relu", "erf", "tanh", "gelu"])
def test_gaussian_moments_match_monte_carlo(activation):
    """E[φ(u)φ(v)] and E[φ'(u)φ'(v)] against 2·10⁶ Gaussian samples (within 5 standard errors)."""
    from mutransfer.limits._fields import elem_of, expect_both

    act = get_activation(activation)
    both = expect_both(
        elem_of(act),
        elem_of(act),
        a_ := torch.tensor([1.3], dtype=torch.float64),
        torch.tensor([0.7], dtype=torch.float64),
        torch.tensor([0.6], dtype=torch.float64),
        True,
    )
    del a_
    a, b, c = (torch.tensor(v, dtype=torch.float64) for v in (1.3, 0.7, 0.6))
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2_000_000, 2, generator=g, dtype=torch.float64)
    u = a.sqrt() * z[:, 0]
    rho = c / (a * b).sqrt()
    v = b.sqrt() * (rho * z[:, 0] + (1 - rho**2).sqrt() * z[:, 1])
    for f, value in zip((act.fn, act.derivative), both):
        samples = f(u) * f(v)
        se = samples.std() / math.sqrt(len(samples))
        assert abs(float(value) - float(samples.mean())) < 5 * se


def test_nngp_matches_wide_random_networks():
    x = _x(4, 8)
    expected = L.nngp(x, depth=2, activation="relu", bias_var=0.2)
    torch.manual_seed(0)
    mc, se = finite.empirical_nngp(lambda: finite.NTKMLP(8, 1024, depth=2, bias_var=0.2).double(), x, samples=300)
    assert ((mc - expected).abs() <= 5 * se + 0.02 * expected.abs().max()).all(), (mc, expected, se)


@pytest.mark.parametrize("activation", ["relu", "erf", "tanh"])
def test_kernels_are_symmetric_psd(activation):
    x = _x(40, 5, seed=2)
    k, t = L.kernels(x, depth=3, activation=activation, bias_var=0.05)
    for m in (k, t):
        assert torch.equal(m, m.T)
        eig = torch.linalg.eigvalsh(m)
        assert eig.min() > -1e-10 * eig.max()
    k12 = L.nngp(x[:7], x[7:19], depth=3, activation=activation, bias_var=0.05)
    # a block computed on its own agrees with the full matrix (up to quadrature error for tanh)
    torch.testing.assert_close(k12, k[:7, 7:19], rtol=0, atol=1e-5 * float(k.abs().max()))
    torch.testing.assert_close(
        nngp_diag(x, depth=3, activation=activation, bias_var=0.05), k.diagonal(), rtol=1e-6, atol=0
    )


@pytest.mark.slow
def test_empirical_ntk_approaches_the_analytic_one():
    x = _x(6, 8)
    analytic = L.ntk(x, depth=2)
    widths, errors = [64, 256, 1024, 4096], []
    for width in widths:
        errs = []
        for seed in range(3):
            torch.manual_seed(seed)
            emp = finite.empirical_ntk(finite.NTKMLP(8, width, depth=2).double(), x)
            errs.append(float((emp - analytic).norm() / analytic.norm()))
        errors.append(sum(errs) / len(errs))
    slope = finite.fitted_slope(widths, errors)
    print(f"empirical NTK relative error {errors} at widths {widths}: slope {slope:+.2f}")
    assert errors[-1] < 0.1 and errors == sorted(errors, reverse=True)
    assert -0.8 < slope < -0.3


def test_nngp_posterior_mean_and_variance():
    x, xt = _x(10, 3), _x(5, 3, seed=1)
    y = torch.sin(x.sum(1))
    mean, var = L.nngp_predict(x, y, xt, depth=2, bias_var=0.1, jitter=0)
    kxx = L.nngp(x, depth=2, bias_var=0.1)
    ksx = L.nngp(xt, x, depth=2, bias_var=0.1)
    kss = L.nngp(xt, depth=2, bias_var=0.1)
    expected_mean = ksx @ torch.linalg.solve(kxx, y)
    expected_var = (kss - ksx @ torch.linalg.solve(kxx, ksx.T)).diagonal()
    torch.testing.assert_close(mean, expected_mean, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(var, expected_var, rtol=1e-6, atol=1e-10)
    mean_tr, var_tr = L.nngp_predict(x, y, x, depth=2, bias_var=0.1)
    torch.testing.assert_close(mean_tr, y, rtol=1e-6, atol=1e-6)
    assert var_tr.max() < 1e-6 and var.min() > 1e-3


def test_ntk_gradient_flow_matches_the_matrix_exponential():
    x, xt = _x(8, 3), _x(4, 3, seed=1)
    y = torch.cos(x[:, 0]) + x[:, 1]
    lr, t = 0.3, 2.5
    txx, tsx = L.ntk(x, depth=2), L.ntk(xt, x, depth=2)
    # Independent: integrate df/dt = −lr Θ (f − y) on train and test points jointly, f(0) = 0.
    ftr, fte = torch.zeros_like(y), torch.zeros(len(xt), dtype=torch.float64)
    dt = 1e-4
    for _ in range(int(t / dt)):
        r = ftr - y
        ftr, fte = ftr - dt * lr * txx @ r, fte - dt * lr * tsx @ r
    got = L.ntk_predict(x, y, xt, t=t, lr=lr, depth=2)
    torch.testing.assert_close(got, fte, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(L.ntk_predict(x, y, xt, t=0.0, depth=2), torch.zeros(4, dtype=torch.float64))
    inf = L.ntk_predict(x, y, xt, depth=2)
    torch.testing.assert_close(inf, tsx @ torch.linalg.solve(txx, y), rtol=1e-8, atol=1e-10)


def test_kernel_arguments_are_checked():
    x = _x()
    with pytest.raises(ValueError, match="depth"):
        L.nngp(x, depth=-1)
    with pytest.raises(ValueError, match="weight_var"):
        L.nngp(x, weight_var=0)
    with pytest.raises(ValueError, match="unknown activation 'swish2'"):
        L.nngp(x, activation="swish2")
    with pytest.raises(ValueError, match="feature sizes"):
        L.nngp(x, _x(3, 5))
    with pytest.raises(ValueError, match="y_train"):
        L.nngp_predict(x, torch.zeros(3), x)


# ---------------------------------------------------------------------------- the µP limit

XS = _x(3, 8, seed=5)
YS = torch.tensor([1.0, -0.5, 0.3], dtype=torch.float64)
XT = _x(5, 8, seed=6)
# finite widths of the convergence checks: a factor 64 from the narrowest to the widest, so a
# 1/√n rate moves the error by 8 (the checks ask for > 4 and a fitted slope in (−0.75, −0.3))
WIDTHS = [128, 512, 2048, 8192]


@pytest.fixture(scope="module")
def tanh_quadrature():
    """The tanh µP limit by quadrature after 60 SGD steps at lr 0.5 on (XS, YS), fitted once."""
    return L.MuPLimit("tanh", method="quadrature").fit(XS, YS, steps=60, lr=0.5)


@pytest.fixture(scope="module")
def adam_limit():
    """The tanh µP limit under Adam (40 steps, lr 0.02), Monte Carlo with 2**18 neurons: (mean, error)."""
    return L.MuPLimit("tanh", optimizer="adam", samples=2**18).fit(XS, YS, 40, 0.02).predict(XT, return_error=True)


@pytest.fixture(scope="module")
def momentum_free_limit():
    """The tanh µP limit by quadrature under plain SGD (40 steps, lr 0.05), on XT."""
    return L.MuPLimit("tanh", method="quadrature").fit(XS, YS, 40, 0.05).predict(XT)


@pytest.mark.parametrize(
    "activation, method", [("relu", "quadrature"), ("tanh", "monte_carlo"), ("identity", "linear")]
)
def test_mup_limit_output_is_exactly_zero_at_init(activation, method):
    lim = L.MuPLimit(activation, method=method, samples=1024).fit(XS, YS, steps=0, lr=0.5)
    assert torch.equal(lim.predict(XT), torch.zeros(5, dtype=torch.float64))


def test_mup_limit_quadrature_and_monte_carlo_agree(tanh_quadrature):
    quad = tanh_quadrature
    # 16384 neurons: the largest error 0.0039 (measured), within the 0.01 asked
    mc = L.MuPLimit("tanh", method="monte_carlo", samples=16384).fit(XS, YS, steps=60, lr=0.5)
    mean, err = mc.predict(XT, return_error=True)
    q = quad.predict(XT)
    assert (err > 0).all() and err.max() < 0.01
    assert ((mean - q).abs() < 5 * err + 1e-3).all(), (mean, q, err)
    assert quad.method_used == "quadrature" and L.MuPLimit("tanh").fit(XS, YS, 1, 0.5).method_used == "quadrature"
    assert L.MuPLimit("tanh").fit(_x(8, 8), torch.zeros(8), 1, 0.5).method_used == "monte_carlo"


def _finite_errors(activation, limit, widths, steps, lr, seeds=8, **opt):
    """Mean over seeds of the RMS difference on XT between finite µP nets (`train_finite(..., **opt)`) and the limit."""
    errors = []
    for width in widths:
        errs = []
        for seed in range(seeds):
            torch.manual_seed(seed)
            net = finite.train_finite(finite.OneHiddenLayer(8, width, activation=activation), XS, YS, steps, lr, **opt)
            with torch.no_grad():
                errs.append(float((net(XT)[:, 0] - limit).pow(2).mean().sqrt()))
        errors.append(sum(errs) / len(errs))
    return errors


@pytest.mark.parametrize("activation, method", [("tanh", "quadrature"), ("identity", "linear")])
def test_finite_mup_networks_approach_the_limit_like_one_over_sqrt_width(activation, method, tanh_quadrature):
    steps, lr = 60, 0.5
    if activation == "tanh":
        limit = tanh_quadrature.predict(XT)
    else:
        limit = L.MuPLimit(activation, method=method).fit(XS, YS, steps=steps, lr=lr).predict(XT)
    widths = WIDTHS  # measured (tanh): errors 0.041, 0.022, 0.012, 0.0052; slope −0.49
    errors = _finite_errors(activation, limit, widths, steps, lr)
    slope = finite.fitted_slope(widths, errors)
    print(f"{activation}: |finite µP − limit| {[f'{e:.2e}' for e in errors]} at widths {widths}: slope {slope:+.2f}")
    assert -0.75 < slope < -0.3
    assert errors[-1] < errors[0] / 4


def test_feature_movement_is_order_one_in_mup_and_vanishes_in_ntk():
    import copy

    widths, moves = [256, 1024, 4096, 16384], {"mup": [], "ntk": []}
    for p in moves:
        for width in widths:
            torch.manual_seed(0)
            net = finite.OneHiddenLayer(8, width, activation="tanh", parametrization=p)
            start = copy.deepcopy(net)
            finite.train_finite(net, XS, YS, 60, 0.5)
            moves[p].append(finite.feature_movement(net, start, XS))
    mup, ntk = finite.fitted_slope(widths, moves["mup"]), finite.fitted_slope(widths, moves["ntk"])
    print(f"feature movement slopes: µP {mup:+.2f}, NTK {ntk:+.2f}")
    assert abs(mup) < 0.1 and -0.6 < ntk < -0.4
    assert moves["mup"][-1] > 0.05


def test_mup_limit_arguments_are_checked():
    with pytest.raises(ValueError, match="method"):
        L.MuPLimit(method="exact")
    with pytest.raises(ValueError, match="identity"):
        L.MuPLimit("relu", method="linear").fit(XS, YS, 1, 0.1)
    with pytest.raises(ValueError, match="before predict"):
        L.MuPLimit().predict(XT)
    with pytest.raises(ValueError, match="features"):
        L.MuPLimit().fit(XS, YS, 1, 0.1).predict(_x(2, 3))
    with pytest.raises(ValueError, match="lr"):
        L.MuPLimit().fit(XS, YS, 1, 0.0)


def test_monte_carlo_error_is_honest():
    """The reported standard error matches the seed-to-seed spread of the Monte Carlo limit."""
    x, y = _x(32, 8, seed=7), torch.tanh(_x(32, 8, seed=7)[:, 0])
    runs = [
        L.MuPLimit("relu", method="monte_carlo", samples=4096, seed=s)
        .fit(x, y, 100, 0.3)
        .predict(XT, return_error=True)
        for s in (0, 1)
    ]
    spread = float((runs[0][0] - runs[1][0]).pow(2).mean().sqrt()) / math.sqrt(2)
    reported = float(runs[0][1].pow(2).mean().sqrt())
    assert 0.4 < reported / spread < 2.5, (reported, spread)


# ---------------------------------------------------------------------------- Adam and momentum (TP4b)


def test_finite_mup_adam_networks_approach_the_adam_limit_like_one_over_sqrt_width(adam_limit):
    steps, lr, widths = 40, 0.02, WIDTHS  # measured: gaps 0.046, 0.025, 0.011, 0.0058; slope −0.51
    limit, err = adam_limit
    assert float(limit.abs().max()) > 0.3 and float(err.max()) < 2e-3  # it learned; Monte Carlo is tight
    gaps = _finite_errors("tanh", limit, widths, steps, lr, seeds=6, optimizer="adam")
    slope = finite.fitted_slope(widths, gaps)
    print(f"adam: |finite µP − limit| {[f'{e:.2e}' for e in gaps]} at widths {widths}: slope {slope:+.2f}")
    assert -0.75 < slope < -0.3
    assert gaps[-1] < gaps[0] / 4


def test_adam_eps_must_shrink_like_the_gradients():
    """With a visible ε, the width-4096 net reaches the limit only if its ε is ε/n (the rules'
    ``adam_eps`` column); keeping the width-256 net's ε leaves it in between."""
    steps, lr, eps = 40, 0.02, 0.05
    limit = L.MuPLimit("tanh", optimizer="adam", eps=eps, samples=2**17).fit(XS, YS, steps, lr).predict(XT)
    scaled = _finite_errors("tanh", limit, [4096], steps, lr, seeds=3, optimizer="adam", eps=eps)[0]
    kept = _finite_errors("tanh", limit, [4096], steps, lr, seeds=3, optimizer="adam", eps=eps * 4096 / 256)[0]
    print(f"adam, eps {eps}: gap with ε/n {scaled:.3e}, with the base width's ε {kept:.3e}")
    assert kept > 5 * scaled


@pytest.mark.parametrize("nesterov", [False, True])
def test_finite_momentum_networks_approach_the_momentum_limit(nesterov, momentum_free_limit):
    steps, lr, widths = 40, 0.05, WIDTHS  # measured: slopes −0.55 (plain), −0.57 (Nesterov)
    limit = L.MuPLimit("tanh", method="quadrature", momentum=0.9, nesterov=nesterov).fit(XS, YS, steps, lr).predict(XT)
    plain = momentum_free_limit
    assert float((limit - plain).abs().max()) > 0.05  # momentum changes the trajectory
    gaps = _finite_errors("tanh", limit, widths, steps, lr, seeds=6, momentum=0.9, nesterov=nesterov)
    slope = finite.fitted_slope(widths, gaps)
    print(f"momentum (nesterov={nesterov}): gaps {[f'{e:.2e}' for e in gaps]}: slope {slope:+.2f}")
    assert -0.75 < slope < -0.3 and gaps[-1] < gaps[0] / 4


def test_momentum_limit_is_the_same_by_all_three_methods():
    x, y = XS[:2], YS[:2]
    lin = L.MuPLimit("identity", method="linear", momentum=0.8).fit(x, y, 30, 0.1).predict(XT)
    quad = L.MuPLimit("identity", method="quadrature", momentum=0.8).fit(x, y, 30, 0.1).predict(XT)
    mc, err = (
        L.MuPLimit("identity", method="monte_carlo", momentum=0.8, samples=16384)
        .fit(x, y, 30, 0.1)
        .predict(XT, return_error=True)
    )
    assert torch.allclose(lin, quad, atol=1e-8), (lin, quad)
    assert ((mc - lin).abs() < 5 * err + 1e-3).all()


def test_finite_optimizer_scales_lr_and_eps_as_the_library_rules_say():
    """OneHiddenLayer is µP in the readout-multiplier formulation: u is an input weight, v a readout
    behind 1/n. Its optimizers' lr and ε across widths follow the rules' exponents (Table 8)."""
    from mutransfer.rules import TABLE8

    n, m = 64, 4
    small, large = (finite.OneHiddenLayer(8, w) for w in (n, m * n))
    assert TABLE8["output"].forward == (-1.0, 0.0) and large.scale * m == small.scale
    for opt, col, eps_col in (
        ("sgd", "sgd_lr", None),
        ("adam", "adam_lr", "adam_eps"),
        ("adamw", "adam_lr", "adam_eps"),
    ):
        a, b = finite.finite_optimizer(small, 0.1, opt), finite.finite_optimizer(large, 0.1, opt)
        for _i, role, dim in ((0, "input", 1), (1, "output", 0)):  # m_out for u, m_in for v
            ratio = b.param_groups[0]["lr"] / a.param_groups[0]["lr"]
            assert ratio == pytest.approx(m ** getattr(TABLE8[role], col)[dim]), (opt, role)
            if eps_col:
                eps_ratio = b.param_groups[0]["eps"] / a.param_groups[0]["eps"]
                assert eps_ratio == pytest.approx(m ** getattr(TABLE8[role], eps_col)[dim]), (opt, role)


def test_finite_mup_adamw_networks_approach_the_adamw_limit(adam_limit):
    steps, lr, wd, widths = 40, 0.02, 2.0, WIDTHS
    limit = L.MuPLimit("tanh", optimizer="adamw", weight_decay=wd, samples=2**17).fit(XS, YS, steps, lr).predict(XT)
    adam = adam_limit[0]
    assert float((limit - adam).abs().max()) > 0.05  # the decay changes the trajectory
    gaps = _finite_errors("tanh", limit, widths, steps, lr, seeds=4, optimizer="adamw", weight_decay=wd)
    slope = finite.fitted_slope(widths, gaps)
    print(f"adamw: gaps {[f'{e:.2e}' for e in gaps]}: slope {slope:+.2f}")
    assert -0.75 < slope < -0.3 and gaps[-1] < gaps[0] / 4


def test_optimizer_arguments_are_checked():
    with pytest.raises(ValueError, match="weight_decay is the decoupled decay"):
        L.MuPLimit(optimizer="adam", weight_decay=0.1)
    with pytest.raises(ValueError, match="weight_decay must be"):
        L.MuPLimit(optimizer="adamw", weight_decay=-1.0)
    with pytest.raises(ValueError, match="monte_carlo"):
        L.MuPLimit(method="linear", optimizer="adamw")
    with pytest.raises(ValueError, match="optimizer"):
        L.MuPLimit(optimizer="lion")
    with pytest.raises(ValueError, match="monte_carlo"):
        L.MuPLimit(method="quadrature", optimizer="adam")
    with pytest.raises(ValueError, match="momentum"):
        L.MuPLimit(momentum=1.0)
    with pytest.raises(ValueError, match="nesterov"):
        L.MuPLimit(nesterov=True)
    with pytest.raises(ValueError, match="betas"):
        L.MuPLimit(optimizer="adam", betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="parametrization='mup'"):
        finite.train_finite(finite.OneHiddenLayer(8, 16, parametrization="ntk"), XS, YS, 1, 0.1, optimizer="adam")
    assert L.MuPLimit(optimizer="adam").fit(XS, YS, 1, 0.01).method_used == "monte_carlo"


def test_a_diverging_mup_limit_raises_naming_lr():
    with pytest.raises(ValueError, match="diverged .*lower lr"):
        L.MuPLimit("tanh", method="monte_carlo", samples=256, momentum=0.9).fit(XS * 10, YS * 10, 200, 50.0)


def test_coarse_quadrature_warns_and_auto_avoids_it():
    """Issue 33: tanh, 8 inputs in d = 4 (a 5-D grid of 10 points per dimension) missed the Monte
    Carlo limit by up to 24 standard errors; an explicit method="quadrature" there warns, "auto"
    takes Monte Carlo, and a 3-D grid (18+ points) stays silent."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, generator=g, dtype=torch.float64)
    y = torch.randn(8, generator=g, dtype=torch.float64)
    with pytest.warns(L.KernelWarning, match="too coarse for tanh"):
        L.MuPLimit("tanh", method="quadrature", max_nodes=4096).fit(x, y, 1, 0.5)
    assert L.MuPLimit("tanh", samples=256).fit(x, y, 1, 0.5).method_used == "monte_carlo"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert L.MuPLimit("tanh", max_nodes=8000).fit(x[:2], y[:2], 1, 0.5).method_used == "quadrature"
