"""Step-time overhead of µP's optimizer groups, for every optimizer: µP vs the plain model.

For each optimizer (SGD + Nesterov, AdamW, Lion, Adafactor, Muon + AdamW, SOAP), two builds of the
recipe GPT (tied embeddings, 2 blocks) at one width train side by side on one fixed batch:

* plain  the model as written, the optimizer over its parameters in one group (Muon: its hidden
         matrices found from shapes, `mt.optim.hidden_matrices`, the rest in its AdamW);
* µP     the same model after `mt.parametrize`, the optimizer from `mt.optim.build_optimizer`
         (µP's groups: one per distinct (lr, ε, wd) factor).

A full step (forward, loss, backward, step, zero_grad) of each, round-robin with the starting build
alternating, after warm-up; each round gives a paired ratio µP/plain. The table shows the median
step times and the median ratio with its quartiles. The µP model also carries its attention scale
(the SDPA wrapper), so the ratio covers everything µP adds to a step, not only the groups.

    python benchmarks/optimizer_overhead.py               # about 3 minutes on 2 CPU cores
    python benchmarks/optimizer_overhead.py --quick       # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer.recipes import GPT

OPTIMIZERS = {
    "sgd": {"momentum": 0.9, "nesterov": True},
    "adamw": {},
    "lion": {},
    "adafactor": {},
    "muon": {"adjust_lr_fn": "match_rms_adamw"},
    "soap": {},
}
LRS = {"sgd": 0.1, "adamw": 1e-3, "lion": 1e-4, "adafactor": 0.01, "muon": 1e-3, "soap": 1e-3}


def builds(name: str, width: int, base: int):
    torch.manual_seed(0)
    plain = GPT(width)
    torch.manual_seed(0)
    mup = GPT(width)
    mt.parametrize(mup, base=GPT(base), delta=GPT(2 * base))
    kw = OPTIMIZERS[name]
    hidden = mt.optim.hidden_matrices(plain, GPT(2 * width)) if name == "muon" else None
    return (
        (plain, mt.optim.build_optimizer(plain, name, LRS[name], mup=False, hidden=hidden, **kw)),
        (mup, mt.optim.build_optimizer(mup, name, LRS[name], **kw)),
    )


def step(model, opt, x, y) -> float:
    t = time.perf_counter()
    logits = model(x)
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def measure(name: str, width: int, base: int, budget: float, min_rounds: int) -> dict:
    (pm, po), (mm, mo) = builds(name, width, base)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (8, 64), generator=g)
    y = torch.randint(0, 256, (8, 64), generator=g)
    for _ in range(3):
        step(pm, po, x, y)
        step(mm, mo, x, y)
    plain, mup, ratios = [], [], []
    start = time.perf_counter()
    r = 0
    while (r < min_rounds or time.perf_counter() - start < budget) and time.perf_counter() - start < 3 * budget:
        if r % 2 == 0:
            a = step(pm, po, x, y)
            b = step(mm, mo, x, y)
        else:
            b = step(mm, mo, x, y)
            a = step(pm, po, x, y)
        plain.append(a)
        mup.append(b)
        ratios.append(b / a)
        r += 1
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {
        "optimizer": name,
        "plain_ms": 1e3 * statistics.median(plain),
        "mup_ms": 1e3 * statistics.median(mup),
        "ratio": statistics.median(ratios),
        "q1": q[0],
        "q3": q[2],
        "rounds": r,
        "groups": (len(po.param_groups), len(mo.param_groups)),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="width 64, 1 s per optimizer")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--budget", type=float, default=25.0, help="seconds of paired rounds per optimizer")
    ap.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    width, budget, min_rounds = (64, 1.0, 5) if args.quick else (args.width, args.budget, 30)
    rows = []
    for name in args.optimizers.split(","):
        if name not in OPTIMIZERS:
            ap.error(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}")
        rows.append(measure(name, width, 32, budget, min_rounds))
        print(f"{name}: {rows[-1]['ratio']:.3f}", file=sys.stderr, flush=True)
    print(f"GPT width {width} (µP base 32), batch 8 × 64 tokens, {torch.get_num_threads()} threads")
    print("| optimizer | groups plain / µP | plain step | µP step | µP / plain (median, quartiles) | rounds |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['optimizer']} | {r['groups'][0]} / {r['groups'][1]} | {r['plain_ms']:.1f} ms | {r['mup_ms']:.1f} ms "
            f"| {r['ratio']:.3f} ({r['q1']:.3f}–{r['q3']:.3f}) | {r['rounds']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
