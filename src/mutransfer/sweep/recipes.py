"""Built-in sweep objectives: `objective = "recipe:gpt"`, `"recipe:mlp"` or `"recipe:resmlp"`.

Each reads its settings from the hyperparameters ([fixed] or swept) and returns the mean
training loss over the last tenth of the steps (NaN if training diverged). The data order
depends only on the seed, so every width and depth sees the same batches. In a sweep over
`depths`, gpt and resmlp take their number of blocks from `scale.depth` and build the µP base
and delta models at `scale.base_depth`.

Devices: each builds its model on the CPU under the seed (so the initial values are the same on
every device) and moves it to `scale.device`; data is made on the CPU with the same generators
and each batch moved there; forward passes and the loss run under ``with scale.autocast():``
(bf16 autocast for ``scale.precision == "bf16"``), the parameters and optimizer state stay float32.
On the CPU in fp32 the losses are the same, bit for bit, as before devices existed.

Every tenth of the steps each calls `scale.report(step, loss)` with the mean training loss of the
last tenth of the steps so far (a single minibatch's loss is too noisy to prune on): in a sweep
with a pruner, a trial clearly worse than its study's finished ones stops there.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .. import optim as mt_optim
from .._core.devices import check_precision
from .._core.loading import load_callable
from .._core.parametrize import parametrize
from ..errors import ConfigError
from ..recipes.data import stdlib_text
from ..recipes.models import GPT, MLP, ResMLP
from ..rules import OPTIMIZERS
from .scale import Objective, Scale, mup_kwargs

__all__ = [
    "OPTIMIZER_HPS",
    "SWEEP_RECIPES",
    "TASKS",
    "Builder",
    "load_objective",
    "train_gpt",
    "train_mlp",
    "train_resmlp",
]


def _threads(hp: dict) -> None:
    if "threads" in hp:  # e.g. 1 per worker process when several share the machine's cores
        torch.set_num_threads(int(hp["threads"]))


Builder = Callable[[int, int | None], torch.nn.Module]  # (width, depth) -> plain model


def _depth(hp: dict, scale: Scale, key: str, default: int) -> tuple[int, int]:
    """(depth, µP base depth): the sweep's when it has depths (then hp must not set `key`), else hp[key]."""
    if scale.depth is None:
        depth = int(hp.get(key, default))
        return depth, depth
    if key in hp:
        raise ValueError(f"{key} is set by the sweep's depths; remove {key} from [fixed] or [space]")
    return scale.depth, scale.base_depth or scale.depth


# Hyperparameters each optimizer reads from a trial (besides lr, weight_decay), with their defaults.
OPTIMIZER_HPS: dict[str, dict[str, object]] = {
    "sgd": {"momentum": 0.9, "nesterov": False},
    "adam": {"beta1": 0.9, "beta2": 0.95},
    "adamw": {"beta1": 0.9, "beta2": 0.95},
    "lion": {"beta1": 0.9, "beta2": 0.99},
    "adafactor": {"beta2_decay": -0.8},
    "muon": {"momentum": 0.95, "nesterov": True, "adjust_lr_fn": None, "partner_lr": None},
    "soap": {"beta1": 0.95, "beta2": 0.95},
}


def _optimizer_kwargs(name: str, hp: dict) -> dict:
    if name not in OPTIMIZER_HPS:
        raise ValueError(
            f"optimizer '{name}' is not a sweep optimizer; the recipes train with one of "
            f"{', '.join(OPTIMIZER_HPS)} (hyperparameter 'optimizer')"
        )
    got = {k: hp.get(k, v) for k, v in OPTIMIZER_HPS[name].items()}
    if "beta1" in got:
        got["betas"] = (float(got.pop("beta1")), float(got.pop("beta2")))
    for k in ("momentum", "beta2_decay"):
        if k in got:
            got[k] = float(got[k])
    if "nesterov" in got:
        got["nesterov"] = bool(got["nesterov"])
    if got.get("partner_lr") is not None:
        got["partner_lr"] = float(got["partner_lr"])
    return got


def _optimizer(model, hp: dict, scale: Scale, build: Builder, base_depth: int | None = None) -> torch.optim.Optimizer:
    """The optimizer named by hp["optimizer"] (default "adamw", betas (0.9, 0.95)); its own
    hyperparameters from `OPTIMIZER_HPS`. Under µP the model is first parametrized against
    build(base width, base depth) and the delta build(2 × base width, base depth), with µP's
    hyperparameters from `hp`. A plain model trained by Muon finds its hidden matrices against
    build(2 × width) (`optim.hidden_matrices`)."""
    lr, wd = float(hp["lr"]), float(hp.get("weight_decay", 0.0))
    name = str(hp.get("optimizer", "adamw")).lower()
    kwargs = _optimizer_kwargs(name, hp)
    if scale.mup:
        if scale.base_width is None:
            raise ConfigError(
                "scale.base_width is None: a µP recipe builds its base model at the base width; "
                "pass Scale(width, base_width=...) (a sweep sets it from the config's base_width)"
            )
        parametrize(
            model,
            base=build(scale.base_width, base_depth),
            delta=build(2 * scale.base_width, base_depth),
            **mup_kwargs(hp),
        )
    hidden = None
    if not scale.mup and OPTIMIZERS[name].partner is not None:
        hidden = mt_optim.hidden_matrices(model, build(2 * scale.width, scale.depth))
    return mt_optim.build_optimizer(model, name, lr, weight_decay=wd, mup=scale.mup, hidden=hidden, **kwargs)


def _placed(model: torch.nn.Module, scale: Scale) -> torch.nn.Module:
    """`model` (built on the CPU) moved to `scale.device`, once `scale.precision` is known to run there."""
    check_precision(scale.precision, scale.device, "scale.precision")
    return model.to(scale.device)


# The gradient noise scale after training (`Scale.noise_scale`, measured only in the sweep's µP proxy-cell trials
# that beat the best so far): NOISE_BATCHES fresh batches of NOISE_BIG × the batch size, cut into chunks of one batch size.
NOISE_BATCHES, NOISE_BIG = 8, 8


def _train(model, opt, batches, steps: int, criterion, fresh, batch: int, scale: Scale) -> float:
    """Train for `steps` on `scale.device` (batches moved there, forward and loss under
    `scale.autocast()`); the mean loss of the last tenth. `scale.monitor` watches it (a no-op unless
    the sweep records this run). Reports to `scale` every tenth (the mean of the last tenth so far;
    not at the end: the returned loss is the final value). The loss is ``criterion(model(x), y)``;
    after training, `scale.noise_scale` gets `NOISE_BATCHES` batches ``fresh(i, n)`` of n =
    `NOISE_BIG` × `batch` examples the model did not train on (measured only where the sweep asks: `Scale.noise_scale`)."""
    warmup = window = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))  # keeps µP's ratios
    losses = []
    mon = scale.monitor(model, opt, steps=steps)
    try:
        for step in range(steps):
            x, y = (t.to(scale.device) for t in batches(step))
            with scale.autocast():
                loss = criterion(model(x), y)
            if not torch.isfinite(loss):
                return math.nan
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            mon.step(loss)
            losses.append(loss.item())
            done = step + 1
            if done % window == 0 and done < steps:
                tail = losses[-window:]
                scale.report(done, sum(tail) / len(tail))  # raises Pruned when the sweep's pruner says so
    finally:
        mon.close()

    def noise_batches():
        return [tuple(t.to(scale.device) for t in fresh(i, NOISE_BIG * batch)) for i in range(NOISE_BATCHES)]

    tail = losses[-window:]
    final = sum(tail) / len(tail)
    scale.noise_scale(model, criterion, noise_batches, batch, NOISE_BIG * batch, loss=final)
    return final


def train_gpt(hp: dict, scale: Scale) -> float:
    """Byte-level GPT (recipes.GPT, tied embeddings) on text from the standard library's docs.

    Settings: lr (required), optimizer="adamw" (and its own settings, `OPTIMIZER_HPS`), steps=100,
    batch_size=16, seq_len=64, n_layer=2 (the sweep's depth when it has depths), n_head=4,
    tied=true, init_std=0.02 (or "default" for PyTorch's init), weight_decay=0, threads (torch
    threads), plus µP's multipliers and depth_alpha (see `mutransfer.sweep.scale`).
    """
    steps, batch, seq = int(hp.get("steps", 100)), int(hp.get("batch_size", 16)), int(hp.get("seq_len", 64))
    n_layer, base_layers = _depth(hp, scale, "n_layer", 2)
    n_head = int(hp.get("n_head", 4))
    tied = bool(hp.get("tied", True))
    init_std = hp.get("init_std", 0.02)
    init_std = None if init_std in (None, "default") else float(init_std)

    def build(width: int, layers: int | None = None) -> GPT:
        return GPT(width, n_layer=layers or n_layer, n_head=n_head, ctx=seq, tied=tied, init_std=init_std)

    _threads(hp)
    torch.manual_seed(scale.seed)
    model = _placed(build(scale.width), scale)
    opt = _optimizer(model, hp, scale, build, base_layers)
    text = torch.frombuffer(bytearray(stdlib_text()), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(1_000 + scale.seed)
    starts = torch.randint(0, len(text) - seq - 1, (steps, batch), generator=g)
    offsets = torch.arange(seq)

    def windows(at: torch.Tensor):  # (inputs, next bytes) of the sequences starting at `at`
        idx = at[:, None] + offsets
        return text[idx], text[idx + 1]

    def batches(step: int):
        return windows(starts[step])

    def criterion(logits, y):
        logits = logits.float()  # the loss in float32 (a no-op in fp32)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def fresh(i: int, n: int):  # text the model did not train on (another generator), for the noise scale
        return windows(
            torch.randint(0, len(text) - seq - 1, (n,), generator=torch.Generator().manual_seed(2_000 + 97 * i))
        )

    return _train(model, opt, batches, steps, criterion, fresh, batch, scale)


def train_mlp(hp: dict, scale: Scale) -> float:
    """3-layer ReLU MLP classifying Gaussian inputs labelled by a fixed random teacher network.

    Settings: lr (required), optimizer="adamw" (and its own settings, `OPTIMIZER_HPS`), steps=100,
    batch_size=64, d_in=32, n_classes=10, weight_decay=0.
    """
    steps, batch = int(hp.get("steps", 100)), int(hp.get("batch_size", 64))
    d_in, n_classes = int(hp.get("d_in", 32)), int(hp.get("n_classes", 10))

    def build(width: int, depth: int | None = None) -> MLP:
        return MLP(width, d_in=d_in, d_out=n_classes, depth=3)

    _threads(hp)
    g = torch.Generator().manual_seed(7)
    teacher = torch.randn(d_in, 64, generator=g), torch.randn(64, n_classes, generator=g)
    g = torch.Generator().manual_seed(1_000 + scale.seed)

    def label(x):
        return (torch.relu(x @ teacher[0]) @ teacher[1]).argmax(-1)

    xs = torch.randn(steps, batch, d_in, generator=g)
    ys = label(xs)
    torch.manual_seed(scale.seed)
    model = _placed(build(scale.width), scale)
    opt = _optimizer(model, hp, scale, build)

    def criterion(out, y):
        return F.cross_entropy(out.float(), y)

    fresh = _fresh_gaussian(d_in, label)
    return _train(model, opt, lambda s: (xs[s], ys[s]), steps, criterion, fresh, batch, scale)


def _fresh_gaussian(d_in: int, label):
    """`fresh(i, n)` for `_train`: n Gaussian inputs the model did not train on (their own generator) and their labels."""

    def fresh(i: int, n: int):
        x = torch.randn(n, d_in, generator=torch.Generator().manual_seed(2_000 + 97 * i))
        return x, label(x)

    return fresh


TASKS = ("classify", "regress")


def train_resmlp(hp: dict, scale: Scale) -> float:
    """Residual MLP (recipes.ResMLP: pre-LN blocks) on Gaussian inputs and a fixed random teacher
    network: classification of the teacher's argmax (cross-entropy) or regression onto its
    outputs, normalized to unit variance (mean squared error).

    Settings: lr (required), optimizer="adamw" (and its own settings, `OPTIMIZER_HPS`), steps=100,
    batch_size=64, d_in=32, d_out=10, task="classify" or
    "regress", depth=2 (the sweep's depth when it has depths), weight_decay=0, threads, plus
    µP's multipliers and depth_alpha (see `mutransfer.sweep.scale`).
    """
    steps, batch = int(hp.get("steps", 100)), int(hp.get("batch_size", 64))
    d_in, d_out = int(hp.get("d_in", 32)), int(hp.get("d_out", 10))
    task = hp.get("task", "classify")
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    depth, base_depth = _depth(hp, scale, "depth", 2)

    def build(width: int, blocks: int | None = None) -> ResMLP:
        return ResMLP(width, depth=blocks or depth, d_in=d_in, d_out=d_out)

    _threads(hp)
    g = torch.Generator().manual_seed(7)
    teacher = torch.randn(d_in, 64, generator=g), torch.randn(64, d_out, generator=g)
    g = torch.Generator().manual_seed(1_000 + scale.seed)

    def label(x):
        out = torch.relu(x @ teacher[0]) @ teacher[1] / math.sqrt(32 * d_in)  # unit variance
        return out.argmax(-1) if task == "classify" else out

    xs = torch.randn(steps, batch, d_in, generator=g)
    ys = label(xs)
    loss_fn = F.cross_entropy if task == "classify" else F.mse_loss
    torch.manual_seed(scale.seed)
    model = _placed(build(scale.width), scale)
    opt = _optimizer(model, hp, scale, build, base_depth)

    def criterion(out, y):
        return loss_fn(out.float(), y)

    fresh = _fresh_gaussian(d_in, label)
    return _train(model, opt, lambda s: (xs[s], ys[s]), steps, criterion, fresh, batch, scale)


SWEEP_RECIPES = {"gpt": train_gpt, "mlp": train_mlp, "resmlp": train_resmlp}


def load_objective(spec: str, base_dir: str | os.PathLike | None = None) -> Objective:
    """The objective a config names.

    Args:
        spec: 'recipe:NAME' for a built-in, else 'module:function' or 'path/to/file.py:function'.
        base_dir: where a relative file path is taken from and a dotted module imported from (a
            sweep: its TOML file's directory); default the current directory.

    Returns:
        The function `train(hparams, scale) -> float`.

    Raises:
        ValueError: naming the file, for anything wrong — an exception raised by the module's
            import too.
    """
    kind, _, name = spec.partition(":")
    if kind == "recipe":
        if name not in SWEEP_RECIPES:
            raise ValueError(f"objective: unknown recipe '{name}'; built-in: {', '.join(SWEEP_RECIPES)}")
        return SWEEP_RECIPES[name]
    return load_callable(spec, "objective", base_dir)
