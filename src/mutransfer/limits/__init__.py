"""Infinite-width limits: NNGP/NTK kernels of any traced torch.nn module (and the closed
recursion for fully-connected networks) and the µP feature-learning limits: a 1-hidden-layer
network under SGD, momentum, Adam or AdamW (`MuPLimit`), deep relu MLPs (the π-limit, `PiLimit`)
and word2vec (`Word2VecLimit`), each with the finite networks it is the limit of.

    import mutransfer as mt
    K = mt.limits.nngp(model, x1, x2)                 # (n1, n2), float64, one output unit
    K = mt.limits.nngp(x, depth=3)                    # (n, n), float64
    T = mt.limits.ntk(x, x_test, depth=3, activation="erf")
    mean, var = mt.limits.nngp_predict(x, y, x_test, depth=3)
    f = mt.limits.MuPLimit("relu").fit(x, y, steps=500, lr=0.5).predict(x_test)
    f = mt.limits.MuPLimit("relu", optimizer="adam").fit(x, y, 300, 1e-3).predict(x_test)
    f = mt.limits.PiLimit(2, 64, input_alpha=0.3).fit(x, y, 400, 0.3, batch_size=32).predict(x_test)
"""

from .activations import get_activation
from .empirical import NTKMLP, empirical_nngp, empirical_ntk
from .kernels import kernels, mlp_kernels, nngp, nngp_diag, ntk
from .monte_carlo import layer_factors, monte_carlo_kernels
from .mup_limit import (
    MuPLimit,
    OneHiddenLayer,
    feature_movement,
    finite_optimizer,
    fitted_slope,
    sgd_batches,
    train_finite,
)
from .pi_limit import PiLimit, PiNet, train_pi
from .predict import gp_posterior, gradient_flow, nngp_predict, ntk_predict
from .traced import KernelWarning, ModelKernels, model_kernel_diag, model_kernels
from .word2vec import (
    SkipGram,
    Word2VecLimit,
    analogy_accuracy,
    cosine_similarity,
    evaluate_embeddings,
    inflection_analogies,
    inflection_pairs,
    morphological_groups,
    ntk_limit_similarity,
    partner_auc,
    similarity_gap,
    skipgram_batches,
    train_skipgram,
)

__all__ = [
    "NTKMLP",
    "KernelWarning",
    "ModelKernels",
    "MuPLimit",
    "OneHiddenLayer",
    "PiLimit",
    "PiNet",
    "SkipGram",
    "Word2VecLimit",
    "analogy_accuracy",
    "cosine_similarity",
    "empirical_nngp",
    "empirical_ntk",
    "evaluate_embeddings",
    "feature_movement",
    "finite_optimizer",
    "fitted_slope",
    "get_activation",
    "gp_posterior",
    "gradient_flow",
    "inflection_analogies",
    "inflection_pairs",
    "kernels",
    "layer_factors",
    "mlp_kernels",
    "model_kernel_diag",
    "model_kernels",
    "monte_carlo_kernels",
    "morphological_groups",
    "nngp",
    "nngp_diag",
    "nngp_predict",
    "ntk",
    "ntk_limit_similarity",
    "ntk_predict",
    "partner_auc",
    "sgd_batches",
    "similarity_gap",
    "skipgram_batches",
    "train_finite",
    "train_pi",
    "train_skipgram",
]
