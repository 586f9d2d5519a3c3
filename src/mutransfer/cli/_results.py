"""`mutransfer report | transfer | forecast | demo`: what a sweep found, the target trained with it, its forecast, the demo."""

from __future__ import annotations

import sys
import warnings

from ..errors import UsageError
from ._common import EXIT_FAIL, EXIT_PASS, device, devices, open_sweep


def add_parsers(sub) -> None:
    """Add this group's subcommands to the `mutransfer` parser's subparsers `sub`."""
    r = sub.add_parser(
        "report",
        help="write report.html, plots and transferred.json for a sweep",
        description="Analyse a sweep's finished trials (it may still be running) and write "
        "RUN/report.html with its plots, summary.json and transferred.json (the "
        "hyperparameters to use at the target); print the verdicts, the transferred "
        "hyperparameters and the report's path. Exit 0 when the report is written, "
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
    t.add_argument(
        "--tokens",
        type=float,
        help="the target's training tokens instead of --steps: steps = tokens / (batch size × seq_len)",
    )
    t.add_argument(
        "--critical-batch",
        type=float,
        help="the critical batch size (e.g. the gradient noise scale): a batch-size rule holds only below it",
    )
    t.add_argument(
        "--batch-rule",
        choices=("auto", "sqrt", "linear", "none"),
        help="how lr follows the batch size where the sweep did not measure it: auto (√B for Adam/AdamW, "
        "B for SGD), sqrt, linear, or none (lr kept on purpose)",
    )
    t.add_argument(
        "--wd-rule",
        choices=("tau", "independent"),
        help="how weight_decay follows batch size and horizon: tau (AdamW's τ = B/(η·λ·D) kept) or independent",
    )
    t.add_argument("--optimizer", help="the objective's optimizer for those rules (default: hparams['optimizer'])")
    t.add_argument(
        "--extrapolate",
        action="store_true",
        help="apply a power law the sweep measured more than a decade past its measured range (warns)",
    )
    t.add_argument(
        "--peak-tflops",
        type=float,
        help="the target device's peak TFLOPS, to state the FLOPs in device-hours (default: a known GPU's datasheet peak)",
    )
    t.add_argument("--storage", help="storage URL (default: the run's own)")
    t.add_argument(
        "--device",
        help="where the target trains: auto (CUDA when present), cpu, cuda or cuda:N (default: the sweep's own)",
    )
    t.add_argument(
        "--precision",
        help="what the target trains in: fp32, bf16, or fp8 (a simulation of FP8 matmuls: numerics, "
        "not speed; default: the sweep's own precision)",
    )
    t.set_defaults(handler=_transfer)
    f = sub.add_parser(
        "forecast",
        help="forecast the target's loss from the sweep's width ladder, without training it",
        description="Fit the loss at the transferred hyperparameters against width (and depth) — the largest "
        "proxy held out and predicted first — and print the target's forecast loss with its 90%% interval, or "
        "why there is none. Nothing trains. Exit 0 with a forecast, 1 with none (its reason printed), 2 on a bad "
        "run directory, storage or target, 130 on Ctrl-C.",
    )
    f.add_argument("run", help="run directory")
    f.add_argument("--width", type=int, help="target width (default: the config's target_width or largest width)")
    f.add_argument("--depth", type=int, help="target depth for a sweep over depths (default: the largest)")
    f.add_argument(
        "--parametrization",
        default=None,
        choices=("mup", "u-mup", "sp"),
        help="whose transferred point (default: the transferred parametrization, µP when swept, else u-µP)",
    )
    f.add_argument(
        "--extrapolate", action="store_true", help="forecast more than 64× past the largest proxy's width or depth"
    )
    f.add_argument("--json", action="store_true", help="print the forecast as JSON (transfer.json's 'forecast')")
    f.add_argument(
        "--peak-tflops", type=float, help="the target device's peak TFLOPS, to state the FLOPs in device-hours"
    )
    f.add_argument("--storage", help="storage URL (default: the run's own)")
    f.set_defaults(handler=_forecast)
    d = sub.add_parser(
        "demo",
        help="tune a byte-level GPT at width 32, check the transfer to 64 and 128 (µP vs SP), transfer",
        description="Reproduces TP5's headline figure on a laptop: tune lr × output multiplier at "
        "width 32 (µP, 25 trials), sweep the lr at widths 32, 64, 128 (µP and SP, 42 trials), train "
        "width 128 with the proxy's hyperparameters, and write the report (590–690 CPU seconds, 5–6 minutes on 2 cores, "
        "measured on a 2-core CPU without a GPU). Rerunning resumes. Exit 0 when done, 2 on bad arguments, 130 on Ctrl-C "
        "(rerun to resume).",
    )
    d.add_argument("--out", default="mutransfer-demo", help="output directory (default ./mutransfer-demo)")
    d.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: widths 16 → 64 (tuned at 16), 6 lrs, 120 steps, a 3×3 tuning grid (about 190 CPU "
        "seconds, a third of the full demo's)",
    )
    d.add_argument("--workers", type=int, default=2, help="local worker processes (default 2)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    d.add_argument(
        "--device",
        default="auto",
        help="where the sweeps and the target train: auto (CUDA when present, else the CPU; default), cpu, "
        "or comma-separated GPU ids such as 0,1",
    )
    d.set_defaults(handler=_demo)


def _demo(args) -> int:
    from ..sweep.transfer.demo import format_summary, run_demo

    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    where = devices(args.device)
    try:
        result = run_demo(
            args.out, quick=args.quick, workers=args.workers, progress=not args.no_progress, devices=where
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(format_summary(result))
    return EXIT_PASS


def _report(args) -> int:
    import json

    from ..sweep.analysis.summary import summary_text
    from ..sweep.report.report import write_report

    sweep = open_sweep(args)
    try:
        path = write_report(sweep)
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(summary_text(json.loads((path.parent / "summary.json").read_text()), str(path)))
    return EXIT_PASS


def _transfer(args) -> int:
    from ..sweep.transfer.transfer import format_transfer, transfer

    sweep = open_sweep(args)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            out = transfer(
                sweep,
                args.width,
                args.depth,
                args.batch_size,
                args.steps,
                device=None if args.device is None else device(args.device),
                tokens=args.tokens,
                optimizer=args.optimizer,
                rules={k: v for k, v in (("batch", args.batch_rule), ("weight_decay", args.wd_rule)) if v} or None,
                critical_batch=args.critical_batch,
                extrapolate=args.extrapolate,
                say=lambda line: print(line, flush=True),
                peak_tflops=args.peak_tflops,
                precision=args.precision,
            )
    except ValueError as e:
        raise UsageError(_as_flags(str(e))) from None
    for w in caught:
        print(f"mutransfer transfer: warning: {w.message}", file=sys.stderr)
    print(format_transfer(out))
    return EXIT_PASS


def _forecast(args) -> int:
    import json

    from ..sweep.analysis.forecasts import forecast

    sweep = open_sweep(args)
    try:
        fc = forecast(sweep, args.width, args.depth, args.parametrization, extrapolate=args.extrapolate)
    except ValueError as e:
        raise UsageError(_as_flags(str(e))) from None
    if args.json:
        print(json.dumps(fc.as_dict(), indent=1))
    else:
        print(fc.line())
        for p in fc.points:
            seeds = ", ".join(f"{v:.4g}" for v in p["losses"])
            print(
                f"  width {p['width']}"
                + ("" if p["depth"] is None else f", depth {p['depth']}")
                + f": {p['loss']:.4g} (seeds {seeds}; trial {p['trial']})"
            )
        for note in fc.notes:
            print(f"  note: {note}")
        if fc.flops is not None:
            print("  " + _flops_line(fc.flops, args.peak_tflops, fc.parametrization))
    return EXIT_PASS if fc.ok else EXIT_FAIL


def _flops_line(flops: dict, peak_tflops: float | None, parametrization: str = "mup") -> str:
    """The forecast's cost line (`report.forecast_flops_text`, labelled by whose trials), the peak checked."""
    from ..sweep.config.config import short_label
    from ..sweep.report.report import forecast_flops_text

    if peak_tflops is not None and not (peak_tflops > 0):
        raise UsageError(f"--peak-tflops must be a positive number of TFLOPS, got {peak_tflops}")
    peak = None if peak_tflops is None else {"tflops": peak_tflops, "source": "--peak-tflops"}
    return forecast_flops_text(flops, peak, label=short_label(parametrization))


# `mt.transfer_hparams` names its Python arguments in its messages; on the command line they are flags
_FLAGS = (
    ("pass critical_batch=", "pass --critical-batch"),
    ("critical_batch= is needed", "--critical-batch is needed"),
    ("critical_batch ", "--critical-batch "),
    ("rules={'batch': 'sqrt'}, {'batch': 'linear'} or {'batch': 'none'}", "--batch-rule sqrt, linear or none"),
    ("rules={'batch': 'none'}", "--batch-rule none"),
    ("rules={'weight_decay': 'tau'}", "--wd-rule tau"),
    ("rules={'weight_decay': 'independent'}", "--wd-rule independent"),
    ("extrapolate=True", "--extrapolate"),
)


def _as_flags(message: str) -> str:
    for api, flag in _FLAGS:
        message = message.replace(api, flag)
    return message
