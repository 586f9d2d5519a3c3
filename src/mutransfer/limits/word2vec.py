"""word2vec (skip-gram with negative sampling) and its exact µP limit (Tensor Programs IV).

- `skipgram_batches`: (word, context, negatives) batches from a token stream, deterministic in
  the seed; the same batches feed the finite network and the limit;
- `SkipGram` + `train_skipgram`: the finite network of any width, µP or NTK parametrization;
- `Word2VecLimit`: the exact µP limit (a width-2V linear network, float64); `ntk_limit_similarity`:
  the NTK limit's word–word similarity (the identity: its embeddings never move);
- `evaluate_embeddings`, `partner_auc`, `analogy_accuracy`, `morphological_groups`,
  `inflection_pairs`, `inflection_analogies`, `similarity_gap`, `cosine_similarity`: scores of
  embeddings from the vocabulary's morphology, which the model never sees.

    import mutransfer as mt
    batches = mt.limits.word2vec.skipgram_batches(tokens, vocab_size, epochs=2)
    sim = mt.limits.Word2VecLimit(vocab_size).fit(batches, lr=80).similarity()
    scores = mt.limits.word2vec.evaluate_embeddings(sim, vocab)
"""

from ._word2vec import (
    SkipGram,
    Word2VecLimit,
    cosine_similarity,
    ntk_limit_similarity,
    skipgram_batches,
    train_skipgram,
)
from ._word2vec_eval import (
    SUFFIXES,
    analogy_accuracy,
    evaluate_embeddings,
    inflection_analogies,
    inflection_pairs,
    morphological_groups,
    partner_auc,
    similarity_gap,
)

__all__ = [
    "SUFFIXES",
    "SkipGram",
    "Word2VecLimit",
    "analogy_accuracy",
    "cosine_similarity",
    "evaluate_embeddings",
    "inflection_analogies",
    "inflection_pairs",
    "morphological_groups",
    "ntk_limit_similarity",
    "partner_auc",
    "similarity_gap",
    "skipgram_batches",
    "train_skipgram",
]
