"""The public face of `mt.limits` (issue 28): a narrow `__all__`, and every name or submodule it
had before kept one release, warning with the new spelling."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

import mutransfer as mt
from mutransfer.limits import _deprecated

OLD_ALL = [  # mt.limits.__all__ before issue 28
    "NTKMLP", "KernelWarning", "ModelKernels", "MuPLimit", "OneHiddenLayer", "PiLimit", "PiNet", "SkipGram",
    "Word2VecLimit", "analogy_accuracy", "cosine_similarity", "empirical_nngp", "empirical_ntk",
    "evaluate_embeddings", "feature_movement", "finite_optimizer", "fitted_slope", "get_activation",
    "gp_posterior", "gradient_flow", "inflection_analogies", "inflection_pairs", "kernels", "layer_factors",
    "mlp_kernels", "model_kernel_diag", "model_kernels", "monte_carlo_kernels", "morphological_groups", "nngp",
    "nngp_diag", "nngp_predict", "ntk", "ntk_limit_similarity", "ntk_predict", "partner_auc", "sgd_batches",
    "similarity_gap", "skipgram_batches", "train_finite", "train_pi", "train_skipgram",
]  # fmt: skip


def test_the_public_api_is_narrow_and_importable():
    names = mt.limits.__all__
    # issue 28 asked for ~15 names; FeatureLimit (issue 33) made 16, MAMLLimit and the maml namespace (issue 47) 18
    assert len(names) <= 18 and len(set(names)) == len(names)
    for name in names:
        assert getattr(mt.limits, name) is not None
    for module in (mt.limits.finite, mt.limits.word2vec):
        for name in module.__all__:
            assert getattr(module, name) is not None


@pytest.mark.parametrize("name", sorted(set(OLD_ALL) - set(mt.limits.__all__)))
def test_every_old_name_still_works_with_a_warning_naming_the_new_spelling(name):
    with pytest.warns(DeprecationWarning, match=rf"mt\.limits\.{name} is deprecated.*use "):
        obj = getattr(mt.limits, name)
    where, _ = _deprecated.MOVED[name]
    assert obj is getattr(importlib.import_module(where), name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mt.limits.nope  # noqa: B018


@pytest.mark.parametrize("old", sorted(_deprecated.OLD_MODULES))
def test_old_submodules_import_with_a_warning(old, monkeypatch):
    monkeypatch.delitem(sys.modules, f"mutransfer.limits.{old}", raising=False)
    kernels = mt.limits.kernels
    try:
        with pytest.warns(DeprecationWarning, match=rf"mutransfer\.limits\.{old} is deprecated"):
            module = importlib.import_module(f"mutransfer.limits.{old}")
        for name in module.__all__:
            assert getattr(module, name) is not None
        # importing a submodule rebinds the package's attribute of its name: `kernels` stays callable
        x = torch.randn(3, 2, dtype=torch.float64)
        torch.testing.assert_close(mt.limits.kernels(x, depth=1)[0], kernels(x, depth=1)[0])
    finally:
        mt.limits.kernels = kernels  # the function again, for the tests that follow
