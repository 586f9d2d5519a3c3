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
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._core import attention as attn
from .._core.depth import block_containers, join_name, split_block
from .._core.devices import AUTO, DeviceLike, move, resolve_device
from .._core.naming import canonical_name
from .._core.observe import recording
from .._core.progress import Progress
from .._core.spec import find_spec
from ..errors import CoordCheckError
from ..optim import build_optimizer, hidden_matrices
from ..rules import DEFAULT_OPTIMIZER, OPTIMIZERS, optimizer_family
from .report import ATTN_SUFFIX, CoordCheckResult, Record

__all__ = ["DEFAULT_OPTIMIZER", "MODEL_OUTPUT", "LossFn", "OptimizerFactory", "check_widths", "coord_check"]

MODEL_OUTPUT = "(model output)"
LossFn = Callable[[Any, Any], torch.Tensor]


OptimizerFactory = Callable[[nn.Module, float], torch.optim.Optimizer]


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
            ``["loss"]`` if it has one, else cross-entropy for integer targets and mean
            squared error for float targets, on the output's logits (the output itself, its
            ``.logits``/``["logits"]``, or the first element of a tuple).
        max_growth: allowed growth of any recorded quantity per 16× width (1.5: slope of
            log(size) against log(width) at most log 1.5 / log 16 ≈ 0.146).
        progress: draw a progress bar on stderr.
        device: where the models train: "auto" (CUDA when this process sees a GPU, else the CPU),
            "cpu", "cuda", "cuda:N" or a `torch.device`. Each model `make_model` returns, and every
            tensor of `data` (tensors, tuples, lists and dicts of them), is moved there; the models
            are built where `make_model` builds them (under the seed, so the CPU's initial values
            are the same whatever the device). Every recorded statistic is a Python float.
    """
    if depths is not None:
        widths = [widths] if isinstance(widths, int) else list(widths)
        if len(set(widths)) != 1:
            raise CoordCheckError(
                f"a coordinate check across depth takes one width (widths={widths}); check width and depth in two runs"
            )
        axis, sizes, fixed_width = "depth", check_widths(depths, "depths"), int(widths[0])
    else:
        axis, sizes, fixed_width = "width", check_widths(widths), None
    data = _check_data(data)
    where = resolve_device(device, "device")
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
    out_dims: dict[str, dict[int, set]] = {}
    records: list[Record] = []
    parametrizations = set()
    diverged: list[tuple[int, int, int]] = []
    bar = Progress(len(sizes) * seeds, "coord-check", enabled=progress)
    for size in sizes:
        for seed in range(seeds):
            bar.update(f"{axis} {size}, seed {seed}")
            torch.manual_seed(seed)
            model = make_model(size) if axis == "width" else make_model(fixed_width, size)
            call = f"make_model({size})" if axis == "width" else f"make_model({fixed_width}, {size})"
            if not isinstance(model, nn.Module):
                raise TypeError(f"{call} returned {type(model).__name__}, not an nn.Module")
            model.to(where)
            is_mup = find_spec(model) is not None
            parametrizations.add("µP" if is_mup else "SP")
            if seed == 0:
                hidden = None
                if not is_mup and family is not None and OPTIMIZERS[family].partner is not None:
                    # a plain model has no roles: its hidden matrices are the 2-D parameters whose both dims
                    # change with width, seen against the same model at twice the width (shapes only: one
                    # look per size serves every seed)
                    hidden = hidden_matrices(
                        model, make_model(2 * size) if axis == "width" else make_model(2 * fixed_width, size)
                    )
            run_records, bad_step, probe = _run(
                model, data, optimizer, family, lr, weight_decay, eps, steps, loss_fn, is_mup, readouts, hidden
            )
            rename = _depth_names(model) if axis == "depth" else {}
            prob_modules |= {rename.get(m, m) for m in probe.prob_modules if rename.get(m, m) is not None}
            for label, d in probe.head_dims.items():
                head_dims.setdefault(label, {})[size] = d
            for label, d in probe.out_dims.items():
                out_dims.setdefault(label, {}).setdefault(size, set()).add(d)
            records += [
                Record(rename.get(m, m), q, t, size, seed, v)
                for (m, q, t), v in run_records.items()
                if rename.get(m, m) is not None
            ]
            if bad_step is not None:
                diverged.append((size, seed, bad_step))
            bar.advance()
    bar.close()
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
    )


def _growth_exponent(by_size: dict[int, float]) -> float:
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
):
    model.train()
    opt = _make_optimizer(model, optimizer, lr, weight_decay, eps, is_mup, hidden)
    probe = _Probe(model, readouts)
    out: dict[tuple[str, str, int], float] = {}
    measure_inputs = data[0][0]
    initial = probe.measure(measure_inputs)
    for name, h in initial.items():
        out[(name, "size", 0)] = _mean_abs(h)
    bad_step = None
    for t in range(1, steps + 1):
        inputs, targets = data[(t - 1) % len(data)]
        loss = _loss(model(*_args(inputs), **_kwargs(inputs)), targets, loss_fn)
        if not torch.isfinite(loss.detach()).all():
            bad_step = t
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        current = probe.measure(measure_inputs)
        for name, h in current.items():
            out[(name, "size", t)] = _mean_abs(h)
            h0 = initial.get(name)
            if h0 is not None and h0.shape == h.shape:
                out[(name, "change", t)] = _mean_abs(h - h0)
    probe.close()
    return out, bad_step, probe


def _make_optimizer(model, optimizer, lr, weight_decay, eps, is_mup, hidden=None) -> torch.optim.Optimizer:
    if callable(optimizer):
        opt = optimizer(model, lr)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"optimizer(model, lr) returned {type(opt).__name__}, not a torch.optim.Optimizer")
        return opt
    return build_optimizer(model, optimizer, lr, weight_decay=weight_decay, eps=eps, mup=is_mup, hidden=hidden)


def _args(inputs) -> tuple:
    if isinstance(inputs, dict):
        return ()
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def _kwargs(inputs) -> dict:
    return dict(inputs) if isinstance(inputs, dict) else {}


def _logits(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and "logits" in output:
        return output["logits"]
    if isinstance(getattr(output, "logits", None), torch.Tensor):
        return output.logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"cannot find logits in the model's output ({type(output).__name__}); pass loss_fn=")


def _loss(output, targets, loss_fn: LossFn | None) -> torch.Tensor:
    if loss_fn is not None:
        loss = loss_fn(output, targets)
    elif isinstance(getattr(output, "loss", None), torch.Tensor):
        loss = output.loss
    elif isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
        loss = output["loss"]
    else:
        logits = _logits(output)
        if targets is None:
            raise CoordCheckError("data has no targets and the model's output has no .loss; pass targets or loss_fn=")
        if not targets.is_floating_point():
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        else:
            loss = F.mse_loss(logits.float(), targets.float())
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError("the loss must be a scalar tensor")
    return loss.reshape(())


def _mean_abs(t: torch.Tensor) -> float:
    return float(t.abs().mean()) if t.numel() else 0.0


def _first_float(output) -> torch.Tensor | None:
    """The tensor of a module's output that the check follows."""
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    if isinstance(output, dict) or hasattr(output, "keys"):
        for key in ("logits", "last_hidden_state"):
            v = output.get(key) if hasattr(output, "get") else None
            if isinstance(v, torch.Tensor):
                return v if v.is_floating_point() else None
        values = list(output.values())
    elif isinstance(output, (tuple, list)):
        values = list(output)
    else:
        return None
    return next((v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()), None)


# --------------------------------------------------------------------------- measuring


class _Probe:
    """Forward hooks on every module and attention logits recorded (see `observe`), run on demand."""

    def __init__(self, model: nn.Module, readouts: dict[str, str] | None = None):
        self.model = model
        self.active = False
        self.captured: dict[str, torch.Tensor] = {}
        self.out_dims: dict[str, int] = {}
        self.head_dims: dict[str, int] = {}
        self.readouts = readouts or {}  # label → name of the readout's bias (left out of its output)
        self.prob_modules: set[str] = set()  # modules fed attention probabilities
        self.handles = []
        params = dict(model.named_parameters())
        self.biases = {label: params.get(bias) for label, bias in self.readouts.items()}
        for name, module in model.named_modules():
            label = name or MODEL_OUTPUT
            self.handles.append(module.register_forward_hook(self._leave(label), always_call=True))
            if isinstance(module, nn.MultiheadAttention):
                self.handles.append(module.register_forward_hook(self._mha(label), with_kwargs=True))

    def _leave(self, label: str):
        def hook(mod, args, output):
            if not self.active:
                return
            h = _first_float(output)
            if h is not None and label not in self.captured:
                bias = self.biases.get(label)
                if isinstance(bias, torch.Tensor) and bias.ndim == 1 and h.shape[-1:] == bias.shape:
                    h = h - bias  # a readout's bias does not scale with width: measure W·x alone
                self.captured[label] = h.detach().float().clone()
                if h.ndim:
                    self.out_dims[label] = int(h.shape[-1])

        return hook

    def _record_logits(self, label: str, q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> None:
        key = label + ATTN_SUFFIX
        if key in self.captured:
            return
        q, k = q.detach().float(), k.detach().float()
        if q.dim() >= 3 and k.dim() >= 3 and q.shape[-3] != k.shape[-3] and q.shape[-3] % k.shape[-3] == 0:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)  # grouped-query attention
        logits = (q @ k.transpose(-2, -1)) * scale
        if causal:
            n, s = logits.shape[-2], logits.shape[-1]
            keep = torch.ones(n, s, dtype=torch.bool, device=logits.device).tril(s - n)
            logits = logits[..., keep]
        self.captured[key] = logits
        self.head_dims[key] = int(q.shape[-1])

    def _on_attention(self, call, q, k, logits, causal) -> None:
        label = (call.module or MODEL_OUTPUT) + ATTN_SUFFIX
        if label in self.captured:
            return
        if q is not None and k is not None:
            self._record_logits(call.module or MODEL_OUTPUT, q, k, call.scale, causal)
        elif logits is not None:
            x = logits.detach().float()
            x = x[torch.isfinite(x) & (x.abs() < 1e30)]  # masked entries (−inf or dtype min) are not logits
            self.captured[label] = x
            self.head_dims[label] = call.head_dim

    def _mha(self, label: str):
        def hook(mod: nn.MultiheadAttention, args, kwargs, output):
            if not self.active or label + ATTN_SUFFIX in self.captured:
                return
            names = ("query", "key", "value")
            query, key = [args[i] if i < len(args) else kwargs[names[i]] for i in range(2)]
            (w_q, b_q), (w_k, b_k), _ = attn.mha_in_projections(mod)
            q, k = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k)
            if q.dim() == 2:
                q, k = q.unsqueeze(0), k.unsqueeze(0)
            elif not mod.batch_first:
                q, k = q.transpose(0, 1), k.transpose(0, 1)
            h, hd = mod.num_heads, mod.head_dim
            q = q.reshape(q.shape[0], q.shape[1], h, hd).transpose(1, 2)
            k = k.reshape(k.shape[0], k.shape[1], h, hd).transpose(1, 2)
            cfg = getattr(mod, "_mutransfer_attn", None)
            scale = attn.mup_logit_scale(cfg, hd)
            self._record_logits(label, q, k, scale, bool(kwargs.get("is_causal", False)))

        return hook

    def measure(self, inputs) -> dict[str, torch.Tensor]:
        """One forward pass on `inputs` without grad; buffers (BatchNorm statistics) restored."""
        buffers = {n: b.detach().clone() for n, b in self.model.named_buffers()}
        self.captured, self.active = {}, True
        try:
            with torch.no_grad(), recording(self.model, on_attention=self._on_attention) as recorder:
                self.model(*_args(inputs), **_kwargs(inputs))
            self.prob_modules |= {m or MODEL_OUTPUT for m in recorder.obs.prob_modules}
        finally:
            self.active = False
            with torch.no_grad():
                for n, b in self.model.named_buffers():
                    if n in buffers:
                        b.copy_(buffers[n])
        return self.captured

    def close(self) -> None:
        for h in self.handles:
            h.remove()


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
