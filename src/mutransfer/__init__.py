"""mutransfer: the Maximal Update Parametrization (µP) and µTransfer for PyTorch."""
from . import optim, rules
from .attention import attn_scale
from .describe import describe
from .optim import param_groups
from .parametrize import parametrize
from .shapes import WidthShapes, load_shapes, save_shapes
from .spec import MuSpec

__version__ = "0.1.0"
__all__ = ["parametrize", "param_groups", "describe", "attn_scale", "save_shapes", "load_shapes",
           "WidthShapes", "MuSpec", "optim", "rules", "__version__"]
