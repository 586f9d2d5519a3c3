"""Built-in recipes: a plain model as a function of width, data, and defaults for the checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from .data import gaussian_batches, image_batches, text_batches
from .models import CNN, GPT, MLP, ResMLP

__all__ = ["COORD_LR", "RECIPES", "Recipe", "get_recipe"]


@dataclass(frozen=True)
class Recipe:
    name: str
    build: Callable[[int], nn.Module]  # the plain (standard-parametrization) model at a width
    data: Callable[[], list]  # a few (inputs, targets) batches
    widths: tuple[int, ...]  # default widths of the coordinate check; the first is µP's base width
    coord_lr: dict[str, float] = field(default_factory=dict)  # coordinate-check lr per optimizer family
    description: str = ""
    build_depth: Callable[[int, int], nn.Module] | None = None  # (width, depth) → model, for depth checks

    def lr_for(self, optimizer: str) -> float | None:
        """The coordinate-check lr for `optimizer`: the recipe's own, else COORD_LR's, else the
        recipe's Adam lr (Adam's relatives: adamw, nadam, …)."""
        name = optimizer.lower()
        return self.coord_lr.get(name, COORD_LR.get(name, self.coord_lr.get("adam")))


# Coordinate-check lrs of the optimizers whose lr means something else than Adam's: Lion's sign step
# (≈ 3× smaller than Adam's), Adafactor's relative step (ρ: a fraction of RMS(W) per step), Muon's
# and SOAP's spectral step.
COORD_LR = {"lion": 3e-3, "adafactor": 0.1, "muon": 0.05, "soap": 1e-2}


RECIPES: dict[str, Recipe] = {
    "mlp": Recipe(
        "mlp",
        lambda w: MLP(w, d_in=32, d_out=10, depth=3),
        lambda: gaussian_batches(4, 64, 32, 10),
        (64, 128, 256, 512, 1024),
        {"sgd": 0.1, "adam": 1e-2},
        "3-layer ReLU MLP on Gaussian inputs, 10 classes",
    ),
    "cnn": Recipe(
        "cnn",
        lambda w: CNN(w),
        lambda: image_batches(4, 16, 3, 8, 10),
        (16, 32, 64, 128, 256),
        {"sgd": 0.1, "adam": 1e-2},
        "2 conv layers with BatchNorm, 8×8 random images, 10 classes",
    ),
    "gpt": Recipe(
        "gpt",
        lambda w: GPT(w),
        lambda: text_batches(4, 8, 32),
        (64, 128, 256, 512, 1024),
        {"sgd": 1.0, "adam": 1e-2},
        "2-layer pre-LN GPT, 4 heads, tied embeddings, SDPA attention, byte-level text",
        build_depth=lambda w, d: GPT(w, n_layer=d),
    ),
    "resmlp": Recipe(
        "resmlp",
        lambda w: ResMLP(w, depth=2),
        lambda: gaussian_batches(4, 64, 32, 10),
        (64, 128, 256, 512, 1024),
        {"sgd": 0.1, "adam": 1e-2},
        "residual MLP, pre-LN blocks (2 by default), Gaussian inputs, 10 classes",
        build_depth=lambda w, d: ResMLP(w, depth=d),
    ),
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe '{name}'; choose one of {', '.join(RECIPES)}")
    return RECIPES[name]
