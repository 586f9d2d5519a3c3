"""The independent sampler against random and grid search of the same budget, on the demo's task.

The task is `mutransfer demo`'s proxy (recipe:gpt at width 32, µP, the demo's [fixed] settings:
150 AdamW steps, batch 16, context 32, 2 layers, 4 heads, untied readout, PyTorch's init), with
three hyperparameters: lr (log, 2^-8 … 2^-4), output_mult (log, 1 … 8, default 1) and attn_mult
(log, 1/4 … 2, default 1). Each search gets the same budget of trials:

- independent: lr's 5 points (multipliers at 1), then output_mult's 3 other points and attn_mult's
  3 other points at the best lr, then the combination: 12 trials (`mutransfer.sweep.engine.independent.plan`,
  the sweep's own logic, run in this process);
- grid: 3 lrs × 2 output_mults × 2 attn_mults (the ends of each range), 12 trials;
- random: 12 trials of Optuna's RandomSampler, for each of `--seeds` sampler seeds.

Every trial trains one model (training seed 0); a point trained twice (grid and independent share
points) is trained once and its loss reused. Printed: the best loss found after 4, 8 and 12 trials
(random: the mean over its seeds, with the worst and best seed), and each search's best point.

    python benchmarks/independent_search.py [--seeds 5] [--steps 150] [--threads 1]
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import optuna
import tomllib
import torch

from mutransfer.sweep.config.space import LogUniform
from mutransfer.sweep.engine.independent import plan
from mutransfer.sweep.recipes import train_gpt
from mutransfer.sweep.scale import Scale
from mutransfer.sweep.transfer.demo import FIXED

SPACE = {
    "lr": LogUniform(2.0**-8, 2.0**-4, 5),
    "output_mult": LogUniform(1.0, 8.0, 4, default=1.0),
    "attn_mult": LogUniform(0.25, 2.0, 4, default=1.0),
}
GRID = {"lr": [2.0**-8, 2.0**-6, 2.0**-4], "output_mult": [1.0, 8.0], "attn_mult": [0.25, 2.0]}
BUDGETS = (4, 8, 12)


class Task:
    """The demo's proxy trained at one point; each point trained once."""

    def __init__(self, steps: int, threads: int):
        self.fixed = tomllib.loads(FIXED.format(steps=steps))["fixed"]
        self.fixed["threads"] = threads
        self.cache: dict[tuple, float] = {}
        self.seconds = 0.0

    def __call__(self, point: dict) -> float:
        key = tuple(sorted(point.items()))
        if key not in self.cache:
            start = time.perf_counter()
            loss = train_gpt({**self.fixed, **point}, Scale(32, 32, "mup", 0))
            self.seconds += time.perf_counter() - start
            self.cache[key] = loss if math.isfinite(loss) else math.inf
            print(f"  {fmt(point)}: {loss:.4f}", file=sys.stderr, flush=True)
        return self.cache[key]


def fmt(point: dict) -> str:
    return ", ".join(f"{k} 2^{math.log2(v):+.2f}" for k, v in point.items())


def _distributions() -> dict:
    return {n: optuna.distributions.FloatDistribution(d.low, d.high, log=True) for n, d in SPACE.items()}


def independent(task: Task) -> list[tuple[dict, float]]:
    trials: list[optuna.trial.FrozenTrial] = []
    out: list[tuple[dict, float]] = []
    while True:
        p = plan(SPACE, trials)
        todo = p.points[len(out) :]
        if not todo:
            return out
        for point in todo:
            loss = task(point)
            out.append((point, loss))
            trials.append(
                optuna.trial.create_trial(
                    params=point,
                    distributions=_distributions(),
                    value=loss if math.isfinite(loss) else None,
                    state=optuna.trial.TrialState.COMPLETE if math.isfinite(loss) else optuna.trial.TrialState.FAIL,
                    user_attrs={} if math.isfinite(loss) else {"diverged": True},
                )
            )


def grid(task: Task) -> list[tuple[dict, float]]:
    points = [
        {"lr": lr, "output_mult": om, "attn_mult": am}
        for lr in GRID["lr"]
        for om in GRID["output_mult"]
        for am in GRID["attn_mult"]
    ]
    return [(p, task(p)) for p in points]


def random(task: Task, seed: int, n: int) -> list[tuple[dict, float]]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        trial = study.ask(_distributions())
        loss = task(dict(trial.params))
        study.tell(
            trial,
            loss if math.isfinite(loss) else None,
            state=None if math.isfinite(loss) else optuna.trial.TrialState.FAIL,
        )
        out.append((dict(trial.params), loss))
    return out


def best_after(results: list[tuple[dict, float]], k: int) -> float:
    return min(loss for _, loss in results[:k])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="random search's sampler seeds")
    ap.add_argument("--steps", type=int, default=150, help="training steps per trial (the demo's: 150)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    task = Task(args.steps, args.threads)
    start = time.perf_counter()
    ind = independent(task)
    assert len(ind) == BUDGETS[-1], len(ind)
    grd = grid(task)
    rnd = [random(task, s, BUDGETS[-1]) for s in range(args.seeds)]
    print(
        f"\nThe demo's proxy (recipe:gpt, width 32, µP, {args.steps} steps, training seed 0), lr × output_mult × attn_mult;"
    )
    print(f"best loss found after k trials ({len(task.cache)} distinct points trained, {task.seconds:.0f} s)\n")
    print("| search | " + " | ".join(f"k = {k}" for k in BUDGETS) + " | best point |")
    print("|---|" + "---|" * len(BUDGETS) + "---|")

    def row(name: str, cells: list[str], point: dict) -> None:
        print(f"| {name} | " + " | ".join(cells) + f" | {fmt(point)} |")

    row("independent", [f"{best_after(ind, k):.4f}" for k in BUDGETS], min(ind, key=lambda r: r[1])[0])
    row(
        "grid 3×2×2",
        ["—"] * (len(BUDGETS) - 1) + [f"{best_after(grd, BUDGETS[-1]):.4f}"],
        min(grd, key=lambda r: r[1])[0],
    )
    cells = []
    for k in BUDGETS:
        values = [best_after(r, k) for r in rnd]
        cells.append(f"{sum(values) / len(values):.4f} ({min(values):.4f} … {max(values):.4f})")
    overall = min((r for rs in rnd for r in rs), key=lambda r: r[1])
    row(f"random (mean of {args.seeds} seeds; best … worst)", cells, overall[0])
    every = min(task.cache.values())
    print(f"\nbest of every point trained here: {every:.4f}; total {time.perf_counter() - start:.0f} s")
    print("(grid: its order is not an anytime search, so only its full budget is shown)")


if __name__ == "__main__":
    main()
