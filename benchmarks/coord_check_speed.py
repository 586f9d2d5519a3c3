"""Wall time of the coordinate check on the built-in recipes (issue: GPT, 5 widths, < 60 s).

Each row runs `mt.coord_check` once, as `mutransfer coord-check --recipe NAME` does (4 steps,
3 seeds, the recipe's widths and lr), and reports the wall time, the time per (width, seed)
run and the verdict, µP and SP side by side.

    python benchmarks/coord_check_speed.py                 # mlp, cnn, gpt; adam
    python benchmarks/coord_check_speed.py --recipes gpt --optimizer sgd
"""

from __future__ import annotations

import argparse
import time

import torch

import mutransfer as mt
from mutransfer.recipes import get_recipe
from mutransfer.rules import optimizer_family


def make_factory(recipe, mup: bool):
    base = recipe.widths[0]

    def make(width):
        model = recipe.build(width)
        if mup:
            mt.parametrize(model, base=recipe.build(base), delta=recipe.build(2 * base))
        return model

    return make


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipes", default="mlp,cnn,gpt")
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    family = optimizer_family(args.optimizer)
    rows = []
    for name in args.recipes.split(","):
        recipe = get_recipe(name)
        data = recipe.data()
        for mup in (True, False):
            t0 = time.perf_counter()
            result = mt.coord_check(
                make_factory(recipe, mup),
                recipe.widths,
                data,
                optimizer=args.optimizer,
                lr=recipe.lr_for(family),
                steps=args.steps,
                seeds=args.seeds,
                progress=False,
            )
            dt = time.perf_counter() - t0
            rows.append(
                (
                    name,
                    "µP" if mup else "SP",
                    ",".join(map(str, recipe.widths)),
                    dt,
                    dt / (len(recipe.widths) * args.seeds),
                    "PASS" if result.passed else "FAIL",
                )
            )
    print(
        f"coordinate check, {args.optimizer}, {args.steps} steps × {args.seeds} seeds, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"{'recipe':<7} {'param':<5} {'widths':<22} {'wall s':>7} {'s/run':>6}  verdict")
    for name, param, widths, dt, per, verdict in rows:
        print(f"{name:<7} {param:<5} {widths:<22} {dt:>7.1f} {per:>6.2f}  {verdict}")


if __name__ == "__main__":
    main()
