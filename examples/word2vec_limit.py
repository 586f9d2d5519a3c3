"""word2vec's infinite-width limits (Tensor Programs IV): the µP limit learns word embeddings, the NTK limit cannot.

Corpus: the docstrings of standard-library modules (`mutransfer.recipes.data.stdlib_text`) plus the
text of `pydoc_data.topics` (the language reference shipped with Python), lower-cased word tokens —
offline, ≈110K words. Vocabulary: words with count ≥ --min-count (≈1000 words); other tokens are
dropped before the windows are taken.

Model: skip-gram with negative sampling (SGNS), word and context embeddings N(0, σ²) entrywise,
logits U_w·C_c / n (µP; SGD lr η·n) or / √n (NTK parametrization; SGD lr η), trained on exactly
the same minibatches and negative samples (`skipgram_batches`, seeded):
- finite µP nets at several widths and seeds, and the exact µP limit (`Word2VecLimit`: a width-2V
  network with identity-initialised embeddings — see `mutransfer.limits.word2vec`);
- finite NTK-parametrized nets and the NTK limit (embeddings never move: cosine similarity = I).

Evaluation, built from the vocabulary's spellings (which the models never see): words sharing a
stem (x, x+s, x+es, x+ed/x+d, x+ing) — partner AUC among all words by cosine similarity (chance 0.5)
and 3CosAdd analogies within a suffix (a : a+s :: b : b+s; chance 1/(V−3)).

    python examples/word2vec_limit.py            # ≈1 min on 2 cores; writes docs/limits_word2vec.png
    python examples/word2vec_limit.py --quick
"""

from __future__ import annotations

import argparse
import collections
import math
import re
import time

import torch

from mutransfer import limits as L
from mutransfer.limits import finite as finite_nets
from mutransfer.limits import word2vec
from mutransfer.recipes.data import stdlib_text


def corpus(extra: bool = True) -> list[str]:
    """Lower-cased word tokens of the stdlib docstrings (and of pydoc_data.topics with `extra`)."""
    text = stdlib_text().decode("utf-8")
    if extra:
        try:
            from pydoc_data.topics import topics

            text += "\n" + "\n".join(topics[k] for k in sorted(topics))
        except ImportError:  # some Python builds leave out pydoc_data: say so, the numbers will differ
            print(
                "pydoc_data is not installed: the corpus is the stdlib docstrings alone (≈45K words), "
                "so the vocabulary and the scores differ from the README's"
            )
    return re.findall(r"[a-z]+", text.lower())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-count", type=int, default=12, help="vocabulary: words with at least this count")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=80.0, help="η: SGD lr η·n in µP, η in NTK (per batch mean loss)")
    ap.add_argument("--sigma", type=float, default=1.0, help="init std of every embedding entry")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--window", type=int, default=2)
    ap.add_argument("--negatives", type=int, default=5)
    ap.add_argument("--subsample", type=float, default=1e-4)
    ap.add_argument("--widths", default="64,128,256,512,1024", help="finite µP widths")
    ap.add_argument("--ntk-widths", default="64,256,1024", help="finite NTK-parametrized widths")
    ap.add_argument("--seeds", type=int, default=2, help="finite nets per width (scores and gaps are their means)")
    ap.add_argument("--quick", action="store_true", help="stdlib docstrings only, 1 epoch, few widths")
    ap.add_argument("--plot", default="docs/limits_word2vec.png")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (each SGD step is many small kernels: one thread is fastest, "
        "and far faster when other processes share the cores)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.epochs, args.widths, args.ntk_widths, args.seeds, args.min_count = 2, "64,256", "64", 1, 8
    widths = [int(w) for w in args.widths.split(",")]
    ntk_widths = [int(w) for w in args.ntk_widths.split(",") if w]
    start = time.perf_counter()

    tokens = corpus(extra=not args.quick)
    counts = collections.Counter(tokens)
    vocab = sorted((w for w in counts if counts[w] >= args.min_count), key=lambda w: (-counts[w], w))
    index = {w: i for i, w in enumerate(vocab)}
    ids = [index[w] for w in tokens if w in index]
    V = len(vocab)
    batches = word2vec.skipgram_batches(
        ids,
        V,
        epochs=args.epochs,
        batch_size=args.batch_size,
        window=args.window,
        negatives=args.negatives,
        seed=0,
        subsample=args.subsample,
    )
    pairs, analogies = word2vec.inflection_pairs(vocab), word2vec.inflection_analogies(vocab)
    words = sorted({i for p in pairs for i in p})
    print(
        f"corpus: {len(tokens)} words, vocabulary {V} words (count ≥ {args.min_count}) covering {len(ids)} "
        f"tokens; {len(batches)} SGD steps ({args.epochs} epochs, batch {args.batch_size}, window {args.window}, "
        f"{args.negatives} negatives, subsample {args.subsample:g}), η = {args.lr:g}, σ = {args.sigma:g}"
    )
    print(
        f"evaluation: {len(pairs)} same-stem pairs among {len(words)} words (partner AUC, chance 0.5), "
        f"{len(analogies)} suffix analogies (3CosAdd, chance {100 / (V - 3):.2f}%)"
    )
    print("  e.g. " + ", ".join(f"{vocab[a]}/{vocab[b]}" for a, b in pairs[:: max(1, len(pairs) // 8)][:8]))

    epoch_steps = max(1, len(batches) // args.epochs)
    rows = []  # (name, kind, width, auc, analogy, loss, gap)

    def score(sim):
        r = word2vec.evaluate_embeddings(sim, vocab)
        return r["auc"], r["analogy"]

    t0 = time.perf_counter()
    # float32 like the finite nets: its rounding (~1e-6) is far below the finite-width gaps (> 1e-2)
    limit = L.Word2VecLimit(V, sigma=args.sigma, dtype=torch.float32).fit(batches, args.lr)
    s_lim = limit.similarity()
    auc, ana = score(s_lim)
    lim_loss = sum(limit.losses[-epoch_steps:]) / epoch_steps
    print(f"µP limit (width 2V = {2 * V}, float32): {time.perf_counter() - t0:.1f} s")
    s_ntk = word2vec.ntk_limit_similarity(V)
    rows.append(("µP limit", "mup_limit", None, auc, ana, lim_loss, 0.0))

    def finite(parametrization, width):
        """Per-seed means of (AUC, analogy, last-epoch loss, Δcos vs the µP limit, Δcos vs the NTK limit)."""
        res = []
        for seed in range(args.seeds):
            net = word2vec.SkipGram(V, width, parametrization, sigma=args.sigma, seed=seed)
            losses = word2vec.train_skipgram(net, batches, args.lr)
            sim = net.similarity()
            res.append(
                (
                    *score(sim),
                    sum(losses[-epoch_steps:]) / epoch_steps,
                    word2vec.similarity_gap(sim, s_lim, words),
                    word2vec.similarity_gap(sim, s_ntk, words),
                )
            )
        return [sum(r[k] for r in res) / len(res) for k in range(5)]

    gaps, mup_scores = {}, {}
    for width in widths:
        mean = finite("mup", width)
        gaps[width], mup_scores[width] = mean[3], mean[:2]
        rows.append((f"finite µP, width {width}", "mup", width, *mean[:4]))
    ntk_scores, ntk_gaps = {}, {}
    for width in ntk_widths:
        mean = finite("ntk", width)
        ntk_scores[width], ntk_gaps[width] = mean[:2], mean[4]
        rows.append((f"finite NTK, width {width}", "ntk", width, *mean[:4]))
    auc, ana = score(s_ntk)
    rows.append(("NTK limit", "ntk_limit", None, auc, ana, float("nan"), word2vec.similarity_gap(s_ntk, s_lim, words)))

    print("\n| model | partner AUC | analogy acc. | train loss (last epoch) | RMS Δcos vs µP limit |")
    print("|---|---|---|---|---|")
    for name, _, _, auc, ana, loss, gap in rows:
        loss_s = "–" if math.isnan(loss) else f"{loss:.3f}"
        print(f"| {name} | {auc:.3f} | {100 * ana:.2f}% | {loss_s} | {gap:.4f} |")
    print(f"| chance | 0.500 | {100 / (V - 3):.2f}% | {math.log(2) * (1 + args.negatives):.3f} (init) | |")
    slope = finite_nets.fitted_slope(widths, [gaps[w] for w in widths])
    print(
        f"\nfinite µP vs the µP limit, RMS difference of cosine similarities over the {len(words)} evaluation "
        f"words: " + ", ".join(f"{gaps[w]:.4f} (width {w})" for w in widths) + f"; fitted slope {slope:+.2f} "
        "(theory −0.5)"
    )
    if len(ntk_widths) > 1:
        s_ntk_gap = finite_nets.fitted_slope(ntk_widths, [ntk_gaps[w] for w in ntk_widths])
        print(
            "finite NTK vs the NTK limit (cosine = identity): "
            + ", ".join(f"{ntk_gaps[w]:.4f} (width {w})" for w in ntk_widths)
            + f"; fitted slope {s_ntk_gap:+.2f}"
        )
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.plot:
        plot(rows, widths, ntk_widths, mup_scores, ntk_scores, gaps, ntk_gaps, slope, V, args.plot)
        print(f"figure: {args.plot}")
    return 0


def plot(rows, widths, ntk_widths, mup_scores, ntk_scores, gaps, ntk_gaps, slope, V, path) -> None:
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lim = next(r for r in rows if r[1] == "mup_limit")
    ntk_lim = next(r for r in rows if r[1] == "ntk_limit")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for k, (ax, label, _chance, fmt) in enumerate(
        zip(
            axes[:2],
            ["partner AUC (same-stem words)", "3CosAdd analogy accuracy (%)"],
            [0.5, 100 / (V - 3)],
            [1.0, 100.0],
        )
    ):
        ax.plot(widths, [fmt * mup_scores[w][k] for w in widths], "-o", color="#1f77b4", label="finite µP nets")
        if ntk_widths:
            ax.plot(
                ntk_widths,
                [fmt * ntk_scores[w][k] for w in ntk_widths],
                "-s",
                color="#ff7f0e",
                label="finite NTK-param. nets",
            )
        ax.axhline(fmt * lim[3 + k], color="#2ca02c", lw=2, label="µP limit")
        ax.axhline(fmt * ntk_lim[3 + k], color="#d62728", ls="--", lw=2, label="NTK limit (= chance)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("width")
        ax.set_ylabel(label)
        ax.set_title(label.split(" (")[0] if k == 0 else "analogies a : a+s :: b : b+s …")
        ax.legend(fontsize=8)
    axes[0].set_ylim(0.4, 1.0)
    axes[1].set_ylim(bottom=0)
    ax = axes[2]
    ax.loglog(
        widths, [gaps[w] for w in widths], "-o", color="#1f77b4", label=f"finite µP − µP limit (slope {slope:+.2f})"
    )
    ref = [gaps[widths[0]] * math.sqrt(widths[0] / w) for w in widths]
    ax.loglog(widths, ref, "k--", lw=1, label="∝ width^-½")
    if ntk_widths:
        ax.loglog(ntk_widths, [ntk_gaps[w] for w in ntk_widths], "-s", color="#ff7f0e", label="finite NTK − NTK limit")
    ax.set_xlabel("width")
    ax.set_ylabel("RMS difference of cosine similarities")
    ax.set_title("finite nets → their limits")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    lo = min([gaps[w] for w in widths] + [ntk_gaps[w] for w in ntk_widths])
    hi = max([gaps[w] for w in widths] + [ntk_gaps[w] for w in ntk_widths])
    ticks = [t for t in (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5) if lo / 1.5 <= t <= hi * 1.5]
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{t:g}" for t in ticks])
    for a in axes:
        a.set_xticks(sorted(set(widths) | set(ntk_widths)))
        a.set_xticklabels([str(w) for w in sorted(set(widths) | set(ntk_widths))])
        a.minorticks_off()
    fig.suptitle(
        "word2vec (SGNS) on Python's docstrings: the µP limit learns embeddings, the NTK limit cannot", fontsize=11
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
