"""What a sweep trains: `train(hparams, scale) -> loss`, user-given or a built-in recipe.

`hparams` holds the swept values and the config's [fixed] table. µP's tunable hyperparameters
have reserved names, wired into `mt.parametrize` / `mt.param_groups` by `mup_kwargs`:

- ``lr`` — the base learning rate;
- ``output_mult``, ``attn_mult``, ``embedding_mult`` — α_output, α_attention, α_embedding;
- ``init_mult_<role>``, ``lr_mult_<role>`` — per-role init std and lr multipliers
  (role: input, hidden, output, vector, scalar);
- ``depth_alpha`` — the depth exponent α: residual branches × (L/L₀)^-α (1.0 CompleteP, the
  default; 0.5 Depth-µP; 0 no depth scaling).

In a sweep over `depths`, `scale.depth` is the number of residual blocks to build and
`scale.base_depth` the µP base depth (both None otherwise).

`scale.device` is the `torch.device` the trial trains on: ``cuda`` (the one GPU its worker
sees, ``CUDA_VISIBLE_DEVICES`` set by the sweep) or ``cpu``; build the model and move the data
there. `scale.precision` is ``"fp32"`` or ``"bf16"`` (the config's ``precision``); run the
forward passes under ``with scale.autocast():`` (bf16 autocast, or nothing for fp32).

Any other name is the user's own. The loss should be a training loss (final or mean over the
last steps); NaN or inf marks the trial as diverged.

**Pruning** (config key ``pruner``): during training the objective may call
``scale.report(step, loss)`` with a smoothed training loss (e.g. the mean of the last few
minibatches: a single minibatch loss is too noisy to prune on). In a sweep with a pruner the value
goes to the trial's Optuna study, and `report` raises `Pruned` when the pruner finds the trial
worse than the trials already finished in its study at the same step; let it propagate (the
runner records the trial as pruned). Without a pruner, outside a sweep (``mutransfer transfer``,
a direct call) or when `scale` was pickled to another process, `report` does nothing. With
several seeds only the first seed's run reports: a pruner compares the same fidelity (the same
seed's data and step) across trials, so the later seeds' values, on other data, would compare
apples with oranges; a trial pruned on its first seed never trains the others. A non-finite loss
is not reported (return NaN from the objective to mark a diverged trial).

**Monitoring** (docs/monitor.md, "In sweeps and transfers"): the objective may call
``mon = scale.monitor(model, optimizer, steps=steps)`` once the optimizer is built, ``mon.step(loss)``
after each optimizer step and ``mon.close()`` at the end. In the one run the sweep records at the proxy
optimum (RUN/proxy_trajectory.json) and in ``mutransfer transfer``'s µP target run it is a real
`mutransfer.Monitor`; everywhere else a no-op that costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
import torch

from .._core.devices import autocast as _autocast
from ..rules import ROLES

__all__ = ["MULTIPLIER_NAMES", "Objective", "Pruned", "Reporter", "Scale", "mup_kwargs"]

Objective = Callable[[dict, "Scale"], float]
MULTIPLIER_NAMES = ("output_mult", "attn_mult", "embedding_mult")
Reporter = Callable[[int, float], None]  # (step, loss); raises Pruned when the trial should stop


class Pruned(optuna.TrialPruned):
    """Raised by `Scale.report` when the sweep's pruner stops the trial; let it propagate."""


@dataclass(frozen=True)
class Scale:
    """Where a trial runs: the model's width and depth, parametrization and seed.

    `depth`/`base_depth` are None when the sweep has no `depths`: the objective's own depth.
    `reporter` is set by the sweep runner (see `report`); it takes no part in equality, hashing,
    repr or pickling. `device` and `precision`: where and how to train (see the module docstring).
    """

    width: int
    base_width: int
    parametrization: str  # "mup" or "sp"
    seed: int = 0
    depth: int | None = None
    base_depth: int | None = None
    reporter: Reporter | None = field(default=None, compare=False, repr=False)
    device: torch.device = torch.device("cpu")  # noqa: RUF009 (a torch.device is immutable)
    precision: str = "fp32"
    _recording: Any = field(default=None, compare=False, repr=False)  # sweep.trajectory.Recording, set by the runner

    @property
    def mup(self) -> bool:
        """Is this trial µP (`parametrization == "mup"`)? False for SP, the plain model."""
        return self.parametrization == "mup"

    def autocast(self):
        """The context the objective's forward passes run under: bf16 autocast on `device` when
        `precision` is "bf16", else nothing."""
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
            return _NO_MONITOR
        return self._recording.start(model, optimizer, steps)

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
            ),
        )


class _NoMonitor:
    """`Scale.monitor` outside a recorded run: the surface of `mutransfer.Monitor`, doing nothing."""

    alarms: tuple = ()  # never any

    def step(self, loss: Any = None) -> list:
        return []

    def close(self) -> None:
        pass


_NO_MONITOR = _NoMonitor()


def mup_kwargs(hparams: dict[str, Any]) -> dict[str, Any]:
    """The `mt.parametrize` keyword arguments held in `hparams` (the reserved names above).

    Args:
        hparams: what the objective received.

    Returns:
        ``output_mult``, ``attn_mult``, ``embedding_mult``, ``depth_alpha``, and ``init_mult`` /
        ``lr_mult`` dicts by role, for those present; ``{}`` when none is.

    Raises:
        TypeError: ``depth_alpha`` is not a number.
    """
    kw: dict[str, Any] = {name: float(hparams[name]) for name in MULTIPLIER_NAMES if name in hparams}
    if "depth_alpha" in hparams:
        kw["depth_alpha"] = _number("depth_alpha", hparams["depth_alpha"])
    init = {role: float(hparams[f"init_mult_{role}"]) for role in ROLES if f"init_mult_{role}" in hparams}
    lr = {role: float(hparams[f"lr_mult_{role}"]) for role in ROLES if f"lr_mult_{role}" in hparams}
    if init:
        kw["init_mult"] = init
    if lr:
        kw["lr_mult"] = lr
    return kw


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)
