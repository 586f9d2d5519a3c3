"""What a sweep trains: `train(hparams, scale) -> loss`, user-given or a built-in recipe.

`hparams` holds the swept values and the config's [fixed] table. µP's tunable hyperparameters
have reserved names, wired into `mt.parametrize` / `mt.param_groups` by `mup_kwargs`:

- ``lr`` — the base learning rate;
- ``output_mult``, ``attn_mult``, ``embedding_mult`` — α_output, α_attention, α_embedding;
- ``init_mult_<role>``, ``lr_mult_<role>`` — per-role init std and lr multipliers
  (role: input, hidden, output, vector, scalar);
- ``depth_alpha`` — the depth exponent α: residual branches × (L/L₀)^-α (1.0 CompleteP, the
  default; 0.5 Depth-µP; 0 no depth scaling);
- ``parametrization`` — ``"mup"`` (default) or ``"u-mup"`` (unit-scaled µP, docs/u-mup.md): the
  µP runs of the sweep are then u-µP's, usually set in ``[fixed]``;
- u-µP's hyperparameters (with ``parametrization = "u-mup"``): ``alpha_res``,
  ``alpha_res_attn_ratio``, ``alpha_ffn_act``, ``alpha_loss_softmax``, and ``alpha_attn_softmax`` /
  ``alpha_output`` (the same places as ``attn_mult`` / ``output_mult``, which they set).

In a sweep over `depths`, `scale.depth` is the number of residual blocks to build and
`scale.base_depth` the µP base depth (both None otherwise).

`scale.device` is the `torch.device` the trial trains on: ``cuda`` (the one GPU its worker
sees, ``CUDA_VISIBLE_DEVICES`` set by the sweep) or ``cpu``; build the model and move the data
there. `scale.precision` is ``"fp32"``, ``"bf16"`` or ``"fp8"`` (the config's ``precision``); run the
forward passes under ``with scale.autocast():`` (bf16 autocast, the FP8 simulation, or nothing for fp32).

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
after each optimizer step and ``mon.close()`` at the end. In the first seed of every µP or u-µP trial (the
transferred parametrization's proxy optimum's becomes RUN/proxy_trajectory.json: µP's, else u-µP's) and in
``mutransfer transfer``'s target run of that parametrization it is a real `mutransfer.Monitor`; everywhere else
a no-op that costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from .._core.scale import Reporter, Scale
from ..errors import ConfigError
from ..rules import ROLES, parametrization_name

__all__ = ["MULTIPLIER_NAMES", "UMUP_NAMES", "Objective", "Pruned", "Reporter", "Scale", "mup_kwargs"]

Objective = Callable[[dict, "Scale"], float]
MULTIPLIER_NAMES = ("output_mult", "attn_mult", "embedding_mult")
# u-µP's hyperparameters as sweep names → parametrize's keyword (α_attn_softmax and α_output are µP's attn_mult and
# output_mult: one multiplier per place in the forward)
UMUP_NAMES = {
    "alpha_res": "alpha_res",
    "alpha_res_attn_ratio": "alpha_res_attn_ratio",
    "alpha_ffn_act": "alpha_ffn_act",
    "alpha_loss_softmax": "alpha_loss_softmax",
    "alpha_attn_softmax": "attn_mult",
    "alpha_output": "output_mult",
}


class Pruned(optuna.TrialPruned):
    """Raised by `Scale.report` when the sweep's pruner stops the trial; let it propagate."""


def mup_kwargs(hparams: dict[str, Any]) -> dict[str, Any]:
    """The `mt.parametrize` keyword arguments held in `hparams` (the reserved names above).

    Args:
        hparams: what the objective received.

    Returns:
        ``output_mult``, ``attn_mult``, ``embedding_mult``, ``depth_alpha``, ``parametrization``, u-µP's
        α's, and ``init_mult`` / ``lr_mult`` dicts by role, for those present; ``{}`` when none is.

    Raises:
        TypeError: ``depth_alpha`` is not a number.
    """
    kw: dict[str, Any] = {name: float(hparams[name]) for name in MULTIPLIER_NAMES if name in hparams}
    if "depth_alpha" in hparams:
        kw["depth_alpha"] = _number("depth_alpha", hparams["depth_alpha"])
    if "parametrization" in hparams:
        kw["parametrization"] = parametrization_name(hparams["parametrization"])
    for name, key in UMUP_NAMES.items():
        if name in hparams:
            if key in kw:
                raise ConfigError(f"{name} and {key} set the same multiplier; give one of them")
            kw[key] = _number(name, hparams[name])
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
