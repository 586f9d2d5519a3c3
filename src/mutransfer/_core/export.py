"""`export`: the plain model behind a µP model — every µP forward constant folded into weights.

A parametrized model computes a few constants in its forward that a state_dict does not carry:
the readout multiplier (Table 8, always on a tied readout), α_output / α_embedding, residual
branch multipliers across depth, and the µP attention logit scale (a module attribute such as
Hugging Face's ``scaling``, an SDPA correction, `MuMultiheadAttention`, the `attn_scale` helper).
Code that loads the plain architecture (``from_pretrained``, vLLM, a colleague's script) rebuilds
those from its config and would silently compute something else. `export` returns a copy whose
forward is the plain class's own and whose weights absorb the constants:

- output × c of a layer (Linear, Conv, Embedding): its weight and bias × c;
- input × c of a readout: its weight × c; for a readout tied to the input embedding, the
  weight is shared, so c goes into the affine norm whose output the readout reads (GPT-2's
  ``ln_f``, Llama's ``norm``) — the tie is kept — or, with ``untie=True``, the readout gets
  its own weight (and a Hugging Face config ``tie_word_embeddings=False``);
- a branch multiplier c of a residual branch: the layer whose output is the branch's × c;
- an attention module's µP scale over the plain one, c = target/before: the query projection
  × c (the rows of q in a fused qkv projection; the query norm's gain with QK-norm), the module's
  own attribute restored to its plain value.

**Observed, not assumed.** Where the layer to fold into is not fixed by the structure (which
projection makes q, which layer ends a branch, which norm feeds the readout), candidates are
tried on a probe forward and kept only when the module's output (the model's, for the readout)
is unchanged. The search runs on a copy whose all-zero tensors (zero-initialised readout or
query) are filled with random values, so that a fold cannot pass by multiplying zeros. The
exported model is then checked against the µP model on the probe; a mismatch above `rtol`, or a
constant with no place to go, is a ValueError naming the module — never a wrong checkpoint.

Low precision (float16/bfloat16): the folds are decided and checked on float32 copies, then the
weights are rounded back to the model's dtypes and compared with the µP model at that precision
(tolerance 8 ε of the dtype). Memory: two copies of the model (float32 for a low-precision model)
besides the original while it works (three when `device=` is not the model's own).

Devices: the probe forwards run where the model lives (the device of its parameters), or on
`device=` (a model kept on the CPU, probed on a GPU); the exported copy lives where the model does.

Sharded models (parameters that are DTensors: FSDP2 `fully_shard`, tensor parallel): `export` first
gathers a plain copy — the user's classes, full tensors, no distributed hooks — on every rank (it is
collective: every rank calls it), on the CPU unless `device=` says otherwise, and exports that; every
rank gets the plain model (save it from one).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import ExportError
from .devices import DeviceLike, meta_parameters, module_device, resolve_device, same_device
from .export_check import (
    NoCache,
    cast_floats,
    check_same_outputs,
    copy_model,
    fill_zeros,
    low_precision,
    probe_inputs,
    restore_dtypes,
)
from .fold import Folder
from .sharding import gathered_copy, is_sharded
from .spec import SPEC_ATTR, require_spec, spec_holder

__all__ = ["RTOL", "export"]

RTOL = 1e-5


def export(
    model: nn.Module,
    example_inputs: Any = None,
    *,
    untie: bool = False,
    rtol: float = RTOL,
    device: DeviceLike | None = None,
) -> nn.Module:
    """A plain copy of the parametrized `model`: same outputs, no µP forward constants.

    Args:
        model: a model put in µP by `mt.parametrize` (also through DDP / torch.compile wrappers, and
            sharded: FSDP2 / tensor-parallel DTensor parameters, gathered on every rank). It is not changed.
        example_inputs: inputs for the probe forwards (a tensor, a tuple of arguments or a dict
            of keyword arguments); made from the model like `parametrize` does when omitted.
        untie: for a readout tied to the input embedding whose multiplier no norm can absorb,
            give the readout its own weight instead of refusing.
        rtol: largest relative difference (max |Δ| / max |output|) allowed between the µP and the
            exported model on the probe.
        device: where the probe forwards run ("cpu", "cuda", "cuda:N", "auto" or a `torch.device`);
            None: the model's own device (for a sharded model: the CPU, where its full copy is gathered). `example_inputs` are moved there. The returned model lives
            on the model's device either way.

    Returns:
        The exported model (its class is the user's, its state_dict keys are the model's). For
        Hugging Face models: ``export(model).save_pretrained(dir)``, then plain
        ``from_pretrained(dir)`` gives the same outputs.

    Raises:
        ModelError: the model was never parametrized (a plain model needs no export).
        ExportError: a parameter is still on the meta device (nothing to save).
        ExportError: the model does not run on `example_inputs`, a constant has no place to go, or
            the exported model differs from the µP model by more than `rtol` on the probe.
    """
    spec = require_spec(model, "export")  # a plain model needs no export: save it as it is
    root = spec_holder(model)
    if root is None:  # require_spec found a spec, so a holder exists
        raise ExportError(f"export: no module of {type(model).__name__} holds the µP spec")
    meta = meta_parameters(root)
    if meta:
        raise ExportError(
            f"export: '{meta[0]}' (and {len(meta) - 1} more) is still on the meta device: it has no values to "
            "save. Materialise the model (model.to_empty(device=...)) and give it values (mt.init_weights(model), "
            "training, or a checkpoint) first"
        )
    if is_sharded(root):  # FSDP2 / tensor parallel: gather a plain copy (collective), export that
        root = gathered_copy(root, "cpu" if device is None else resolve_device(device, "device"))
    home = module_device(root)
    where = home if device is None else resolve_device(device, "device")
    training = root.training
    caching = NoCache(root)
    try:
        with torch.no_grad(), caching:
            # the model itself, or a copy on the probe device (the original stays where it is)
            probed = root if same_device(where, home) else copy_model(root).to(where)
            inputs = probe_inputs(probed, example_inputs)
            reference = copy_model(probed).eval()  # decisions are taken on this copy, zeros filled
            low = low_precision(reference)
            if low is not None:  # decide in float32: bf16 rounding would hide which fold is right
                reference.float()
                inputs = cast_floats(inputs, torch.float32)
            filled = fill_zeros(reference)
            plain = copy_model(reference)
            Folder(reference, plain, inputs, spec, rtol).fold(untie)
            check_same_outputs(plain, reference, inputs, rtol, "the exported model")
            params = dict(plain.named_parameters(remove_duplicate=False))
            for name in filled:
                params[name].zero_()
            final_rtol = rtol
            if low is not None:
                restore_dtypes(plain, root)
                inputs = cast_floats(inputs, low)
                final_rtol = max(rtol, 8 * torch.finfo(low).eps)  # the folded weights rounded to `low`
            check_same_outputs(plain, probed, inputs, final_rtol, "the exported model (with the model's own values)")
    finally:
        root.train(training)
    plain.to(home)
    caching.restore(plain)
    plain.train(training)
    plain.__dict__.pop(SPEC_ATTR, None)
    return plain
