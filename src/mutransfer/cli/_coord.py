"""`mutransfer coord-check`: the coordinate check of a recipe or of the user's own model factory."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import UsageError
from ..rules import DEFAULT_OPTIMIZER, OPTIMIZERS, check_depth_alpha
from ._common import EXIT_FAIL, EXIT_PASS, device


def add_parsers(sub) -> None:
    """Add this group's subcommands to the `mutransfer` parser's subparsers `sub`."""
    c = sub.add_parser(
        "coord-check",
        help="coordinate check with a pass/fail verdict and a plot",
        description="Train a few steps at several widths and check that no activation grows "
        "with width. Exit 0 on PASS, 1 on FAIL, 2 on bad arguments, 130 on Ctrl-C.",
    )
    c.add_argument(
        "factory", nargs="?", help="module:function (or path/to/file.py:function) returning the model at a given width"
    )
    c.add_argument("--recipe", help="built-in model instead of a factory: mlp, cnn, gpt or resmlp")
    c.add_argument(
        "--data",
        help="module:function returning a list of (inputs, targets) batches "
        "(default for a factory: its module's coord_check_data())",
    )
    c.add_argument("--widths", help="comma-separated widths (default: the recipe's; 64,128,256,512,1024)")
    c.add_argument("--base-width", type=int, help="µP base width (default: the smallest width)")
    c.add_argument(
        "--depths",
        help="comma-separated depths: check across depth at one width instead (the "
        "factory is then called as factory(width, depth); recipes gpt, resmlp)",
    )
    c.add_argument("--width", type=int, help="the width of a check across depth (default: the base width)")
    c.add_argument("--base-depth", type=int, help="µP base depth (default: the smallest depth)")
    c.add_argument(
        "--depth-alpha", type=float, default=1.0, help="depth scaling: 1 CompleteP (default), 0.5 Depth-µP, 0 off"
    )
    c.add_argument(
        "--optimizer",
        default=DEFAULT_OPTIMIZER,
        help=f"{', '.join(OPTIMIZERS)} (default {DEFAULT_OPTIMIZER}, as mt.coord_check)",
    )
    c.add_argument("--lr", type=float, help="base learning rate (default: the recipe's for the optimizer)")
    c.add_argument("--eps", type=float, help="Adam's ε at base width (default torch's 1e-8); µP scales it per group")
    c.add_argument("--steps", type=int, default=4, help="training steps per width and seed (default 4)")
    c.add_argument(
        "--seeds",
        type=int,
        default=3,
        help="seeds (initializations) per width; the verdict fits every (width, seed) point (default 3)",
    )
    c.add_argument(
        "--parametrization",
        choices=("mup", "sp"),
        default="mup",
        help="check the model in µP (mup, default) or as it is, in standard parametrization (sp)",
    )
    c.add_argument("--max-growth", type=float, default=1.5, help="allowed growth per 16× width (default 1.5)")
    c.add_argument("--out", default="coord-check", help="directory for the plot, CSV and JSON (default ./coord-check)")
    c.add_argument(
        "--device",
        default="auto",
        help="where the models train: auto (CUDA when present, else the CPU; default), cpu, cuda or cuda:N",
    )
    c.add_argument(
        "--precision",
        default="fp32",
        help="what the training steps run in: fp32 (default), bf16 (autocast) or fp8 (a simulation of FP8 "
        "matmuls: E4M3 operands, E5M2 gradients)",
    )
    c.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    c.set_defaults(handler=_coord_check)


def _coord_check(args) -> int:
    import torch

    import mutransfer as mt

    from ..recipes import get_recipe
    from ..rules import optimizer_family

    if (args.factory is None) == (args.recipe is None):
        raise UsageError("give either a factory (module:function) or --recipe mlp|cnn|gpt")
    try:
        family = optimizer_family(args.optimizer)
    except ValueError as e:
        raise UsageError(str(e)) from None
    for name in ("steps", "seeds"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be at least 1")
    if not args.max_growth > 1:
        raise UsageError("--max-growth must be greater than 1")
    args.device = device(args.device)

    if args.recipe is not None:
        try:
            recipe = get_recipe(args.recipe)
        except ValueError as e:
            raise UsageError(str(e)) from None
        build: Callable = recipe.build
        default_widths, default_lr = list(recipe.widths), recipe.lr_for(family)
        if args.depths:
            if recipe.build_depth is None:
                raise UsageError(f"recipe {recipe.name} has a fixed depth; --depths works with gpt and resmlp")
            build = recipe.build_depth
        data = recipe.data() if args.data is None else _load_data(args.data)
        label = f"recipe {recipe.name}"
    else:
        build = _load_callable(args.factory, "factory")
        default_widths, default_lr = [64, 128, 256, 512, 1024], None
        data = _load_data(args.data) if args.data else _data_next_to(args.factory)
        label = args.factory
    if args.depths:
        return _coord_check_depth(args, build, data, label, default_widths[0], default_lr)
    widths = _parse_widths(args.widths) if args.widths else default_widths
    lr = args.lr if args.lr is not None else default_lr
    if lr is None:
        raise UsageError("--lr is required with a factory (try 1e-2 for adam, 0.1 for sgd)")
    if lr <= 0:
        raise UsageError("--lr must be positive")
    base_width = args.base_width or min(widths)
    if base_width <= 0:
        raise UsageError("--base-width must be positive")

    def make_model(width: int) -> torch.nn.Module:
        return _as_requested(
            build(width),
            args,
            label,
            f"width {width}",
            lambda m: mt.parametrize(m, base=build(base_width), delta=build(2 * base_width)),
        )

    print(
        f"coordinate check: {label}, {args.parametrization}, {args.optimizer} lr={lr:g}, "
        f"widths {','.join(map(str, widths))}, {args.steps} steps × {args.seeds} seeds",
        file=sys.stderr,
    )
    return _run_check(args, make_model, widths, data, lr)


def _coord_check_depth(
    args, build: Callable, data: list, label: str, default_width: int, default_lr: float | None
) -> int:
    """`coord-check --depths`: one width, several depths, µP in width and depth relative to the base."""
    import torch

    import mutransfer as mt

    depths = _parse_widths(args.depths, "--depths")
    width = args.width or args.base_width or default_width
    base_width = args.base_width or width
    base_depth = args.base_depth or min(depths)
    lr = args.lr if args.lr is not None else default_lr
    if lr is None:
        raise UsageError("--lr is required with a factory (try 1e-2 for adam, 0.1 for sgd)")
    if lr <= 0 or width <= 0 or base_width <= 0 or base_depth <= 0:
        raise UsageError("--lr, --width, --base-width and --base-depth must be positive")
    try:
        check_depth_alpha(args.depth_alpha, "--depth-alpha")
    except ValueError as e:
        raise UsageError(str(e)) from None

    def make_model(w: int, depth: int) -> torch.nn.Module:
        return _as_requested(
            build(w, depth),
            args,
            label,
            f"width {w}, depth {depth}",
            lambda m: mt.parametrize(
                m,
                base=build(base_width, base_depth),
                delta=build(2 * base_width, base_depth),
                depth_alpha=args.depth_alpha,
            ),
        )

    alpha = f", depth_alpha={args.depth_alpha:g}" if args.parametrization == "mup" else ""
    print(
        f"coordinate check across depth: {label}, {args.parametrization}{alpha}, {args.optimizer} lr={lr:g}, "
        f"width {width}, depths {','.join(map(str, depths))}, {args.steps} steps × {args.seeds} seeds",
        file=sys.stderr,
    )
    return _run_check(args, make_model, [width], data, lr, depths=depths)


def _as_requested(model, args, label: str, where: str, to_mup: Callable):
    """The factory's model in the parametrization asked for (µP via `to_mup` unless it already is)."""
    import torch

    from .._core.spec import find_spec

    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{label} returned {type(model).__name__} for {where}, not an nn.Module")
    if find_spec(model) is not None:
        if args.parametrization == "sp":
            raise UsageError(f"{label} returns a model already in µP; --parametrization sp needs a plain model")
        return model
    if args.parametrization == "mup":
        to_mup(model)
    return model


def _run_check(args, make_model: Callable, widths: list, data: list, lr: float, depths=None) -> int:
    import mutransfer as mt

    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out}: cannot create the directory ({e.strerror})") from None
    try:
        result = mt.coord_check(
            make_model,
            widths,
            data,
            optimizer=args.optimizer,
            lr=lr,
            steps=args.steps,
            seeds=args.seeds,
            max_growth=args.max_growth,
            progress=not args.no_progress,
            depths=depths,
            eps=args.eps,
            device=args.device,
            precision=args.precision,
        )
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None
    result.to_csv(out / "coord_check.csv")
    result.to_json(out / "coord_check.json")
    plot: Path | None = out / "coord_check.png"
    try:
        result.plot(out / "coord_check.png")
    except ImportError as e:
        plot = None
        print(f"(no plot: {e})", file=sys.stderr)
    print(result)
    print(f"wrote {out / 'coord_check.csv'}, {out / 'coord_check.json'}" + (f", {plot}" if plot else ""))
    return EXIT_PASS if result.passed else EXIT_FAIL


def _parse_widths(text: str, option: str = "--widths") -> list[int]:
    try:
        widths = [int(w) for w in text.replace(" ", "").split(",") if w]
    except ValueError:
        raise UsageError(f"{option} must be comma-separated integers, got '{text}'") from None
    try:
        from ..coord import check_widths

        return check_widths(widths, option)
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None


def _load_module(spec: str, what: str):
    """Import `spec`'s module part (a dotted module name or a path to a .py file); UsageError if not."""
    from .._core.loading import load_module

    try:
        return load_module(spec, what)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _load_callable(spec: str, what: str) -> Callable:
    from .._core.loading import load_callable

    try:
        return load_callable(spec, what)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _load_data(spec: str) -> list:
    return _call_data(_load_callable(spec, "--data"), spec)


def _data_next_to(factory: str) -> list:
    module = _load_module(factory, "factory")
    fn = getattr(module, "coord_check_data", None)
    if not callable(fn):
        raise UsageError(
            f"no data for {factory}: pass --data module:function, or define coord_check_data() "
            f"returning a list of (inputs, targets) batches in {module.__name__}"
        )
    return _call_data(fn, f"{module.__name__}.coord_check_data")


def _call_data(fn: Callable, label: str) -> list:
    data = fn()
    if isinstance(data, tuple) and len(data) == 2:
        data = [data]
    if not isinstance(data, list) or not data:
        raise UsageError(f"{label} must return a non-empty list of (inputs, targets) batches")
    return data
