"""mutransfer: the Maximal Update Parametrization (µP) and µTransfer for PyTorch."""
from . import limits, optim, rules
from .attention import attn_logits, attn_scale
from .depth import residual_branch
from .coord import coord_check
from .coord_report import CoordCheckResult
from .describe import describe
from .optim import param_groups
from .parametrize import parametrize
from .roles import MuPWarning
from .shapes import WidthShapes, load_shapes, save_shapes
from .spec import MuSpec

__version__ = "0.1.0"
__all__ = ["parametrize", "residual_branch", "coord_check", "CoordCheckResult", "param_groups", "describe", "attn_scale", "attn_logits", "save_shapes", "load_shapes",
           "WidthShapes", "MuSpec", "MuPWarning", "limits", "optim", "rules", "__version__"]
