"""µTransfer quickstart: in µP the best learning rate does not move when the model gets wider.

This script trains the same small MLP at three widths over a grid of Adam learning rates,
twice:

* SP (standard parametrization): plain PyTorch and ``torch.optim.Adam(model.parameters(), lr)``.
  The best lr shrinks as the model widens, so it has to be re-tuned at every size.
* µP: the same model code plus two calls to mutransfer::

      mt.parametrize(model, base=MLP(64), delta=MLP(128))        # rescale the init to µP
      torch.optim.Adam(mt.param_groups(model, lr, optimizer="adam"))  # µP per-layer lrs

  The best lr stays put, so it can be tuned on the small model and reused on the big
  one: that is µTransfer.

At the smallest width (the base width) µP is exactly the SP model, so the first rows of
both tables are identical. Everything runs offline on CPU: the data is synthetic (Gaussian
inputs labelled by a random "teacher" network) and every run sees the same data in the same
order; the seed fixes the data, the initial weights and the batch order.

    python examples/quickstart.py            # about 2 min on 2 CPU cores
    python examples/quickstart.py --quick    # widths 64 and 256, lrs 2^-9 … 2^-5 (15 s on one CPU thread), a smoke test
    python examples/quickstart.py --seed 1   # another draw of data, init and batch order
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer._core.devices import resolve_device
from mutransfer.recipes import MLP

D_IN, N_CLASSES, DEPTH = 128, 10, 3  # MLP: input layer, 2 hidden width×width layers, readout
N_TRAIN, BATCH = 4096, 128

CONFIGS = {
    # widths (the first is µP's base width), log2 lr grid, training steps
    "default": dict(widths=(64, 256, 1024), log2_lrs=range(-12, -2), steps=300),
    "quick": dict(widths=(64, 256), log2_lrs=range(-9, -4), steps=100),
}


def make_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """N_TRAIN Gaussian points in R^D_IN, labelled by the argmax of a random ReLU teacher."""
    g = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(N_TRAIN, D_IN, generator=g)
    w1 = torch.randn(D_IN, 256, generator=g) / math.sqrt(D_IN)
    w2 = torch.randn(256, N_CLASSES, generator=g) / math.sqrt(256)
    y = (torch.relu(x @ w1) @ w2).argmax(dim=1)
    return x, y


def make_model(width: int, mup: bool, base_width: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)  # same initial weights for SP and µP (before µP rescales them)
    model = MLP(width, d_in=D_IN, d_out=N_CLASSES, depth=DEPTH)
    if mup:
        # µP relative to the base width: the base model tells mutransfer the reference init,
        # and base vs. delta (twice as wide) tells it which dimensions are "width".
        mt.parametrize(
            model,
            base=MLP(base_width, d_in=D_IN, d_out=N_CLASSES, depth=DEPTH),
            delta=MLP(2 * base_width, d_in=D_IN, d_out=N_CLASSES, depth=DEPTH),
        )
    return model


def make_optimizer(model: torch.nn.Module, lr: float, mup: bool) -> torch.optim.Optimizer:
    if mup:
        # `lr` is the base model's lr; hidden and readout layers get lr × base_width / width.
        return torch.optim.Adam(mt.param_groups(model, lr, optimizer="adam"))
    return torch.optim.Adam(model.parameters(), lr=lr)


def train(
    width: int,
    mup: bool,
    lr: float,
    data,
    base_width: int,
    steps: int,
    seed: int,
    device: torch.device = torch.device("cpu"),  # noqa: B008 (immutable)
) -> float:
    """Final training loss: the mean minibatch loss over the last 10% of steps (inf if it diverged).
    The model is built on the CPU under the seed and trained on `device`, where `data` is."""
    x, y = data
    model = make_model(width, mup, base_width, seed).to(device)
    opt = make_optimizer(model, lr, mup)
    batches = torch.Generator().manual_seed(20_000 + seed)  # same batch order in every run
    tail = max(1, steps // 10)
    total = 0.0
    for step in range(steps):
        idx = torch.randint(0, N_TRAIN, (BATCH,), generator=batches).to(device)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()
        if not math.isfinite(value):
            return math.inf
        if step >= steps - tail:
            total += value
    return total / tail


def print_table(title: str, widths, log2_lrs, losses: dict) -> None:
    print(f"\n{title}")
    print("width \\ log2 lr " + "".join(f"{e:>7d}" for e in log2_lrs))
    for w in widths:
        row = losses[w]
        best = min(row)
        cells = "".join(f"{'inf' if math.isinf(v) else f'{v:.3f}':>6s}{'*' if v == best else ' '}" for v in row)
        print(f"{w:>15d} {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="widths 64 and 256, lrs 2^-9 … 2^-5 (15 s on one CPU thread)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for data, init and batch order")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present, else the CPU), cpu, cuda or cuda:N")
    args = parser.parse_args()
    device = resolve_device(args.device, "--device")
    cfg = CONFIGS["quick" if args.quick else "default"]
    widths, log2_lrs, steps = cfg["widths"], list(cfg["log2_lrs"]), cfg["steps"]
    base = widths[0]
    start = time.perf_counter()

    print(
        f"µTransfer quickstart{' (--quick)' if args.quick else ''}: seed {args.seed}, "
        f"torch {torch.__version__}, mutransfer {mt.__version__}"
    )
    print(f"Task: {N_TRAIN} synthetic points in R^{D_IN}, {N_CLASSES} classes from a random teacher net.")
    print(
        f"Model: MLP with {DEPTH - 1} hidden width×width layers, widths {', '.join(map(str, widths))}; "
        f"Adam, batch {BATCH}, {steps} steps, constant lr."
    )
    print(
        f"Grid: lr = 2^{log2_lrs[0]} … 2^{log2_lrs[-1]}; loss = mean training loss over the last "
        f"{max(1, steps // 10)} steps."
    )
    print(f"\nWhat µP changes at width {widths[-1]} (factors relative to the base width {base}):")
    print(mt.describe(make_model(widths[-1], True, base, args.seed)))
    print()

    data = tuple(t.to(device) for t in make_data(args.seed))  # made on the CPU, the same on every device
    results = {}  # (name, width) -> [loss per log2 lr]
    for name, mup in (("SP", False), ("µP", True)):
        for w in widths:
            row = [train(w, mup, 2.0**e, data, base, steps, args.seed, device) for e in log2_lrs]
            results[name, w] = row
            i = min(range(len(row)), key=row.__getitem__)
            print(
                f"[{time.perf_counter() - start:6.1f} s] {name} width {w:>5d}: {len(row)} lrs × {steps} steps, "
                f"best lr 2^{log2_lrs[i]} (loss {row[i]:.3f})",
                flush=True,
            )

    print_table(
        "Standard parametrization (plain torch.optim.Adam): final training loss, * = best",
        widths,
        log2_lrs,
        {w: results["SP", w] for w in widths},
    )
    print_table(
        f"µP (mutransfer, base width {base}): final training loss, * = best",
        widths,
        log2_lrs,
        {w: results["µP", w] for w in widths},
    )

    best = {k: log2_lrs[min(range(len(v)), key=v.__getitem__)] for k, v in results.items()}
    print("\nOptimal log2 lr per width (and its loss):")
    print(f"{'width':>7s} {'SP':>13s} {'µP':>13s}")
    for w in widths:
        sp, mu = results["SP", w], results["µP", w]
        print(f"{w:>7d} {best['SP', w]:>5d} ({min(sp):.3f}) {best['µP', w]:>5d} ({min(mu):.3f})")

    moved = {name: max(best[name, w] for w in widths) - min(best[name, w] for w in widths) for name in ("SP", "µP")}
    path = {name: " → ".join(str(best[name, w]) for w in widths) for name in ("SP", "µP")}
    octaves = {name: f"{moved[name]} octave{'' if moved[name] == 1 else 's'}" for name in ("SP", "µP")}
    print(
        f"\nAcross widths {widths[0]}–{widths[-1]} the optimal lr moved by {octaves['SP']} in SP "
        f"({path['SP']}) and by {octaves['µP']} in µP ({path['µP']})."
    )
    e0 = best["µP", base]  # = SP's optimum at the base width: the two models are identical there
    j = log2_lrs.index(e0)
    wide = widths[-1]
    print(
        f"Reusing the lr tuned at width {base} (2^{e0}) at width {wide}: "
        f"SP loss {results['SP', wide][j]:.3f}, µP loss {results['µP', wide][j]:.3f} "
        f"(SP needs a new sweep at width {wide} to reach {min(results['SP', wide]):.3f} at 2^{best['SP', wide]})."
    )
    if moved["µP"] <= 1 and moved["SP"] >= 2:
        print(
            "As expected: µP's optimum stays within one grid step while SP's drifts with width, "
            "so with µP you can tune on the small model and train the big one with the same lr."
        )
    else:
        print(
            "Note: this run does not show the usual picture (µP moves ≤ 1 grid step, SP ≥ 2); "
            "neighbouring lrs can have near-equal losses, so try another --seed."
        )
    print(f"\nTotal runtime: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
