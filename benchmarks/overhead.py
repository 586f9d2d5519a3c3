"""Training-step overhead of µP: mutransfer (and the `mup` package) versus plain PyTorch.

What is measured
    The wall time of one full training step — forward, loss, backward, ``optimizer.step()``,
    ``optimizer.zero_grad()`` — for three builds of the same architecture at the same width:

    * plain       the recipe model as written, ``torch.optim.Adam(model.parameters())``;
    * mutransfer  the same model after ``mt.parametrize(model, base=..., delta=...)`` (default
                  Table 3 formulation), ``torch.optim.Adam(mt.param_groups(model, lr))``;
    * mup         an equivalent model written for Microsoft's ``mup`` package (``MuReadout`` /
                  ``MuSharedReadout`` readout, 1/d attention), ``mup.set_base_shapes``,
                  ``mup.MuAdam`` — only when ``mup`` is importable.

    for (a) an MLP and (b) a GPT-style transformer with tied embeddings, each eager and under
    ``torch.compile`` (the model is compiled, the optimizer runs eagerly). For the compiled
    rows each compiled build's output is checked against its own eager output, so that no build
    is timed with a graph traced from another one.

How
    All builds of one case train side by side in one process on one fixed random batch. After
    warm-up steps (which also trigger compilation), they are stepped round-robin — one step of
    each per round, the starting build rotating every round — so that machine noise hits all
    builds alike. Each round gives a paired ratio (build / plain); the table reports median step
    times and the median of the per-round ratios, the notes their quartiles. Rounds run until
    the row's time budget (35 s; 2 s with ``--quick``; ``--budget``) is spent and at least 50
    rounds (5) are done, but stop at twice the budget on a machine too slow or busy for that.

    A ratio near 1 says little about *why*, so each case ends with a breakdown: every piece by
    which mutransfer's eager step differs from the plain one — the µP forward of a tied
    readout (x·c), the scale push/pop of SDPA attention modules, the process-wide
    ``scaled_dot_product_attention`` wrapper, the fixed cost of the extra optimizer param
    groups — is timed in isolation (median of paired differences over interleaved batches)
    and summed into an expected ratio. Isolated pieces miss allocator and cache effects, so
    when mutransfer switched module classes the eager round-robin also steps a fourth build,
    mutransfer's model with the plain classes restored (same values and param groups, not µP):
    the paired ratio mutransfer / that build is the µP forward's cost inside the real step, and that
    build's own ratio to plain (same arithmetic) shows the noise floor of such comparisons.

    Note that once any model with SDPA attention is parametrized, mutransfer's SDPA wrapper
    replaces ``F.scaled_dot_product_attention`` for the whole process, so the plain and mup
    builds pass through it too (the breakdown shows that cost separately).

Usage
    python benchmarks/overhead.py            # default: about 3 minutes on 2 CPU cores
    python benchmarks/overhead.py --quick    # CI smoke run: narrower models, few rounds
    python benchmarks/overhead.py --json results.json
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import overhead_breakdown as breakdown_timing
import torch
import torch.nn.functional as F
from overhead_breakdown import LR, NO_HOOKS, count_hooks, overhead_breakdown, print_breakdown
from torch import nn

import mutransfer as mt
from mutransfer.recipes import GPT, MLP
from mutransfer.recipes.models import CausalSelfAttention

try:
    import mup
except ImportError:  # the comparison with mup is optional
    mup = None

PLAIN, MUTRANSFER, MUP = "plain", "mutransfer", "mup"
Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------- mup versions of the recipes


class MupMLP(MLP):
    """`recipes.MLP` with mup's `MuReadout` as readout (mup's 1/width output multiplier)."""

    def __init__(self, width: int, d_in: int, d_out: int):
        super().__init__(width, d_in=d_in, d_out=d_out)
        self.readout = mup.MuReadout(width, d_out)


class MupAttention(CausalSelfAttention):
    """Causal self-attention with logits scaled by √d₀/d (1/d as mup requires, = 1/√d at d₀)."""

    def __init__(self, d_model: int, n_head: int, base_head_dim: int):
        super().__init__(d_model, n_head)
        self.scale = math.sqrt(base_head_dim) / (d_model // n_head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MupGPT(GPT):
    """`recipes.GPT` with 1/d attention and mup's `MuSharedReadout` tied to the embedding."""

    def __init__(self, width: int, vocab: int, n_layer: int, n_head: int, ctx: int, base_head_dim: int):
        super().__init__(width, vocab=vocab, n_layer=n_layer, n_head=n_head, ctx=ctx, tied=True)
        for block in self.blocks:
            block.attn = MupAttention(width, n_head, base_head_dim)
        self.lm_head = mup.MuSharedReadout(self.wte.weight, bias=False)
        self.apply(self._init)


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One architecture: how to build it (plain and mup) at a width, its data and loss."""

    name: str
    description: str
    width: int
    base_width: int
    delta_width: int
    build_plain: Callable[[int], nn.Module]
    build_mup: Callable[[int], nn.Module]
    make_batch: Callable[[], Batch]
    loss_fn: LossFn


def mlp_case(width: int = 1024, d_in: int = 256, d_out: int = 10, batch: int = 256) -> Case:
    def make_batch() -> Batch:
        return torch.randn(batch, d_in), torch.randint(0, d_out, (batch,))

    return Case(
        "MLP",
        f"width {width}, d_in {d_in}, batch {batch}",
        width,
        64,
        128,
        build_plain=lambda w: MLP(w, d_in=d_in, d_out=d_out),
        build_mup=lambda w: MupMLP(w, d_in=d_in, d_out=d_out),
        make_batch=make_batch,
        loss_fn=F.cross_entropy,
    )


def gpt_case(
    width: int = 256, n_layer: int = 2, n_head: int = 4, ctx: int = 64, vocab: int = 256, batch: int = 8
) -> Case:
    base_width = 64

    def make_batch() -> Batch:
        return torch.randint(0, vocab, (batch, ctx)), torch.randint(0, vocab, (batch, ctx))

    def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return Case(
        "GPT",
        f"width {width}, {n_layer} layers, {n_head} heads, ctx {ctx}, batch {batch}, tied",
        width,
        base_width,
        2 * base_width,
        build_plain=lambda w: GPT(w, vocab=vocab, n_layer=n_layer, n_head=n_head, ctx=ctx),
        build_mup=lambda w: MupGPT(w, vocab, n_layer, n_head, ctx, base_head_dim=base_width // n_head),
        make_batch=make_batch,
        loss_fn=lm_loss,
    )


# --------------------------------------------------------------------------- builds


@dataclass
class Trainer:
    """A model, its optimizer and a fixed batch; `step()` is the timed unit."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    batch: Batch
    loss_fn: LossFn
    last_loss: torch.Tensor | None = None

    def step(self) -> None:
        x, y = self.batch
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.last_loss = loss.detach()


def build_plain(case: Case) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = case.build_plain(case.width)
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def build_mutransfer(case: Case) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = case.build_plain(case.width)
    mt.parametrize(model, base=case.build_plain(case.base_width), delta=case.build_plain(case.delta_width))
    return model, torch.optim.Adam(mt.param_groups(model, LR, "adam"), lr=LR)


def build_mup(case: Case) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = case.build_mup(case.width)
    mup.set_base_shapes(model, case.build_mup(case.base_width), delta=case.build_mup(case.delta_width))
    return model, mup.MuAdam(model.parameters(), lr=LR)


def restore_plain_classes(model: nn.Module) -> int:
    """Switch every module that mutransfer gave a µP forward back to its own class."""
    restored = 0
    for module in model.modules():
        parent = type(module).__dict__.get("_mutransfer_parent")
        if parent is not None:
            module.__class__ = parent
            restored += 1
    return restored


def build_mutransfer_without_hooks(case: Case) -> tuple[nn.Module, torch.optim.Optimizer]:
    """mutransfer's model and optimizer with the plain classes' forward: µP's values and param groups
    but no readout multiplier and 1/√d attention. Not µP — it isolates what the µP forward costs
    inside the real training step."""
    model, optimizer = build_mutransfer(case)
    restore_plain_classes(model)
    return model, optimizer


BUILDERS: dict[str, Callable[[Case], tuple[nn.Module, torch.optim.Optimizer]]] = {
    PLAIN: build_plain,
    MUTRANSFER: build_mutransfer,
    MUP: build_mup,
    NO_HOOKS: build_mutransfer_without_hooks,
}


def short_reason(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:160]}"


@dataclass
class Setup:
    """Per-build outcome of building, compiling and warming up."""

    trainers: dict[str, Trainer] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    warmup_s: dict[str, float] = field(default_factory=dict)
    graphs: dict[str, dict[str, Any]] = field(default_factory=dict)


def dynamo_counts() -> tuple[int, int]:
    """(graphs compiled so far, graph breaks so far) from dynamo's global counters."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


def compiled_vs_eager(compiled: nn.Module, x: torch.Tensor) -> float:
    """max |compiled − eager| / max |eager| of the outputs: proves the compiled graph is this model's.

    Runs with grad enabled so that the compiled training graph (not a no_grad one) is checked.
    """
    eager = compiled._orig_mod(x).detach()
    return float((compiled(x).detach() - eager).abs().max() / eager.abs().max())


def prepare(case: Case, names: list[str], compiled: bool, warmup: int) -> Setup:
    """Build every requested variant, compile it if asked, and run its warm-up steps.

    A variant that fails (typically under torch.compile) is recorded with its reason and left out.
    """
    setup = Setup()
    batch = case.make_batch()
    for name in names:
        try:
            model, optimizer = BUILDERS[name](case)
            trainer = Trainer(torch.compile(model) if compiled else model, optimizer, batch, case.loss_fn)
            graphs0, breaks0 = dynamo_counts()
            t0 = time.perf_counter()
            for _ in range(warmup):
                trainer.step()
            setup.warmup_s[name] = time.perf_counter() - t0
            if compiled:
                graphs1, breaks1 = dynamo_counts()
                setup.graphs[name] = {
                    "new_graphs": graphs1 - graphs0,
                    "graph_breaks": breaks1 - breaks0,
                    "max_rel_diff_vs_eager": compiled_vs_eager(trainer.model, batch[0]),
                }
            setup.trainers[name] = trainer
        except Exception as exc:
            setup.failed[name] = short_reason(exc)
    return setup


# --------------------------------------------------------------------------- timing


def time_round_robin(
    trainers: dict[str, Trainer], min_rounds: int, max_rounds: int, budget_s: float
) -> dict[str, list[float]]:
    """Step every trainer once per round, rotating the order; returns seconds per step.

    Stops once `budget_s` is spent and `min_rounds` are done, and in any case (after 3 rounds)
    at twice the budget, so that a slow or busy machine still finishes in bounded time.
    """
    names = list(trainers)
    times: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    for r in range(max_rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            trainers[name].step()
            times[name].append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
        if (r + 1 >= min_rounds and elapsed > budget_s) or (r + 1 >= 3 and elapsed > 2 * budget_s):
            break
    return times


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def paired_ratios(ts: list[float], ref: list[float]) -> dict[str, float]:
    """Median and quartiles of the per-round ratios ts[r] / ref[r]."""
    ratios = [t / r for t, r in zip(ts, ref)]
    return {
        "ratio": statistics.median(ratios),
        "ratio_q25": quantile(ratios, 0.25),
        "ratio_q75": quantile(ratios, 0.75),
        "ratio_of_medians": statistics.median(ts) / statistics.median(ref),
    }


def summarize(times: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Median ms per build and its per-round ratios against plain (and, for mutransfer,
    against mutransfer without hooks when that build ran)."""
    out: dict[str, dict[str, Any]] = {}
    for name, ts in times.items():
        entry: dict[str, Any] = {"median_ms": 1e3 * statistics.median(ts), "min_ms": 1e3 * min(ts), "steps": len(ts)}
        if name != PLAIN and PLAIN in times:
            entry.update(paired_ratios(ts, times[PLAIN]))
        if name == MUTRANSFER and NO_HOOKS in times:
            entry["vs_without_hooks"] = paired_ratios(ts, times[NO_HOOKS])
        out[name] = entry
    return out


# --------------------------------------------------------------------------- output


def fmt_ms(entry: dict[str, float] | None) -> str:
    return f"{entry['median_ms']:.2f}" if entry else "n/a"


def fmt_ratio(entry: dict[str, float] | None) -> str:
    return f"{entry['ratio']:.3f}" if entry and "ratio" in entry else "n/a"


def table_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = [["model", "mode", "plain ms", "mutransfer ms", "ratio", "mup ms", "mup ratio"]]
    for res in results:
        s = res["summary"]
        rows.append(
            [
                res["model"],
                res["mode"],
                fmt_ms(s.get(PLAIN)),
                fmt_ms(s.get(MUTRANSFER)),
                fmt_ratio(s.get(MUTRANSFER)),
                fmt_ms(s.get(MUP)),
                fmt_ratio(s.get(MUP)),
            ]
        )
    return rows


def print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def line(row: list[str]) -> str:  # text columns left-aligned, numbers right-aligned
        return " | ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    print(line(rows[0]))
    print("-+-".join("-" * w for w in widths))
    for row in rows[1:]:
        print(line(row))


def print_failures(results: list[dict[str, Any]]) -> None:
    for res in results:
        for name, reason in res["failed"].items():
            print(f"n/a: {res['model']} {res['mode']} {name} — {reason}")


def print_notes(results: list[dict[str, Any]]) -> None:
    print("\nratio = median over rounds of (build step time / plain step time in the same round)")
    for res in results:
        tag = f"{res['model']} {res['mode']}"
        for name, entry in res["summary"].items():
            if "ratio" in entry:
                print(
                    f"  {tag:12s} {name:10s} ratio {entry['ratio']:.3f}, quartiles {entry['ratio_q25']:.3f}–"
                    f"{entry['ratio_q75']:.3f}, ratio of medians {entry['ratio_of_medians']:.3f}, "
                    f"{entry['steps']} steps"
                )
        for name, ok in res["loss_finite"].items():
            if not ok:
                print(f"  {tag:12s} {name:10s} WARNING: loss is not finite (timings of NaN arithmetic)")
        for name, g in res.get("graphs", {}).items():
            print(
                f"  {tag:12s} {name:10s} compiled: {g['new_graphs']} new graph(s), {g['graph_breaks']} "
                f"graph break(s), output vs eager {g['max_rel_diff_vs_eager']:.0e}"
                f"{'  WARNING: not its own graph' if g['max_rel_diff_vs_eager'] > 1e-3 else ''}"
            )


# --------------------------------------------------------------------------- main


@dataclass(frozen=True)
class Settings:
    warmup: int
    compile_warmup: int
    min_rounds: int
    max_rounds: int
    budget_s: float
    breakdown_calls: int


DEFAULT = Settings(warmup=5, compile_warmup=5, min_rounds=50, max_rounds=1000, budget_s=35.0, breakdown_calls=50)
QUICK = Settings(warmup=2, compile_warmup=3, min_rounds=5, max_rounds=200, budget_s=2.0, breakdown_calls=10)


def run_case(case: Case, compiled: bool, names: list[str], st: Settings) -> dict[str, Any]:
    mode = "compile" if compiled else "eager"
    print(f"[{case.name} {mode}] building and warming up {', '.join(names)} …", file=sys.stderr, flush=True)
    setup = prepare(case, names, compiled, st.compile_warmup if compiled else st.warmup)
    times = time_round_robin(setup.trainers, st.min_rounds, st.max_rounds, st.budget_s) if setup.trainers else {}
    finite = {n: bool(torch.isfinite(t.last_loss).item()) for n, t in setup.trainers.items() if t.last_loss is not None}
    return {
        "model": case.name,
        "description": case.description,
        "mode": mode,
        "summary": summarize(times),
        "times_ms": {n: [round(1e3 * t, 4) for t in ts] for n, ts in times.items()},
        "failed": setup.failed,
        "warmup_s": setup.warmup_s,
        "graphs": setup.graphs,
        "loss_finite": finite,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few steps, for CI smoke runs")
    p.add_argument("--json", metavar="PATH", help="also write the results to PATH")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    p.add_argument("--no-mup", action="store_true", help="skip the mup package even if importable")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all usable cores)")
    p.add_argument("--budget", type=float, default=None, help="seconds of timed rounds per row")
    return p.parse_args(argv)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def busy_cores(seconds: float = 1.0) -> float | None:
    """Cores kept busy by other processes over the next `seconds` (Linux /proc/stat), else the
    1-minute load average; None when neither is available."""

    def cpu_times() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    try:
        total0, idle0 = cpu_times()
        time.sleep(seconds)
        total1, idle1 = cpu_times()
        return (os.cpu_count() or 1) * (1.0 - (idle1 - idle0) / max(1, total1 - total0))
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):
            return None


def mup_version() -> str:
    if mup is None:
        return "absent"
    try:
        return importlib.metadata.version("mup")
    except importlib.metadata.PackageNotFoundError:
        return "present"


def settings_from(args: argparse.Namespace) -> Settings:
    st = QUICK if args.quick else DEFAULT
    if args.budget is not None:
        st = Settings(**{**st.__dict__, "budget_s": args.budget})
    return st


def run_all(
    cases: list[Case], names: list[str], modes: list[bool], st: Settings, skipped: dict[str, str]
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Every (case, mode) row, then the breakdown of each case's eager µP step."""
    results = []
    for case in cases:
        hooked = MUTRANSFER in names and sum(count_hooks(build_mutransfer(case)[0]).values()) > 0
        for compiled in modes:
            results.append(run_case(case, compiled, names + ([NO_HOOKS] if hooked and not compiled else []), st))
    for res in results:
        res["failed"].update(skipped)
    breakdowns = {}
    for case in cases:
        eager = next((r for r in results if r["model"] == case.name and r["mode"] == "eager"), None)
        if eager is not None and PLAIN in eager["summary"]:
            torch.manual_seed(0)
            model, _ = build_mutransfer(case)
            bd = overhead_breakdown(
                model, case.make_batch()[0], eager["summary"][PLAIN]["median_ms"], st.breakdown_calls
            )
            bd["hooks_in_situ"] = eager["summary"].get(MUTRANSFER, {}).get("vs_without_hooks")
            bd["without_hooks_vs_plain"] = eager["summary"].get(NO_HOOKS, {}).get("ratio")
            breakdowns[case.name] = bd
    return results, breakdowns


def print_report(
    cases: list[Case], results: list[dict[str, Any]], breakdowns: dict[str, dict[str, Any]], meta: dict[str, Any]
) -> None:
    busy = meta["busy_cores_before"]
    quick = ", quick" if meta["quick"] else ""
    print(
        f"\nµP training-step overhead — torch {meta['torch']}, {meta['threads']} threads on "
        f"{meta['cores']} cores ({'n/a' if busy is None else f'{busy:.1f}'} busy before the run), "
        f"mup {meta['mup']}{quick}"
    )
    for case in cases:
        print(f"  {case.name}: {case.description}; µP base width {case.base_width}, delta {case.delta_width}")
    if busy is not None and busy >= 0.5:
        print(
            f"  WARNING: other processes kept {busy:.1f} cores busy before the run. Threads that lose their "
            "core stall every parallel op, so step times (and ratios) are far noisier than usual; rerun "
            "on a quiet machine, or with --threads 1."
        )
    print()
    print_table(table_rows(results))
    print_failures(results)
    print_notes(results)
    for model, bd in breakdowns.items():
        print_breakdown(model, bd)
    print(f"\ntotal time {meta['elapsed_s']:.0f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    st = settings_from(args)
    torch.set_num_threads(args.threads or usable_cores())
    names = [PLAIN, MUTRANSFER] + ([MUP] if mup is not None and not args.no_mup else [])
    skipped = {} if MUP in names else {MUP: "mup is not installed" if mup is None else "skipped (--no-mup)"}
    modes = [False] if args.no_compile else [False, True]
    # --quick (a smoke run of every code path) on models a quarter and a half as wide
    cases = [mlp_case(256), gpt_case(128)] if args.quick else [mlp_case(), gpt_case()]
    if args.quick:
        breakdown_timing.SAMPLE_SECONDS = 0.5

    meta: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cores": usable_cores(),
        "threads": torch.get_num_threads(),
        "mup": mup_version(),
        "quick": args.quick,
        "settings": st.__dict__,
        "busy_cores_before": busy_cores(),
    }
    t_start = time.perf_counter()
    results, breakdowns = run_all(cases, names, modes, st, skipped)
    meta.update(elapsed_s=time.perf_counter() - t_start)
    print_report(cases, results, breakdowns, meta)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({**meta, "results": results, "breakdown": breakdowns}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
