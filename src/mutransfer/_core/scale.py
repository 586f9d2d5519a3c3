"""The scale of a run (`mt.Scale`): width, depth, batch size, tokens; what a sweep objective receives.

It lives in the core so that `mt.transfer_hparams` (core) and the sweeps (`mt.sweep.Scale`, the same
class, re-exported by `mutransfer.sweep.scale` beside `Pruned`) share one meaning of "scale".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .fp8 import autocast as _autocast

__all__ = ["NO_MONITOR", "NoMonitor", "Reporter", "Scale"]

Reporter = Callable[
    [int, float], None
]  # (step, loss); raises Pruned (mutransfer.sweep.scale) when the trial should stop


@dataclass(frozen=True)
class Scale:
    """The scale of a run: width and depth, and where it matters batch size and tokens.

    One object for two uses. A sweep objective receives one per trial (`mt.sweep.Scale`, the
    same class): `width`, `base_width`, `parametrization`, `seed`, `depth`/`base_depth` (None when
    the sweep has no `depths`: the objective's own depth), `device` and `precision` (where and how
    to train, see `mutransfer.sweep.scale`). `mt.transfer_hparams` compares two of them, a proxy's
    and a target's: ``mt.Scale(width=256, depth=8, batch_size=512, tokens=2e9)``.

    `reporter` is set by the sweep runner (see `report`); it takes no part in equality, hashing,
    repr or pickling.

    Attributes:
        width: the model's width (the dim µP scales).
        base_width: µP's base width; None where it plays no part (`transfer_hparams`).
        parametrization: "mup" (default), "u-mup" (unit-scaled µP: the objective passes it to
            `mt.parametrize`, which `mutransfer.sweep.scale.mup_kwargs` does from the hyperparameters) or "sp".
        seed: the run's seed.
        depth: the number of residual blocks; None: not stated.
        base_depth: µP's base depth (sweeps over `depths`); None otherwise.
        batch_size: the number of sequences (or examples) per optimizer step; None: not stated.
        tokens: the training horizon in tokens (or examples): batch size × steps × sequence
            length; None: not stated.
    """

    width: int
    base_width: int | None = None
    parametrization: str = "mup"  # "mup", "u-mup" or "sp"
    seed: int = 0
    depth: int | None = None
    base_depth: int | None = None
    reporter: Reporter | None = field(default=None, compare=False, repr=False)
    device: torch.device = torch.device("cpu")  # noqa: RUF009 (a torch.device is immutable)
    precision: str = "fp32"
    _recording: Any = field(default=None, compare=False, repr=False)  # sweep.trajectory.Recording, set by the runner
    batch_size: int | None = None
    tokens: float | None = None

    @property
    def mup(self) -> bool:
        """Is this trial µP (`parametrization` "mup" or "u-mup", unit-scaled µP)? False for SP, the plain model."""
        return self.parametrization in ("mup", "u-mup")

    def autocast(self):
        """The context the objective's forward passes run under: bf16 autocast on `device` when
        `precision` is "bf16", the FP8 simulation (`mutransfer.precision.fp8_simulation`) when it
        is "fp8", else nothing."""
        return _autocast(self.device, self.precision)

    def report(self, step: int, loss: float) -> None:
        """Report an intermediate training loss to the sweep's pruner.

        A no-op without a pruner or outside a sweep, and for a non-finite loss (the objective's
        NaN return marks divergence).

        Args:
            step: the training step (≥ 0, increasing).
            loss: a smoothed training loss (a single minibatch's is too noisy to prune on).

        Raises:
            Pruned: the pruner stops the trial; let it propagate.
            ValueError: `step` is not a non-negative integer.
        """
        if self.reporter is None:
            return
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"scale.report: step must be a non-negative integer (the training step), got {step!r}")
        loss = float(loss)
        if math.isfinite(loss):
            self.reporter(step, loss)

    def monitor(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int | None = None) -> Any:
        """The µP monitor of this run: a `mutransfer.Monitor` when the sweep records this run (the proxy
        optimum's run, ``mutransfer transfer``'s µP target), else a no-op with the same `step` / `close`.

        Call it once the optimizer is built; then ``mon.step(loss)`` after every optimizer step and
        ``mon.close()`` after training.

        Args:
            model: the parametrized model being trained.
            optimizer: the torch optimizer training it.
            steps: the run's number of training steps (sets the sampling interval: ~12 samples per run);
                None: the sweep's ``steps`` hyperparameter, else every 10 steps.

        Returns:
            An object with ``step(loss) -> list`` and ``close()`` (and ``alarms``).
        """
        if self._recording is None or not self.mup:
            return NO_MONITOR
        return self._recording.start(model, optimizer, steps)

    def noise_scale(
        self,
        model: torch.nn.Module,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        batches: Any,
        small: int,
        big: int,
        loss: float | None = None,
    ) -> Any:
        """Measure the gradient noise scale (`mt.gradient_noise_scale`) where the sweep asks for it, else nothing.

        The sweep asks in the trials of its µP proxy cell (proxy width and depth, first seed) — with
        `loss`, only when it beats every finished trial of that cell so far, so that a sweep pays for a
        few measurements, not one per trial; the optimum's measurement goes to RUN/noise_scale.json and
        is the critical batch size ``mutransfer transfer`` uses for a batch-size rule. Call it after
        training, with batches the model has not trained on. Everywhere else it returns None at no cost.

        Args:
            model: the trained model.
            loss_fn: ``loss_fn(output, targets)`` → a scalar, averaged over the examples.
            batches: at least 3 ``(inputs, targets)`` batches of at least `big` examples, or a callable
                returning them (called only when the measurement is made, so that building them costs
                nothing elsewhere).
            small: B_small.
            big: B_big, a multiple of `small`.
            loss: the run's final loss (what the objective returns); None: measure whenever asked.

        Returns:
            The `NoiseScale` when measured, else None.
        """
        rec = self._recording
        if rec is None or not self.mup or not getattr(rec, "noise", False):
            return None
        below = getattr(rec, "noise_below", None)
        if loss is not None and below is not None and not float(loss) < below:
            return None  # not the best trial of the proxy cell so far: the optimum's is the one that counts
        return rec.measure_noise(model, loss_fn, batches() if callable(batches) else batches, small, big)

    def __reduce__(self):
        # A reporter talks to the sweep's storage from this process: a copy elsewhere is a plain Scale.
        return (
            Scale,
            (
                self.width,
                self.base_width,
                self.parametrization,
                self.seed,
                self.depth,
                self.base_depth,
                None,
                self.device,
                self.precision,
                self._recording,
                self.batch_size,
                self.tokens,
            ),
        )


class NoMonitor:
    """`Scale.monitor` outside a recorded run (and a monitor the sweep dropped): the surface of
    `mutransfer.Monitor`, doing nothing."""

    alarms: tuple = ()  # never any

    def step(self, loss: Any = None) -> list:
        return []

    def close(self) -> None:
        pass


NO_MONITOR = NoMonitor()
