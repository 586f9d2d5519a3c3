"""The monitor in other people's training loops: a Hugging Face `TrainerCallback` and a Lightning
`Callback`, each attached in one line. The libraries are imported when a callback is first built."""

from __future__ import annotations

from typing import Any

from .monitor import Monitor
from .sinks import EXTRA

__all__ = ["hf_callback", "lightning_callback"]


def _need(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"the µP monitor's {module} callback needs {module}: {EXTRA}") from e


def hf_callback(**monitor_kwargs: Any) -> Any:
    """A `transformers.TrainerCallback` that runs `Monitor` on the Trainer's model and optimizer.

    ``trainer.add_callback(mt.monitor.hf_callback(every=50, log="tensorboard:runs/x"))``. The monitor
    starts at ``on_train_begin`` (the Trainer has built its optimizer then) and steps at every
    ``on_step_end``; it is ``callback.monitor`` afterwards.

    Args:
        **monitor_kwargs: everything `Monitor` takes but the model and optimizer.
    """
    transformers = _need("transformers")

    class MonitorCallback(transformers.TrainerCallback):  # type: ignore[name-defined]  # imported on use
        """Runs `mt.Monitor` inside a Hugging Face Trainer (see `hf_callback`)."""

        def __init__(self) -> None:
            self.monitor: Monitor | None = None

        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            self.monitor = Monitor(model, optimizer, **monitor_kwargs)

        def on_step_end(self, args, state, control, **kwargs):
            if self.monitor is not None:
                self.monitor.step()

        def on_train_end(self, args, state, control, **kwargs):
            if self.monitor is not None:
                self.monitor.close()

    return MonitorCallback()


def lightning_callback(**monitor_kwargs: Any) -> Any:
    """A Lightning `Callback` that runs `Monitor` on the LightningModule (or the parametrized model it holds)
    and the trainer's first optimizer.

    ``Trainer(callbacks=[mt.monitor.lightning_callback(every=50)])``; the monitor is ``callback.monitor``.

    Args:
        **monitor_kwargs: everything `Monitor` takes but the model and optimizer.
    """
    pl = _need("lightning.pytorch")

    class MonitorCallback(pl.Callback):  # type: ignore[name-defined]  # imported on use
        """Runs `mt.Monitor` inside a Lightning Trainer (see `lightning_callback`)."""

        def __init__(self) -> None:
            self.monitor: Monitor | None = None

        def on_train_start(self, trainer, pl_module):
            self.monitor = Monitor(pl_module, trainer.optimizers[0], **monitor_kwargs)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if self.monitor is not None:
                loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
                self.monitor.step(loss)

        def on_train_end(self, trainer, pl_module):
            if self.monitor is not None:
                self.monitor.close()

    return MonitorCallback()
