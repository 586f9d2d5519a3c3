"""Step-time overhead of depth scaling: µP in width and depth (CompleteP) over the plain model.

A GPT (tied embeddings, SDPA attention) of width 256 and 8 blocks, parametrized against a width-64,
2-block base, is trained next to the identical plain model, steps interleaved, eager and under
torch.compile. Under Table 3 the branch multiplier m_L^-α is folded into each branch's last
Linear layer, so the µP forward adds nothing for depth; what remains is the tied readout's
multiplier and the extra optimizer groups. Prints median per-round ratios µP / plain.

    python benchmarks/depth_overhead.py [--rounds 60] [--no-compile]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer.recipes import GPT

WIDTH, LAYERS, BASE_WIDTH, BASE_LAYERS, BATCH, CTX = 256, 8, 64, 2, 8, 64


def trainer(model: torch.nn.Module, groups) -> callable:
    opt = torch.optim.Adam(groups, lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (BATCH, CTX), generator=g)
    y = torch.randint(0, 256, (BATCH, CTX), generator=g)

    def step() -> None:
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def build(mup: bool, compiled: bool):
    torch.manual_seed(0)
    model = GPT(WIDTH, n_layer=LAYERS, ctx=CTX)
    if mup:
        mt.parametrize(
            model,
            base=GPT(BASE_WIDTH, n_layer=BASE_LAYERS, ctx=CTX),
            delta=GPT(2 * BASE_WIDTH, n_layer=BASE_LAYERS, ctx=CTX),
            depth_alpha=1.0,
        )
        groups = mt.param_groups(model, 1e-3, "adam")
    else:
        groups = [{"params": list(model.parameters())}]
    step_model = torch.compile(model) if compiled else model
    return trainer(step_model, groups), len(groups)


def measure(compiled: bool, rounds: int) -> tuple[float, float, float, int]:
    (plain, _), (mup, n_groups) = build(False, compiled), build(True, compiled)
    for _ in range(3):  # warm-up (and compilation)
        plain(), mup()
    ratios, tp, tm = [], [], []
    for r in range(rounds):
        pair = [(plain, tp), (mup, tm)] if r % 2 == 0 else [(mup, tm), (plain, tp)]
        for fn, sink in pair:
            start = time.perf_counter()
            fn()
            sink.append(time.perf_counter() - start)
        ratios.append(tm[-1] / tp[-1])
    return statistics.median(ratios), statistics.median(tp), statistics.median(tm), n_groups


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args(argv)
    print(
        f"GPT width {WIDTH}, {LAYERS} blocks (base {BASE_WIDTH} × {BASE_LAYERS}, CompleteP), batch {BATCH}×{CTX}, "
        f"Adam, {torch.get_num_threads()} threads, {args.rounds} interleaved rounds"
    )
    print("| mode | plain step (ms) | µP + depth step (ms) | µP / plain (median of per-round ratios) | µP groups |")
    print("|---|---|---|---|---|")
    for compiled in [False] if args.no_compile else [False, True]:
        ratio, tp, tm, groups = measure(compiled, args.rounds)
        print(f"| {'compiled' if compiled else 'eager'} | {tp * 1e3:.1f} | {tm * 1e3:.1f} | {ratio:.3f} | {groups} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
