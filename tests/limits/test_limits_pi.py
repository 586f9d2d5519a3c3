"""The π-limit (`PiLimit`) against its finite π-nets (`PiNet` + `train_pi`), a derivation by hand,
the kernel machinery of `mt.limits` at init, and its errors."""

import math

import numpy as np
import pytest
import torch

import mutransfer as mt
from mutransfer.limits import finite
from mutransfer.limits._activations import get_activation
from mutransfer.limits._pi_limit import pi_initial_state, relu_delta_moment

torch.set_num_threads(2)


def task(seed, n=8, d=4, extra=6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.sin(2 * x[:, 0]) + x[:, 1]
    x_eval = torch.cat([x, torch.randn(extra, d, generator=g, dtype=torch.float64)])
    return x, y, x_eval


def convergence(depth, rank, steps, lr, widths, seeds, batch_size=None, data_seed=2, net_kw=None, fit_kw=None):
    """RMS over Ω-seeds and points of f_n − f_∞ per width, and the RMS size of f_∞."""
    net_kw, fit_kw = net_kw or {}, fit_kw or {}
    x, y, x_eval = task(data_seed)
    limit = mt.limits.PiLimit(depth, rank, seed=data_seed, **net_kw).fit(x, y, steps, lr, batch_size, **fit_kw)
    f_inf = limit.predict(x_eval)
    gaps = []
    for width, count in zip(widths, seeds):
        sq = []
        for s in range(count):
            net = finite.PiNet(x.shape[1], width, depth, rank, seed=data_seed, omega_seed=7919 * width + s, **net_kw)
            finite.train_pi(net, x, y, steps, lr, batch_size, **fit_kw)
            with torch.no_grad():
                sq.append(((net(x_eval)[:, 0] - f_inf) ** 2).mean().item())
        gaps.append(math.sqrt(np.mean(sq)))
    return gaps, f_inf.pow(2).mean().sqrt().item(), limit


def test_finite_pi_nets_converge_to_the_limit_at_rate_one_over_sqrt_width():
    # depth 2, full batch, every multiplier away from 1 (α_in, α_out, both lr multipliers)
    widths = [256, 1024, 4096]
    gaps, size, limit = convergence(
        depth=2,
        rank=8,
        steps=3,
        lr=1.0,
        widths=widths,
        seeds=[12, 8, 4],
        data_seed=3,
        net_kw=dict(input_alpha=1.5, output_alpha=0.7),
        fit_kw=dict(input_lr_mult=2.0, output_lr_mult=0.5),
    )
    slope = finite.fitted_slope(widths, gaps)  # measured: gaps 0.047, 0.020, 0.0125; slope −0.48
    assert -0.7 < slope < -0.3, (gaps, slope)
    assert gaps[-1] < 0.15 * size, (gaps, size)
    assert size > 0.1  # the function moved away from f ≡ 0
    x, y, _ = task(3)
    assert ((limit.predict(x) - y) ** 2).mean() < (y**2).mean()  # and learned


@pytest.mark.slow
def test_deeper_pi_nets_converge_to_the_limit():
    widths = [256, 1024, 4096]
    gaps, size, _ = convergence(
        depth=3, rank=8, steps=4, lr=1.0, widths=widths, seeds=[12, 8, 4], data_seed=2, net_kw=dict(input_alpha=1.5)
    )
    slope = finite.fitted_slope(widths, gaps)  # measured: gaps 0.065, 0.032, 0.020; slope −0.43
    assert -0.7 < slope < -0.3, (gaps, slope)
    assert gaps[-1] < 0.15 * size, (gaps, size)


# ---------------------------------------------------------------------- two SGD steps by hand

# rank 2: ω = ρ(cos φ, sin φ) with E[ρ²] = 2, so E[h(ω)] = 2 · mean_φ h(cos φ, sin φ) for any h that is
# positively homogeneous of degree 2 — both expectations below are. Midpoint rule on φ.
_PHI = (torch.arange(400_000, dtype=torch.float64) + 0.5) * (2 * math.pi / 400_000)
_U = torch.stack([_PHI.cos(), _PHI.sin()], 1)


def V(b, g):
    """E[relu(ω·b) relu(ω·g)], ω ~ N(0, I₂)."""
    return 2 * (torch.relu(_U @ b) * torch.relu(_U @ g)).mean()


def grad_V(b, g):
    """∂/∂g E[relu(ω·b) relu(ω·g)] = E[ω relu(ω·b) 1(ω·g > 0)]."""
    return 2 * (_U * (torch.relu(_U @ b) * (_U @ g > 0))[:, None]).mean(0)


def test_two_sgd_steps_match_a_derivation_by_hand():
    d, rank, lr, seed = 3, 2, 0.8, 5
    x = torch.tensor([[0.9, -0.4, 1.3]], dtype=torch.float64)
    y = torch.tensor([1.1], dtype=torch.float64)
    x_test = torch.tensor([[0.9, -0.4, 1.3], [-0.2, 1.0, 0.5], [1.5, 0.3, -0.7]], dtype=torch.float64)
    a_in, [(a2, b2)] = pi_initial_state(d, 2, rank, seed)

    def hidden(a_in, rows2, xp):
        g1 = a_in.T @ xp
        return g1, sum(a * V(b, g1) for a, b in rows2)

    rows2 = list(zip(a2, b2))
    g1, g2 = hidden(a_in, rows2, x[0])
    # step 1: f ≡ 0, so only the readout gets a row: a = −η |g²| (f − y), b = g²/|g²|
    readout = [(lr * g2.norm() * y[0], g2 / g2.norm())]
    expected_1 = torch.stack([sum(a * V(b, hidden(a_in, rows2, xp)[1]) for a, b in readout) for xp in x_test])
    limit = mt.limits.PiLimit(2, rank, seed=seed).fit(x, y, 1, lr)
    torch.testing.assert_close(limit.predict(x_test), expected_1, rtol=1e-6, atol=1e-9)
    # step 2: backprop δ³ = f − y, δ² = Σ (a·δ³) ∇V(b, g²), δ¹ = Σ (a·δ²) ∇V(b, g¹); append the rows
    f = sum(a * V(b, g2) for a, b in readout)
    delta3 = f - y[0]
    delta2 = sum(a * delta3 * grad_V(b, g2) for a, b in readout)
    delta1 = sum((a @ delta2) * grad_V(b, g1) for a, b in rows2)
    readout = readout + [(-lr * g2.norm() * delta3, g2 / g2.norm())]
    rows2 = rows2 + [(-lr * g1.norm() * delta2, g1 / g1.norm())]
    a_in = a_in - lr * torch.outer(x[0], delta1)
    expected_2 = torch.stack([sum(a * V(b, hidden(a_in, rows2, xp)[1]) for a, b in readout) for xp in x_test])
    limit = mt.limits.PiLimit(2, rank, seed=seed).fit(x, y, 2, lr)
    torch.testing.assert_close(limit.A_in, a_in, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(limit.predict(x_test), expected_2, rtol=1e-6, atol=1e-9)
    assert (expected_2 - expected_1).abs().max() > 1e-2  # the second step did something


def test_relu_delta_moment_is_the_rest_of_the_gradient_of_the_v_transform():
    # ∇_g V(b, g) = b·E[1 1] + g·E[relu δ] (Stein), checked against autograd of the arc-cosine formula
    relu = get_activation("relu")
    g = torch.tensor([0.7, -1.2, 0.4], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([0.3, 0.5, -0.8], dtype=torch.float64)
    b = b / b.norm()
    (auto,) = torch.autograd.grad(relu.phi_moment(torch.tensor(1.0), g @ g, b @ g), g)
    s = g.detach().norm()
    q = (b @ g.detach()) / s
    closed = b * relu.dphi_moment(torch.tensor(1.0), s * s, s * q) + g.detach() * relu_delta_moment(q, s)
    torch.testing.assert_close(closed, auto, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------- at initialization


def test_limit_at_init_is_the_one_layer_nngp_of_its_representations():
    """With r-dimensional representations gˡ (g¹ = A_inᵀx): layer l's post-activation kernel is the
    one-hidden-layer relu NNGP of gˡ (weight_var = √r: K¹ = √r·g·g'/r, K² = √r·E[relu relu] = V),
    and g^{l+1} = Aᵀ K(rows of B, gˡ) with the same kernel between B's rows and gˡ."""
    x, y, _ = task(3, n=6, d=5)
    rank, w = 5, math.sqrt(5)
    limit = mt.limits.PiLimit(3, rank, seed=4).fit(x, y, 0, 1.0)
    assert torch.equal(limit.predict(x), torch.zeros(6, dtype=torch.float64))
    reps = limit.representations(x)
    a_in, layers = pi_initial_state(5, 3, rank, 4)
    torch.testing.assert_close(reps[0], x @ a_in)
    for l, (a, b) in enumerate(layers):
        torch.testing.assert_close(reps[l + 1], mt.limits.nngp(b, reps[l], depth=1, weight_var=w).T @ a)
    for l in range(3):
        torch.testing.assert_close(
            limit.feature_kernel(x, layer=l + 1), mt.limits.nngp(reps[l], depth=1, weight_var=w), rtol=1e-10, atol=1e-12
        )


def test_finite_pi_net_at_init_has_the_limits_feature_kernels():
    """relu(hˡ(x))·relu(hˡ(x')) of the finite π-net → the limit's feature kernel, layer by layer, at
    rate n^{-1/2} (a Monte Carlo over the n neurons' ω; independent Ω per width and seed)."""
    x, y, _ = task(3, n=6, d=5)
    limit = mt.limits.PiLimit(3, 5, seed=4).fit(x, y, 0, 1.0)
    kernels = [limit.feature_kernel(x, layer=l + 1) for l in range(3)]
    widths, seeds, errors = [256, 1024, 4096], 5, []
    for width in widths:
        sq = np.zeros(3)
        for s in range(seeds):
            net = finite.PiNet(5, width, 3, 5, seed=4, omega_seed=1000 * width + s)
            with torch.no_grad():
                feats = net.features(x)
            sq += [((f @ f.T - k).norm() / k.norm()).item() ** 2 / seeds for f, k in zip(feats, kernels)]
        errors.append(np.sqrt(sq))
    errors = np.array(errors)  # measured (6 seeds): 0.12/0.27/0.29 at 256 → 0.037/0.072/0.088 at 4096
    slopes = [finite.fitted_slope(widths, errors[:, l]) for l in range(3)]
    assert all(-0.8 < s < -0.3 for s in slopes), (errors, slopes)
    assert (errors[-1] < 0.15).all(), errors


def test_first_layer_gram_averaged_over_the_pi_init_is_the_nngp_input_kernel():
    """A_in has uniform unit columns, so E[g¹(x)·g¹(x')] = r·x·x'/d = K¹ of nngp with weight_var = r."""
    x, _, _ = task(1, n=5, d=4)
    rank = 3
    grams = torch.stack([(x @ a) @ (x @ a).T for a, _ in (pi_initial_state(4, 2, rank, s) for s in range(3000))])
    expected = mt.limits.nngp(x, depth=0, weight_var=float(rank))
    torch.testing.assert_close(grams.mean(0), expected, rtol=0.0, atol=0.06 * expected.diag().max().item())


# ---------------------------------------------------------------------- errors


def test_errors_name_the_argument_and_the_fix():
    x, y, _ = task(0)
    with pytest.raises(ValueError, match="MuPLimit"):
        mt.limits.PiLimit(1, 4)
    with pytest.raises(ValueError, match="MuPLimit"):
        finite.PiNet(4, 64, 1, 4)
    with pytest.raises(ValueError, match="rank"):
        mt.limits.PiLimit(2, 0)
    with pytest.raises(TypeError, match="rank"):
        mt.limits.PiLimit(2, 2.5)
    with pytest.raises(ValueError, match="width"):
        finite.PiNet(4, 3, 2, 4)
    with pytest.raises(ValueError, match="before predict"):
        mt.limits.PiLimit(2, 4).predict(x)
    limit = mt.limits.PiLimit(2, 3).fit(x, y, 1, 0.5)
    with pytest.raises(ValueError, match="features"):
        limit.predict(x[:, :3])
    with pytest.raises(ValueError, match="lr"):
        mt.limits.PiLimit(2, 3).fit(x, y, 1, -1.0)
    with pytest.raises(ValueError, match="steps"):
        mt.limits.PiLimit(2, 3).fit(x, y, -1, 0.5)
    with pytest.raises(ValueError, match="y must have shape"):
        mt.limits.PiLimit(2, 3).fit(x, y[:5], 1, 0.5)
    with pytest.raises(ValueError, match="layer"):
        limit.feature_kernel(x, layer=3)
    net = finite.PiNet(4, 16, 2, 3, d_out=1)
    with pytest.raises(TypeError, match="PiNet"):
        finite.train_pi(torch.nn.Linear(4, 1), x, y, 1, 0.5)
    with pytest.raises(ValueError, match="features"):
        finite.train_pi(net, x[:, :2], y, 1, 0.5)
    with pytest.raises(ValueError, match="d_out"):
        finite.train_pi(net, x, torch.stack([y, y], 1), 1, 0.5)
    with pytest.raises(ValueError, match="batch_size"):
        finite.train_pi(net, x, y, 1, 0.5, batch_size=0)


def test_several_outputs_and_minibatches_share_the_batches_of_sgd_batches():
    x, y, x_eval = task(4)
    y2 = torch.stack([y, -0.5 * y], 1)
    limit = mt.limits.PiLimit(2, 3, seed=1).fit(x, y2, 4, 1.0, batch_size=3, batch_seed=9)
    out = limit.predict(x_eval)
    assert out.shape == (len(x_eval), 2) and out.dtype == torch.float64
    net = finite.PiNet(4, 2048, 2, 3, d_out=2, seed=1, omega_seed=0)
    finite.train_pi(net, x, y2, 4, 1.0, batch_size=3, batch_seed=9)
    with torch.no_grad():
        gap = (net(x_eval) - out).norm() / out.norm()
    assert gap < 0.15, gap
    # a different data order is a different limit
    other = mt.limits.PiLimit(2, 3, seed=1).fit(x, y2, 4, 1.0, batch_size=3, batch_seed=10).predict(x_eval)
    assert (other - out).norm() / out.norm() > 2 * gap
    # the state grows by B rows per layer and step: r + 4·3 hidden rows, 4·3 readout rows
    assert [a.shape[0] for a in limit.A] == [3 + 12, 12]


def test_a_diverging_pi_limit_raises_naming_lr_and_input_alpha():
    x, y, _ = task(0, n=16, d=8)
    with pytest.raises(ValueError, match="diverged at step .*lower lr or input_alpha"):
        mt.limits.PiLimit(2, 64).fit(x * 4, y * 10, 50, 5.0)
