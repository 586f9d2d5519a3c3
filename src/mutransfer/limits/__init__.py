"""Infinite-width limits: NNGP/NTK kernels of any traced torch.nn module (and the closed
recursion for fully-connected networks), predictions from them, and the µP feature-learning
limits: a 1-hidden-layer network under SGD, momentum, Adam or AdamW (`MuPLimit`), deep relu MLPs
(the π-limit, `PiLimit`), word2vec (`Word2VecLimit`) and, by the master theorem on particles, the
µP limit of your own traced module — MLPs and attention blocks — under SGD or Adam (`FeatureLimit`). The finite networks they are the limits
of are in `mutransfer.limits.finite`, word2vec's data and evaluation in `mutransfer.limits.word2vec`.

    import mutransfer as mt
    K = mt.limits.nngp(model, x1, x2)                 # (n1, n2), float64, one output unit
    K = mt.limits.nngp(x, depth=3)                    # (n, n), float64
    T = mt.limits.ntk(x, x_test, depth=3, activation="erf")
    mean, var = mt.limits.nngp_predict(x, y, x_test, depth=3)
    f = mt.limits.MuPLimit("relu").fit(x, y, steps=500, lr=0.5).predict(x_test)
    f = mt.limits.MuPLimit("relu", optimizer="adam").fit(x, y, 300, 1e-3).predict(x_test)
    f = mt.limits.PiLimit(2, 64, input_alpha=0.3).fit(x, y, 400, 0.3, batch_size=32).predict(x_test)
    lim = mt.limits.FeatureLimit(model, base=base_model, particles=2**14, groups=8)  # any traced MLP or attention block
    f, se = lim.fit(x, y, steps=20, lr=0.1).predict(x_test, return_error=True)
"""

from typing import Any

from . import finite, maml, word2vec
from ._deprecated import moved
from ._feature import FeatureLimit
from ._kernels import kernels, nngp, ntk
from ._maml import MAMLLimit
from ._mup_limit import MuPLimit
from ._pi_limit import PiLimit
from ._predict import gp_posterior, gradient_flow, nngp_predict, ntk_predict
from ._traced import KernelWarning, ModelKernels, model_kernels
from ._word2vec import Word2VecLimit

__all__ = [
    "FeatureLimit",
    "KernelWarning",
    "MAMLLimit",
    "ModelKernels",
    "MuPLimit",
    "PiLimit",
    "Word2VecLimit",
    "finite",
    "gp_posterior",
    "gradient_flow",
    "kernels",
    "maml",
    "model_kernels",
    "nngp",
    "nngp_predict",
    "ntk",
    "ntk_predict",
    "word2vec",
]


def __getattr__(name: str) -> Any:
    """The names `mt.limits` exported before issue 28, one release longer, with a DeprecationWarning."""
    return moved(name)
