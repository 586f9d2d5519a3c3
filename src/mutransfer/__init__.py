"""mutransfer: the Maximal Update Parametrization (µP) and µTransfer for PyTorch."""

import os as _os
import signal as _signal
import sys as _sys

if (
    _sys.argv
    and _os.path.basename(_sys.argv[0]) in ("mutransfer", "mutransfer.exe")
    and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler
):
    # The `mutransfer` command: a Ctrl-C while torch is imported (a few seconds) ends quietly,
    # not with an import traceback. `cli.main` restores Python's handler as it starts.
    def _interrupted_while_importing(signum, frame):
        _os.write(2, b"interrupted\n")
        _os._exit(130)

    _signal.signal(_signal.SIGINT, _interrupted_while_importing)

from . import limits, optim, optimizers, rules
from .attention import attn_logits, attn_scale
from .coord import CoordCheckResult, coord_check
from .depth import residual_branch
from .describe import describe
from .export import export
from .optim import param_groups
from .parametrize import parametrize
from .roles import MuPWarning
from .shapes import WidthShapes, load_shapes, save_shapes
from .spec import MuSpec

__version__ = "0.1.0"
__all__ = [
    "CoordCheckResult",
    "MuPWarning",
    "MuSpec",
    "WidthShapes",
    "__version__",
    "attn_logits",
    "attn_scale",
    "coord_check",
    "describe",
    "export",
    "limits",
    "load_shapes",
    "optim",
    "optimizers",
    "param_groups",
    "parametrize",
    "residual_branch",
    "rules",
    "save_shapes",
]
