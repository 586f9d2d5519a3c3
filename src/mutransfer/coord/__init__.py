"""The coordinate check (TP5 appendix D.1): train a few steps at several widths and test whether
every activation scales as µP predicts. `run` trains, `measure` records activations, `result` holds the records and
the verdict (slopes against the exponents µP predicts), `plot` draws them."""

from .result import ATTN_SUFFIX, CoordCheckResult, Record, Trend
from .run import DEFAULT_OPTIMIZER, MODEL_OUTPUT, check_widths, coord_check

__all__ = [
    "ATTN_SUFFIX",
    "DEFAULT_OPTIMIZER",
    "MODEL_OUTPUT",
    "CoordCheckResult",
    "Record",
    "Trend",
    "check_widths",
    "coord_check",
]
