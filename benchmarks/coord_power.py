"""The coordinate check's false-alarm rate and power, measured on the in-repo zoo.

For each model of the zoo (tests/zoo.py) the coordinate check runs at its documented defaults (Adam,
lr 1e-2, 3 steps, 2 seeds) over widths 32…256 with the head count fixed, under correct µP, under
the standard parametrization and under each single mistake, and each setting is repeated with
`--reps` independent draws (default 5: other initial values and other batches). It prints the
number of repetitions that PASS for each (model, setting), then per setting the pass rate of correct
µP (1 − the false-alarm rate) or the fail rate of the mistake (the check's power):

- correct µP: `mt.parametrize` + `mt.param_groups`;
- SP: the plain model, one lr for every parameter;
- attention at 1/√d: ``parametrize(..., attention=False)``;
- readout not scaled: the readout keeps its standard init and lr (``roles={readout: "vector"}``;
  for a tied readout, ``output_mult=m`` cancels Table 8's 1/m);
- embedding ×√width: the input embedding's output multiplied by √width (as Gemma or T5 scale it)
  after `parametrize`, which therefore does not compensate it;
- hidden lr not scaled: the optimizer gives hidden weights the base lr instead of lr/m;
- with ``--extra``: router in SP (Mixtral), ε unscaled (Adam's ε = 1e-2 in every group instead of
  1e-2/m; ε matters only where it is comparable to the gradients: 1e-2 is to these tiny models'
  gradients what 1e-8 is to a large model's), and correct µP at ε = 1e-2.

    python benchmarks/coord_power.py [--models gpt2,llama] [--reps 5] [--extra] [--quick] [--json out.json]

`--quick` runs nanogpt only, 1 repetition, widths 32…128 (the test).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import mutransfer as mt
from zoo import ZOO, loss_of

WIDTHS = [32, 64, 128, 256]
BASE = 32
EPS = 1e-2  # comparable to these small models' gradients, as 1e-8 is to a large model's
READOUTS = {
    "gpt2": "tied",
    "nanogpt": "tied",
    "llama": "lm_head.weight",
    "mixtral": "lm_head.weight",
    "timm_vit": "head.weight",
    "timm_vit_unfused": "head.weight",
    "qwen2": "tied",
    "mistral": "lm_head.weight",
    "t5": "tied",
    "bert": "tied",
    "vit": "classifier.weight",
    "gpt_neox": "lm_head.weight",
    "mamba": "tied",
    "timm_resnet": "fc.weight",
    "timm_convnext": "head.fc.weight",
}
ROUTERS = {"mixtral": "model.layers.*.mlp.gate.weight"}
DEFAULT_MODELS = ["nanogpt", "gpt2", "llama", "bert", "mixtral", "t5", "timm_vit", "timm_resnet"]
MISTAKES = [
    "correct µP",
    "SP",
    "attention at 1/√d",
    "readout not scaled",
    "embedding ×√width",
    "hidden lr not scaled",
]
EXTRA = ["router in SP", "ε unscaled", "correct µP, ε=1e-2"]
REP_SEED = 100  # repetition r builds with the factory's seed r·REP_SEED and batches from seed r·REP_SEED


def _embedding(model):
    """The module whose output is the input embedding, or None."""
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            return get()
        except NotImplementedError:
            pass
    for name in ("transformer.wte", "patch_embed", "stem", "conv1"):
        try:
            return model.get_submodule(name)
        except AttributeError:
            continue
    return None


def _scaled_embedding(make):
    """The mistake: the embedding's output × √width, added after `parametrize` (which cannot see it)."""

    def build(width):
        model = make(width)
        emb = _embedding(model)
        # every module holding the embedding's weight: T5's encoder and decoder each look it up
        # through their own nn.Embedding that shares `shared.weight` (`shared` itself never runs)
        weight = getattr(emb, "weight", None)
        holders = [m for m in model.modules() if weight is not None and getattr(m, "weight", None) is weight]
        for m in [emb] + [m for m in holders if m is not emb and isinstance(m, nn.Embedding)]:
            m.register_forward_hook(lambda mod, args, out: out * math.sqrt(width))
        return model

    return build


def _maker(entry, rep: int = 0, mup: bool = True, **kw):
    def make(width):
        m = entry.make(width, seed=rep * REP_SEED)
        if not mup:
            return m
        extra = dict(kw)
        if extra.pop("output_mult_m", False):
            extra["output_mult"] = width / BASE
        return mt.parametrize(m, base=entry.make(BASE), delta=entry.make(2 * BASE), **extra)

    return make


def _adam_hidden_unscaled(model, lr):
    spec = model._mutransfer_spec
    names = {id(p): n for n, p in model.named_parameters()}
    groups = mt.param_groups(model, lr, "adam")
    for g in groups:
        if all(spec.params[names[id(p)]].role == "hidden" for p in g["params"]):
            g["lr"] = lr  # the mistake: no 1/m
    return torch.optim.Adam(groups, lr=lr)


def _adam_eps_unscaled(model, lr):
    groups = mt.param_groups(model, lr, "adam", eps=EPS)
    for g in groups:
        g["eps"] = EPS  # the mistake: no 1/m
    return torch.optim.Adam(groups, lr=lr)


def setups(name: str, entry, rep: int = 0, extra: bool = False):
    """setting → (make_model, extra coord_check kwargs), or None where it does not apply."""
    out = {"correct µP": (_maker(entry, rep), {}), "SP": (_maker(entry, rep, mup=False), {})}
    no_attention = name in ("mamba", "timm_resnet", "timm_convnext")
    out["attention at 1/√d"] = None if no_attention else (_maker(entry, rep, attention=False), {})
    readout = READOUTS.get(name)
    if readout == "tied":
        out["readout not scaled"] = (_maker(entry, rep, output_mult_m=True), {})
    elif readout:
        out["readout not scaled"] = (_maker(entry, rep, roles={readout: "vector"}), {})
    else:
        out["readout not scaled"] = None
    has_embedding = _embedding(entry.make(BASE)) is not None
    out["embedding ×√width"] = (_scaled_embedding(_maker(entry, rep)), {}) if has_embedding else None
    out["hidden lr not scaled"] = (_maker(entry, rep), {"optimizer": _adam_hidden_unscaled})
    if extra:
        router = ROUTERS.get(name)
        out["router in SP"] = (_maker(entry, rep, roles={router: "vector"}), {}) if router else None
        out["ε unscaled"] = (_maker(entry, rep), {"optimizer": _adam_eps_unscaled})
        out["correct µP, ε=1e-2"] = (_maker(entry, rep), {"eps": EPS})
    return out


def run(models: list[str], reps: int = 5, extra: bool = False, widths: list[int] = WIDTHS) -> dict:
    """{model: {setting: [{"passed", "seconds", "worst"} per repetition] or None}}."""
    results: dict = {}
    for name in models:
        entry = ZOO[name]
        if not entry.available():
            print(f"{name}: {entry.requires} not installed, skipped", file=sys.stderr)
            continue
        results[name] = {}
        for rep in range(reps):
            data = entry.data(2, seed=rep * REP_SEED)
            for setting, setup in setups(name, entry, rep, extra).items():
                if setup is None:
                    results[name][setting] = None
                    continue
                make, kw = setup
                t = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    r = mt.coord_check(make, widths, data, steps=3, seeds=2, loss_fn=loss_of, progress=False, **kw)
                worst = r.failures[0] if r.failures else None
                one = {
                    "passed": r.passed,
                    "seconds": round(time.perf_counter() - t, 1),
                    "worst": None
                    if worst is None
                    else f"{worst.module} {worst.quantity} {worst.where} "
                    f"slope {worst.slope:+.2f} ± {worst.slope_se:.2f} (µP {worst.expected:+.2f}, {worst.reason})",
                }
                results[name].setdefault(setting, []).append(one)
                print(
                    f"{name:10s} rep {rep} {setting:22s} {'PASS' if r.passed else 'FAIL'} "
                    f"({one['seconds']} s) {one['worst'] or ''}",
                    file=sys.stderr,
                    flush=True,
                )
    return results


def _right(setting: str, passed: bool) -> bool:
    return passed == setting.startswith("correct")


def table(results: dict) -> str:
    """Markdown: PASS count per (model, setting), then the rate of right verdicts per setting."""
    settings = [k for k in MISTAKES + EXTRA if any(row.get(k) for row in results.values())]
    lines = ["| model | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
    for name, row in results.items():
        cells = []
        for setting in settings:
            runs = row.get(setting)
            if not runs:
                cells.append("—")
                continue
            passes = sum(r["passed"] for r in runs)
            wrong = sum(not _right(setting, r["passed"]) for r in runs)
            cells.append(f"{passes}/{len(runs)} pass{' ✗' if wrong else ''}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    rates = []
    for setting in settings:
        runs = [r for row in results.values() for r in (row.get(setting) or [])]
        right = sum(_right(setting, r["passed"]) for r in runs)
        what = "pass rate" if setting.startswith("correct") else "fail rate (power)"
        rates.append(f"| {setting} | {what} | {right}/{len(runs)} = {right / len(runs):.0%} |")
    return "\n".join(lines + ["", "| setting | measured | rate |", "|---|---|---|", *rates])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated zoo entries")
    ap.add_argument("--reps", type=int, default=5, help="independent repetitions of each setting")
    ap.add_argument("--extra", action="store_true", help="also router in SP, ε unscaled, correct µP at ε=1e-2")
    ap.add_argument("--quick", action="store_true", help="nanogpt, 1 repetition, widths 32…128 (the test)")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args()
    models = ["nanogpt"] if args.quick else [m.strip() for m in args.models.split(",") if m.strip()]
    reps = 1 if args.quick else args.reps
    t = time.perf_counter()
    results = run(models, reps, args.extra, WIDTHS[:3] if args.quick else WIDTHS)
    print(table(results))
    runs = [(k, r) for row in results.values() for k, rs in row.items() for r in (rs or [])]
    right = sum(_right(k, r["passed"]) for k, r in runs)
    print(f"\n{right}/{len(runs)} verdicts right ({time.perf_counter() - t:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
