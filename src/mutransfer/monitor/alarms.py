"""What the monitor reports when a run leaves µP: the `Alarm` record and the likely causes, as words."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["CAUSES", "Alarm"]


class Alarm(NamedTuple):
    """One finding of the monitor: at `step`, `layer`'s `what` measured `measured` where µP expects `expected`.

    Attributes:
        step: the training step (the count of `Monitor.step` calls) of the sample.
        layer: the module (or parameter) the finding is about, by its name in the model.
        what: the quantity ("lr", "attention logit scale", "act_rms", …).
        measured: the value measured on the running model.
        expected: the value µP predicts (from what `parametrize` recorded, or the proxy's trajectory).
        cause: the likely cause and the fix, in words.
    """

    step: int
    layer: str
    what: str
    measured: float
    expected: float
    cause: str

    def __str__(self) -> str:
        return (
            f"step {self.step}: {self.layer}: {self.what} = {self.measured:.4g}, µP expects {self.expected:.4g} "
            f"— {self.cause}"
        )


# what → the cause an alarm names (the fix included); a few take the layer's role into account
CAUSES = {
    "plain_group": (
        "lr not in effect: the optimizer group holding it was not built by mt.param_groups, so it runs one lr "
        "for all parameters (AdamW over model.parameters()?); build the optimizer over "
        "mt.param_groups(model, lr, optimizer=...) or use mt.optim.AdamW(model, lr=...)"
    ),
    "lr_changed": (
        "lr not µP's: the group's lr no longer equals the base lr in effect × its µP factor (an lr set by hand "
        "after mt.param_groups, or a scheduler with per-group max lrs such as OneCycleLR(max_lr=scalar))"
    ),
    "readout_lr": (
        "readout lr not scaled: the output layer's lr must be the base lr × 1/m (mt.param_groups gives it); "
        "an lr set by hand on its group, or a scheduler with one max lr, erased the factor"
    ),
    "other_optimizer": (
        "the groups were built by mt.param_groups for another optimizer than the one running: pass its name "
        "as optimizer= to mt.param_groups"
    ),
    "swapped": (
        "layer swapped after mt.parametrize: its parameter is not the one parametrize rescaled and marked "
        "(init, forward constant and lr factor lost); build the model with the new layer and call "
        "mt.parametrize again"
    ),
    "added": (
        "parameter added after mt.parametrize: it has no µP role, init or lr factor; build the model with it and "
        "call mt.parametrize again"
    ),
    "untrained": (
        "the parameter is in no optimizer group, so it does not train (a layer replaced after the optimizer was "
        "built?); rebuild the optimizer over mt.param_groups(model, ...)"
    ),
    "attention_sqrt": (
        "attention at 1/√d: the logits of this module use 1/√d_head, not µP's α·s₀·d₀/d (the scale parametrize "
        "installed was lost — module replaced or reset after mt.parametrize — or never set: parametrize ran with "
        "attention=False on a model that does not scale its logits the µP way); call mt.parametrize again, "
        "with attention=True"
    ),
    "attention_other": (
        "attention logit scale is not the one mt.parametrize installed (module replaced or its scale changed); "
        "call mt.parametrize again"
    ),
    "init": (
        "init not µP's: the values were drawn again after mt.parametrize (the model's own reset_parameters / "
        "init_weights / Hugging Face _init_weights give the standard parametrization's init), or never drawn (a "
        "meta-built model after to_empty); call mt.init_weights(model) after materialising, not the model's own init"
    ),
    "act": "activation size off the proxy's width-scaled trajectory (a layer's init, forward constant or lr)",
    "logits": "output logits off the proxy's trajectory (readout not scaled, or logits growing without bound)",
    "attn_logits": "attention logits off the proxy's trajectory (attention at 1/√d, or q/k lr not scaled)",
    "update": "update size ‖ΔW‖ off the proxy's width-scaled trajectory (lr not in effect for this layer)",
    "unit": (
        "u-µP activation not unit at init: the layer's output is larger than u-µP's unit scale (× the constants "
        "parametrize installed on it) — its weight re-drawn or scaled after mt.parametrize, or its input multiplier "
        "lost; call mt.init_weights(model), or mt.parametrize again"
    ),
}
