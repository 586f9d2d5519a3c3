"""`mutransfer sweep | worker | status | cancel`: run a sweep here, join it from elsewhere, watch it, stop its jobs."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import UsageError
from ._common import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_PASS, existing_file


def add_parsers(sub) -> None:
    """Add this group's subcommands to the `mutransfer` parser's subparsers `sub`."""
    s = sub.add_parser(
        "sweep",
        help="run (or resume) a hyperparameter sweep on proxy models",
        description="Run the sweep described by a TOML config; rerunning the same command "
        "resumes it. A trial whose objective raises is recorded as failed (traceback "
        "in RUN/failures) and the sweep goes on. Exit 0 when every trial is done "
        "(failed ones included: the last line says how many), 1 when trials are "
        "left unfinished or none completed (every one failed or diverged: no result), "
        "2 on a bad config, objective or storage, 130 on Ctrl-C, 143 on SIGTERM (both: the running trials are "
        "queued again and the workers stopped; rerun to resume).",
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
        "trial is left, 2 on a bad run directory, storage or objective, 130 on Ctrl-C, 143 "
        "on SIGTERM (its running trial is queued again).",
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


def _sweep(args) -> int:
    from ..sweep.engine.interrupts import terminate_as_interrupt

    with terminate_as_interrupt():  # SIGTERM takes Ctrl-C's path: trials re-queued, workers stopped, 143
        return _run_sweep(args)


def _run_sweep(args) -> int:
    from ..sweep import load_config, run_sweep
    from ..sweep.engine.storage import mask_url

    config = existing_file(args.config, "config file")
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
            from ..sweep.config.placement import parse_devices

            args.devices = parse_devices(args.devices, "--devices")
        loaded = load_config(config)  # the one read of the TOML for this command
        if overrides or args.detach or loaded.cluster is not None:
            return _sweep_on_cluster(args, config, run_dir, overrides, loaded)
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
            config=loaded,
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


def _sweep_on_cluster(args, config: Path, run_dir: Path, overrides: dict, loaded) -> int:
    from ..sweep import Sweep
    from ..sweep.launch.cluster import plan_cluster, run_cluster

    if args.workers is not None:
        raise UsageError(
            "--workers is for sweeps on this machine; a cluster sweep runs [cluster] jobs × its GPUs "
            "(--jobs, --gpus-per-job, [cluster] trials_per_device)"
        )
    try:
        # checked before anything is written, then the sweep created once and handed to the submitter
        plan = plan_cluster(
            loaded, run_dir, storage=args.storage, overrides=overrides, devices=args.devices, threads=args.threads
        )
        sweep = Sweep.create(config, run_dir, args.storage, config=loaded)
        run, ok = run_cluster(
            sweep, plan, detach=args.detach, progress=not args.no_progress, retry_failed=args.retry_failed
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
    from ..sweep import Sweep
    from ..sweep.launch.cluster import CLUSTER_FILE, ClusterRun, status_lines

    try:
        sweep = Sweep(args.run, storage=args.storage)
        run = ClusterRun(args.run) if (Path(args.run) / CLUSTER_FILE).is_file() else None
        print("\n".join(status_lines(sweep, run)))
    except ValueError as e:
        raise UsageError(str(e)) from None
    return EXIT_PASS


def _cancel(args) -> int:
    from ..sweep.launch.cluster import ClusterRun, cancel

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
    from ..sweep.engine.interrupts import terminate_as_interrupt

    with terminate_as_interrupt():  # SIGTERM takes Ctrl-C's path: its trial re-queued, exit 143
        return _run_worker(args)


def _run_worker(args) -> int:
    from ..sweep import Sweep

    try:
        if args.threads is not None and args.threads < 1:
            raise ValueError("--threads must be at least 1")
        sweep = Sweep(args.run, storage=args.storage, wait=args.wait, patient=True)
        sweep.use_device(args.device, "--device")
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        _ = sweep.objective  # loaded before any trial: a broken objective fails here
        sweep.wait_prepared(args.wait)
        n = sweep.work(progress=not args.no_progress)
    except ValueError as e:  # bad input, or the storage failed for longer than its patience
        raise UsageError(str(e)) from None
    print(f"worker done: {n} trial(s) run here", file=sys.stderr)
    return EXIT_PASS
