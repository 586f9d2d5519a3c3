"""Forward multipliers installed by switching a module's class, not by hooks.

µP sometimes needs a constant inside the forward pass: the readout multiplier of Table 8
(always for a readout tied to the embedding), α_output, α_embedding, and the µP attention
scale for modules that call ``scaled_dot_product_attention``. Forward hooks would do, but
torch.compile does not guard on a module's hooks: once a plain instance of a class has been
compiled, a µP instance of the same class reuses that graph and its hooks are silently
dropped. A different class is guarded on, so each such module is switched in place to a
subclass of its own class (``MuScaled<Name>``) whose forward applies the constants, which are
plain float attributes of the module. Parameters, buffers, state_dict keys and
``isinstance`` checks are unchanged; the subclasses pickle by reference to their parent.
"""

from __future__ import annotations

import importlib
from enum import Enum

import torch
from torch import nn

from ._core import sdpa as _sdpa

__all__ = ["INPUT_ATTR", "OUTPUT_ATTR", "SDPA_ATTR", "Side", "install", "scaled_class"]


class Side(str, Enum):
    """Where a forward constant multiplies: a module's input or its output. Compares equal to its
    text ("input ×", "output ×"), which is how `describe` prints it."""

    INPUT = "input ×"
    OUTPUT = "output ×"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


INPUT_ATTR = "_mutransfer_input_mult"
OUTPUT_ATTR = "_mutransfer_output_mult"
SDPA_ATTR = "_mutransfer_sdpa"
_PREFIX = "MuScaled_"
_CLASSES: dict[type, type] = {}


def _key(cls: type) -> str:
    path = f"{cls.__module__}:{cls.__qualname__}".encode()
    return f"{_PREFIX}{cls.__name__}_{path.hex()}"


def _make(parent: type) -> type:
    parent_forward = parent.forward

    def forward(self, *args, **kwargs):
        c_in = self.__dict__.get(INPUT_ATTR, 1.0)
        if c_in != 1.0:
            if args:
                args = (args[0] * c_in,) + tuple(args[1:])
            else:  # input passed by keyword: scale the first tensor argument
                first = next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
                kwargs = {**kwargs, first: kwargs[first] * c_in}
        correction = self.__dict__.get(SDPA_ATTR)
        if correction is not None:
            with _sdpa.correcting(correction):
                out = parent_forward(self, *args, **kwargs)
        else:
            out = parent_forward(self, *args, **kwargs)
        c_out = self.__dict__.get(OUTPUT_ATTR, 1.0)
        if c_out != 1.0:  # a tuple output (e.g. nn.MultiheadAttention's) scales its first element
            out = (out[0] * c_out,) + tuple(out[1:]) if isinstance(out, tuple) else out * c_out
        return out

    key = _key(parent)
    cls = type(
        f"MuScaled{parent.__name__}",
        (parent,),
        {
            "forward": forward,
            "_mutransfer_parent": parent,
            "__module__": __name__,
            "__qualname__": key,
            "__doc__": f"{parent.__name__} with µP's forward multipliers (see mutransfer.scaled_forward).",
        },
    )
    globals()[key] = cls
    return cls


def scaled_class(parent: type) -> type:
    """The (cached) µP subclass of an nn.Module class."""
    if "_mutransfer_parent" in parent.__dict__:
        return parent
    if parent not in _CLASSES:
        _CLASSES[parent] = _make(parent)
    return _CLASSES[parent]


def install(
    module: nn.Module,
    *,
    input_mult: float | None = None,
    output_mult: float | None = None,
    sdpa: float | None = None,
) -> None:
    """Give `module` forward multipliers (input ×, output ×) and/or a correction of the logit scale of
    the ``scaled_dot_product_attention`` calls made inside its forward (`sdpa`)."""
    module.__class__ = scaled_class(type(module))
    if input_mult is not None:
        setattr(module, INPUT_ATTR, float(input_mult) * module.__dict__.get(INPUT_ATTR, 1.0))
    if output_mult is not None:
        setattr(module, OUTPUT_ATTR, float(output_mult) * module.__dict__.get(OUTPUT_ATTR, 1.0))
    if sdpa is not None:
        _sdpa.install_wrapper()
        setattr(module, SDPA_ATTR, float(sdpa))


def __getattr__(name: str) -> type:
    """Rebuild a MuScaled class on unpickling in a process that has not created it yet."""
    if not name.startswith(_PREFIX):
        raise AttributeError(name)
    try:
        module_name, qualname = bytes.fromhex(name.rsplit("_", 1)[1]).decode().split(":", 1)
        parent = importlib.import_module(module_name)
        for part in qualname.split("."):
            parent = getattr(parent, part)
    except (ValueError, ImportError, AttributeError) as e:
        raise AttributeError(f"cannot rebuild µP class {name}: {e}") from None
    return scaled_class(parent)
