"""Train a µP model in a plain PyTorch loop, checkpoint it, resume it, and export it.

The whole life of a µP model in one page:

1. build the model at its real width and put it in µP relative to a small base model;
2. train with ``mt.param_groups`` (per-layer µP learning rates) and a scheduler that multiplies
   every group's lr by the same factor (LambdaLR, cosine: µP's ratios are kept);
3. checkpoint: ``model.state_dict()`` and ``opt.state_dict()``. A state_dict holds values only,
   so to resume, build the model the same way, call ``mt.parametrize`` the same way, then load —
   training continues bit for bit;
4. serve: ``mt.export(model)`` folds µP's forward constants (readout multiplier, attention
   scale, branch multipliers) into the weights; its state_dict loads into the plain class.

    python examples/train_plain.py [--steps 20] [--out runs/plain]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer._core.devices import resolve_device
from mutransfer.recipes import GPT, text_batches


def build(width: int) -> GPT:
    """The model exactly as the checkpoint expects it: same constructor, same parametrize call."""
    return mt.parametrize(GPT(width), base=GPT(32), delta=GPT(64))


def make_optimizer(model, lr: float, steps: int):
    opt = torch.optim.AdamW(mt.param_groups(model, lr=lr, optimizer="adamw", weight_decay=0.1))
    warmup = max(1, steps // 10)
    cosine = lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))  # noqa: E731
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, cosine)  # one factor for every group: ratios kept


def train(model, opt, sched, batches) -> list[float]:
    losses = []
    model.train()
    device = next(model.parameters()).device
    for x, y in batches:
        x, y = x.to(device), y.to(device)  # the batches are made on the CPU
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def load_checkpoint(path: Path, device: torch.device | str = "cpu"):
    """A checkpoint saved by this script, loaded safely: ``weights_only=True`` lets torch.load
    rebuild tensors, dicts, lists and numbers only, so a tampered file cannot run code (a pickle
    may call any function while it loads)."""
    return torch.load(path, map_location=device, weights_only=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=2**-7)
    p.add_argument("--out", default="runs/plain")
    p.add_argument("--device", default="auto", help="auto (CUDA when present, else the CPU), cpu, cuda or cuda:N")
    args = p.parse_args()
    device = resolve_device(args.device, "--device")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches = text_batches(args.steps, batch=8, seq=32, seed=0)
    half = args.steps // 2

    torch.manual_seed(0)
    model = build(args.width).to(device)  # built (and parametrized) on the CPU, trained on `device`
    opt, sched = make_optimizer(model, args.lr, args.steps)
    first = train(model, opt, sched, batches[:half])
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, out / "ckpt.pt")
    rest = train(model, opt, sched, batches[half:])

    # resume in a "new process": build, parametrize, load; then the same steps again
    ckpt = load_checkpoint(out / "ckpt.pt", device)
    resumed = build(args.width).to(device)
    resumed.load_state_dict(ckpt["model"])
    opt2, sched2 = make_optimizer(resumed, args.lr, args.steps)
    opt2.load_state_dict(ckpt["opt"])
    sched2.load_state_dict(ckpt["sched"])
    again = train(resumed, opt2, sched2, batches[half:])
    print(f"loss {first[0]:.4f} -> {rest[-1]:.4f}; resumed run identical: {again == rest}")

    plain = mt.export(model)
    torch.save(plain.state_dict(), out / "plain.pt")
    fresh = GPT(args.width).to(device)  # plain code: no mutransfer needed to load and serve it
    fresh.load_state_dict(load_checkpoint(out / "plain.pt", device))
    x = batches[0][0].to(device)
    with torch.no_grad():
        diff = (fresh.eval()(x) - model.eval()(x)).abs().max() / model(x).abs().max()
    print(f"exported to {out / 'plain.pt'}: plain GPT reproduces the µP model's logits to {float(diff):.1e} (relative)")


if __name__ == "__main__":
    main()
