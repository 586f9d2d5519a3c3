"""The µP monitor: is a training run still in µP, step by step (`mt.Monitor`).

- `monitor` — `Monitor` (sample, check, log), `load_trajectory`
- `quantities` — what a sample measures (hooks armed for one step, update sizes, power iteration)
- `predictions` — what µP predicts and where the run differs (lrs, swapped layers, attention, proxy)
- `alarms` — `Alarm` and the causes
- `sinks` — TensorBoard, W&B, CSV, a callable
- `integrations` — Hugging Face and Lightning callbacks
"""

from .alarms import Alarm
from .integrations import hf_callback, lightning_callback
from .monitor import TRAJECTORY_FORMAT, Monitor, load_trajectory
from .sinks import tag

__all__ = ["TRAJECTORY_FORMAT", "Alarm", "Monitor", "hf_callback", "lightning_callback", "load_trajectory", "tag"]
