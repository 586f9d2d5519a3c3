"""Small reference models and data used by the examples, the tests, the checks and the demo."""

from .data import gaussian_batches, image_batches, stdlib_text, text_batches
from .models import CNN, GPT, MLP, Llama, MHATransformer, ResMLP, ResNet
from .registry import RECIPES, Recipe, get_recipe

__all__ = [
    "CNN",
    "GPT",
    "MLP",
    "RECIPES",
    "Llama",
    "MHATransformer",
    "Recipe",
    "ResMLP",
    "ResNet",
    "gaussian_batches",
    "get_recipe",
    "image_batches",
    "stdlib_text",
    "text_batches",
]
