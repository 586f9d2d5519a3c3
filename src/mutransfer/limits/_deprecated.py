"""Names and submodules of `mutransfer.limits` kept one release after the narrowing of its public
API (issue 28), each warning with a `DeprecationWarning` that names the new spelling."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "OLD_MODULES", "moved", "old_module", "old_names"]

_PKG = "mutransfer.limits"
_FINITE = ("mutransfer.limits.finite", "mt.limits.finite")
_W2V = ("mutransfer.limits.word2vec", "mt.limits.word2vec")

# old name in mt.limits → (module that holds it now, its new spelling for the message)
MOVED: dict[str, tuple[str, str]] = {
    **{
        name: (_FINITE[0], f"{_FINITE[1]}.{name}")
        for name in (
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
            "train_pi",
        )
    },
    **{
        name: (_W2V[0], f"{_W2V[1]}.{name}")
        for name in (
            "SkipGram",
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
        )
    },
    "mlp_kernels": (f"{_PKG}._kernels", "mt.limits.kernels(x1, x2, depth=..., activation=...), the same function"),
    "nngp_diag": (f"{_PKG}._kernels", "mt.limits.nngp(x, depth=...).diagonal() (it is internal now)"),
    "model_kernel_diag": (f"{_PKG}._traced", "mt.limits.model_kernels(model, x).nngp.diagonal() (it is internal now)"),
    "get_activation": (f"{_PKG}._activations", "an activation name or a callable where a function takes one"),
}

# old public submodule → (the internal modules that hold its names now, what to use instead)
OLD_MODULES: dict[str, tuple[tuple[str, ...], str]] = {
    "activations": (("_activations",), "pass activation names or callables to mt.limits' functions"),
    "empirical": (("_empirical",), "mt.limits.finite"),
    "fields": (("_fields",), "nothing public: it is internal"),
    "gaussian": (("_gaussian",), "nothing public: it is internal"),
    "kernels": (("_kernels",), "mt.limits.nngp, ntk and kernels"),
    "layers": (("_layers",), "nothing public: it is internal"),
    "monte_carlo": (("_monte_carlo",), "mt.limits.model_kernels (exact=False) or mt.limits.finite"),
    "mup_limit": (("_mup_limit", "_one_hidden"), "mt.limits.MuPLimit and mt.limits.finite"),
    "pi_limit": (("_pi_limit",), "mt.limits.PiLimit and mt.limits.finite"),
    "predict": (("_predict",), "mt.limits.nngp_predict, ntk_predict, gp_posterior and gradient_flow"),
    "program": (("_program",), "mt.limits.model_kernels (exact=True)"),
    "traced": (("_traced",), "mt.limits.model_kernels"),
}


def _warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def moved(name: str) -> Any:
    """`mt.limits.<name>` for a name moved or made internal: its object, with a warning; an old
    submodule's name: that (deprecated) submodule. AttributeError for anything else."""
    if name in MOVED:
        where, new = MOVED[name]
        _warn(f"mt.limits.{name}", new, stacklevel=4)
        return getattr(importlib.import_module(where), name)
    if name in OLD_MODULES:
        return importlib.import_module(f"{_PKG}.{name}")
    raise AttributeError(f"module {_PKG!r} has no attribute {name!r}")


def old_module(name: str) -> Callable[[str], Any]:
    """Warn that submodule `mutransfer.limits.<name>` is deprecated; return the module-level
    `__getattr__` that reads its names from the internal modules that hold them now."""
    impls, instead = OLD_MODULES[name]
    _warn(f"the module {_PKG}.{name}", instead, stacklevel=4)
    modules: list[ModuleType] = [importlib.import_module(f"{_PKG}.{m}") for m in impls]

    def __getattr__(attr: str) -> Any:
        for m in modules:
            if hasattr(m, attr):
                return getattr(m, attr)
        raise AttributeError(f"module {_PKG}.{name!r} has no attribute {attr!r}")

    return __getattr__


def old_names(name: str) -> list[str]:
    """The names an old submodule declared (the union of its internal modules' `__all__`)."""
    impls, _ = OLD_MODULES[name]
    names: list[str] = []
    for m in impls:
        names += getattr(importlib.import_module(f"{_PKG}.{m}"), "__all__", [])
    return names
