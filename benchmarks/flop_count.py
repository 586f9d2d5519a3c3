"""What counting a sweep trial's FLOPs (`mutransfer.sweep.engine.flops.FlopCount`) costs, and how right it is, in one run.

The built-in recipe `train_gpt` (µP, 2 layers, 4 heads, batch 16 × 32 tokens, 150 steps, one torch
thread) at widths 32 and 128, plain and "recorded" (as a sweep's µP proxy trial: the monitor on and the
gradient noise scale measured after training). Rounds interleave a run without counting, one under
`FlopCount()` (its default sample), one under `FlopCount(first=...)` (I_0 reused from an earlier seed, as
a trial's later seeds do; plain runs only: later seeds record nothing) and one under
`FlopCount(exact=True)` (every op counted). Overheads two ways: the best process CPU time of each kind
over the rounds (noisy: runs differ by ±5 % here), and in-run — a run's counted parts (I_0, the counted
step intervals, the noise measurement) against the same parts uncounted, which sees a 0.5 % overhead
through that noise. Errors: the estimates against the full count, the full count against the analytic
one (`analytic_gpt_flops`; a recorded run adds the noise measurement's passes).

    python benchmarks/flop_count.py                  # widths 32 and 128, 3 rounds
    python benchmarks/flop_count.py --quick          # width 32, 30 steps, 1 round
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import time
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from mutransfer.sweep.engine.flops import FlopCount
from mutransfer.sweep.engine.recording import Recording
from mutransfer.sweep.recipes import NOISE_BATCHES, NOISE_BIG, train_gpt
from mutransfer.sweep.scale import Scale

VOCAB = 256


def analytic_gpt_flops(width: int, n_layer: int, seq: int, batch: int, steps: int, vocab: int = VOCAB) -> float:
    """The matmul FLOPs of training recipes.GPT (tied readout, no noise measurement), by hand.

    Per token and layer, forward: the four Linear layers (qkv 3d², proj d², fc 4d², fc_out 4d²) 2·12·d²;
    attention (torch's SDPA formula, causal mask ignored) QKᵀ and PV 2·2·seq·d. Backward: every Linear's
    input needs a gradient (the first one's comes from the embeddings), so 2× its forward (grad-input and
    grad-weight); SDPA's backward recomputes the scores and takes four more products: 5·2·seq·d. The
    readout (d → vocab) likewise 3·2·d·vocab. Adam's update is elementwise (nothing).
    """
    per_token = n_layer * (3 * 24 * width**2 + (4 + 10) * seq * width) + 3 * 2 * width * vocab
    return float(per_token * batch * seq * steps)


class Ticks:
    """Process CPU time at each optimizer step, and whether a `FlopCount` counts the interval that starts there
    (its hook runs before this one, registered later)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.counted: list[bool] = []

    def __enter__(self) -> Ticks:
        self.start = time.process_time()
        self.hook = register_optimizer_step_post_hook(self.tick)
        return self

    def tick(self, optimizer: object, args: object, kwargs: object) -> None:
        self.times.append(time.process_time())
        self.counted.append(isinstance(_get_current_dispatch_mode(), TorchDispatchMode))

    def __exit__(self, *exc: object) -> None:
        self.hook.remove()

    def first(self) -> float:
        """I_0's seconds: from the start to the end of the first step."""
        return self.times[0] - self.start

    def steps(self, counted: bool) -> list[float]:
        """The seconds of the step intervals that were (or were not) counted."""
        return [b - a for a, b, c in zip(self.times, self.times[1:], self.counted) if c == counted]


NOISE_SECONDS = [0.0]  # CPU seconds of the last run's gradient noise measurement


class TimedRecording(Recording):
    """A sweep trial's recording whose noise measurement is timed (`NOISE_SECONDS`)."""

    def measure_noise(self, *args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return super().measure_noise(*args, **kwargs)
        finally:
            NOISE_SECONDS[0] = time.process_time() - start


def run(width: int, hp: dict, counter: FlopCount | None, recorded: bool) -> tuple[float, Ticks, float]:
    """CPU seconds of one run (under `counter` when given; `recorded`: as a sweep's µP proxy trial that
    records its trajectory and measures the noise scale), its ticks and its noise measurement's seconds."""
    scale = Scale(width, 32, "mup", 0)
    rec = TimedRecording(hp["steps"], noise=True, guarded=True) if recorded else None
    if rec is not None:
        scale = dataclasses.replace(scale, _recording=rec)
    NOISE_SECONDS[0] = 0.0
    start = time.process_time()
    with contextlib.ExitStack() as stack:
        if counter is not None:
            stack.enter_context(counter)
        ticks = stack.enter_context(Ticks())
        train_gpt(dict(hp), scale)
    seconds = time.process_time() - start
    if rec is not None:
        rec.close()
    return seconds, ticks, NOISE_SECONDS[0]


def paired(ticks: Ticks, noise: float, plain_first: float, plain_noise: float, plain: float) -> float:
    """The overhead (%) from one run's own parts: each counted step interval's excess over the median
    uncounted one, I_0's and the noise measurement's excess over the plain runs' (their median) — against the
    plain run's time."""
    uncounted = statistics.median(ticks.steps(False))
    excess = sum(t - uncounted for t in ticks.steps(True)) + ticks.first() - plain_first + noise - plain_noise
    return 100 * excess / plain


def measure(width: int, hp: dict, rounds: int, recorded: bool) -> dict[str, Any]:
    """One width's row: best CPU times and in-run overheads of each kind, the estimates' errors."""
    kinds = ["plain", "sampled", "exact"] if recorded else ["plain", "sampled", "reused I_0", "exact"]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    parts: dict[str, list[tuple[Ticks, float]]] = {k: [] for k in kinds}
    counts: dict[str, FlopCount] = {}
    for r in range(rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            counter = None
            if kind == "sampled":
                counter = FlopCount()
            elif kind == "reused I_0":
                counter = FlopCount(first=counts["sampled"].first if "sampled" in counts else 0.0)
            elif kind == "exact":
                counter = FlopCount(exact=True)
            seconds, ticks, noise = run(width, hp, counter, recorded)
            if counter is not None:
                counts[kind] = counter
            times[kind].append(seconds)
            parts[kind].append((ticks, noise))
    best = {k: min(v) for k, v in times.items()}
    plain_first = statistics.median(t.first() for t, _ in parts["plain"])
    plain_noise = statistics.median(n for _, n in parts["plain"])
    exact = counts["exact"].total
    steps = analytic_gpt_flops(width, hp["n_layer"], hp["seq_len"], hp["batch_size"], hp["steps"])
    passes = NOISE_BATCHES * NOISE_BIG + NOISE_BIG  # chunks of one batch, and the first batch once whole
    analytic = steps * (1 + passes / hp["steps"]) if recorded else steps
    row: dict[str, Any] = {"width": width, "recorded": recorded, "plain": best["plain"]}
    for k in kinds[1:]:
        row[f"best {k}"] = 100 * (best[k] / best["plain"] - 1)
    for k in kinds[1:-1]:
        row[f"in-run {k}"] = statistics.median(
            paired(t, n, plain_first, plain_noise, best["plain"]) for t, n in parts[k]
        )
        row[f"err {k}"] = 100 * (counts[k].total / exact - 1)
    row["counted"] = counts["sampled"].intervals_counted
    row["total"] = counts["sampled"].total
    row["vs analytic"] = 100 * (exact / analytic - 1)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", type=int, nargs="+", default=[32, 128])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-recorded", action="store_true", help="leave out the recorded (monitor + noise) trials")
    p.add_argument("--quick", action="store_true", help="width 32, 30 steps, 1 round")
    args = p.parse_args()
    if args.quick:
        args.widths, args.steps, args.rounds = [32], 30, 1
    torch.set_num_threads(1)
    batch, seq, n_layer = 16, 32, 2
    hp = {"lr": 2**-6, "steps": args.steps, "batch_size": batch, "seq_len": seq, "n_layer": n_layer, "n_head": 4}
    run(32, {**hp, "steps": 5}, None, recorded=True)  # warm up (imports, first-call costs)
    rows = [
        measure(width, hp, args.rounds, recorded)
        for recorded in ([False] if args.no_recorded else [False, True])
        for width in args.widths
    ]
    print(
        f"train_gpt, µP, {n_layer} layers, batch {batch} × {seq}, {args.steps} steps, 1 thread; best of {args.rounds}. "
        "Overheads (%) from the best CPU time of each kind (noisy: ±5 % between rounds here) and in-run (each run's "
        "counted parts against the plain runs' same parts, the median over rounds); errors (%) of the estimates against the full count."
    )
    print(
        "recorded: as a sweep's µP proxy trial: the monitor on, the gradient noise measured after training "
        f"({NOISE_BATCHES * NOISE_BIG + NOISE_BIG} forward/backward passes of one batch each, in FLOPs)."
    )
    head = ["width", "recorded", "plain s"]
    head += ["best sampled", "best reused I_0", "best exact", "in-run sampled", "in-run reused I_0"]
    head += ["counted", "total FLOPs", "err sampled", "err reused I_0", "exact vs analytic"]
    print("  ".join(head))
    keys = ["width", "recorded", "plain"] + [
        "best sampled",
        "best reused I_0",
        "best exact",
        "in-run sampled",
        "in-run reused I_0",
        "counted",
        "total",
        "err sampled",
        "err reused I_0",
        "vs analytic",
    ]
    for row in rows:
        cells = []
        for h, k in zip(head, keys):
            v = row.get(k)
            text = "-" if v is None else f"{v:.4g}" if k == "total" else f"{v:.3f}" if isinstance(v, float) else str(v)
            cells.append(text.rjust(len(h)))
        print("  ".join(cells))


if __name__ == "__main__":
    main()
