"""`mutransfer export`: a µP checkpoint as the plain model, every µP constant folded into its weights."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ._common import EXIT_PASS, existing_file


def add_parsers(sub) -> None:
    """Add this group's subcommands to the `mutransfer` parser's subparsers `sub`."""
    e = sub.add_parser(
        "export",
        help="write the plain model of a µP checkpoint (µP's constants folded into weights)",
        description="Rebuild the µP model with BUILD (a function returning it parametrized exactly "
        "as in training), load CHECKPOINT into it, fold every µP forward constant into the "
        "weights (mt.export) and write the plain model: save_pretrained for a Hugging Face "
        "model (OUT is a directory), else its state_dict with torch.save (OUT is a file). "
        "The result loads into the plain class with the same outputs. Exit 0 when "
        "written, 2 on bad arguments or a model that cannot be made plain, 130 on Ctrl-C.",
    )
    e.add_argument(
        "checkpoint", help="a torch.save file: a state_dict, or a dict holding it under 'model' or 'state_dict'"
    )
    e.add_argument(
        "--build",
        required=True,
        help="module:function or path/to/file.py:function returning the µP "
        "model (built and mt.parametrize'd as in training)",
    )
    e.add_argument("--out", required=True, help="output directory (Hugging Face) or file")
    e.add_argument(
        "--untie",
        action="store_true",
        help="give a tied readout its own weight when no norm can take its multiplier (see mt.export)",
    )
    e.set_defaults(handler=_export)


def _export(args) -> int:
    import torch

    from .._core.export import export
    from .._core.loading import load_callable
    from .._core.spec import find_spec

    ckpt_path = existing_file(args.checkpoint, "checkpoint")
    try:
        build = load_callable(args.build, "--build")
        model = build()
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not isinstance(model, torch.nn.Module) or find_spec(model) is None:
        raise UsageError(
            f"--build {args.build} returned {type(model).__name__}, not a model put in µP by "
            "mt.parametrize; return the model parametrized exactly as in training"
        )
    try:
        state = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UsageError(f"checkpoint {ckpt_path}: cannot load it with torch.load ({type(e).__name__}: {e})") from None
    if isinstance(state, dict):
        state = next((state[k] for k in ("model", "state_dict") if isinstance(state.get(k), dict)), state)
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as e:
        raise UsageError(f"checkpoint {ckpt_path} does not fit the model --build returns: {e}") from None
    try:
        plain = export(model, untie=args.untie)
    except ValueError as e:
        raise UsageError(str(e)) from None
    out = Path(args.out)
    if hasattr(plain, "save_pretrained"):
        plain.save_pretrained(out)  # type: ignore[operator]  # a Hugging Face model's method
        print(f"exported (save_pretrained): {out}; load it with from_pretrained")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        from .._core.atomic import atomic_path

        with atomic_path(out) as tmp:
            torch.save(plain.state_dict(), tmp)
        print(f"exported state_dict: {out}; load it into the plain {type(plain).__name__}")
    return EXIT_PASS
