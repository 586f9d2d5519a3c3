"""The coordinate check's power: which µP mistakes it catches, on which real architectures.

For each model of the zoo (tests/zoo.py) and each classic mistake, the coordinate check runs at its
documented defaults (Adam, lr 1e-2, 3 steps) over widths 32…256 with the head count fixed, 2 seeds,
and the verdict is printed as a table (PASS is right for "correct µP", FAIL for every mistake):

- correct µP: `mt.parametrize` + `mt.param_groups`;
- attention at 1/√d: ``parametrize(..., attention=False)``;
- readout in SP: the readout keeps its standard init and lr (``roles={readout: "vector"}``; for a
  tied readout, ``output_mult=m`` cancels Table 8's 1/m);
- router in SP: the MoE router likewise (Mixtral);
- hidden Adam lr unscaled: the optimizer gives hidden weights the base lr instead of lr/m;
- ε unscaled: Adam's ε = 1e-2 in every group instead of 1e-2/m where µP scales it. ε matters only where
  it is comparable to the gradients: 1e-2 is to these tiny models' gradients what 1e-8 is to a large
  model's (at ε = 1e-3 the unscaled ε changes too little over 32…256 to fail on GPT-2 or Llama). The
  column "correct µP, ε=1e-2" shows the check passing µP's own ε scaling at that ε.

    python benchmarks/coord_power.py [--models gpt2,llama] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import torch

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
DEFAULT_MODELS = ["gpt2", "llama", "nanogpt", "mixtral", "timm_vit"]
MISTAKES = [
    "correct µP",
    "correct µP, ε=1e-2",
    "attention at 1/√d",
    "readout in SP",
    "router in SP",
    "hidden Adam lr unscaled",
    "ε unscaled",
]


def _maker(entry, **kw):
    def make(width):
        m = entry.make(width)
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


def setups(name: str, entry):
    """mistake → (make_model, extra coord_check kwargs), or None where it does not apply."""
    out = {"correct µP": (_maker(entry), {}), "correct µP, ε=1e-2": (_maker(entry), {"eps": EPS})}
    out["attention at 1/√d"] = (
        (_maker(entry, attention=False), {}) if name not in ("mamba", "timm_resnet", "timm_convnext") else None
    )
    readout = READOUTS.get(name)
    if readout == "tied":
        out["readout in SP"] = (_maker(entry, output_mult_m=True), {})
    elif readout:
        out["readout in SP"] = (_maker(entry, roles={readout: "vector"}), {})
    else:
        out["readout in SP"] = None
    router = ROUTERS.get(name)
    out["router in SP"] = (_maker(entry, roles={router: "vector"}), {}) if router else None
    out["hidden Adam lr unscaled"] = (_maker(entry), {"optimizer": _adam_hidden_unscaled})
    out["ε unscaled"] = (_maker(entry), {"optimizer": _adam_eps_unscaled})
    return out


def run(models: list[str]) -> dict:
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    results: dict = {}
    for name in models:
        entry = ZOO[name]
        if not entry.available():
            print(f"{name}: {entry.requires} not installed, skipped", file=sys.stderr)
            continue
        data = entry.data(2)
        results[name] = {}
        for mistake, setup in setups(name, entry).items():
            if setup is None:
                results[name][mistake] = None
                continue
            make, kw = setup
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = mt.coord_check(make, WIDTHS, data, steps=3, seeds=2, loss_fn=loss_of, progress=False, **kw)
            worst = r.failures[0] if r.failures else None
            results[name][mistake] = {
                "passed": r.passed,
                "seconds": round(time.perf_counter() - t, 1),
                "worst": None
                if worst is None
                else f"{worst.module} {worst.quantity}@{worst.step} "
                f"slope {worst.slope:+.2f} (µP {worst.expected:+.2f}, {worst.reason})",
            }
            print(
                f"{name:10s} {mistake:25s} {'PASS' if r.passed else 'FAIL'} "
                f"({results[name][mistake]['seconds']} s) {results[name][mistake]['worst'] or ''}",
                file=sys.stderr,
                flush=True,
            )
    return results


def table(results: dict) -> str:
    lines = ["| model | " + " | ".join(MISTAKES) + " |", "|---" * (len(MISTAKES) + 1) + "|"]
    for name, row in results.items():
        cells = []
        for mistake in MISTAKES:
            r = row.get(mistake)
            if r is None:
                cells.append("—")
            else:
                right = r["passed"] == mistake.startswith("correct")
                cells.append(f"{'PASS' if r['passed'] else 'FAIL'}{'' if right else ' ✗'}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated zoo entries")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args()
    t = time.perf_counter()
    results = run([m.strip() for m in args.models.split(",") if m.strip()])
    print(table(results))
    right = sum((r["passed"] == k.startswith("correct")) for row in results.values() for k, r in row.items() if r)
    total = sum(1 for row in results.values() for r in row.values() if r)
    print(f"\n{right}/{total} verdicts right ({time.perf_counter() - t:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
