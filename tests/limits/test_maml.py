"""First-order MAML on the µP linear net and its infinite-width limits (`mutransfer.limits.maml`,
`mt.limits.MAMLLimit`, issue 47): finite µP nets meta-trained by `train_maml` approach the exact µP
limit as width grows (at init and after meta-training), `train_maml` is first-order MAML by autograd,
the NTK and GP limits are one-step dot-product classifiers that meta-training cannot change (and finite
centred NTK-parametrized nets approach them), the µP limit beats them on digits, the errors, and the
task loaders (digits, Omniglot on a synthetic folder, `sample_tasks`, `meta_batches`)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import nn

import mutransfer as mt
from mutransfer.limits import maml
from script_runner import run_here

D, K, BASE, STEP, META_LR = 64, 5, 16, 0.3, 0.3
F = nn.functional


def net(n: int, seed: int = 0, d: int = D, k: int = K) -> nn.Sequential:
    """The plain linear net Linear(d, n) → Linear(n, k), no biases, seeded."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, n, bias=False), nn.Linear(n, k, bias=False))


def mup_net(n: int, seed: int) -> nn.Sequential:
    """The finite µP net at width n (base width 16, the base always seed 0, as the limit's), float64."""
    model = net(n, seed)
    mt.parametrize(model, base=net(BASE))
    return model.double()


def limit(kind: str = "mup", step: float = STEP, width: int = 64) -> mt.limits.MAMLLimit:
    return mt.limits.MAMLLimit(net(width), net(BASE), kind, step)


def rms_gap(predict_a, predict_b, tasks) -> float:
    """The mean over tasks of the RMS difference of two adapted query logits."""
    gaps = [(predict_a(xs, ys, xq) - predict_b(xs, ys, xq)).pow(2).mean().sqrt() for xs, ys, xq, _ in tasks]
    return float(torch.stack(gaps).mean())


def rms(predict, tasks) -> float:
    return float(torch.stack([predict(xs, ys, xq).pow(2).mean().sqrt() for xs, ys, xq, _ in tasks]).mean())


def slope(widths, gaps) -> float:
    """The least-squares slope of log(gap) against log(width)."""
    x = torch.tensor(widths, dtype=torch.float64).log()
    y = torch.tensor(gaps, dtype=torch.float64).log()
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / (x * x).sum())


def dot_product_logits(xs, ys, xq, step, theta, f_support=None, f_query=None):
    """One softmax cross-entropy step of size `step` with the kernel θ xᵀx′ from the function f
    (f = 0 unless its values are given): f(x_q) + step·θ/m Σ_s (y_s − softmax f(x_s)) x_sᵀ x_q, m = |support|."""
    m = len(ys)
    p = torch.full((m, K), 1.0 / K, dtype=torch.float64) if f_support is None else torch.softmax(f_support, -1)
    resid = F.one_hot(ys, K).double() - p
    out = step * theta / m * (xq @ xs.T) @ resid
    return out if f_query is None else f_query + out


@pytest.fixture(scope="module")
def train_batches():
    """200 meta-batches of 16 digits tasks (5-way 1-shot, 5 queries); the first 20 are
    `maml.meta_batches(maml.digits_tasks("train", 16 * 20, seed=0), 16)`: the same draws."""
    return maml.meta_batches(maml.digits_tasks("train", 16 * 200, seed=0), 16)


@pytest.fixture(scope="module")
def test_tasks():
    return maml.digits_tasks("test", 300, seed=1)


# ------------------------------------------------------------------------ finite µP → the µP limit


@pytest.mark.parametrize("meta_steps", [0, pytest.param(20, marks=pytest.mark.slow)])
def test_finite_mup_nets_approach_the_mup_limit(train_batches, test_tasks, meta_steps):
    """Finite µP nets (widths 256/1024/4096, 3 seeds, float64) meta-trained by `train_maml` (step 0.3,
    meta_lr 0.3) on 20 digits meta-batches of 16, against `MAMLLimit("mup")` fitted on the same: the
    mean per-seed RMS gap of the adapted query logits on 10 held-out test tasks falls with width at a
    log-log slope below −0.35 (measured: −0.50 at init, gaps 0.086/0.049/0.022 against logits of RMS
    0.44; −0.50 after 20 meta-steps, gaps 0.095/0.047/0.024 against 1.46), and at 4096 it is under a
    tenth of the logits. After meta-training the limit's logits differ from its fresh ones by much more
    than the gap, so the nets converge to a limit that meta-training moved, not to the fresh one.
    Runtime: ~1 s at init, ~10 s with 20 meta-steps."""
    batches, held_out = train_batches[:meta_steps], test_tasks[:10]
    lim = limit(width=1 << 14).fit(batches, META_LR)  # σ_u² read off 10⁶ entries: its sampling error ~0.1%
    scale = rms(lim.predict, held_out)
    widths, gaps = [256, 1024, 4096], []
    for n in widths:
        per_seed = []
        for seed in (1, 2, 3):
            model = maml.train_maml(mup_net(n, seed), batches, STEP, META_LR)
            per_seed.append(
                rms_gap(lambda xs, ys, xq, m=model: maml.maml_logits(m, xs, ys, xq, STEP), lim.predict, held_out)
            )
        gaps.append(sum(per_seed) / len(per_seed))
    s = slope(widths, gaps)
    print(f"meta-steps {meta_steps}: gaps {[round(g, 4) for g in gaps]}, logits rms {scale:.3f}, slope {s:.2f}")
    assert s < -0.35, (gaps, s)
    assert gaps[-1] < 0.1 * scale, (gaps, scale)
    if meta_steps:
        moved = rms_gap(lim.predict, limit(width=1 << 14).predict, held_out)
        assert moved > 10 * gaps[-1], (moved, gaps)


def _fo_maml_autograd(model, batches, step, meta_lr):
    """First-order MAML by autograd, one task at a time: the reference for `train_maml`."""
    lrs = {id(p): float(g["lr"]) for g in mt.param_groups(model, 1.0, "sgd") for p in g["params"]}
    params = list(model.parameters())
    for batch in batches:
        total = [torch.zeros_like(p) for p in params]
        for xs, ys, xq, yq in batch:
            grads = torch.autograd.grad(F.cross_entropy(model(xs), ys), params)
            adapted = [(p - step * lrs[id(p)] * g).detach().requires_grad_() for p, g in zip(params, grads)]
            w1, w2 = adapted
            query = torch.autograd.grad(F.cross_entropy(xq @ w1.T @ w2.T, yq), adapted)
            total = [t + q for t, q in zip(total, query)]
        with torch.no_grad():
            for p, t in zip(params, total):
                p -= meta_lr * lrs[id(p)] * t / len(batch)
    return model


def test_train_maml_is_first_order_maml_by_autograd():
    """`train_maml` and `maml_logits` equal first-order MAML written with autograd (each layer's steps
    × its µP factor from mt.param_groups), to 1e-12, on meta-batches that mix 1-shot and 2-shot tasks
    (tasks of several shapes in one batch) and 3-way tasks on a 5-way net (labels 0…2 ⊂ 0…4)."""
    one = maml.digits_tasks("train", 6, seed=3)
    two = maml.digits_tasks("train", 6, shots=2, queries=3, seed=4)
    three_way = maml.digits_tasks("train", 2, ways=3, seed=5)
    batches = [[one[0], two[0], one[1], three_way[0]], [two[1], two[2], one[2]], [one[3], three_way[1]]]
    ours = maml.train_maml(mup_net(48, 7), batches, STEP, META_LR)
    ref = _fo_maml_autograd(mup_net(48, 7), batches, STEP, META_LR)
    moved = float((ours[0].weight - mup_net(48, 7)[0].weight).detach().abs().max())
    assert moved > 1e-3
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    xs, ys, xq, _ = two[5]
    lrs = [float(g["lr"]) for g in mt.param_groups(ref, 1.0, "sgd")]
    grads = torch.autograd.grad(F.cross_entropy(ref(xs), ys), list(ref.parameters()))
    with torch.no_grad():
        w1, w2 = (p - STEP * lr * g for p, g, lr in zip(ref.parameters(), grads, lrs))
        torch.testing.assert_close(maml.maml_logits(ours, xs, ys, xq, STEP), xq @ w1.T @ w2.T, rtol=1e-12, atol=1e-12)


def test_fit_continues_and_counts_meta_steps(train_batches):
    """fit(a).fit(b) is fit(a + b) (the state carries on), and meta_steps counts the meta-batches."""
    a, b = train_batches[:3], train_batches[3:5]
    split = limit().fit(a, META_LR).fit(b, META_LR)
    whole = limit().fit(a + b, META_LR)
    assert split.meta_steps == whole.meta_steps == 5
    xs, ys, xq, _ = train_batches[6][0]
    torch.testing.assert_close(split.predict(xs, ys, xq), whole.predict(xs, ys, xq), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["mup", "ntk", "gp"])
def test_restarted_and_accuracy(train_batches, kind):
    """`restarted(step)` of a meta-trained limit is a fresh limit at that step (equal predictions, 0
    meta-steps) and leaves the trained one as it was; `accuracy` (batched by task shape) is the share
    of queries whose `predict` argmax is right, on tasks of two shapes."""
    trained = limit(kind).fit(train_batches[:5], META_LR)
    xs, ys, xq, _ = train_batches[6][0]
    before = trained.predict(xs, ys, xq)
    fresh = trained.restarted(0.1)
    assert fresh.meta_steps == 0 and fresh.step_size == 0.1 and trained.meta_steps == 5
    torch.testing.assert_close(fresh.predict(xs, ys, xq), limit(kind, 0.1).predict(xs, ys, xq), rtol=1e-12, atol=1e-12)
    fresh.fit(train_batches[7:9], META_LR)
    torch.testing.assert_close(trained.predict(xs, ys, xq), before, rtol=0, atol=0)
    torch.testing.assert_close(
        trained.restarted().predict(xs, ys, xq), limit(kind).predict(xs, ys, xq), rtol=1e-12, atol=1e-12
    )
    with pytest.raises(ValueError, match="step_size must be a positive number"):
        trained.restarted(0.0)
    tasks = maml.digits_tasks("test", 7, seed=2) + maml.digits_tasks("test", 5, shots=2, queries=3, seed=3)
    right = sum(int((trained.predict(xs, ys, xq).argmax(-1) == yq).sum()) for xs, ys, xq, yq in tasks)
    assert trained.accuracy(tasks) == right / sum(len(t[3]) for t in tasks)


# ------------------------------------------------------------------------ the kernel limits


def _constants():
    """σ_u², σ_a², κ₁, κ₂ read off the finite µP net at width 64 (the one `limit()` is given), not off
    the limit: σ_u² = rms²(W₁), σ_a² = n²·rms²(W₂), κ₁ = lr₁/n, κ₂ = lr₂·n (mt.param_groups' SGD factors)."""
    n = 64
    model = net(n)
    mt.parametrize(model, base=net(BASE))
    lr1, lr2 = (float(g["lr"]) for g in mt.param_groups(model, 1.0, "sgd"))
    s_u = float(model[0].weight.detach().double().pow(2).mean())
    s_a = n * n * float(model[1].weight.detach().double().pow(2).mean())
    return s_u, s_a, lr1 / n, lr2 * n


def test_fresh_limits_are_one_step_dot_product_classifiers(test_tasks):
    """A fresh limit starts at f = 0, so one softmax-CE step gives the logits
    step·θ/m Σ_s (y_s − 1/k) x_sᵀ x_q (m support examples): to 1e-12, with θ = σ_u² + σ_a² for the NTK,
    σ_u² for the GP and — derived from A = I: A_u ← [I, −ηκ₁pᵀ], A_a ← [−ηκ₂p, I], M = A_a Σ₀ A_uᵀ =
    −η(κ₂σ_u² + κ₁σ_a²)p — θ = κ₂σ_u² + κ₁σ_a² for µP (measured 5.215, 0.00516 and 0.408). A wide
    finite µP net (width 2¹⁴) after its one inner step gives the µP formula within 5% RMS (measured ~2%)."""
    s_u, s_a, k1, k2 = _constants()
    thetas = {"ntk": s_u + s_a, "gp": s_u, "mup": k2 * s_u + k1 * s_a}
    print({kind: round(t, 5) for kind, t in thetas.items()})
    for kind, theta in thetas.items():
        lim = limit(kind)
        for xs, ys, xq, _ in test_tasks[:5]:
            expected = dot_product_logits(xs, ys, xq, STEP, theta)
            torch.testing.assert_close(lim.predict(xs, ys, xq), expected, rtol=1e-12, atol=1e-12)
    wide = mup_net(1 << 14, 11)
    tasks = test_tasks[:5]
    gap = rms_gap(
        lambda xs, ys, xq: maml.maml_logits(wide, xs, ys, xq, STEP),
        lambda xs, ys, xq: dot_product_logits(xs, ys, xq, STEP, thetas["mup"]),
        tasks,
    )
    scale = rms(lambda xs, ys, xq: dot_product_logits(xs, ys, xq, STEP, thetas["mup"]), tasks)
    print(f"width 2^14 finite µP vs the one-step formula: {gap:.4f} of {scale:.3f}")
    assert gap < 0.05 * scale


@pytest.mark.parametrize("kind", ["ntk", "gp"])
def test_kernel_limits_learn_no_features(train_batches, test_tasks, kind):
    """After 20 meta-batches the NTK/GP limit's function is f = Bx with B ≠ 0 (the documented state),
    yet its adaptation is still one step with the fresh kernel θ xᵀx′: the adapted logits equal
    Bx_q + step·θ/m Σ_s (y_s − softmax(Bx_s)) x_sᵀx_q to 1e-12. The µP limit's adaptation, after the same
    meta-training, is no longer of that form (its kernel moved): off by more than 10% of its logits."""
    s_u, s_a, k1, k2 = _constants()
    theta = s_u + s_a if kind == "ntk" else s_u
    lim = limit(kind).fit(train_batches[:20], META_LR)
    B = lim.state
    assert B.shape == (K, D)
    assert rms(lambda xs, ys, xq: xq @ B.T, test_tasks[:5]) > 0.1 * rms(lim.predict, test_tasks[:5])  # B matters
    for xs, ys, xq, _ in test_tasks[:5]:
        expected = dot_product_logits(xs, ys, xq, STEP, theta, xs @ B.T, xq @ B.T)
        torch.testing.assert_close(lim.predict(xs, ys, xq), expected, rtol=1e-12, atol=1e-12)
    mup = limit("mup").fit(train_batches[:20], META_LR)
    A = mup.state
    sigma0 = torch.diag(torch.tensor([s_u] * D + [s_a] * K, dtype=torch.float64))
    M = A[D:] @ sigma0 @ A[:D].T  # the µP limit's function before adaptation: f(x) = M x
    theta_mup = k2 * s_u + k1 * s_a
    tasks = test_tasks[:5]
    off = rms_gap(
        mup.predict, lambda xs, ys, xq: dot_product_logits(xs, ys, xq, STEP, theta_mup, xs @ M.T, xq @ M.T), tasks
    )
    adapt = rms_gap(mup.predict, lambda xs, ys, xq: xq @ M.T, tasks)
    print(f"µP after meta-training: off the fresh-kernel step by {off:.3f}, the step itself {adapt:.3f}")
    assert off > 0.1 * adapt


def _centred_ntk_maml(n, var, batches, step, meta_lr, seed, gp):
    """The finite net in the NTK parametrization, centred: f(x) = (W₂W₁ − W₂⁰W₁⁰)x/√n, W₁ entries of
    variance σ_u², W₂ of σ_a² (Gaussian), plain SGD of `step` on both layers (the GP: on W₂ only),
    first-order MAML by autograd, tasks batched (each task its own copy of the weights)."""
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(n, D, generator=g, dtype=torch.float64) * math.sqrt(var[0])
    w2 = torch.randn(K, n, generator=g, dtype=torch.float64) * math.sqrt(var[1])
    start = w2 @ w1

    def logits(a1, a2, x):  # (tasks, n, d), (tasks, k, n), (tasks, m, d)
        return x @ (a2 @ a1 - start).transpose(1, 2) / math.sqrt(n)

    def loss(a1, a2, x, y):
        return F.cross_entropy(logits(a1, a2, x).flatten(0, 1), y.flatten(), reduction="sum") / y.shape[1]

    def grads(a1, a2, x, y):
        """d(loss)/d(a1), d(loss)/d(a2); the GP's a1 is fixed (gradient 0)."""
        a1, a2 = a1.detach().requires_grad_(not gp), a2.detach().requires_grad_()
        if gp:
            return torch.zeros_like(a1), torch.autograd.grad(loss(a1, a2, x, y), a2)[0]
        return torch.autograd.grad(loss(a1, a2, x, y), [a1, a2])

    def adapt(w1, w2, xs, ys):
        a1, a2 = w1.expand(len(xs), -1, -1), w2.expand(len(xs), -1, -1)
        g1, g2 = grads(a1, a2, xs, ys)
        return a1 - step * g1, a2 - step * g2

    for batch in batches:
        xs, ys, xq, yq = (torch.stack([t[i] for t in batch]) for i in range(4))
        g1, g2 = grads(*adapt(w1, w2, xs, ys), xq, yq)
        w1, w2 = w1 - meta_lr * g1.mean(0), w2 - meta_lr * g2.mean(0)

    def predict(xs, ys, xq):
        a1, a2 = adapt(w1, w2, xs[None], ys[None])
        return logits(a1, a2, xq[None])[0]

    return predict


@pytest.mark.parametrize(
    "kind,step,meta_steps", [("ntk", STEP, 0), ("gp", STEP, 0), pytest.param("ntk", 0.03, 10, marks=pytest.mark.slow)]
)
def test_finite_centred_ntk_nets_approach_the_kernel_limits(train_batches, test_tasks, kind, step, meta_steps):
    """The NTK/GP limits are the limits of the same net in the NTK parametrization — centred (f − f₀:
    the limit starts at f = 0, an uncentred net at a random f₀ of variance σ_a²σ_u²|x|², ~1.7 here),
    with the limit's σ_u², σ_a² and plain SGD of the same step and meta_lr: widths 256/1024/4096, 2 seeds,
    the mean RMS gap to `MAMLLimit(kind)` falls at a log-log slope below −0.35. Measured: NTK fresh,
    gaps 0.70/0.40/0.19 of logits 5.7, slope −0.48; GP fresh, 0.0011/0.00068/0.00028 of 0.0056, −0.51;
    NTK after 10 meta-steps (meta_lr 0.3) at step 0.03, 0.17/0.08/0.03 of logits 1.03 (0.57 fresh),
    ~−0.55. (At step 0.3 the NTK's inner step, 0.3·5.2·|x|²/5 ≈ 20 per unit of logit gradient, is so
    large that 10 meta-steps converge at only ~−0.36 over these widths: 2.5/1.2/0.94 of 7.0.)"""
    batches, held_out = train_batches[:meta_steps], test_tasks[:10]
    lim = limit(kind, step).fit(batches, META_LR)
    widths, gaps = [256, 1024, 4096], []
    for n in widths:
        per_seed = [
            rms_gap(_centred_ntk_maml(n, lim.var, batches, step, META_LR, seed, kind == "gp"), lim.predict, held_out)
            for seed in (0, 1)
        ]
        gaps.append(sum(per_seed) / len(per_seed))
    s = slope(widths, gaps)
    scale = rms(lim.predict, held_out)
    print(
        f"{kind}, step {step}, meta-steps {meta_steps}: gaps {[f'{g:.3g}' for g in gaps]}, logits {scale:.3g}, slope {s:.2f}"
    )
    assert s < -0.35, (gaps, s)
    assert gaps[-1] < 0.1 * scale, (gaps, scale)


# ------------------------------------------------------------------------ µP beats the kernels


def test_mup_limit_beats_the_kernel_limits_on_digits(train_batches, test_tasks):
    """5-way 1-shot digits, 200 meta-batches of 16, 300 test tasks (1500 queries). At meta_lr 0 all three
    limits are the same dot-product classifier (the fresh logits are proportional), so their accuracies
    are equal (measured 0.742). Meta-trained, the µP limit (step 0.3, best meta_lr of {0.1, 0.3, 1};
    measured 0.753/0.791/0.829) beats the best NTK or GP limit over step ∈ {0.03, 0.3, 3} × meta_lr ∈
    {0, 0.1, 0.3} (measured 0.742, at meta_lr 0: meta-training a kernel limit only adds a fixed Bx,
    which random label orders make noise) by at least 0.04 (measured 0.087)."""
    fresh = {kind: limit(kind).fit([], 0.0).accuracy(test_tasks) for kind in ("mup", "ntk", "gp")}
    assert fresh["mup"] == fresh["ntk"] == fresh["gp"], fresh
    mup = {lr: limit("mup").fit(train_batches, lr).accuracy(test_tasks) for lr in (0.1, 0.3, 1.0)}
    kernels = {
        (kind, step, lr): limit(kind, step).fit(train_batches if lr else [], lr).accuracy(test_tasks)
        for kind in ("ntk", "gp")
        for step in (0.03, 0.3, 3.0)
        for lr in (0.0, 0.1, 0.3)
    }
    best_kernel = max(kernels.values())
    print(f"fresh {fresh}; µP {mup}; best kernel {best_kernel:.3f} at {max(kernels, key=kernels.get)}")
    assert max(mup.values()) >= best_kernel + 0.04, (mup, kernels)
    assert mup[META_LR] > fresh["mup"] + 0.03  # the brief's setting alone (measured 0.791)


# ------------------------------------------------------------------------ errors


class Wrapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = net(32)

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize(
    "model,match",
    [
        (nn.Sequential(nn.Linear(D, 32), nn.Linear(32, K, bias=False)), r"layer 0 .* has a bias"),
        (nn.Sequential(nn.Linear(D, 32, bias=False), nn.Linear(32, K)), r"layer 1 .* has a bias"),
        (nn.Sequential(nn.Linear(D, 32, bias=False), nn.ReLU(), nn.Linear(32, K, bias=False)), r"ReLU"),
        (nn.Sequential(*[nn.Linear(a, b, bias=False) for a, b in ((D, 32), (32, 32), (32, K))]), r"3 linear layers"),
        (Wrapped(), r"nn\.Sequential.*got Wrapped"),
        (
            nn.Sequential(nn.Linear(D, 32, bias=False), nn.Linear(16, K, bias=False)),
            r"gives 32 features, layer 1 takes 16",
        ),
    ],
    ids=["bias0", "bias1", "relu", "three", "not_sequential", "mismatch"],
)
def test_unsupported_models_raise_naming_the_problem(model, match):
    with pytest.raises(ValueError, match=match):
        maml.linear_net(model)
    with pytest.raises(ValueError, match=match):
        mt.limits.MAMLLimit(model, net(BASE), "mup", STEP)
    with pytest.raises(ValueError, match=match):
        maml.train_maml(model, [], STEP, META_LR)
    xs, ys, xq, _ = maml.digits_tasks("test", 1)[0]
    with pytest.raises(ValueError, match=match):
        maml.maml_logits(model, xs, ys, xq, STEP)


def test_bad_tasks_and_arguments_raise():
    lim = limit()
    finite = mup_net(32, 0)
    good = maml.digits_tasks("train", 2, seed=0)
    ten_way = maml.digits_tasks("train", 1, ways=10, seed=0)[0]
    xs, ys, xq, yq = good[0]
    bad = {
        "every task must be 5-way": ten_way,
        r"support set is empty": (xs[:0], ys[:0], xq, yq),
        r"query set is empty": (xs, ys, xq[:0], yq[:0]),
        r"support inputs must be \(examples, 64\), got \(5, 63\)": (xs[:, :63], ys, xq, yq),
        r"query inputs must be \(examples, 64\)": (xs, ys, xq[:, :10], yq),
        r"query labels must be integers": (xs, ys, xq, yq.double()),
        r"support labels must be integers, one per example \(5\)": (xs, ys[:4], xq, yq),
        r"support labels run -1": (xs, ys - 1, xq, yq),
        r"must be a tuple \(xs, ys, xq, yq\)": (xs, ys, xq),
    }
    for match, task in bad.items():
        with pytest.raises(ValueError, match=match):
            limit().fit([[good[1], task]], META_LR)
        with pytest.raises(ValueError, match=match):
            maml.train_maml(mup_net(32, 0), [[good[1], task]], STEP, META_LR)
    with pytest.raises(ValueError, match=r"meta_batches\[1\]\[0\]: .*every task must be 5-way"):
        lim.fit([[good[0]], [ten_way]], META_LR)
    with pytest.raises(ValueError, match="every task must be 5-way"):
        lim.predict(*ten_way[:3])
    with pytest.raises(ValueError, match="every task must be 5-way"):
        maml.maml_logits(finite, *ten_way[:3], STEP)
    with pytest.raises(ValueError, match=r"support inputs must be \(examples, 64\)"):
        lim.predict(xs[:, :32], ys, xq)
    with pytest.raises(ValueError, match=r"query inputs must be \(examples, 64\)"):
        maml.maml_logits(finite, xs, ys, xq[:, :32], STEP)
    with pytest.raises(ValueError, match=r"meta_batches\[1\] is empty"):
        lim.fit([[good[0]], []], META_LR)
    with pytest.raises(ValueError, match=r"meta_batches\[0\] is empty"):
        maml.train_maml(finite, [[]], STEP, META_LR)
    with pytest.raises(ValueError, match=r"kind must be one of mup, ntk, gp, got 'foo'"):
        limit("foo")
    for step in (0, -0.1, float("nan"), True, "0.3"):
        with pytest.raises(ValueError, match="step_size must be a positive number"):
            limit(step=step)
    for lr in (-0.1, float("nan"), True):
        with pytest.raises(ValueError, match=r"meta_lr must be a number ≥ 0"):
            lim.fit([], lr)
    narrower = r"base must be the same net at a smaller width: model is 64 → 32 → 5, base 64 → "
    with pytest.raises(ValueError, match=narrower + "64 → 5"):
        mt.limits.MAMLLimit(net(32), net(64), "mup", STEP)
    with pytest.raises(ValueError, match=narrower + "32 → 5"):
        mt.limits.MAMLLimit(net(32), net(32), "mup", STEP)
    with pytest.raises(ValueError, match=r"model is 64 → 32 → 5, base 60 → 16 → 5"):
        mt.limits.MAMLLimit(net(32), net(16, d=60), "mup", STEP)
    with pytest.raises(ValueError, match=r"model is 64 → 32 → 5, base 64 → 16 → 10"):
        mt.limits.MAMLLimit(net(32), net(16, k=10), "mup", STEP)
    const = net(32)
    nn.init.constant_(const[1].weight, 0.1)
    base = net(BASE)
    nn.init.constant_(base[1].weight, 0.1 * 2)  # µP's readout ∝ 1/n: constant, but not centred
    with pytest.raises(ValueError, match=r"starts constant|not width-independent|width-independent"):
        mt.limits.MAMLLimit(const, base, "mup", STEP)
    assert repr(limit()) == "MAMLLimit(kind='mup', d=64, k=5, step_size=0.3, meta_steps=0)"


def test_a_rejected_fit_changes_nothing():
    """A fit (or train_maml) that raises on a bad task in its 2nd meta-batch has already applied the
    1st: the limit's state and meta_steps, and the finite net's weights, have moved, so fixing the
    data and fitting again trains on the first batch twice. Every batch should be checked first."""
    good, ten_way = maml.digits_tasks("train", 1, seed=0)[0], maml.digits_tasks("train", 1, ways=10, seed=0)[0]
    lim = limit()
    with pytest.raises(ValueError, match="every task must be 5-way"):
        lim.fit([[good], [ten_way]], META_LR)
    model = mup_net(32, 0)
    with pytest.raises(ValueError, match="every task must be 5-way"):
        maml.train_maml(model, [[good], [ten_way]], STEP, META_LR)
    assert lim.meta_steps == 0 and torch.equal(lim.state, limit().state)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), mup_net(32, 0).parameters()))


# ------------------------------------------------------------------------ Omniglot


def _drawing(character: int, drawing: int) -> torch.Tensor:
    """A 105 × 105 white image with black strokes: a bar and a column placed by the character, shifted
    by a pixel or two per drawing (the same character's drawings alike, the characters apart)."""
    img = torch.ones(105, 105)
    r, c, s = 8 + 15 * character, 90 - 13 * character, drawing % 3
    img[r + s : r + s + 6, 10:95] = 0.0
    img[10:95, c + s : c + s + 6] = 0.0
    return img


@pytest.fixture
def omniglot_root(tmp_path):
    """2 alphabets × 3 characters × 4 drawings, in the standard images_background layout, as PNGs."""
    import matplotlib.image as mpimg

    character = 0
    for alphabet in ("Alpha", "Beta"):
        for c in range(3):
            folder = tmp_path / "images_background" / alphabet / f"character{c + 1:02d}"
            folder.mkdir(parents=True)
            for j in range(4):
                mpimg.imsave(
                    folder / f"{character:04d}_{j + 1:02d}.png",
                    _drawing(character, j).numpy(),
                    cmap="gray",
                    vmin=0,
                    vmax=1,
                )
            character += 1
    return tmp_path


def test_omniglot_tasks_from_a_synthetic_folder(omniglot_root):
    """(5, 784) support and (10, 784) query sets, float64, labels 0…4 (each once in the support, twice
    in the queries); each query's nearest support image carries its label (the images follow their
    characters); the same seed gives the same tasks, another seed others."""
    tasks = maml.omniglot_tasks(omniglot_root, "background", n_tasks=3, ways=5, shots=1, queries=2, size=28)
    assert len(tasks) == 3
    for xs, ys, xq, yq in tasks:
        assert xs.shape == (5, 784) and xq.shape == (10, 784) and xs.dtype == xq.dtype == torch.float64
        assert sorted(ys.tolist()) == list(range(5)) and sorted(yq.tolist()) == sorted(list(range(5)) * 2)
        nearest = torch.cdist(xq, xs).argmin(1)
        assert torch.equal(ys[nearest], yq)
    again = maml.omniglot_tasks(omniglot_root, "background", n_tasks=3, ways=5, shots=1, queries=2, size=28)
    for a, b in zip(tasks, again):
        for u, v in zip(a, b):
            assert torch.equal(u, v)
    other = maml.omniglot_tasks(omniglot_root, "background", n_tasks=3, ways=5, shots=1, queries=2, seed=1)
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(tasks, other))
    small = maml.omniglot_tasks(omniglot_root, "background", n_tasks=1, ways=2, shots=2, queries=2, size=14)[0]
    assert small[0].shape == (4, 196)


def test_omniglot_errors(omniglot_root, tmp_path_factory):
    with pytest.raises(ValueError, match=r"split must be 'background' or 'evaluation', got 'train'"):
        maml.omniglot_tasks(omniglot_root, "train", 1)
    with pytest.raises(ValueError, match=r"images_evaluation does not exist"):
        maml.omniglot_tasks(omniglot_root, "evaluation", 1)
    with pytest.raises(ValueError, match=r"images_background does not exist"):
        maml.omniglot_tasks(tmp_path_factory.mktemp("empty"), "background", 1)
    with pytest.raises(ValueError, match=r"fewer than shots \+ queries = 5"):
        maml.omniglot_tasks(omniglot_root, "background", 1, shots=1, queries=4)
    with pytest.raises(ValueError, match=r"7-way tasks need 7 classes; the data has 6"):
        maml.omniglot_tasks(omniglot_root, "background", 1, ways=7)
    (omniglot_root / "images_background" / "Beta" / "character04").mkdir()
    with pytest.raises(ValueError, match=r"character04 holds no \.png drawing"):
        maml.omniglot_tasks(omniglot_root, "background", 1)
    bare = tmp_path_factory.mktemp("bare")
    (bare / "images_evaluation" / "Alpha").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"holds no <alphabet>/<character> folders"):
        maml.omniglot_tasks(bare, "evaluation", 1)


# ------------------------------------------------------------------------ sample_tasks, meta_batches, digits


def test_sample_tasks_shapes_labels_and_determinism():
    """On data whose input is its class and its index: per task `ways` distinct classes, labels 0…ways−1
    in an order that changes from task to task, support and query examples of the labelled class and
    never repeated; the same seed gives the same tasks."""
    classes, per_class = 8, 6
    y = torch.arange(classes).repeat_interleave(per_class)
    x = torch.stack([y.double(), torch.arange(len(y)).double()], 1)
    tasks = maml.sample_tasks(x, y, 40, ways=4, shots=2, queries=3, seed=5)
    first_class, in_order = set(), 0
    for xs, ys, xq, yq in tasks:
        assert xs.shape == (8, 2) and xq.shape == (12, 2)
        assert ys.tolist() == [0, 0, 1, 1, 2, 2, 3, 3] and yq.tolist() == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
        cls_s, cls_q = xs[:, 0].long(), xq[:, 0].long()
        mapping = {int(label): int(c) for label, c in zip(ys, cls_s)}
        assert len(set(mapping.values())) == 4
        assert all(mapping[int(label)] == int(c) for label, c in zip(yq, cls_q))
        ids = torch.cat([xs[:, 1], xq[:, 1]])
        assert len(ids.unique()) == len(ids)
        first_class.add(mapping[0])
        in_order += [mapping[i] for i in range(4)] == sorted(mapping.values())
    assert len(first_class) >= 4  # label 0 is a different class from task to task
    assert in_order <= 10, in_order  # labels in a random order, not by class (in order: 1 in 24, ~2 of 40)
    again = maml.sample_tasks(x, y, 40, ways=4, shots=2, queries=3, seed=5)
    assert all(torch.equal(u, v) for a, b in zip(tasks, again) for u, v in zip(a, b))
    other = maml.sample_tasks(x, y, 40, ways=4, shots=2, queries=3, seed=6)
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(tasks, other))
    with pytest.raises(ValueError, match="9-way tasks need 9 classes; the data has 8"):
        maml.sample_tasks(x, y, 1, ways=9)
    with pytest.raises(ValueError, match=r"fewer than shots \+ queries = 7"):
        maml.sample_tasks(x, y, 1, shots=2, queries=5)
    for name in ("n_tasks", "ways", "shots", "queries"):
        kwargs = {"n_tasks": 1, "ways": 2, "shots": 1, "queries": 1, name: 0}
        with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
            maml.sample_tasks(x, y, **kwargs)


def test_meta_batches():
    tasks = list(range(10))
    assert maml.meta_batches(tasks, 3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]  # the short last one dropped
    assert maml.meta_batches(tasks, 5) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert maml.meta_batches(tasks, 11) == []
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="per_batch must be a positive integer"):
            maml.meta_batches(tasks, bad)


def test_digits_tasks_halves_are_disjoint_and_deterministic():
    """5-way 1-shot digits tasks: (5, 64) support, (25, 64) queries, float64; 300 train and 300 test
    tasks never share an image (sklearn's 1797 digits have no duplicates), each draws from at most its
    half (~900 images); the same seed gives the same tasks; another split name raises."""
    train = maml.digits_tasks("train", 300, seed=0)
    test = maml.digits_tasks("test", 300, seed=0)
    xs, ys, xq, yq = train[0]
    assert xs.shape == (5, 64) and xq.shape == (25, 64) and xs.dtype == torch.float64
    assert sorted(ys.tolist()) == list(range(5)) and sorted(yq.tolist()) == sorted(list(range(5)) * 5)

    def images(tasks):
        return torch.cat([torch.cat([t[0], t[2]]) for t in tasks]).unique(dim=0)

    a, b = images(train), images(test)
    assert 700 < len(a) <= 905 and 700 < len(b) <= 905, (len(a), len(b))
    assert float(torch.cdist(a, b).min()) > 1e-6
    again = maml.digits_tasks("train", 300, seed=0)
    assert all(torch.equal(u, v) for s, t in zip(train, again) for u, v in zip(s, t))
    assert not torch.equal(maml.digits_tasks("train", 1, seed=1)[0][0], train[0][0])
    assert maml.digits_tasks("test", 2, ways=10, shots=2, queries=3)[0][0].shape == (20, 64)
    with pytest.raises(ValueError, match=r"split must be 'train' or 'test', got 'val'"):
        maml.digits_tasks("val", 1)


def test_public_names():
    assert mt.limits.MAMLLimit is maml.MAMLLimit and mt.limits.maml is maml
    for name in maml.__all__:
        assert hasattr(maml, name), name


# ------------------------------------------------------------------------ the cost benchmark


def test_cost_benchmark_quick_runs():
    """benchmarks/maml_cost.py --quick: its table has a row per kind and the headline line (a 200-step
    fit in quick mode; the full run's 1000-step fit measured ~2 s)."""
    out = run_here(["benchmarks/maml_cost.py", "--quick"])
    rows = [line for line in out.splitlines() if re.match(r"\s*(mup|ntk)\s+\d+", line)]
    assert len(rows) >= 2, out
    headline = re.search(r"(\d+)-meta-step fit, mup, .*?: ([\d.]+) s", out)
    assert headline and int(headline.group(1)) == 200 and float(headline.group(2)) < 60, out
