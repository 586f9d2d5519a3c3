"""The `mutransfer` command. Exit codes: 0 success/pass, 1 check failed, 2 bad arguments,
130 interrupted (Ctrl-C)."""

from __future__ import annotations

import argparse
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from .errors import UsageError
from .rules import DEFAULT_OPTIMIZER, OPTIMIZERS, check_depth_alpha

__all__ = ["main"]

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)  # exits with 2 on unknown flags
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.handler(args)
    except UsageError as e:
        print(f"mutransfer {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:
        if argv is None:  # the command itself, about to exit: a second Ctrl-C must not add a traceback.
            # Called in-process (main([...]): tests, scripts), SIGINT is left as it was: an ignored
            # SIGINT would be inherited by every process started afterwards.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(_interrupted_line(args, e), file=sys.stderr)
        return EXIT_INTERRUPTED


def _interrupted_line(args, e: KeyboardInterrupt) -> str:
    """'interrupted: N trials done, rerun to resume' for a sweep (N: finished trials of the whole
    sweep), plain 'interrupted' for the other commands."""
    finished = getattr(e, "finished", None)  # a SweepInterrupted from run_sweep counts them
    if finished is None:
        run = {
            "sweep": lambda: Path(args.run) if args.run else Path("runs") / Path(args.config).stem,
            "demo": lambda: Path(args.out) / "run",
            "worker": lambda: Path(args.run),
        }.get(args.command)
        if run is None:
            return "interrupted"
        finished = 0
        if (run() / "config.toml").is_file():
            try:
                from .sweep import Sweep

                finished = Sweep(run(), storage=getattr(args, "storage", None)).finished()
            except Exception:  # the count is a courtesy; the line must be printed whatever happens
                pass
    return f"interrupted: {finished} trials done, rerun to resume"


def _version() -> str:
    from . import __version__  # the package's own string: importlib.metadata would cost 0.1 s per call

    return __version__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mutransfer", description="µP and µTransfer for PyTorch")
    p.add_argument("--version", action="version", version=f"mutransfer {_version()}", help="print the version and exit")
    sub = p.add_subparsers(dest="command")
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
    c.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    c.set_defaults(handler=_coord_check)

    s = sub.add_parser(
        "sweep",
        help="run (or resume) a hyperparameter sweep on proxy models",
        description="Run the sweep described by a TOML config; rerunning the same command "
        "resumes it. A trial whose objective raises is recorded as failed (traceback "
        "in RUN/failures) and the sweep goes on. Exit 0 when every trial is done "
        "(failed ones included: the last line says how many), 1 when trials are "
        "left unfinished or none completed (every one failed or diverged: no result), "
        "2 on a bad config, objective or storage, 130 on Ctrl-C (rerun to resume).",
    )
    s.add_argument("config", help="sweep config (TOML); relative paths in it resolve against its directory")
    s.add_argument("--run", help="run directory (default: runs/<config name>)")
    s.add_argument(
        "--workers",
        type=int,
        help="local CPU worker processes, this one included (default 1; on GPUs "
        "the workers are devices × trials-per-device)",
    )
    s.add_argument(
        "--devices",
        help="auto (every visible GPU, else the CPU), cpu, or GPU ids like 0,1,2,3: one worker "
        "per GPU (× --trials-per-device), each seeing only its GPU (default: the "
        "config's devices, else auto)",
    )
    s.add_argument(
        "--trials-per-device",
        type=int,
        help="workers per GPU (several small proxies may share one; default: the config's, else 1)",
    )
    s.add_argument(
        "--threads", type=int, help="torch CPU threads per worker (default: the cores split between the workers)"
    )
    s.add_argument("--storage", help="Optuna storage URL (default: sqlite file in the run directory)")
    s.add_argument(
        "--cluster",
        choices=("slurm", "local"),
        help="submit the workers as a job array through submitit (overrides [cluster] backend)",
    )
    s.add_argument("--jobs", type=int, help="cluster: array tasks (overrides [cluster] jobs)")
    s.add_argument("--gpus-per-job", type=int, help="cluster: GPUs per task (overrides [cluster] gpus_per_job)")
    s.add_argument("--partition", help="cluster: Slurm partition (overrides [cluster] partition)")
    s.add_argument("--time-min", type=int, help="cluster: minutes per task (overrides [cluster] time_min)")
    s.add_argument(
        "--detach",
        action="store_true",
        help="cluster: return once the jobs are submitted (watch with `mutransfer status RUN`)",
    )
    s.add_argument(
        "--retry-failed",
        action="store_true",
        help="run every failed trial (the objective raised) once more with the same hyperparameters",
    )
    s.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    s.set_defaults(handler=_sweep)

    w = sub.add_parser(
        "worker",
        help="join a sweep as one more worker (any machine that reaches its storage)",
        description="Join a running sweep as one more worker: claim trials, train them and record "
        "the losses until none is left (waiting up to --wait seconds for `mutransfer "
        "sweep` to create it). On another machine, pass the sweep's name with --storage "
        "(or MUTRANSFER_STORAGE): the config is fetched from the storage. A trial whose "
        "objective raises is recorded as failed and the worker goes on. Exit 0 when no "
        "trial is left, 2 on a bad run directory, storage or objective, 130 on Ctrl-C "
        "(its running trial is queued again).",
    )
    w.add_argument(
        "run",
        help="the sweep's run directory (holding config.toml); or, with --storage or "
        "MUTRANSFER_STORAGE, the sweep's name (its `name` key): the config is then fetched "
        "from the storage into a directory of that name under the current directory",
    )
    w.add_argument("--storage", help="storage URL (or env MUTRANSFER_STORAGE); default: the run's own")
    w.add_argument(
        "--wait",
        type=float,
        default=120.0,
        help="seconds to wait for the sweep to be created by `mutransfer sweep` (default 120)",
    )
    w.add_argument(
        "--device", default="auto", help="auto (CUDA when visible, else the CPU), cpu, cuda or cuda:N (default auto)"
    )
    w.add_argument("--threads", type=int, help="torch CPU threads (default torch's)")
    w.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    w.set_defaults(handler=_worker)

    st = sub.add_parser(
        "status",
        help="a sweep's trials per study (done/running/failed/pending) and its jobs",
        description="Print, for each study of the sweep, how many trials are done, running, failed "
        "and pending, and for a sweep submitted to a cluster the state of its jobs. Exit 0 when "
        "printed, 2 on a bad run directory or storage, 130 on Ctrl-C.",
    )
    st.add_argument("run", help="run directory")
    st.add_argument("--storage", help="storage URL (default: the run's own)")
    st.set_defaults(handler=_status)

    ca = sub.add_parser(
        "cancel",
        help="cancel the cluster jobs of a sweep (its running trials rerun on resume)",
        description="Cancel the jobs a cluster sweep submitted (scancel; local: stop the processes). "
        "Trials they were running go stale and run again when the sweep is resumed. "
        "Exit 0 when cancelled, 2 on a run directory without jobs, 130 on Ctrl-C.",
    )
    ca.add_argument("run", help="run directory")
    ca.set_defaults(handler=_cancel)

    r = sub.add_parser(
        "report",
        help="write report.html, plots and transferred.json for a sweep",
        description="Analyse a sweep's finished trials (it may still be running) and write "
        "RUN/report.html with its plots, summary.json and transferred.json (the "
        "hyperparameters to use at the target). Exit 0 when the report is written, "
        "2 on a bad run directory or storage or a sweep without results, "
        "130 on Ctrl-C.",
    )
    r.add_argument("run", help="run directory")
    r.add_argument("--storage", help="storage URL (default: the run's own)")
    r.set_defaults(handler=_report)

    t = sub.add_parser(
        "transfer",
        help="train the target with the proxy's optimum (µP) and compare with SP",
        description="Train the target model (--width, --depth) once with the µP proxy's best "
        "hyperparameters transferred as they are, and with SP's, and print both losses "
        "(recorded in RUN/transfer.json and the report). Exit 0 when the target was "
        "trained, 2 on a bad run directory, storage or target, or a sweep without "
        "results, 130 on Ctrl-C.",
    )
    t.add_argument("run", help="run directory")
    t.add_argument(
        "--width",
        type=int,
        help="target width, at least the proxy's (the smallest swept width; "
        "default: the config's target_width or largest width)",
    )
    t.add_argument(
        "--depth",
        type=int,
        help="target depth for a sweep over depths, at least the proxy's (default: "
        "the config's target_depth or largest depth)",
    )
    t.add_argument(
        "--batch-size",
        type=int,
        help="the target's batch size, passed to the objective as hparams['batch_size'] (default: the proxy's)",
    )
    t.add_argument(
        "--steps",
        type=int,
        help="the target's training steps, passed to the objective as hparams['steps'] (default: the proxy's)",
    )
    t.add_argument("--storage", help="storage URL (default: the run's own)")
    t.add_argument(
        "--device",
        help="where the target trains: auto (CUDA when present), cpu, cuda or cuda:N (default: the sweep's own)",
    )
    t.set_defaults(handler=_transfer)

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

    d = sub.add_parser(
        "demo",
        help="LR sweep of a byte-level GPT at 4 widths, SP vs µP, report and transfer",
        description="Reproduces TP5's headline figure on a laptop (about 5 minutes on 2 cores). "
        "Rerunning resumes. Exit 0 when done, 2 on bad arguments, 130 on Ctrl-C "
        "(rerun to resume).",
    )
    d.add_argument("--out", default="mutransfer-demo", help="output directory (default ./mutransfer-demo)")
    d.add_argument("--quick", action="store_true", help="widths 32, 128, 256 and 6 lrs (about 2 minutes)")
    d.add_argument("--workers", type=int, default=2, help="local worker processes (default 2)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    d.add_argument(
        "--device",
        default="auto",
        help="where the sweeps and the target train: auto (CUDA when present, else the CPU; default), cpu, "
        "or comma-separated GPU ids such as 0,1",
    )
    d.set_defaults(handler=_demo)
    return p


def _demo(args) -> int:
    from .sweep.demo import format_summary, run_demo

    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    devices = _devices(args.device)
    try:
        result = run_demo(
            args.out, quick=args.quick, workers=args.workers, progress=not args.no_progress, devices=devices
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(format_summary(result))
    return EXIT_PASS


def _device(text: str, what: str = "--device"):
    """--device as a torch.device (auto: CUDA when present); a usage error naming the option when bad."""
    from ._core.devices import resolve_device

    try:
        return resolve_device(text, what)
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None


def _devices(text: str, what: str = "--device"):
    """--device of a sweep: "auto", "cpu" or comma-separated GPU ids (a list of ints, each checked to be
    visible without initialising CUDA); a usage error naming the option otherwise."""
    if text in ("auto", "cpu"):
        return text
    try:
        ids = [int(i) for i in text.replace(" ", "").split(",") if i]
    except ValueError:
        ids = []
    if not ids or any(i < 0 for i in ids):
        raise UsageError(f"{what} must be 'auto', 'cpu' or comma-separated GPU ids such as 0,1; got '{text}'")
    for i in ids:
        _device(f"cuda:{i}", what)
    return ids


def _existing_file(path: str, what: str) -> Path:
    """`path` as a Path; a usage error naming it when there is no such file."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{what} {p} not found")
    return p


def _export(args) -> int:
    import torch

    from ._core.export import export
    from ._core.loading import load_callable
    from ._core.spec import find_spec

    ckpt_path = _existing_file(args.checkpoint, "checkpoint")
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
        plain.save_pretrained(out)
        print(f"exported (save_pretrained): {out}; load it with from_pretrained")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(plain.state_dict(), out)
        print(f"exported state_dict: {out}; load it into the plain {type(plain).__name__}")
    return EXIT_PASS


def _open_sweep(args):
    from .sweep import Sweep

    try:
        return Sweep(args.run, storage=args.storage)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _report(args) -> int:
    from .sweep.report import write_report

    sweep = _open_sweep(args)
    try:
        path = write_report(sweep)
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(f"report: {path}")
    return EXIT_PASS


def _transfer(args) -> int:
    from .sweep.transfer import format_transfer, transfer

    sweep = _open_sweep(args)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            out = transfer(
                sweep,
                args.width,
                args.depth,
                args.batch_size,
                args.steps,
                device=None if args.device is None else _device(args.device),
            )
    except ValueError as e:
        raise UsageError(str(e)) from None
    for w in caught:
        print(f"mutransfer transfer: warning: {w.message}", file=sys.stderr)
    print(format_transfer(out))
    return EXIT_PASS


# --------------------------------------------------------------------------- sweep


def _sweep(args) -> int:
    from .sweep import run_sweep
    from .sweep.storage import mask_url

    config = _existing_file(args.config, "config file")
    run_dir = Path(args.run) if args.run else Path("runs") / config.stem
    for name in ("workers", "trials_per_device", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    overrides = {
        key: value
        for key, value in (
            ("backend", args.cluster),
            ("jobs", args.jobs),
            ("gpus_per_job", args.gpus_per_job),
            ("partition", args.partition),
            ("time_min", args.time_min),
        )
        if value is not None
    }
    try:
        if args.devices is not None:
            from .sweep.placement import parse_devices

            args.devices = parse_devices(args.devices, "--devices")
        if overrides or args.detach or _has_cluster_table(config):
            return _sweep_on_cluster(args, config, run_dir, overrides)
        sweep = run_sweep(
            config,
            run_dir,
            workers=args.workers,
            storage=args.storage,
            progress=not args.no_progress,
            retry_failed=args.retry_failed,
            devices=args.devices,
            trials_per_device=args.trials_per_device,
            threads=args.threads,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    finished, total, failed = sweep.finished(), sweep.total_trials(), sweep.failed()
    completed = sweep.completed()
    how_many = "every one" if failed == finished else str(failed)
    failures = (
        f", {how_many} failed (tracebacks in {sweep.run_dir / 'failures'}; fix the cause, then rerun with "
        "--retry-failed)"
        if failed
        else ""
    )
    pruned = sweep.pruned()
    failures = (f", {pruned} of them pruned" if pruned else "") + failures
    useless = finished >= total and completed == 0  # every trial failed, diverged or was pruned
    if useless:
        failures += ": no trial completed, so there is no result"
    print(
        f"sweep {sweep.config.name}: {finished}/{total} trials done{failures}, storage {mask_url(sweep.url)}, "
        f"run directory {sweep.run_dir}"
    )
    return EXIT_PASS if finished >= total and not useless else EXIT_FAIL


def _has_cluster_table(config: Path) -> bool:
    from .sweep import load_config

    return load_config(config).cluster is not None


def _sweep_on_cluster(args, config: Path, run_dir: Path, overrides: dict) -> int:
    from .sweep.cluster import run_cluster

    if args.workers is not None:
        raise UsageError(
            "--workers is for sweeps on this machine; a cluster sweep runs [cluster] jobs × its GPUs "
            "(--jobs, --gpus-per-job, [cluster] trials_per_device)"
        )
    try:
        sweep, run, ok = run_cluster(
            config,
            run_dir,
            storage=args.storage,
            overrides=overrides,
            detach=args.detach,
            progress=not args.no_progress,
            retry_failed=args.retry_failed,
            devices=args.devices,
            threads=args.threads,
        )
    except KeyboardInterrupt:
        print(
            f"stopped watching; the jobs go on: `mutransfer status {run_dir}`, `mutransfer cancel {run_dir}`",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if ok is None:
        print(f"detached: watch with `mutransfer status {run_dir}`, stop with `mutransfer cancel {run_dir}`")
        return EXIT_PASS
    finished, total = sweep.finished(), sweep.total_trials()
    print(
        f"sweep {sweep.config.name}: {finished}/{total} trials done, {sweep.failed()} failed, "
        f"{len(run.job_ids)} {run.backend} job(s), run directory {sweep.run_dir}"
    )
    if not ok:
        print(
            f"the jobs ended with {total - finished} trial(s) left; rerun the same command to resume", file=sys.stderr
        )
    return EXIT_PASS if ok else EXIT_FAIL


def _status(args) -> int:
    from .sweep import Sweep
    from .sweep.cluster import CLUSTER_FILE, ClusterRun, status_lines

    try:
        sweep = Sweep(args.run, storage=args.storage)
        run = ClusterRun(args.run) if (Path(args.run) / CLUSTER_FILE).is_file() else None
        print("\n".join(status_lines(sweep, run)))
    except ValueError as e:
        raise UsageError(str(e)) from None
    return EXIT_PASS


def _cancel(args) -> int:
    from .sweep.cluster import ClusterRun, cancel

    try:
        run = ClusterRun(args.run)
    except ValueError as e:
        raise UsageError(str(e)) from None
    ids = cancel(run)
    print(
        f"cancelled {len(ids)} {run.backend} job(s){': ' + ', '.join(ids) if ids else ''}; their running trials "
        f"run again when the sweep is resumed (`mutransfer sweep CONFIG --run {args.run}`)"
    )
    return EXIT_PASS


def _worker(args) -> int:
    from .sweep import Sweep

    try:
        if args.threads is not None and args.threads < 1:
            raise ValueError("--threads must be at least 1")
        sweep = Sweep(args.run, storage=args.storage, wait=args.wait)
        sweep.use_device(args.device, "--device")
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        _ = sweep.objective  # loaded before any trial: a broken objective fails here
        sweep.wait_prepared(args.wait)
    except ValueError as e:
        raise UsageError(str(e)) from None
    n = sweep.work(progress=not args.no_progress)
    print(f"worker done: {n} trial(s) run here", file=sys.stderr)
    return EXIT_PASS


# --------------------------------------------------------------------------- coord-check


def _coord_check(args) -> int:
    import torch

    import mutransfer as mt

    from .recipes import get_recipe
    from .rules import optimizer_family

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
    args.device = _device(args.device)

    if args.recipe is not None:
        try:
            recipe = get_recipe(args.recipe)
        except ValueError as e:
            raise UsageError(str(e)) from None
        build, default_widths, default_lr = recipe.build, list(recipe.widths), recipe.lr_for(family)
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

    from ._core.spec import find_spec

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
        )
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None
    result.to_csv(out / "coord_check.csv")
    result.to_json(out / "coord_check.json")
    plot = out / "coord_check.png"
    try:
        result.plot(plot)
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
        from .coord import check_widths

        return check_widths(widths, option)
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None


def _load_module(spec: str, what: str):
    """Import `spec`'s module part (a dotted module name or a path to a .py file); UsageError if not."""
    from ._core.loading import load_module

    try:
        return load_module(spec, what)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _load_callable(spec: str, what: str) -> Callable:
    from ._core.loading import load_callable

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


if __name__ == "__main__":
    sys.exit(main())
