"""Small reference models and data used by the examples, the tests and (later) the demo."""
from .models import CNN, GPT, MLP, MHATransformer

__all__ = ["MLP", "CNN", "GPT", "MHATransformer"]
