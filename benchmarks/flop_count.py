"""What counting a sweep trial's FLOPs (`mutransfer.sweep.flops.FlopCount`) costs, and how right it is, in one run.

The built-in recipe `train_gpt` (µP, 2 layers, 4 heads, batch 16 × 32 tokens, 150 steps, one torch
thread) at widths 32 and 128. Rounds interleave a run without counting, one under `FlopCount()` (its
default sample), one under `FlopCount(first=...)` (I_0 reused from an earlier seed, as a trial's later
seeds do) and one under `FlopCount(exact=True)` (every op counted); the best process CPU time of each over
the rounds gives the overhead. Printed per width: the overheads, the sampled estimate's error against
the full count, and the full count against the analytic one (`analytic_gpt_flops`).

    python benchmarks/flop_count.py                  # widths 32 and 128, 3 rounds
    python benchmarks/flop_count.py --quick          # width 32, 30 steps, 1 round
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from mutransfer.sweep.flops import FlopCount
from mutransfer.sweep.recipes import train_gpt
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


def run(width: int, hp: dict, counter: FlopCount | None) -> tuple[float, Ticks]:
    """CPU seconds of one run (under `counter` when given), and its ticks."""
    scale = Scale(width, 32, "mup", 0)
    start = time.process_time()
    with contextlib.ExitStack() as stack:
        if counter is not None:
            stack.enter_context(counter)
        ticks = stack.enter_context(Ticks())
        train_gpt(dict(hp), scale)
    return time.process_time() - start, ticks


def paired(ticks: Ticks, plain_first: float, plain: float) -> float:
    """The overhead (%) from one run's own intervals: each counted step interval's excess over the median
    uncounted one, plus I_0's excess over the plain runs' fastest I_0 — against the plain run's time."""
    uncounted = statistics.median(ticks.steps(False))
    excess = sum(t - uncounted for t in ticks.steps(True)) + ticks.first() - plain_first
    return 100 * excess / plain


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", type=int, nargs="+", default=[32, 128])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="width 32, 30 steps, 1 round")
    args = p.parse_args()
    if args.quick:
        args.widths, args.steps, args.rounds = [32], 30, 1
    torch.set_num_threads(1)
    batch, seq, n_layer = 16, 32, 2
    hp = {"lr": 2**-6, "steps": args.steps, "batch_size": batch, "seq_len": seq, "n_layer": n_layer, "n_head": 4}
    run(32, {**hp, "steps": 5}, None)  # warm up (imports, first-call costs)
    rows = []
    for width in args.widths:
        times: dict[str, list[float]] = {"plain": [], "sampled": [], "reused I_0": [], "exact": []}
        ticks: dict[str, list[Ticks]] = {k: [] for k in times}
        sampled = exact = first = None
        for r in range(args.rounds):
            for kind in list(times) if r % 2 == 0 else list(reversed(times)):
                if kind == "plain":
                    counter = None
                elif kind == "sampled":
                    counter = sampled = FlopCount()
                elif kind == "reused I_0":
                    counter = first = FlopCount(first=sampled.first if sampled is not None else 0.0)
                else:
                    counter = exact = FlopCount(exact=True)
                seconds, got = run(width, hp, counter)
                times[kind].append(seconds)
                ticks[kind].append(got)
        assert sampled is not None and exact is not None and first is not None
        best = {k: min(v) for k, v in times.items()}
        plain_first = min(t.first() for t in ticks["plain"])
        within = {
            k: statistics.median(paired(t, plain_first, best["plain"]) for t in ticks[k])
            for k in ("sampled", "reused I_0")
        }
        analytic = analytic_gpt_flops(width, n_layer, seq, batch, args.steps)
        rows.append(
            (
                width,
                best["plain"],
                *(100 * (best[k] / best["plain"] - 1) for k in ("sampled", "reused I_0", "exact")),
                within["sampled"],
                within["reused I_0"],
                sampled.intervals_counted,
                sampled.total,
                100 * (sampled.total / exact.total - 1),
                100 * (first.total / exact.total - 1),
                100 * (exact.total / analytic - 1),
            )
        )
    print(
        f"train_gpt, µP, {n_layer} layers, batch {batch} × {seq}, {args.steps} steps, 1 thread; best of {args.rounds}"
    )
    print("overheads: best CPU time of each kind (noisy: ±5 % between rounds here), and in-run (paired intervals)")
    head = (
        "width  plain s  sampled %  reused I_0 %  exact %  in-run sampled %  in-run reused %  counted  "
        "total FLOPs  sampled err %  reused err %  exact vs analytic %"
    )
    print(head)
    for w, t, o1, o2, o3, p1, p2, k, total, e1, e2, e3 in rows:
        print(
            f"{w:5d}  {t:7.3f}  {o1:9.1f}  {o2:12.1f}  {o3:7.1f}  {p1:16.2f}  {p2:15.2f}  {k:7d}  {total:11.4g}  "
            f"{e1:13.3f}  {e2:12.3f}  {e3:19.3f}"
        )


if __name__ == "__main__":
    main()
