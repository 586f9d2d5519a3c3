"""Evaluating word embeddings by the morphology of the vocabulary, which the model never sees (it
sees token ids only): words sharing a stem (x, x+"s", x+"es" after s/x/z/ch/sh, x+"ed"/x+"d" after
e, x+"ing", x[:-1]+"ing" after e for stems of ≥ 4 letters, so not the/thing) are found from the
spellings. Two scores from the word–word cosine matrix: the AUC of a word's inflection partner
among all other vocabulary words (chance 0.5, ties count ½), and 3CosAdd analogy accuracy
a : a* :: b : b* over pairs of the same suffix, excluding the three question words (ties split the
credit; chance 1/(V−3))."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from ._checks import integer

__all__ = [
    "SUFFIXES",
    "analogy_accuracy",
    "evaluate_embeddings",
    "inflection_analogies",
    "inflection_pairs",
    "morphological_groups",
    "partner_auc",
    "similarity_gap",
]

# (relation name, how to form the inflected word from a stem x, or None when the rule does not apply)
SUFFIXES = (
    ("s", lambda x: x + "s"),
    ("es", lambda x: x + "es" if x.endswith(("s", "x", "z", "ch", "sh")) else None),
    ("ed", lambda x: x + "d" if x.endswith("e") else x + "ed"),
    ("ing", lambda x: x[:-1] + "ing" if x.endswith("e") and len(x) > 3 else x + "ing"),
)


def _vocab_list(vocab) -> list[str]:
    if isinstance(vocab, (str, bytes)) or not isinstance(vocab, Iterable):
        raise TypeError("vocab must be a list of word strings (index = token id)")
    vocab = list(vocab)
    if not all(isinstance(v, str) for v in vocab):
        raise TypeError("vocab must be a list of word strings (index = token id)")
    if len(set(vocab)) != len(vocab):
        raise ValueError("vocab must not repeat a word")
    return vocab


def morphological_groups(vocab, min_stem: int = 3) -> dict[str, dict[str, int]]:
    """{stem: {relation: token id}} for every stem x (a vocabulary word of ≥ `min_stem` letters) with
    at least one inflected form of `SUFFIXES` also in the vocabulary; relation "" is the stem itself."""
    vocab = _vocab_list(vocab)
    min_stem = integer(min_stem, "min_stem")
    index = {w: i for i, w in enumerate(vocab)}
    groups: dict[str, dict[str, int]] = {}
    for x in vocab:
        if len(x) < min_stem or not x.isalpha():
            continue
        forms = {rel: index[f(x)] for rel, f in SUFFIXES if f(x) is not None and f(x) in index and f(x) != x}
        if forms:
            groups[x] = {"": index[x], **forms}
    return groups


def inflection_pairs(vocab, min_stem: int = 3) -> list[tuple[int, int]]:
    """Unordered pairs (i, j), i < j, of distinct words that share a stem (all pairs within each
    group of `morphological_groups`, e.g. return/returns, return/returned, returns/returned)."""
    pairs: set[tuple[int, int]] = set()
    for forms in morphological_groups(vocab, min_stem).values():
        ids = sorted(set(forms.values()))
        pairs.update((a, b) for k, a in enumerate(ids) for b in ids[k + 1 :])
    return sorted(pairs)


def inflection_analogies(vocab, min_stem: int = 3) -> list[tuple[int, int, int, int]]:
    """Analogies (a, a*, b, b*) — "a is to a* as b is to b*" — for every ordered pair of distinct
    stems a, b that both have the inflection of one relation of `SUFFIXES` (e.g. call : calls ::
    return : returns)."""
    by_rel: dict[str, list[tuple[int, int]]] = {}
    for forms in morphological_groups(vocab, min_stem).values():
        for rel, j in forms.items():
            if rel:
                by_rel.setdefault(rel, []).append((forms[""], j))
    out = []
    for rel in sorted(by_rel):
        pairs = by_rel[rel]
        out += [(a, a2, b, b2) for (a, a2) in pairs for (b, b2) in pairs if a != b and len({a, a2, b, b2}) == 4]
    return out


def _check_sim(sim, name: str = "sim") -> torch.Tensor:
    s = torch.as_tensor(sim).detach().to(torch.float64)
    if s.ndim != 2 or s.shape[0] != s.shape[1]:
        raise ValueError(f"{name} must be a square (V, V) similarity matrix, got shape {tuple(s.shape)}")
    return s


def partner_auc(sim, pairs: Sequence[tuple[int, int]]) -> float:
    """Mean over both directions of every pair (x, y) of the AUC of y among all words other than x by
    similarity to x: the fraction of the other V − 2 words less similar to x than y (ties count ½).
    Chance: 0.5."""
    s = _check_sim(sim)
    if not len(pairs):
        raise ValueError("pairs is empty: the vocabulary has no inflection pairs (lower min_stem or enlarge it)")
    p = torch.as_tensor(list(pairs), dtype=torch.long)
    x = torch.cat([p[:, 0], p[:, 1]])
    y = torch.cat([p[:, 1], p[:, 0]])
    rows = s[x].clone()  # (P, V)
    rows[torch.arange(len(x)), x] = float("nan")  # the query word itself is no candidate
    target = rows[torch.arange(len(x)), y][:, None]
    less = (rows < target).sum(1).double()
    ties = (rows == target).sum(1).double() - 1  # minus y itself
    return float(((less + 0.5 * ties) / (s.shape[0] - 2)).mean())


def analogy_accuracy(sim, analogies: Sequence[tuple[int, int, int, int]], chunk: int = 4096) -> float:
    """3CosAdd accuracy on analogies (a, a*, b, b*): the answer is argmax_x cos(x, b − a + a*) over
    normalised embeddings, i.e. argmax_x S[x, b] − S[x, a] + S[x, a*], over all words except a, a*, b.
    Ties share the credit (1/#tied when b* is among them), so identical scores give chance 1/(V − 3)."""
    s = _check_sim(sim)
    if not len(analogies):
        raise ValueError("analogies is empty: the vocabulary has no inflection analogies")
    q = torch.as_tensor(list(analogies), dtype=torch.long)
    total = 0.0
    for k in range(0, len(q), chunk):
        a, a2, b, b2 = q[k : k + chunk].T
        score = s[b] - s[a] + s[a2]  # (Q, V)
        r = torch.arange(len(a))
        for idx in (a, a2, b):
            score[r, idx] = -float("inf")
        best = score.max(1, keepdim=True).values
        tied = (score == best).sum(1).double()
        hit = (score[r, b2] == best[:, 0]).double()
        total += float((hit / tied).sum())
    return total / len(q)


def evaluate_embeddings(sim, vocab, min_stem: int = 3) -> dict[str, float]:
    """Scores of a (V, V) word-similarity matrix on the inflections found in `vocab`: partner AUC
    (`partner_auc`, chance 0.5) and 3CosAdd analogy accuracy (`analogy_accuracy`, chance 1/(V−3)),
    with the counts and chance levels."""
    vocab = _vocab_list(vocab)
    s = _check_sim(sim)
    if s.shape[0] != len(vocab):
        raise ValueError(f"sim is {s.shape[0]}×{s.shape[0]} but vocab has {len(vocab)} words")
    pairs, analogies = inflection_pairs(vocab, min_stem), inflection_analogies(vocab, min_stem)
    return {
        "auc": partner_auc(s, pairs),
        "auc_chance": 0.5,
        "pairs": len(pairs),
        "analogy": analogy_accuracy(s, analogies) if analogies else float("nan"),
        "analogy_chance": 1.0 / (len(vocab) - 3),
        "analogies": len(analogies),
    }


def similarity_gap(sim, reference, words: Sequence[int] | None = None) -> float:
    """RMS difference of two similarity matrices over the off-diagonal entries among `words` (all by default)."""
    a, b = _check_sim(sim), _check_sim(reference, "reference")
    if a.shape != b.shape:
        raise ValueError(f"sim {tuple(a.shape)} and reference {tuple(b.shape)} differ in shape")
    if words is not None:
        idx = torch.as_tensor(list(words), dtype=torch.long)
        a, b = a[idx][:, idx], b[idx][:, idx]
    off = ~torch.eye(a.shape[0], dtype=torch.bool)
    if not off.any():
        raise ValueError("words must name at least 2 words")
    return float(((a - b)[off] ** 2).mean().sqrt())
