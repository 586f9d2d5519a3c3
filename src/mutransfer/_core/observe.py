"""Input probing: build example inputs, run one probe forward under the recorder, and keep what it saw.

`observe` runs a model once on given inputs (eval mode, no grad, buffers restored) under
`recorder.recording`; `observe_model` first builds candidate inputs (`example_inputs`) when the
caller has none. `call_model` and `to_device` are the two ways every probe calls a model.
What is recorded and how: `recorder` and `observation`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .devices import module_device, move
from .observation import AttentionCall, Observation, Use
from .recorder import recording

__all__ = [
    "AttentionCall",
    "Observation",
    "Use",
    "call_model",
    "example_inputs",
    "observe",
    "observe_model",
    "recording",
    "to_device",
]


def observe(model: nn.Module, inputs: Any, on_attention: Callable | None = None) -> Observation:
    """Run `model` once on `inputs` (a tensor, a tuple of positional args or a dict of kwargs) and
    record parameter usage and attention calls. No grad, eval mode (restored after), buffers restored."""
    was_training = {m: m.training for m in model.modules()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers() if not b.is_meta}
    obs = None
    try:
        model.eval()
        with torch.no_grad(), recording(model, on_attention) as recorder:
            obs = recorder.obs
            call_model(model, inputs)
    except Exception as e:  # the probe is best effort; the caller decides what a failure means
        first = str(e).splitlines()[0] if str(e) else ""
        obs = obs or Observation()
        obs.error = f"{type(e).__name__}: {first[:300]}"
    finally:
        for m, t in was_training.items():
            m.training = t
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


def example_inputs(model: nn.Module) -> list[Any]:
    """Candidate inputs for a probe forward, best first (each tried until one runs).

    Hugging Face models: built from ``main_input_name`` and the config (token ids, or images
    of the configured size; encoder-decoders get decoder ids too). timm models: their
    ``pretrained_cfg['input_size']``. Anything else: from the first layer that takes the input
    (an embedding → token ids; a Linear → features; a Conv → images of 32 pixels a side).
    """
    params = list(model.parameters())
    device = module_device(model)
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
            size = get("image_size", 32)
            size = size if isinstance(size, int) else (size[0] if isinstance(size, (list, tuple)) else 32)
            out.append(
                {"pixel_values": torch.randn(1, int(get("num_channels", 3)), size, size, device=device, dtype=dtype)}
            )
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    if isinstance(cfg, dict) and isinstance(cfg.get("input_size"), (tuple, list)):
        size = tuple(int(s) for s in cfg["input_size"])
        img = getattr(model, "patch_embed", None)
        img_size = getattr(img, "img_size", None)
        if isinstance(img_size, (tuple, list)) and len(size) == 3:
            size = (size[0], int(img_size[0]), int(img_size[1]))
        out.append(torch.randn(1, *size, device=device, dtype=dtype))
    first = next(
        (
            m
            for m in model.modules()
            if isinstance(m, (nn.Embedding, nn.Linear, nn.modules.conv._ConvNd)) or type(m).__name__ == "Conv1D"
        ),
        None,
    )
    if isinstance(first, nn.Embedding):
        out.append(torch.randint(0, min(first.num_embeddings, 64), (1, 8), device=device))
    elif isinstance(first, nn.Linear):
        out += [
            torch.randn(2, first.in_features, device=device, dtype=dtype),
            torch.randn(1, 8, first.in_features, device=device, dtype=dtype),
        ]
    elif isinstance(first, nn.modules.conv._ConvNd):
        spatial = len(first.kernel_size)
        out.append(torch.randn(1, first.in_channels, *([32] * spatial), device=device, dtype=dtype))
    return out


def observe_model(model: nn.Module, inputs: Any = None) -> Observation:
    """`observe` with the given inputs, or with the first candidate of `example_inputs` that runs."""
    if inputs is not None:
        return observe(model, to_device(inputs, model))
    candidates = example_inputs(model)
    if not candidates:
        return Observation(error="no example inputs could be made for it")
    errors = []
    for cand in candidates:
        obs = observe(model, cand)
        if obs.ran:
            return obs
        errors.append(obs.error)
    return Observation(error="; ".join(dict.fromkeys(e for e in errors if e)))


def to_device(inputs: Any, model: nn.Module) -> Any:
    """`inputs` (a tensor, or tuples, lists, dicts of them) moved to `model`'s device (as they are
    for a model without parameters)."""
    if next(model.parameters(), None) is None:
        return inputs
    return move(inputs, module_device(model))
