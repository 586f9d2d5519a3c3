"""word2vec (SGNS) and its exact µP limit (`mutransfer.limits.word2vec`): exactness of the width-2V
construction, a hand-derived first step, finite µP nets → the limit at rate n^-½, finite
NTK-parametrized nets → the NTK limit (identity similarity, at chance), the µP limit above chance
on a corpus with planted structure, the evaluation, and errors."""

import math
import re

import pytest
import torch

from mutransfer import limits as L
from mutransfer.limits import finite
from mutransfer.limits import word2vec as w2v
from script_runner import run_here


@pytest.fixture(autouse=True)
def one_thread():
    """The SGD steps are many tiny kernels: one thread is fastest and does not fight other processes."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def planted_corpus(n_stems=6, n_ctx=4, sentences=600, seed=0):
    """Stems x and x+"s" share their own context words ("qa…" words have no inflections in the
    vocabulary): the µP limit must learn that x and x+"s" are similar."""
    stems = ["alpha", "bravo", "charl", "delta", "echo", "foxtrot", "golf", "hotel"][:n_stems]
    ctx = [[f"q{chr(97 + i)}{chr(97 + j)}" for j in range(n_ctx)] for i in range(n_stems)]
    vocab = stems + [s + "s" for s in stems] + [c for cs in ctx for c in cs]
    index = {w: i for i, w in enumerate(vocab)}
    g = torch.Generator().manual_seed(seed)
    ids = []
    for _ in range(sentences):
        i = int(torch.randint(n_stems, (1,), generator=g))
        form = stems[i] + ("s" if torch.rand(1, generator=g) < 0.5 else "")
        c = torch.randint(n_ctx, (2,), generator=g)
        ids += [index[ctx[i][int(c[0])]], index[form], index[ctx[i][int(c[1])]]]
    return vocab, ids


def covariance_recursion(batches, V, lr, sigma):
    """E[u_w v_c] = (M Σ₀ Mᵀ)_{w,V+c} with M ← [[I, −ηG], [−ηGᵀ, I]] M: the limit computed directly."""
    M = torch.eye(2 * V, dtype=torch.float64)
    for w, c, neg in batches:
        cov = sigma**2 * M @ M.T
        S = cov[:V, V:]
        G = torch.zeros(V, V, dtype=torch.float64)
        B = len(w)
        G.index_put_((w, c), (torch.sigmoid(S[w, c]) - 1) / B, accumulate=True)
        for k in range(neg.shape[1]):
            G.index_put_((w, neg[:, k]), torch.sigmoid(S[w, neg[:, k]]) / B, accumulate=True)
        A = torch.eye(2 * V, dtype=torch.float64)
        A[:V, V:] = -lr * G
        A[V:, :V] = -lr * G.T
        M = A @ M
    return sigma**2 * M @ M.T


def test_limit_is_exact_covariance_recursion_and_orthogonal_init():
    vocab, ids = planted_corpus(n_stems=3, n_ctx=2, sentences=80)
    V = len(vocab)
    batches = w2v.skipgram_batches(ids, V, epochs=2, batch_size=16, window=1, negatives=3, seed=3)
    lr, sigma = 3.0, 0.8
    ref = covariance_recursion(batches, V, lr, sigma)
    lim = L.Word2VecLimit(V, sigma=sigma).fit(batches, lr)
    wide = L.Word2VecLimit(V, sigma=sigma, width=4 * V, seed=5).fit(batches, lr)
    assert ref[:V, V:].abs().max() > 0.5  # the logits moved
    torch.testing.assert_close(lim.logits(), ref[:V, V:], rtol=0, atol=1e-10)
    torch.testing.assert_close(lim.kernel(), ref[:V, :V], rtol=0, atol=1e-10)
    torch.testing.assert_close(wide.logits(), lim.logits(), rtol=0, atol=1e-10)
    torch.testing.assert_close(wide.kernel(), lim.kernel(), rtol=0, atol=1e-10)
    w, c = torch.tensor([0, 2, 4]), torch.tensor([1, 1, 3])
    torch.testing.assert_close(lim.logits(w, c), ref[w, V + c], rtol=0, atol=1e-10)
    assert lim.embeddings.shape == (V, 2 * V) and wide.embeddings.shape == (V, 4 * V)


def test_first_step_by_hand():
    """V = 2, one pair (word 0, context 1) with negative context 0, at init every limit logit is 0:
    ∂L/∂s = −½ (positive), +½ (negative), so U₀ = σe₀ + ½ησ(e₃ − e₂), C₁ = σe₃ + ½ησe₀,
    C₀ = σe₂ − ½ησe₀: s(0,1) = ησ², s(0,0) = −ησ², E[u₀u₀] = σ²(1 + η²/2)."""
    eta, sigma = 0.7, 1.3
    batch = [(torch.tensor([0]), torch.tensor([1]), torch.tensor([[0]]))]
    lim = L.Word2VecLimit(2, sigma=sigma).fit(batch, eta)
    s2 = sigma**2
    torch.testing.assert_close(lim.logits(), torch.tensor([[-eta * s2, eta * s2], [0.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(
        lim.kernel(), torch.tensor([[s2 * (1 + eta**2 / 2), 0.0], [0.0, s2]], dtype=torch.float64)
    )
    assert lim.losses == pytest.approx([2 * math.log(2)])
    # a finite µP net takes the same step on every coordinate: its logit change is the limit's up to O(n^-½)
    net = w2v.SkipGram(2, 20000, "mup", sigma=sigma, dtype=torch.float64, seed=0)
    before = net.logits()
    w2v.train_skipgram(net, batch, eta)
    torch.testing.assert_close(net.logits() - before, lim.logits(), rtol=0, atol=0.1)


def test_sgns_step_matches_autograd():
    torch.manual_seed(0)
    V, n, B, K = 12, 7, 20, 3
    net = w2v.SkipGram(V, n, "ntk", dtype=torch.float64, seed=1)
    batch = (torch.randint(V, (B,)), torch.randint(V, (B,)), torch.randint(V, (B, K)))
    U, C = net.U.detach().clone().requires_grad_(), net.C.detach().clone().requires_grad_()
    w, c, neg = batch
    s_pos = (U[w] * C[c]).sum(-1) / math.sqrt(n)
    s_neg = torch.einsum("bn,bkn->bk", U[w], C[neg]) / math.sqrt(n)
    loss = (torch.nn.functional.softplus(-s_pos).sum() + torch.nn.functional.softplus(s_neg).sum()) / B
    loss.backward()
    losses = w2v.train_skipgram(net, [batch], 0.9)
    assert losses[0] == pytest.approx(float(loss.detach()), rel=1e-12)
    torch.testing.assert_close(net.U.detach(), U.detach() - 0.9 * U.grad)
    torch.testing.assert_close(net.C.detach(), C.detach() - 0.9 * C.grad)


def test_finite_mup_nets_approach_the_limit_at_rate_inverse_sqrt_width():
    vocab, ids = planted_corpus(n_stems=4, n_ctx=3, sentences=200)
    V = len(vocab)
    batches = w2v.skipgram_batches(ids, V, epochs=3, batch_size=64, window=1, negatives=3, seed=0)
    lr = 8.0
    lim = L.Word2VecLimit(V).fit(batches, lr)
    target = lim.logits()
    assert target.abs().max() > 1.0  # the limit learned: logits are O(1)
    widths, gaps = [256, 512, 1024, 2048, 4096], []
    for width in widths:
        errs = []
        for seed in range(3):
            net = w2v.SkipGram(V, width, "mup", dtype=torch.float64, seed=seed)
            w2v.train_skipgram(net, batches, lr)
            errs.append(float(((net.logits() - target) ** 2).mean().sqrt()))
        gaps.append(sum(errs) / len(errs))
    slope = finite.fitted_slope(widths, gaps)
    assert -0.7 < slope < -0.3, (gaps, slope)
    assert gaps[-1] < 0.1 * target.abs().max()


def planted_batches():
    vocab, ids = planted_corpus()
    return vocab, w2v.skipgram_batches(ids, len(vocab), epochs=4, batch_size=64, window=1, negatives=3, seed=0)


def test_mup_limit_above_chance_where_it_starts_at_the_ntk_limit():
    vocab, batches = planted_batches()
    V = len(vocab)
    pairs, analogies = w2v.inflection_pairs(vocab), w2v.inflection_analogies(vocab)
    assert len(pairs) == 6 and len(analogies) == 30
    mup = w2v.evaluate_embeddings(L.Word2VecLimit(V).fit(batches, 8.0).similarity(), vocab)
    assert mup["auc_chance"] == 0.5 and mup["analogy_chance"] == pytest.approx(1 / (V - 3)) and mup["pairs"] == 6
    assert mup["auc"] > 0.9 and mup["analogy"] > 10 * mup["analogy_chance"], mup
    # at init (no training) the µP limit's similarity is the NTK limit's, the identity: at chance
    init = L.Word2VecLimit(V).similarity()
    assert torch.equal(init, w2v.ntk_limit_similarity(V))
    assert w2v.evaluate_embeddings(init, vocab)["auc"] == 0.5


# Finite NTK-parametrized nets on planted_batches at lr 8 (the µP limit's), means over seeds 0-2, measured:
# RMS off-diagonal cosine similarity (distance to the NTK limit's identity) 0.227, 0.111, 0.044 and
# ‖U − U₀‖ / ‖U₀‖ 0.67, 0.35, 0.18 at widths 64, 256, 1024 (÷2.0–2.5 per 4× width, n^-½: ÷2); partner
# AUC 1.00, 0.89, 0.75 (chance 0.5); the µP limit on the same batches: 0.31 from the identity, AUC 1.
NTK_WIDTHS = (64, 256, 1024)


def test_finite_ntk_nets_approach_the_ntk_limits_identity_similarity():
    """`ntk_limit_similarity` is the identity by definition; the claim behind it is that NTK-parametrized
    nets' embeddings stay at their i.i.d. init as the width grows, so that their cosine similarity
    tends to I and every evaluation to chance. The nets are the library's finite model
    (`SkipGram(..., "ntk")` + `train_skipgram`, SGD lr η) on the batches the µP limit learns from."""
    vocab, batches = planted_batches()
    V = len(vocab)
    identity, pairs = w2v.ntk_limit_similarity(V), w2v.inflection_pairs(vocab)
    gaps, moved, aucs = [], [], []
    for width in NTK_WIDTHS:
        per_seed = []
        for seed in range(3):
            net = w2v.SkipGram(V, width, "ntk", dtype=torch.float64, seed=seed)
            init = net.embeddings.clone()
            w2v.train_skipgram(net, batches, 8.0)
            sim = net.similarity()
            per_seed.append(
                (
                    w2v.similarity_gap(sim, identity),
                    float((net.embeddings - init).norm() / init.norm()),
                    w2v.partner_auc(sim, pairs),
                )
            )
        gap, move, auc = (sum(v) / len(v) for v in zip(*per_seed))
        gaps.append(gap)
        moved.append(move)
        aucs.append(auc)
        print(f"finite NTK, width {width}: distance to I {gap:.3f}, embeddings moved {move:.2f}, AUC {auc:.2f}")
    mup_gap = w2v.similarity_gap(L.Word2VecLimit(V).fit(batches, 8.0).similarity(), identity)
    print(f"µP limit: distance to I {mup_gap:.3f}")
    for k in range(len(NTK_WIDTHS) - 1):  # 4× the width: ÷2 at rate n^-½; measured ÷2.0 to ÷2.5
        assert gaps[k + 1] < gaps[k] / 1.6, gaps
        assert moved[k + 1] < moved[k] / 1.6, moved
    assert gaps[-1] < 0.25 * mup_gap, (gaps, mup_gap)  # measured 0.14×: the data has structure to learn
    assert aucs[-1] - 0.5 < 0.7 * (aucs[0] - 0.5), aucs  # toward chance: measured 0.25 above it, from 0.50


def test_batches_are_deterministic_in_the_seed():
    vocab, ids = planted_corpus(sentences=50)
    a = w2v.skipgram_batches(ids, len(vocab), epochs=2, batch_size=10, window=2, negatives=2, seed=1, subsample=0.05)
    b = w2v.skipgram_batches(ids, len(vocab), epochs=2, batch_size=10, window=2, negatives=2, seed=1, subsample=0.05)
    c = w2v.skipgram_batches(ids, len(vocab), epochs=2, batch_size=10, window=2, negatives=2, seed=2, subsample=0.05)
    assert len(a) == len(b) and all(torch.equal(x, y) for p, q in zip(a, b) for x, y in zip(p, q))
    assert not all(torch.equal(x, y) for p, q in zip(a, c) for x, y in zip(p, q))
    full = w2v.skipgram_batches(list(range(5)), 5, batch_size=100, window=2, negatives=1)
    w, c_, neg = full[0]
    assert sorted(zip(w.tolist(), c_.tolist())) == sorted(
        [(i, j) for i in range(5) for j in range(5) if 0 < abs(i - j) <= 2]
    )
    assert neg.shape == (14, 1)


def test_morphological_evaluation():
    vocab = [
        "return",
        "returns",
        "returned",
        "returning",
        "use",
        "used",
        "uses",
        "using",
        "class",
        "classes",
        "not",
        "notes",
        "is",
        "as",
        "call",
        "calls",
        "str",
        "the",
        "thing",
        "make",
        "making",
    ]
    groups = w2v.morphological_groups(vocab)
    # not/notes is no "es" plural, is/as are too short, the/thing (so use/using) no e-dropping "ing"
    assert set(groups) == {"return", "use", "class", "call", "make"}
    assert groups["use"] == {"": 4, "ed": 5, "s": 6} and groups["make"] == {"": 19, "ing": 20}
    pairs = w2v.inflection_pairs(vocab)
    assert (0, 1) in pairs and (1, 2) in pairs and len(pairs) == 6 + 3 + 1 + 1 + 1
    analogies = w2v.inflection_analogies(vocab)
    assert (14, 15, 0, 1) in analogies and (0, 1, 14, 15) in analogies and (4, 6, 0, 1) in analogies
    # embeddings that encode "stem + suffix" exactly solve every analogy and rank every partner first
    V = len(vocab)
    emb = torch.zeros(V, 32, dtype=torch.float64)
    suffix_dir = {"": 20, "s": 21, "es": 21, "ed": 22, "ing": 23}
    for k, (_stem, forms) in enumerate(groups.items()):
        for rel, i in forms.items():
            emb[i, k] = 2.0
            emb[i, suffix_dir[rel]] = 1.0
    for i in range(V):
        if not emb[i].any():
            emb[i, 24 + i % 8] = 1.0
    sim = w2v.cosine_similarity(emb)
    assert w2v.analogy_accuracy(sim, analogies) == 1.0
    assert w2v.partner_auc(sim, pairs) > 0.9
    assert w2v.partner_auc(torch.eye(V), pairs) == 0.5
    assert w2v.analogy_accuracy(torch.eye(V), analogies) == pytest.approx(1 / (V - 3))
    assert w2v.similarity_gap(sim, sim) == 0.0 and w2v.similarity_gap(torch.eye(3), torch.zeros(3, 3)) == 0.0


def test_bad_input_raises_naming_the_parameter():
    with pytest.raises(ValueError, match="vocab_size"):
        w2v.SkipGram(0, 8)
    with pytest.raises(TypeError, match="width"):
        w2v.SkipGram(5, 8.0)
    with pytest.raises(ValueError, match="parametrization"):
        w2v.SkipGram(5, 8, "sp")
    with pytest.raises(ValueError, match="sigma"):
        w2v.SkipGram(5, 8, sigma=-1.0)
    with pytest.raises(TypeError, match="tokens"):
        w2v.skipgram_batches("hello world", 5)
    with pytest.raises(ValueError, match="tokens"):
        w2v.skipgram_batches([0, 1, 7], 5)
    with pytest.raises(ValueError, match="window"):
        w2v.skipgram_batches([0, 1, 2], 5, window=0)
    with pytest.raises(ValueError, match="subsample"):
        w2v.skipgram_batches([0, 1, 2], 5, subsample=0.0)
    net = w2v.SkipGram(5, 8)
    with pytest.raises(TypeError, match="batches"):
        w2v.train_skipgram(net, torch.tensor([0, 1, 2]), 1.0)
    with pytest.raises(ValueError, match="lr"):
        w2v.train_skipgram(net, w2v.skipgram_batches([0, 1, 2], 5), -1.0)
    with pytest.raises(ValueError, match="vocab_size"):
        w2v.train_skipgram(net, w2v.skipgram_batches([0, 1, 9], 10), 1.0)
    with pytest.raises(TypeError, match="model"):
        w2v.train_skipgram("net", [], 1.0)
    with pytest.raises(ValueError, match="width"):
        L.Word2VecLimit(5, width=6)
    with pytest.raises(ValueError, match="sim"):
        w2v.evaluate_embeddings(torch.eye(3), ["aaa", "aaas"])
    with pytest.raises(ValueError, match="vocab"):
        w2v.morphological_groups(["word", "word"])
    with pytest.raises(TypeError, match="vocab"):
        w2v.morphological_groups("words")
    with pytest.raises(ValueError, match="pairs"):
        w2v.partner_auc(torch.eye(3), [])


@pytest.mark.slow
def test_example_quick_writes_figure(tmp_path):
    out = run_here(["examples/word2vec_limit.py", "--quick", "--plot", str(tmp_path / "w.png")])
    rows = dict(re.findall(r"^\| (.+?) \| ([0-9.]+) \|", out, re.M))
    assert float(rows["NTK limit"]) == 0.5 and float(rows["µP limit"]) > 0.6, out
    assert re.search(r"fitted slope -0\.[3-7]", out), out
    assert (tmp_path / "w.png").stat().st_size > 10_000
