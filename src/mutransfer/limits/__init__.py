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
from .traced import KernelWarning, ModelKernels, model_kernel_diag, model_kernels
from .mup_limit import (MuPLimit, OneHiddenLayer, feature_movement, finite_optimizer, fitted_slope, sgd_batches,
                        train_finite)
from .pi_limit import PiLimit, PiNet, train_pi
from .predict import gp_posterior, gradient_flow, nngp_predict, ntk_predict
from .word2vec import (SkipGram, Word2VecLimit, analogy_accuracy, cosine_similarity, evaluate_embeddings,
                       inflection_analogies, inflection_pairs, morphological_groups, ntk_limit_similarity,
                       partner_auc, similarity_gap, skipgram_batches, train_skipgram)

__all__ = ["kernels", "mlp_kernels", "model_kernels", "model_kernel_diag", "ModelKernels", "KernelWarning",
           "monte_carlo_kernels", "layer_factors", "nngp", "ntk", "nngp_diag", "nngp_predict", "ntk_predict",
           "gp_posterior", "gradient_flow", "empirical_ntk", "empirical_nngp",
           "NTKMLP", "MuPLimit", "OneHiddenLayer", "train_finite", "finite_optimizer", "feature_movement", "fitted_slope",
           "sgd_batches", "get_activation", "PiLimit", "PiNet", "train_pi",
           "SkipGram", "Word2VecLimit", "skipgram_batches", "train_skipgram", "ntk_limit_similarity",
           "cosine_similarity", "morphological_groups", "inflection_pairs", "inflection_analogies", "partner_auc",
           "analogy_accuracy", "evaluate_embeddings", "similarity_gap"]
