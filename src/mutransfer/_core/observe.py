"""Input probing: build example inputs, run one probe forward under the recorder, and keep what it saw.

`observe` runs a model once on given inputs (eval mode, no grad, buffers restored) under
`recorder.recording`; `observe_model` first builds candidate inputs (`example_inputs`) when the
caller has none. `call_model` and `to_device` are the two ways every probe calls a model.
What is recorded and how: `recorder` and `observation`.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from .devices import map_tensors, module_device, move
from .observation import AttentionCall, Observation, Use
from .recorder import recording

__all__ = [
    "AttentionCall",
    "Observation",
    "Use",
    "call_model",
    "effective_logit_scales",
    "example_inputs",
    "observe",
    "observe_model",
    "probe_mode",
    "probing_with",
    "recording",
    "to_device",
]


@contextlib.contextmanager
def probe_mode(model: nn.Module) -> Iterator[None]:
    """A probe forward's mode: no grad, every module in eval (dropout off), each module's training flag put
    back after, whatever happens inside."""
    was_training = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, t in was_training.items():
            m.training = t


def observe(model: nn.Module, inputs: Any, on_attention: Callable | None = None) -> Observation:
    """Run `model` once on `inputs` (a tensor, a tuple of positional args or a dict of kwargs) and
    record parameter usage and attention calls. No grad, eval mode (restored after), buffers restored."""
    buffers = {n: b.detach().clone() for n, b in model.named_buffers() if not b.is_meta}
    obs = None
    try:
        with probe_mode(model), recording(model, on_attention) as recorder:
            obs = recorder.obs
            call_model(model, inputs)
    except Exception as e:  # the probe is best effort; the caller decides what a failure means
        first = str(e).splitlines()[0] if str(e) else ""
        obs = obs or Observation()
        obs.error = f"{type(e).__name__}: {first[:300]}"
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in buffers:
                    b.copy_(buffers[n])
    obs.inputs = inputs
    return obs


def call_model(model: nn.Module, inputs: Any) -> Any:
    """Call `model` on `inputs`: a dict as keyword arguments, a tuple/list as positional ones, else one argument.

    Args:
        model: the model.
        inputs: a tensor, a tuple/list of positional arguments or a dict of keyword arguments.

    Returns:
        The model's output.
    """
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


# --------------------------------------------------------------------------- example inputs


def example_inputs(model: nn.Module, device: torch.device | None = None) -> list[Any]:
    """Candidate inputs for a probe forward, best first (each tried until one runs).

    Hugging Face models: built from ``main_input_name`` and the config (token ids, or images
    of the configured size and channels; encoder-decoders get decoder ids too). timm models: their
    ``pretrained_cfg['input_size']``. Anything else: from the layers that take the input (an
    embedding → token ids; a Linear → features; a Conv → images of a size its stride divides: a
    patch Conv (stride = kernel) gets the grid its positional table implies). A forward with several
    required arguments gets one input per argument (by name — ids, pixels/images — or each kind in turn).
    """
    params = list(model.parameters())
    device = module_device(model) if device is None else device
    dtype = next((p.dtype for p in params if p.is_floating_point()), torch.float32)
    out: list[Any] = []
    config = getattr(model, "config", None)
    main = getattr(model, "main_input_name", None)
    if config is not None and main is not None:

        def get(k, d=None):
            return getattr(config, k, d)

        text = getattr(config, "get_text_config", lambda **kw: config)()
        if main == "input_ids":
            vocab = getattr(text, "vocab_size", None) or 32
            ids = torch.randint(0, min(int(vocab), 64), (1, 8), device=device)
            cand = {"input_ids": ids}
            if get("is_encoder_decoder", False):
                cand["decoder_input_ids"] = ids.clone()
            out.append(cand)
        elif main == "pixel_values":
            vision = get("vision_config", None) or config
            size = getattr(vision, "image_size", None)
            size = size if isinstance(size, int) else (size[0] if isinstance(size, (list, tuple)) else None)
            channels = int(getattr(vision, "num_channels", None) or 3)
            sizes = [size] if size else _image_sizes(model)
            out += [{"pixel_values": torch.randn(1, channels, s, s, device=device, dtype=dtype)} for s in sizes[:2]]
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    if isinstance(cfg, dict) and isinstance(cfg.get("input_size"), (tuple, list)):
        size = tuple(int(s) for s in cfg["input_size"])
        img = getattr(model, "patch_embed", None)
        img_size = getattr(img, "img_size", None)
        if isinstance(img_size, (tuple, list)) and len(size) == 3:
            size = (size[0], int(img_size[0]), int(img_size[1]))
        out.append(torch.randn(1, *size, device=device, dtype=dtype))
    kinds = _first_layer_inputs(model, device, dtype)
    required = _required_arguments(model)
    if len(required) <= 1:
        out += [c for _, c in kinds]
    else:
        out += _several_inputs(required, kinds)
    return out


_ID_NAMES = ("ids", "token", "idx", "index", "text")
_IMAGE_NAMES = ("pixel", "image", "img", "picture", "frame")


def _required_arguments(model: nn.Module) -> list[str]:
    """The names of the forward's positional arguments that have no default (empty when unreadable)."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in sig.parameters.values() if p.kind in kinds and p.default is inspect.Parameter.empty]


def _image_sizes(model: nn.Module) -> list[int]:
    """Image sides a model's first Conv can take: for a patch Conv (stride = kernel > 1) the side its
    positional table implies (n patches, or n + 1 with a class token) and 4 patches a side; else 32."""
    conv = next((m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)), None)
    if conv is None:
        return [32]
    stride = int(conv.stride[0]) if isinstance(conv.stride, tuple) else int(conv.stride)
    if stride <= 1:
        return [32]
    owner = {id(m.weight): m for m in model.modules() if isinstance(getattr(m, "weight", None), torch.Tensor)}
    tables = [p for p in model.parameters() if p.ndim >= 2]
    raw = [t for t in tables if not isinstance(owner.get(id(t)), (nn.Linear, nn.modules.conv._ConvNd))]
    sizes: list[int] = []
    for t in sorted(raw, key=lambda t: id(t) in owner):  # raw tables (pos_embed) before Embedding weights
        for n in t.shape[:-1]:  # positions are never the last (feature) dim
            for tokens in (n, n - 1):
                side = math.isqrt(max(tokens, 0))
                if side > 1 and side * side == tokens and side * stride not in sizes:
                    sizes.append(side * stride)
    return sizes[:3] + [s for s in (4 * stride, 8 * stride) if s not in sizes[:3]]


def _first_layer_inputs(model: nn.Module, device, dtype) -> list[tuple[str, Any]]:
    """(kind, input) for each kind of layer that can take a model's input, in module order: the first
    Embedding (token ids), Linear / HF Conv1D (features, 2-D then 3-D), Conv (images)."""
    out: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for m in model.modules():
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and "ids" not in seen:
            seen.add("ids")
            out.append(("ids", torch.randint(0, min(m.num_embeddings, 64), (1, 8), device=device)))
        elif isinstance(m, nn.Linear) and "features" not in seen:
            seen.add("features")
            out += [
                ("features", torch.randn(2, m.in_features, device=device, dtype=dtype)),
                ("features", torch.randn(1, 8, m.in_features, device=device, dtype=dtype)),
            ]
        elif isinstance(m, nn.modules.conv._ConvNd) and "images" not in seen:
            seen.add("images")
            spatial = len(m.kernel_size)
            out += [
                ("images", torch.randn(1, m.in_channels, *([s] * spatial), device=device, dtype=dtype))
                for s in dict.fromkeys(_image_sizes(model) if spatial == 2 else [32])
            ]
    return out


def _several_inputs(required: list[str], kinds: list[tuple[str, Any]], limit: int = 8) -> list[tuple]:
    """Tuples of one input per required argument: by the argument's name where it says (ids, images),
    else every kind in turn (the same kind for all arguments first)."""
    if not kinds:
        return []
    firsts = list(dict((k, c) for k, c in reversed(kinds)).items())[::-1]  # the first input of each kind
    by_kind = dict(firsts)

    def options(arg: str) -> list[Any]:
        low = arg.lower()
        if any(s in low for s in _ID_NAMES) and "ids" in by_kind:
            return [by_kind["ids"]]
        if any(s in low for s in _IMAGE_NAMES) and "images" in by_kind:
            return [by_kind["images"]]
        return [c for _, c in firsts]

    choices = [options(a) for a in required]
    out: list[tuple] = []
    if all(len(c) > 1 for c in choices):
        out += [tuple(c for _ in required) for _, c in firsts]
    for combo in itertools.product(*choices):
        if len(out) >= limit:
            break
        if not any(all(a is b for a, b in zip(combo, o)) for o in out):
            out.append(tuple(combo))
    return out


# Inputs a caller already holds for the model (the batch `coord_check` trains on), tried before
# derived ones when `parametrize` runs inside that caller without example_inputs=.
_HELD_INPUTS: contextvars.ContextVar[Any] = contextvars.ContextVar("mutransfer_held_inputs", default=None)


@contextlib.contextmanager
def probing_with(inputs: Any) -> Iterator[None]:
    """Within the block, a probe forward that was given no inputs tries `inputs` first (then the
    derived candidates). `coord_check` holds its first batch this way while it calls `make_model`."""
    token = _HELD_INPUTS.set(inputs)
    try:
        yield
    finally:
        _HELD_INPUTS.reset(token)


def observe_model(model: nn.Module, inputs: Any = None) -> Observation:
    """`observe` with the given inputs; else with the inputs held by `probing_with`, then the first
    candidate of `example_inputs` that runs.

    A model on the meta device whose forward reads an input's values (Hugging Face's check for padding
    in the token ids, a mask's ``all()``) cannot run on meta inputs: then the integer inputs (ids,
    masks) are given real values on the CPU beside the meta weights (an embedding of CPU ids in a
    meta table is a meta tensor), and the floating ones stay on meta.
    """
    meta = module_device(model).type == "meta"
    if inputs is not None:
        obs = observe(model, to_device(inputs, model))
        if not obs.ran and meta:
            mixed = observe(model, _integers_real(inputs))
            return mixed if mixed.ran else obs
        return obs
    held = _HELD_INPUTS.get()
    if held is not None:
        obs = observe(model, to_device(held, model))
        if obs.ran:
            return obs
    candidates = example_inputs(model)
    if not candidates:
        return Observation(error="no example inputs could be made for it")
    if meta:
        candidates += [_integers_real(c) for c in example_inputs(model, torch.device("cpu"))]
    errors = []
    for cand in candidates:
        obs = observe(model, cand)
        if obs.ran:
            return obs
        errors.append(obs.error)
    return Observation(error="; ".join(dict.fromkeys(e for e in errors if e)))


def _integers_real(obj: Any) -> Any:
    """`obj` with its floating tensors on the meta device and its other tensors (ids, masks) real, on the CPU."""
    return map_tensors(obj, lambda t: t.to("meta") if t.is_floating_point() or t.is_complex() else t.to("cpu"))


def to_device(inputs: Any, model: nn.Module) -> Any:
    """`inputs` (a tensor, or tuples, lists, dicts of them) moved to `model`'s device (as they are
    for a model without parameters)."""
    if next(model.parameters(), None) is None:
        return inputs
    return move(inputs, module_device(model))


def effective_logit_scales(model: nn.Module, inputs: Any) -> dict[str, float]:
    """Attention module → the constant multiplying q·kᵀ on one no-grad, eval-mode forward of `model` on
    `inputs` (`call_model`'s forms), as `recording` measures it: the attention's own scale times every
    constant the forward put on q and k. Empty when the forward fails (observing never raises)."""
    try:
        with probe_mode(model), recording(model, attention_only=True) as recorder:
            call_model(model, inputs)
    except Exception:
        return {}
    out: dict[str, float] = {}
    for call in recorder.obs.attention:
        out.setdefault(call.module, float(call.scale))
    return out
