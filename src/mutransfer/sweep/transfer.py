"""`mutransfer transfer RUN --width W`: train the target with the proxy's optimum, µP vs SP.

The µP target gets the µP optimum found at the proxy width (the smallest swept width); for
comparison the SP target gets the SP optimum from the same proxy width — what one would do
without µP. The cost ratio is the sweep's total training time over one µP target run.
"""
from __future__ import annotations

import json
import math
import time
from typing import Optional

from .analysis import load_results, transferred_hparams
from .objective import Scale
from .runner import Sweep


def transfer(sweep: Sweep, width: Optional[int] = None) -> dict:
    width = width or sweep.config.target_width or max(sweep.config.widths)
    if width < 1:
        raise ValueError(f"--width must be positive, got {width}")
    results = load_results(sweep)
    proxy = min(sweep.config.widths)
    out: dict = {"target_width": width, "proxy_width": proxy, "seeds": sweep.config.seeds}
    for p in sweep.config.parametrizations:
        hp = transferred_hparams(sweep, results, proxy, p)
        if hp is None:
            raise ValueError(f"{sweep.run_dir}: no finished {p} trial at the proxy width {proxy}; run the sweep first")
        start = time.perf_counter()
        losses = [float(sweep.objective(dict(hp), Scale(width, sweep.config.base_width, p, seed)))
                  for seed in sweep.config.seeds]
        seconds = time.perf_counter() - start
        loss = sum(losses) / len(losses)
        out[p] = {"hparams": hp, "loss": loss if math.isfinite(loss) else None, "seconds": seconds}
    sweep_seconds = sum(r.seconds for r in results)
    if "mup" in out and out["mup"]["seconds"] > 0:
        out["cost_ratio"] = sweep_seconds / out["mup"]["seconds"]
    out["sweep_seconds"] = sweep_seconds
    (sweep.run_dir / "transfer.json").write_text(json.dumps(out, indent=1))
    return out


def format_transfer(out: dict) -> str:
    lines = [f"transfer from width {out['proxy_width']} to width {out['target_width']}:"]
    for p, label in (("mup", "µP target, µP proxy optimum"), ("sp", "SP target, SP proxy optimum")):
        if p in out:
            loss = "diverged" if out[p]["loss"] is None else f"{out[p]['loss']:.4f}"
            lr = out[p]["hparams"].get("lr")
            lines.append(f"  {label:<30} loss {loss}" + (f"  (lr {lr:.3g})" if lr is not None else "")
                         + f"  {out[p]['seconds']:.1f} s")
    if "cost_ratio" in out:
        lines.append(f"  sweep compute / one target run: {out['cost_ratio']:.1f}× "
                     f"({out['sweep_seconds']:.0f} s over {out['mup']['seconds']:.1f} s)")
    return "\n".join(lines)
