"""The finite networks each infinite-width limit of `mutransfer.limits` is the limit of, how to
train them exactly as the limit assumes, and their empirical kernels: the other side of every
finite-to-limit comparison.

- `OneHiddenLayer`, `finite_optimizer`, `train_finite`: the network `MuPLimit` is the limit of
  (µP or NTK parametrization), its optimizer and its training on the same minibatches
  (`sgd_batches`); `feature_movement` measures how far its features moved;
- `PiNet`, `train_pi`: the finite π-network `PiLimit` is the limit of;
- `train_mup`: the finite networks `FeatureLimit(model, base=base)` is the limit of — your own
  module, `mt.parametrize`d relative to `base` and trained by SGD on `mt.param_groups` over the
  limit's batches;
- `NTKMLP`: the fully-connected network in the NTK parametrization that `nngp`/`ntk` describe;
  `empirical_ntk` (torch.func) and `empirical_nngp` (Monte Carlo over inits) of any module;
  `monte_carlo_kernels` and `layer_factors`: NNGP/NTK of finite networks of any module in the NTK
  parametrization (the fallback of `model_kernels`);
- `fitted_slope`: the slope of log(error) against log(width), to read convergence rates.

The word2vec network (`SkipGram`) lives with its limit in `mutransfer.limits.word2vec`.
"""

from ._empirical import NTKMLP, empirical_nngp, empirical_ntk
from ._feature.train import train_mup
from ._monte_carlo import layer_factors, monte_carlo_kernels
from ._mup_limit import sgd_batches
from ._one_hidden import OneHiddenLayer, feature_movement, finite_optimizer, fitted_slope, train_finite
from ._pi_limit import PiNet, train_pi

__all__ = [
    "NTKMLP",
    "OneHiddenLayer",
    "PiNet",
    "empirical_nngp",
    "empirical_ntk",
    "feature_movement",
    "finite_optimizer",
    "fitted_slope",
    "layer_factors",
    "monte_carlo_kernels",
    "sgd_batches",
    "train_finite",
    "train_mup",
    "train_pi",
]
