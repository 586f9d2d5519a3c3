"""The coordinate check (TP5 appendix D.1): train a few steps at several widths and measure.

For every module of the model (its output, through forward hooks) and every attention module
the library can see, it records at each step the mean absolute coordinate of the activation
(``size``) and of its change since initialization (``change``), on a fixed measurement batch
(the first batch of ``data``). In µP both stay Θ(1) as width grows; a layer whose numbers grow
with width is mis-parametrized. `CoordCheckResult` turns that into a verdict.

Attention logits are recorded for modules that call ``F.scaled_dot_product_attention``
(looked up at call time, as ``F.scaled_dot_product_attention`` or
``torch.nn.functional.scaled_dot_product_attention``; Hugging Face's SDPA path does), for
``nn.MultiheadAttention`` (recomputed from its inputs), and for hand-written attention that
uses ``mt.attn_logits``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from .._core.depth import block_containers, join_name, split_block
from .._core.devices import AUTO, DeviceLike, check_precision, move, resolve_device
from .._core.fp8 import autocast
from .._core.naming import canonical_name
from .._core.observe import probing_with
from .._core.progress import Progress
from .._core.spec import find_spec
from ..errors import CoordCheckError, MuPWarning
from ..optim import build_optimizer, hidden_matrices
from ..rules import DEFAULT_OPTIMIZER, OPTIMIZERS, optimizer_family
from .measure import MODEL_OUTPUT, ActivationMeter, mean_abs, model_args, model_kwargs
from .result import ATTN_SUFFIX, CoordCheckResult, Record

__all__ = ["DEFAULT_OPTIMIZER", "MODEL_OUTPUT", "LossFn", "OptimizerFactory", "check_widths", "coord_check"]

LossFn = Callable[[Any, Any], torch.Tensor]


OptimizerFactory = Callable[[nn.Module, float], torch.optim.Optimizer]
SEED_STRIDE = 1_000_003  # seed k of the check turns a factory's torch.manual_seed(s) into s + k·SEED_STRIDE


def coord_check(
    make_model: Callable[..., nn.Module],
    widths: int | Sequence[int],
    data: Sequence[tuple[Any, Any]],
    optimizer: str | OptimizerFactory = DEFAULT_OPTIMIZER,
    lr: float = 1e-2,
    steps: int = 4,
    seeds: int = 3,
    loss_fn: LossFn | None = None,
    *,
    depths: Sequence[int] | None = None,
    max_growth: float = 1.5,
    weight_decay: float = 0.0,
    eps: float | None = None,
    progress: bool = True,
    device: DeviceLike = AUTO,
    precision: str = "fp32",
) -> CoordCheckResult:
    """Train `make_model(width)` for `steps` steps at each width and seed; return the verdict.

    Across depth: give `depths` (at least two) and one width; `make_model(width, depth)` is
    called and the same verdict is taken along depth (growth per 16× depth). The last block of
    every block container is named ``<container>.last`` (its output is the residual stream at
    the end of the blocks); blocks between the first and the last are not compared.

    Args:
        make_model: width → a ready model: parametrized by the user (µP; its optimizer groups
            come from `param_groups`) or plain (standard parametrization; one lr for all).
        widths: at least two widths; 16× between the smallest and largest is typical.
        data: a list of ``(inputs, targets)`` batches; step t trains on batch t mod len(data),
            measurements use the first. Inputs may be a tensor, a tuple (positional
            arguments) or a dict (keyword arguments).
        optimizer: a name in `rules.OPTIMIZERS` ("sgd", "adam", "adamw", "lion", "adafactor", "muon",
            "soap"; groups from `param_groups` for a µP model; for a plain model under Muon, its hidden
            matrices are found by comparing with make_model(2 × width)), or your own
            ``optimizer(model, lr) -> torch.optim.Optimizer`` to check exactly the optimizer setup you
            train with; `lr` is the base learning rate.
        eps: Adam's ε at base width (torch's 1e-8 when None); µP scales it per group.
        loss_fn: ``loss_fn(output, targets)``. By default: the output's ``.loss`` or
            ``["loss"]`` if it has one, or the first element of a ``(loss, logits, ...)`` tuple
            (a scalar followed by tensors), else cross-entropy for integer targets and mean
            squared error for float targets, on the output's logits (the output itself, its
            ``.logits``/``["logits"]``, or the first tensor with a dim of a tuple). The
            ``(model output)`` row follows those logits, never a loss scalar.
        max_growth: allowed growth of any recorded quantity per 16× width (1.5: slope of
            log(size) against log(width) at most log 1.5 / log 16 ≈ 0.146).
        progress: draw a progress bar on stderr.
        device: where the models train: "auto" (CUDA when this process sees a GPU, else the CPU),
            "cpu", "cuda", "cuda:N" or a `torch.device`. Each model `make_model` returns, and every
            tensor of `data` (tensors, tuples, lists and dicts of them), is moved there; the models
            are built where `make_model` builds them (under the seed, so the CPU's initial values
            are the same whatever the device). Every recorded statistic is a Python float.
        precision: what the training steps' forward passes (and loss) run in: "fp32" (default),
            "bf16" (autocast) or "fp8" (`mutransfer.precision.fp8_simulation`: E4M3 matmul operands,
            E5M2 gradients, simulated on any device). The measurements are full-precision forwards
            of the model so trained, and `make_model` (its parametrize) never runs under the precision.
    """
    if depths is not None:
        widths = [widths] if isinstance(widths, int) else list(widths)
        if len(set(widths)) != 1:
            raise CoordCheckError(
                f"a coordinate check across depth takes one width (widths={widths}); check width and depth in two runs"
            )
        axis, sizes, fixed_width = "depth", check_widths(depths, "depths"), int(widths[0])
    else:
        axis, sizes, fixed_width = "width", check_widths(cast(Iterable[int], widths)), None
    data = _check_data(data)
    where = resolve_device(device, "device")
    check_precision(precision, where, "precision")
    data = [move(batch, where) for batch in data]
    if not callable(make_model):
        raise TypeError(f"make_model must be a function of width returning a model, got {type(make_model).__name__}")
    family = None if callable(optimizer) else optimizer_family(optimizer)
    if not isinstance(lr, (int, float)) or not lr > 0:
        raise CoordCheckError(f"lr must be a positive number, got {lr!r}")
    for name, v in (("steps", steps), ("seeds", seeds)):
        if not isinstance(v, int) or v < 1:
            raise CoordCheckError(f"{name} must be a positive integer, got {v!r}")
    if not max_growth > 1.0:
        raise CoordCheckError(f"max_growth must be > 1 (allowed growth per 16× width), got {max_growth!r}")

    expected, readouts = _predictions(make_model, sizes, data[0][0], where) if axis == "width" else ({}, {})
    head_dims: dict[str, dict[int, int]] = {}
    prob_modules: set[str] = set()
    slow_embeddings: set[str] = set()
    out_dims: dict[str, dict[int, set]] = {}
    records: list[Record] = []
    parametrizations = set()
    diverged: list[tuple[int, int, int]] = []
    bar = Progress(len(sizes) * seeds, "coord-check", enabled=progress)

    def build(size: int, times: int = 1) -> Any:
        """The model at `size` (width, or depth at the fixed width), the width × `times`."""
        with probing_with(data[0][0]):  # a parametrize inside make_model probes with the batch it will train on
            return make_model(times * size) if fixed_width is None else make_model(times * fixed_width, size)

    self_seeding: set[int] = set()
    duplicates: list[tuple[int, int]] = []
    for size in sizes:
        fingerprints: dict[tuple[float, ...], int] = {}
        for seed in range(seeds):
            bar.update(f"{axis} {size}, seed {seed}")
            torch.manual_seed(seed)
            with _reseeded(seed) as calls:
                model = build(size)
            if calls:
                self_seeding.add(seed)
            call = f"make_model({size})" if axis == "width" else f"make_model({fixed_width}, {size})"
            if not isinstance(model, nn.Module):
                raise TypeError(f"{call} returned {type(model).__name__}, not an nn.Module")
            fingerprint = _fingerprint(model)
            if fingerprint in fingerprints:
                duplicates.append((size, seed))  # the same model again: not an independent draw
                bar.advance()
                continue
            fingerprints[fingerprint] = seed
            model.to(where)
            spec = find_spec(model)
            is_mup = spec is not None
            umup = getattr(spec, "umup", None) if spec is not None else None
            parametrizations.add(("u-µP" if umup is not None else "µP") if is_mup else "SP")
            # u-µP's embedding lr rule (Adam lr × fan_out^-½): their change shrinks by design
            if spec is not None and umup is not None:
                slow_embeddings.update(
                    m for n, row in umup.rows.items() if row == "embedding" for m, _ in spec.params[n].usages
                )
            if seed == 0:
                hidden = None
                if not is_mup and family is not None and OPTIMIZERS[family].partner is not None:
                    # a plain model has no roles: its hidden matrices are the 2-D parameters whose both dims
                    # change with width, seen against the same model at twice the width (shapes only: one
                    # look per size serves every seed)
                    hidden = hidden_matrices(model, build(size, times=2))
            run_records, bad_step, meter = _run(
                model,
                data,
                optimizer,
                family,
                lr,
                weight_decay,
                eps,
                steps,
                loss_fn,
                is_mup,
                readouts,
                hidden,
                precision,
            )
            rename = _depth_names(model) if axis == "depth" else {}
            prob_modules |= {r for m in meter.prob_modules if (r := rename.get(m, m)) is not None}
            for label, d in meter.head_dims.items():
                head_dims.setdefault(label, {})[size] = d
            for label, d in meter.out_dims.items():
                out_dims.setdefault(label, {}).setdefault(size, set()).add(d)
            records += [
                Record(r, q, t, size, seed, v)
                for (m, q, t), v in run_records.items()
                if (r := rename.get(m, m)) is not None
            ]
            if bad_step is not None:
                diverged.append((size, seed, bad_step))
            bar.advance()
    bar.close()
    notes = []
    if slow_embeddings:
        notes.append(
            "u-µP: the changes of the embeddings ("
            + ", ".join(sorted(slow_embeddings))
            + ") shrink like width^-½ by u-µP's embedding lr rule (Adam lr × fan_out^-½), so they are not "
            "held to Θ(1) (every other curve is: u-µP is µP elsewhere)"
        )
    if self_seeding and not duplicates:
        notes.append(
            "make_model seeds itself (torch.manual_seed inside it): the check shifted that seed by "
            f"seed × {SEED_STRIDE} for each of its seeds, so that they are independent models"
        )
    if duplicates:
        first = duplicates[0]
        warnings.warn(
            f"coord_check: make_model gives identical initial parameters for different seeds ({axis} {first[0]}: "
            f"seed {first[1]} is the same model as an earlier seed; {len(duplicates)} such runs), so those seeds "
            "are not independent models and are counted once: the verdict rests on fewer models. Let make_model "
            "draw its initial values from torch's global generator (no fixed torch.Generator or seed inside it)",
            MuPWarning,
            stacklevel=2,
        )
        notes.append(
            f"{len(duplicates)} of {len(sizes) * seeds} runs were the same model as an earlier seed and are counted once"
        )
    if axis == "width":
        # a readout is only predicted to shrink where its output is finite (the same size at every width)
        expected = {
            m: e for m, e in expected.items() if len({d for ds in out_dims.get(m, {}).values() for d in ds}) == 1
        }
        for label, by_size in head_dims.items():
            gamma = _growth_exponent(by_size)
            if gamma:
                expected[label] = -0.5 * gamma
    name = optimizer if isinstance(optimizer, str) else getattr(optimizer, "__name__", "custom optimizer")
    return CoordCheckResult(
        records,
        widths=list(sizes),
        steps=steps,
        seeds=seeds,
        optimizer=name,
        lr=float(lr),
        max_growth=max_growth,
        parametrization="/".join(sorted(parametrizations)),
        diverged=diverged,
        axis=axis,
        fixed_width=fixed_width,
        expected=expected,
        attention_probs=sorted(prob_modules),
        notes=notes,
        slow_changes=sorted(slow_embeddings),
    )


@contextmanager
def _reseeded(seed: int) -> Iterator[list[int]]:
    """While `make_model` runs for seed `seed` of the check: a ``torch.manual_seed(s)`` inside it seeds
    ``s + seed · SEED_STRIDE`` instead (seed 0 unchanged), so a factory that seeds itself still gives each
    seed its own model. Yields the list of the seeds it was called with."""
    calls: list[int] = []
    original, original_random = torch.manual_seed, torch.random.manual_seed

    def shifted(s):
        calls.append(int(s))
        return original((int(s) + seed * SEED_STRIDE) % (2**63))

    torch.manual_seed = torch.random.manual_seed = shifted
    try:
        yield calls
    finally:
        torch.manual_seed, torch.random.manual_seed = original, original_random


def _fingerprint(model: nn.Module) -> tuple[float, ...]:
    """Sums of every parameter and buffer: equal for two seeds only when they built the same model."""
    with torch.no_grad():
        return tuple(
            float(t.detach().double().sum()) + float(t.detach().double().abs().sum())
            for t in list(model.parameters()) + list(model.buffers())
            if t.is_floating_point()
        )


def _growth_exponent(by_size: Mapping[int, float]) -> float:
    """Slope of log(value) against log(size) through the smallest and largest size."""
    sizes = sorted(by_size)
    if len(sizes) < 2 or by_size[sizes[0]] <= 0:
        return 0.0
    return math.log(by_size[sizes[-1]] / by_size[sizes[0]]) / math.log(sizes[-1] / sizes[0])


def _predictions(make_model, sizes: list[int], inputs, device: torch.device) -> tuple[dict[str, float], dict[str, str]]:
    """µP's predicted slope of each readout's output at init, and the readouts' biases.

    The two smallest models are compared as base and delta and classified from a probe forward
    on the measurement inputs (the same rules as `parametrize`, whatever the parametrization of
    the models): a module holding an output-role weight (or using a tied one as readout) is a
    readout, whose output at init µP predicts to shrink like fan_in^-½.
    """
    import warnings

    from .._core.observe import observe
    from .._core.roles import classify
    from .._core.shapes import WidthShapes

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            with probing_with(inputs):
                small, wider = make_model(sizes[0]), make_model(sizes[1])
            shapes = WidthShapes.from_models(
                {n: p.shape for n, p in small.named_parameters()}, {n: p.shape for n, p in wider.named_parameters()}
            )
            infos = classify(wider, shapes, observation=observe(wider.to(device), inputs))
    except Exception:  # the prediction is a refinement; without it every curve is held to Θ(1)
        return {}, {}
    expected: dict[str, float] = {}
    readouts: dict[str, str] = {}
    step = math.log(sizes[1] / sizes[0])
    for _name, info in infos.items():
        if info.role == "output":
            modules, m_in = [m for m, _ in info.usages], info.m_in
        elif info.tied_readouts:  # a tied readout's fan_in is the embedding's fan_out
            modules, m_in = info.tied_readouts, info.m_out
        else:
            continue
        gamma = math.log(m_in) / step if m_in > 0 else 0.0
        for m in modules:
            label = m or MODEL_OUTPUT
            expected[label] = -0.5 * gamma
            readouts[label] = f"{m}.bias" if m else "bias"
    return expected, readouts


def _depth_names(model: nn.Module) -> dict[str, str | None]:
    """For a check across depth: module name → its name in the records, or None to leave it out.

    The first block keeps its name, the last block of each container is called
    '<container>.last' (its output is the residual stream after all blocks), and the blocks in
    between are left out: block i sits at a different relative depth in each model.
    """
    shapes = {canonical_name(n): tuple(p.shape) for n, p in model.named_parameters()}
    containers = block_containers(shapes)
    out: dict[str, str | None] = {}
    for name, _ in model.named_modules():
        for prefix, n in containers.items():
            hit = split_block(name, prefix)
            if hit is None or (hit[0] == 0 and n > 1):
                continue
            index, rest = hit
            new = None if index != n - 1 else join_name(prefix, "last", rest)
            out[name] = new
            out[name + ATTN_SUFFIX] = None if new is None else new + ATTN_SUFFIX
    return out


# --------------------------------------------------------------------------- one run


def _run(
    model: nn.Module,
    data,
    optimizer,
    family: str | None,
    lr: float,
    weight_decay: float,
    eps: float | None,
    steps: int,
    loss_fn: LossFn | None,
    is_mup: bool,
    readouts: dict[str, str],
    hidden: set | None = None,
    precision: str = "fp32",
):
    model.train()
    opt = _make_optimizer(model, optimizer, lr, weight_decay, eps, is_mup, hidden)
    meter = ActivationMeter(model, readouts)
    out: dict[tuple[str, str, int], float] = {}
    measure_inputs = data[0][0]
    initial = meter.measure(measure_inputs)
    for name, h in initial.items():
        out[(name, "size", 0)] = mean_abs(h)
    bad_step = None
    for t in range(1, steps + 1):
        inputs, targets = data[(t - 1) % len(data)]
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        with autocast(device, precision):
            loss = _loss(model(*model_args(inputs), **model_kwargs(inputs)), targets, loss_fn)
        if not torch.isfinite(loss.detach()).all():
            bad_step = t
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        current = meter.measure(measure_inputs)
        for name, h in current.items():
            out[(name, "size", t)] = mean_abs(h)
            h0 = initial.get(name)
            if h0 is not None and h0.shape == h.shape:
                out[(name, "change", t)] = mean_abs(h - h0)
    meter.close()
    return out, bad_step, meter


def _make_optimizer(model, optimizer, lr, weight_decay, eps, is_mup, hidden=None) -> torch.optim.Optimizer:
    if callable(optimizer):
        opt = optimizer(model, lr)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"optimizer(model, lr) returned {type(opt).__name__}, not a torch.optim.Optimizer")
        return opt
    return build_optimizer(model, optimizer, lr, weight_decay=weight_decay, eps=eps, mup=is_mup, hidden=hidden)


def _logits(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and "logits" in output:
        return output["logits"]
    if isinstance(getattr(output, "logits", None), torch.Tensor):
        return output.logits
    if isinstance(output, (tuple, list)):
        tensors = [v for v in output if isinstance(v, torch.Tensor)]
        found = next((v for v in tensors if v.ndim), tensors[0] if tensors else None)
        if found is not None:
            return found  # the first tensor with a dim: in (loss, logits), the logits
    raise TypeError(f"cannot find logits in the model's output ({type(output).__name__}); pass loss_fn=")


def _loss_first(output) -> bool:
    """A tuple whose first element is a floating scalar followed by a tensor with dims: (loss, logits, ...)."""
    return (
        isinstance(output, (tuple, list))
        and len(output) > 1
        and isinstance(output[0], torch.Tensor)
        and output[0].is_floating_point()
        and output[0].ndim == 0
        and any(isinstance(v, torch.Tensor) and v.ndim for v in output[1:])
    )


def _loss(output, targets, loss_fn: LossFn | None) -> torch.Tensor:
    if loss_fn is not None:
        loss = loss_fn(output, targets)
    elif isinstance(getattr(output, "loss", None), torch.Tensor):
        loss = output.loss
    elif isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
        loss = output["loss"]
    elif _loss_first(output):
        loss = output[0]  # (loss, logits, ...): Hugging Face's return_dict=False order, CLIP's return_loss
    else:
        logits = _logits(output)
        if targets is None:
            raise CoordCheckError("data has no targets and the model's output has no .loss; pass targets or loss_fn=")
        if not targets.is_floating_point():
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        else:
            loss = F.mse_loss(logits.float(), targets.float())
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(
            "coord_check: the loss must be a scalar tensor; make loss_fn(output, targets) (or the model's "
            ".loss) reduce over the batch, e.g. with .mean()"
        )
    return loss.reshape(())


# --------------------------------------------------------------------------- argument checks


def check_widths(widths: Iterable[int], what: str = "widths") -> list[int]:
    """Sorted distinct widths (or depths), at least two, all positive; the one check of a width list."""
    try:
        widths = [int(w) for w in widths]
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a list of integers, got {widths!r}") from None
    if len(set(widths)) < 2 or any(w <= 0 for w in widths):
        raise CoordCheckError(f"{what} needs at least two different positive values, got {widths}")
    return sorted(set(widths))


def _check_data(data) -> list:
    if isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        data = [data]  # one (inputs, targets) batch
    try:
        data = list(data)
    except TypeError:
        raise TypeError("data must be a list of (inputs, targets) batches") from None
    if not data:
        raise CoordCheckError("data is empty; give at least one (inputs, targets) batch")
    for i, batch in enumerate(data):
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise TypeError(f"data[{i}] must be an (inputs, targets) pair, got {type(batch).__name__}")
    return data
