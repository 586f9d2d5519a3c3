"""Infinite-width limits: NNGP/NTK kernels of fully-connected networks and the µP
feature-learning limit of a 1-hidden-layer network (`MuPLimit`).

    import mutransfer as mt
    K = mt.limits.nngp(x, depth=3)                    # (n, n), float64
    T = mt.limits.ntk(x, x_test, depth=3, activation="erf")
    mean, var = mt.limits.nngp_predict(x, y, x_test, depth=3)
    f = mt.limits.MuPLimit("relu").fit(x, y, steps=500, lr=0.5).predict(x_test)
"""
from .activations import get_activation
from .empirical import NTKMLP, empirical_nngp, empirical_ntk
from .kernels import kernels, nngp, nngp_diag, ntk
from .mup_limit import MuPLimit, OneHiddenLayer, feature_movement, fitted_slope, sgd_batches, train_finite
from .predict import nngp_predict, ntk_predict

__all__ = ["kernels", "nngp", "ntk", "nngp_diag", "nngp_predict", "ntk_predict", "empirical_ntk", "empirical_nngp",
           "NTKMLP", "MuPLimit", "OneHiddenLayer", "train_finite", "feature_movement", "fitted_slope",
           "sgd_batches", "get_activation"]
