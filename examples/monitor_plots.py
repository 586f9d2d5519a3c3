"""The plots a user sees in TensorBoard/W&B from `mt.Monitor`: a healthy µP run and a broken one.

Both train the recipes' GPT (width 256, base 32) for 150 steps with warmup + cosine (to 10%) and weight decay,
sampled every 10 steps. Healthy: AdamW over `mt.param_groups`. Broken: AdamW over
`model.parameters()` (one lr for all) — the monitor's alarms are printed and marked on the plot.

    python examples/monitor_plots.py --out docs/monitor.png      # the docs' figure (≈ 4 min on a 2-core CPU)
    python examples/monitor_plots.py --quick --out /tmp/m.png    # width 64, 30 steps
"""

from __future__ import annotations

import argparse
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer.recipes import GPT

V, CTX = 256, 32


def gpt(width: int) -> GPT:
    return GPT(width, vocab=V, n_layer=2, n_head=4, ctx=CTX, tied=False, init_std=None)


def run(broken: bool, width: int, steps: int, every: int) -> mt.Monitor:
    torch.manual_seed(0)
    model = gpt(width)
    mt.parametrize(model, base=gpt(32), delta=gpt(64))
    params = model.parameters() if broken else mt.param_groups(model, lr=3e-3, optimizer="adamw", weight_decay=0.1)
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * (0.1 + 0.45 * (1 + math.cos(math.pi * s / steps)))
    )
    mon = mt.Monitor(model, opt, every=every)
    g = torch.Generator().manual_seed(1)
    text = torch.randint(0, 16, (4096,), generator=g)  # a small alphabet: the loss goes down
    for _ in range(steps):
        i = torch.randint(0, len(text) - CTX - 1, (16,), generator=g)
        x = torch.stack([text[j : j + CTX + 1] for j in i.tolist()])
        loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        mon.step(loss)
    return mon


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="monitor.png")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="width 64, 30 steps, every 10")
    a = p.parse_args()
    if a.quick:
        a.width, a.steps, a.every = 64, 30, 10
    quantities = [("dw_spec_mup", "‖ΔW‖₂ / (lr·µP factor)"), ("act_rms", "activation RMS"), ("lr", "effective lr")]
    layers = ["blocks.0.fc", "blocks.1.attn.qkv", "lm_head", "wte"]
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5), sharex=True)
    for row, broken in enumerate((False, True)):
        mon = run(broken, a.width, a.steps, a.every)
        steps = mon.trajectory()["steps"]
        for col, (q, title) in enumerate(quantities):
            ax = axes[row, col]
            for layer in layers:
                pts = [(r["step"], r["layers"][layer][q]) for r in steps if q in r["layers"].get(layer, {})]
                if pts:
                    ax.plot(*zip(*pts), marker=".", label=layer)
                if q == "lr":
                    exp = [(r["step"], r["layers"][layer]["lr_mup"]) for r in steps if "lr_mup" in r["layers"][layer]]
                    ax.plot(*zip(*exp), ls=":", color=ax.lines[-1].get_color())
            ax.set_yscale("log")
            ax.set_title(f"{'broken: AdamW(model.parameters())' if broken else 'healthy µP'} — {title}", fontsize=9)
            for alarm in mon.alarms:
                if alarm.layer in layers and alarm.what == q:
                    ax.axvline(alarm.step, color="red", lw=0.8)
                    ax.annotate("alarm", (alarm.step, alarm.measured), color="red", fontsize=8)
        print(f"{'broken' if broken else 'healthy'}: {len(mon.alarms)} alarms")
        for alarm in mon.alarms[:4]:
            print("  ", alarm)
    axes[0, 0].legend(fontsize=7)
    axes[1, 2].text(0.02, 0.02, "dotted: the lr µP expects", transform=axes[1, 2].transAxes, fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
