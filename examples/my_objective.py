"""Your own sweep objective: a two-hidden-layer MLP regressing a fixed random teacher, in plain
PyTorch plus µP's two calls. `examples/my_sweep.toml` sweeps its learning rate:

    mutransfer sweep examples/my_sweep.toml --run runs/my-sweep --workers 2
    mutransfer report runs/my-sweep

A sweep calls ``train(hparams, scale)`` once per trial and seed:

- ``hparams``: the config's [fixed] table and this trial's swept values (here ``lr``, and
  ``steps`` and ``batch_size`` from [fixed]);
- ``scale``: where the trial runs — ``scale.width`` (build the model this wide),
  ``scale.base_width`` (µP's base width), ``scale.parametrization`` ("mup" or "sp"; ``scale.mup``
  is True for µP), ``scale.seed``, ``scale.device`` and ``scale.precision``.

It returns the training loss (NaN or inf marks the trial diverged). Calling ``scale.report(step,
loss)`` during training lets a sweep with a ``pruner`` stop a hopeless trial early; without one
it does nothing.
"""

from __future__ import annotations

import math

import torch
from torch import nn

import mutransfer as mt
from mutransfer.sweep import Scale, mup_kwargs

D_IN, D_OUT = 16, 4


def build(width: int) -> nn.Module:
    """The model at `width`: the only place the width appears."""
    return nn.Sequential(nn.Linear(D_IN, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, D_OUT))


def train(hparams: dict, scale: Scale) -> float:
    """Train at `scale` with `hparams`; the mean squared error of the last tenth of the steps."""
    steps, batch = int(hparams.get("steps", 60)), int(hparams.get("batch_size", 32))
    g = torch.Generator().manual_seed(1000 + scale.seed)  # the same data at every width
    teacher = torch.randn(D_IN, D_OUT, generator=torch.Generator().manual_seed(0)) / math.sqrt(D_IN)
    xs = torch.randn(steps, batch, D_IN, generator=g)
    ys = torch.tanh(xs @ teacher)

    torch.manual_seed(scale.seed)
    model = build(scale.width)
    if scale.mup:  # µP: rescale the init against the base width (µP's multipliers from hparams)
        mt.parametrize(model, base=build(scale.base_width), delta=build(2 * scale.base_width), **mup_kwargs(hparams))
        groups = mt.param_groups(model, lr=hparams["lr"], optimizer="adam")
    else:  # SP: the plain model and optimizer
        groups = [{"params": list(model.parameters()), "lr": hparams["lr"]}]
    model.to(scale.device)
    opt = torch.optim.Adam(groups)

    window, losses = max(1, steps // 10), []
    for step in range(steps):
        x, y = xs[step].to(scale.device), ys[step].to(scale.device)
        with scale.autocast():
            loss = nn.functional.mse_loss(model(x).float(), y)
        if not torch.isfinite(loss):
            return math.nan  # diverged
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if (step + 1) % window == 0:
            scale.report(step + 1, sum(losses[-window:]) / window)  # raises Pruned when a pruner says so
    return sum(losses[-window:]) / window
