"""Count the floating-point operations of one training run, cheaply: a sample of its optimizer steps.

What is counted (the convention of ``torch.utils.flop_counter``): the matmul-like aten ops of
``torch.utils.flop_counter.flop_registry`` — mm, addmm, bmm, baddbmm, convolutions and their backward,
scaled-dot-product attention forward and backward (the full score matrix, even when causal), flex
attention — from their shapes, a multiply-add being 2 FLOPs. Elementwise ops, norms, softmax,
embedding lookups, ``dot``/``mv`` and an optimizer's elementwise update count nothing. The CPU kernels
of scaled-dot-product attention (``_scaled_dot_product_flash_attention_for_cpu`` and its backward),
which torch's registry leaves out, count with its formulas for the CUDA kernels, so a run counts the
same on either device.

How (`FlopCount`): a ``TorchDispatchMode`` sees every aten op, at about 12 µs each on a CPU: too slow
to leave on for a whole run (a 150-step width-32 GPT trains 2× slower). So optimizer steps are the
clock: the first ``torch.optim`` optimizer that steps ticks it (a global step post-hook; other
optimizers' steps do not), and the run falls into intervals — I_0 from the start to the end of the
first step (setup included), I_j from tick j to tick j + 1, and the tail after the last tick. I_0 and
I_2 … I_(1 + `WARM`) are counted always; I_1 and the later ones each with probability `RATE` (a seeded
``random.Random``: one seed draws the same intervals every time). I_1 is not a sure one because the
first step often carries one-off work — the first log line or evaluation, the sweep's µP monitor's
first sample (which made I_1 2 % heavier than the average step of a recorded 150-step GPT trial).
Every uncounted step interval is priced at the mean of the counted step intervals (I_0's FLOPs in a
run too short to have one). The tail counts only when its interval happened to be drawn (a recipe does
nothing after its last step) or inside a `counting` block — how the sweep counts the gradient noise
measurement after training.

What it costs and misses (benchmarks/flop_count.py, 2-core CPU, in-run): on the recipe GPT, 150 steps, 4.4 %
of a width-32 run's CPU time (3 % of it I_0: µP's setup is 3,500 aten ops) and 1.2 % at width 128; a
later seed reusing the first's I_0 (`first`) 1.3 % and 0.3 %; a recorded µP proxy trial (monitor and
noise measurement) 3.8 % and 1.0 %. The estimate is exact for steps of
equal FLOPs; work that recurs every so many steps (an evaluation, the µP monitor's samples: −0.5 % on a
recorded trial) is seen only when its interval is drawn — an objective can wrap it in `counting(model)`.
Under torch.compile the compiled code's calls of aten matmuls count; a matmul it generates itself (a Triton
template under max-autotune) does not. ``torch.cond`` counts nothing (torch has no formula for it).
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import weakref
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import torch
from torch._ops import HigherOrderOperator
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils import flop_counter
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _get_current_dispatch_mode,
    _len_torch_dispatch_stack,
    _pop_mode,
    _push_mode,
)

__all__ = [
    "PASSES_WARM",
    "PEAK_TFLOPS",
    "RATE",
    "WARM",
    "FlopCount",
    "count_flops",
    "counting",
    "flop_attrs",
    "guarded",
    "known_peak",
    "next_counter",
]

_ERROR_CHARS = 500  # an error kept in a trial attribute

WARM = 1  # step intervals counted always: I_2 … I_(1 + WARM) (see the module docstring for why not I_1)
RATE = 0.003  # the probability of counting each other step interval (benchmarks/flop_count.py: ≤ 5 % overhead)
PASSES_WARM = 1  # a `counting(model)` block's forward passes counted always (the first)

_aten = torch.ops.aten


def _sdpa_cpu(query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    return int(flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape))


def _sdpa_cpu_backward(
    grad: Any, query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any
) -> int:
    return int(flop_counter.sdpa_backward_flop_count(grad.shape, query.shape, key.shape, value.shape))


# Formulas torch's registry lacks (looked up after it, so a formula torch gains later wins).
_EXTRA: dict[Any, Callable[..., int]] = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward,
}

_open = threading.local()  # .counts: the FlopCounts open in this thread, innermost last


class _Mode(TorchDispatchMode):
    """Adds each registered op's FLOPs to `flops`; a formula that raises stops the counting (`error`),
    never the op. A higher-order operator (flex attention, ``torch.cond``) runs as it would without the mode and
    counts by its formula, if torch has one (flex attention's; ``torch.cond`` counts nothing)."""

    supports_higher_order_operators = True  # else torch refuses to run one under the mode: the run would fail

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """torch.compile compiles with the mode on (else it falls back to eager, and refuses ``fullgraph=True``,
        which flex attention always uses); the compiled code's aten calls (its matmuls) still count."""
        return True

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0
        self.error: str | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        # A higher-order operator comes with this mode popped: it runs as without it.
        packet = func if isinstance(func, HigherOrderOperator) else func._overloadpacket
        out = func(*args, **kwargs)
        if self.error is None:
            formula = flop_counter.flop_registry.get(packet) or _EXTRA.get(packet)
            if formula is not None:
                try:
                    self.flops += int(formula(*args, **kwargs, out_val=out))
                except Exception as e:  # a formula's bug must not fail the run
                    self.error = f"counting {packet} raised {type(e).__name__}: {e}"
        return out


class _Passes:
    """A `counting(model)` block's sample: its prelude and forward passes, each pass weighted by its examples."""

    def __init__(self) -> None:
        self.prelude = 0  # FLOPs before the first pass (counted)
        self.missed = False  # some of the prelude was not counted (another mode sat above our place)
        self.passes = 0  # the passes started
        self.weight: float | None = None  # the current pass's examples (None: still in the prelude)
        self.counting = True
        self.counted: list[tuple[float, int]] = []  # (examples, FLOPs) of the counted passes
        self.uncounted = 0.0  # the uncounted passes' examples

    def close(self, flops: int) -> None:
        """Book the pass (or prelude) that ends now."""
        if self.weight is None:
            self.prelude += flops
            self.missed = self.missed or not self.counting
        elif self.counting:
            self.counted.append((self.weight, flops))
        else:
            self.uncounted += self.weight

    def estimate(self) -> tuple[float, float, bool]:
        """(estimated FLOPs, counted FLOPs, exact)."""
        passes = sum(f for _, f in self.counted)
        examples = sum(w for w, _ in self.counted)
        per_example = passes / examples if examples else 0.0
        counted = float(self.prelude + passes)
        return counted + self.uncounted * per_example, counted, self.uncounted == 0 and not self.missed


def _examples(args: tuple, kwargs: dict) -> float:
    """A forward pass's examples: the leading dim of its first tensor argument with one (1 without)."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor) and v.ndim:
            return float(v.shape[0])
    return 1.0


class FlopCount:
    """The FLOPs of one run (one call of an objective, one seed), sampled over its optimizer steps.

    A context manager: enter it just before the run, leave it just after, then read `total`. The module
    docstring says what counts and how the sample is drawn. Leaving it (by an exception too) takes its
    dispatch mode off the stack and removes its optimizer hook. One thread: the run's own (another
    thread's ops and steps are not seen).

    A run with no ``torch.optim`` optimizer never ticks: it is counted whole, exactly, at about 12 µs per
    aten op on a CPU (a small model trains about twice as slowly); so is every run with ``exact=True``.

    Args:
        warm: the step intervals counted always, I_2 … I_(1 + warm) (at least 1: uncounted ones are
            priced at the counted ones' mean).
        rate: the probability of counting each other step interval (and each `counting(model)` pass
            after the first `PASSES_WARM`).
        seed: seeds the draw (one seed draws the same intervals every time).
        first: I_0's FLOPs from an earlier run of the same code and shapes (a trial's first seed, its
            `first`): this run counts from its first tick on, and its setup costs nothing. None: count I_0.
        exact: count everything (the whole run under the mode).

    Attributes (read after leaving):
        total: the estimated FLOPs of the run (NaN when the counting failed: see `error`).
        counted: the FLOPs counted op by op (I_0 unless reused, the counted intervals and passes).
        first: I_0's FLOPs (counted, or the given `first`); None when the counting failed before it ended.
        steps: the clock's ticks (the clock optimizer's steps).
        intervals: the step intervals (between ticks); `intervals_counted` of them were counted.
        exact: whether `total` is exact: everything counted (the tail too), I_0 not reused.
        blocks: the (estimated) FLOPs of its `counting` blocks, part of `total`: measurements after
            training, such as the sweep's gradient noise scale.
        error: why the counting failed (a formula or the counter's own code raised), else None.

    Raises:
        ValueError: `warm` < 1, `rate` outside [0, 1], or `first` negative or not finite.
        TypeError: `first` is not a number.
    """

    def __init__(
        self, warm: int = WARM, rate: float = RATE, seed: int = 0, first: float | None = None, exact: bool = False
    ):
        if isinstance(warm, bool) or not isinstance(warm, int) or warm < 1:
            raise ValueError(
                f"warm must be an integer ≥ 1 (the step intervals counted always; the estimate needs one), got {warm!r}"
            )
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be a probability in [0, 1], got {rate!r}")
        if first is not None and (isinstance(first, bool) or not isinstance(first, (int, float))):
            raise TypeError(f"first must be a number of FLOPs (an earlier FlopCount's .first) or None, got {first!r}")
        if first is not None and not (math.isfinite(first) and first >= 0):
            raise ValueError(
                f"first must be a finite number of FLOPs ≥ 0 (an earlier FlopCount's .first), got {first!r}"
            )
        self.warm, self.rate, self.everything = warm, float(rate), bool(exact)
        self._rng = random.Random(seed)
        self._reused = first is not None
        self._mode = _Mode()
        self._hook: Any = None
        self._thread = 0
        self._base = 0  # the dispatch stack's depth under our mode
        self._on = False  # our mode is on the stack (the current interval is counted)
        self._clock: Any = None  # a weak reference to the optimizer whose steps tick
        self._passes: _Passes | None = None  # the open `counting` block's sample
        self._step_flops: list[int] = []  # the counted step intervals' FLOPs
        self._extra_total = 0.0  # `counting` blocks' (estimated) FLOPs and a counted tail
        self._extra_counted = 0.0  # … of which counted op by op
        self._extra_exact = True
        self.total = math.nan
        self.counted = 0.0
        self.first: float | None = None if first is None else float(first)
        self.steps = 0
        self.intervals = 0
        self.intervals_counted = 0
        self.exact = False
        self.blocks = 0.0
        self.error: str | None = None

    # ----------------------------------------------------------------- the run

    def __enter__(self) -> FlopCount:
        self._thread = threading.get_ident()
        self._base = _len_torch_dispatch_stack()
        self._hook = register_optimizer_step_post_hook(self._tick)
        _open.__dict__.setdefault("counts", []).append(self)
        if not self._reused:
            self._set(True)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        tail_counted = self._on or self.steps == 0
        try:
            self._hook.remove()
        finally:
            counts = getattr(_open, "counts", [])
            if self in counts:
                counts.remove(self)
            if self._on:
                self._off_anyway()
            try:
                self._finish(tail_counted)
            except Exception as e:  # our own arithmetic: never the run's failure
                self.error = self.error or f"FlopCount raised {type(e).__name__}: {e}"
                self.total = math.nan

    def _set(self, on: bool) -> None:
        """Turn our mode on (only where nothing was pushed above our place since entering) or off (only
        when it is on top; else it stays on and the interval is counted whole)."""
        if on and not self._on and _len_torch_dispatch_stack() == self._base:
            self._mode.__enter__()
            self._on = True
        elif not on and self._on and _get_current_dispatch_mode() is self._mode:
            self._mode.__exit__(None, None, None)
            self._on = False

    def _off_anyway(self) -> None:
        """On leaving: our mode off the stack, even from under modes pushed above it (put back as they were)."""
        above = []
        while _len_torch_dispatch_stack() > self._base + 1 and _get_current_dispatch_mode() is not self._mode:
            above.append(_pop_mode())
        if _get_current_dispatch_mode() is self._mode:
            self._mode.__exit__(None, None, None)
        for mode in reversed(above):
            _push_mode(mode)
        self._on = False

    def _tick(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The global optimizer post-hook: a tick of the clock closes one interval and draws the next."""
        if threading.get_ident() != self._thread or self._passes is not None:
            return
        if self.error is not None or self._mode.error is not None:  # failed: off, not to slow the run for nothing
            self.error = self.error or self._mode.error
            with contextlib.suppress(Exception):
                self._set(False)
            return
        if self._clock is None:
            self._clock = weakref.ref(optimizer)  # not kept alive (a trial's next seed trains beside it)
        elif optimizer is not self._clock():
            return
        try:
            flops, self._mode.flops = self._mode.flops, 0
            if self.steps == 0:  # I_0 ends
                if not self._reused:
                    self.first = float(flops)
            else:
                self.intervals += 1
                if self._on:
                    self._step_flops.append(flops)
            self.steps += 1  # I_steps starts
            j = self.steps
            self._set(self.everything or 2 <= j <= 1 + self.warm or self._rng.random() < self.rate)
        except Exception as e:  # our own code: stop counting, never fail the run
            self.error = f"FlopCount's optimizer hook raised {type(e).__name__}: {e}"

    def _finish(self, tail_counted: bool) -> None:
        """The estimate, once the run has ended (`tail_counted`: the interval after the last tick was)."""
        self.error = self.error or self._mode.error
        if self.error is not None:
            self.total = math.nan
            return
        tail, self._mode.flops = self._mode.flops, 0
        if self.steps == 0:  # never ticked: the whole run was I_0, counted whole (unless reused)
            if not self._reused:
                self.first = float(tail)
        elif tail_counted:
            self._extra_total += tail
            self._extra_counted += tail
        steps = sum(self._step_flops)
        self.intervals_counted = len(self._step_flops)
        first = self.first or 0.0
        mean = steps / self.intervals_counted if self.intervals_counted else first  # too short: I_0's
        self.counted = float(steps + self._extra_counted + (0.0 if self._reused else first))
        self.total = first + steps + self._extra_total + (self.intervals - self.intervals_counted) * mean
        self.exact = (
            not self._reused and self.intervals_counted == self.intervals and tail_counted and self._extra_exact
        )

    # ----------------------------------------------------------------- blocks outside the clock

    @contextlib.contextmanager
    def _block(self, model: torch.nn.Module | None) -> Iterator[None]:
        """`counting`'s block: its FLOPs kept apart from the interval it falls in; optimizer steps in it do
        not tick."""
        if threading.get_ident() != self._thread or self.error is not None or self._passes is not None:
            yield
            return
        saved, was_on = self._mode.flops, self._on
        passes = self._passes = _Passes()
        handle = None
        try:
            self._mode.flops = 0
            self._set(True)
            passes.counting = self._on
            if model is not None:
                handle = model.register_forward_pre_hook(self._pass_hook, with_kwargs=True)
        except Exception as e:
            self.error = f"FlopCount raised {type(e).__name__}: {e}"
        try:
            yield
        finally:
            try:
                if handle is not None:
                    handle.remove()
                flops, self._mode.flops = self._mode.flops, saved
                passes.close(flops)
                total, counted, exact = passes.estimate()
                self._extra_total += total
                self.blocks += total
                self._extra_counted += counted
                self._extra_exact = self._extra_exact and exact
                self._set(was_on)
            except Exception as e:
                self.error = self.error or f"FlopCount raised {type(e).__name__}: {e}"
            finally:
                self._passes = None

    def _pass_hook(self, module: Any, args: tuple, kwargs: dict) -> None:
        """The model's forward pre-hook in a `counting(model)` block: a pass ends, the next is drawn."""
        passes = self._passes
        if passes is None or threading.get_ident() != self._thread or self.error is not None:
            return
        try:
            flops, self._mode.flops = self._mode.flops, 0
            passes.close(flops)
            passes.passes += 1
            passes.weight = _examples(args, kwargs)
            self._set(self.everything or passes.passes <= PASSES_WARM or self._rng.random() < self.rate)
            passes.counting = self._on
        except Exception as e:  # our own code: stop counting, never fail the run
            self.error = f"FlopCount's forward hook raised {type(e).__name__}: {e}"


@contextlib.contextmanager
def counting(model: torch.nn.Module | None = None) -> Iterator[None]:
    """Count a block apart in the innermost `FlopCount` open in this thread (nothing without one).

    For work after training that no optimizer step delimits: a measurement, an evaluation. Without
    `model` the block is counted whole (at the full cost of counting). With `model`, each forward call
    of `model` starts a pass: the block's start up to the first pass and the first `PASSES_WARM` passes
    are counted, later ones with the `FlopCount`'s `rate`, and an uncounted pass is priced per example
    (the leading dim of its first tensor argument) at the counted passes' FLOPs per example — right for
    a model whose FLOPs grow in proportion to its batch, as matmuls over the batch do.

    Args:
        model: the model whose forward calls delimit passes; None: count the block whole.

    Returns:
        A context manager.
    """
    counts = getattr(_open, "counts", [])
    if not counts:
        yield
        return
    with counts[-1]._block(model):
        yield


def count_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, FlopCount]:
    """Call ``fn(*args, **kwargs)`` (one training run) under a `FlopCount` with the default sample.

    Args:
        fn: the run, e.g. an objective: ``count_flops(objective, hparams, scale)``.
        *args: its positional arguments.
        **kwargs: its keyword arguments.

    Returns:
        (what `fn` returned, the `FlopCount`): its `total` is the run's FLOPs (NaN if the counting
        failed: its `error` says why). An exception from `fn` propagates, the count with it lost (use
        `FlopCount` itself to keep a failed run's count).
    """
    with FlopCount() as count:
        out = fn(*args, **kwargs)
    return out, count


def next_counter(counters: list[FlopCount | None], number: int) -> FlopCount | None:
    """The `FlopCount` of a run's next seed: later seeds reuse the first seed's I_0 (setup and first
    step: the same code and shapes), drawn from `number` (a trial's) and the seed's index. None when
    making it raised (a bug of ours: the run goes on uncounted).

    Args:
        counters: the counters of the seeds run so far (this one is not appended).
        number: what seeds the draw with the seed's index (a trial's number).

    Returns:
        A new `FlopCount`, or None.
    """
    try:
        first = counters[0].first if counters and counters[0] is not None and counters[0].error is None else None
        return FlopCount(seed=1_000 * number + len(counters), first=first)
    except Exception:
        return None


@contextlib.contextmanager
def guarded(counter: FlopCount | None) -> Iterator[None]:
    """Run the block under `counter`; the counter's own failure (entering or leaving) is kept in its
    `error` and never reaches the run. The block's own exceptions pass through unchanged.

    Args:
        counter: a `FlopCount` (None: the block runs uncounted).

    Returns:
        A context manager.
    """
    entered = False
    if counter is not None:
        try:
            counter.__enter__()
            entered = True
        except Exception as e:
            counter.error = f"FlopCount raised {type(e).__name__}: {e}"
            with contextlib.suppress(Exception):
                counter.__exit__(None, None, None)  # whatever it had put in place
    try:
        yield
    finally:
        if entered and counter is not None:
            try:
                counter.__exit__(None, None, None)
            except Exception as e:
                counter.error = counter.error or f"FlopCount raised {type(e).__name__}: {e}"


def flop_attrs(counters: list[FlopCount | None]) -> dict[str, Any]:
    """What a run of several seeds records of its FLOPs.

    Args:
        counters: one per seed that ran (None where its counter did not start).

    Returns:
        `flops` (the sum over the seeds; None when a seed's counting failed), `flops_per_seed`,
        `flops_measurement` (the part of `flops` in `counting` blocks: measurements after training), and
        `flops_error` (why not) when it failed.
    """
    try:
        return _flop_attrs_of(counters)
    except Exception as e:  # our own bookkeeping: never the trial's failure
        return {"flops": None, "flops_per_seed": [], "flops_error": f"{type(e).__name__}: {e}"[:_ERROR_CHARS]}


def _flop_attrs_of(counters: list[FlopCount | None]) -> dict[str, Any]:
    per_seed: list[float | None] = []
    error = None
    for c in counters:
        ok = c is not None and c.error is None and math.isfinite(c.total)
        per_seed.append(float(c.total) if ok and c is not None else None)
        if not ok and error is None:
            error = "the FLOP counter did not start" if c is None else c.error or "no count"
    out: dict[str, Any] = {
        "flops": None if error is not None or not per_seed else sum(f for f in per_seed if f is not None),
        "flops_per_seed": per_seed,
        "flops_measurement": sum(c.blocks for c in counters if c is not None and c.error is None),
    }
    if error is not None:
        out["flops_error"] = error[:_ERROR_CHARS]
    return out


# Vendor datasheet peaks, dense (no sparsity), in TFLOPS: bf16 on the tensor cores, and plain fp32 (torch's
# default matmul precision: TF32 off). Not measured here: they price FLOPs in device-hours at 100 % use.
PEAK_TFLOPS: dict[tuple[str, str], float] = {
    ("H200", "bf16"): 989.0,
    ("H200", "fp32"): 67.0,
    ("H100", "bf16"): 989.0,  # SXM; the PCIe card's is lower (756): pass --peak-tflops for it
    ("H100", "fp32"): 67.0,
    ("A100", "bf16"): 312.0,
    ("A100", "fp32"): 19.5,
}


def known_peak(device: str, precision: str) -> tuple[float, str] | None:
    """A CUDA device's datasheet peak for `precision` (`PEAK_TFLOPS`), from its name.

    Args:
        device: where the run trains ("cuda:0"; anything else has no known peak).
        precision: "bf16" or "fp32".

    Returns:
        (TFLOPS, where the number comes from), or None when the device is not a known GPU.
    """
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    try:
        name = torch.cuda.get_device_name(torch.device(device))
    except Exception:  # a device index this process cannot see
        return None
    for (model, prec), tflops in PEAK_TFLOPS.items():
        if model in name and prec == precision:
            return tflops, f"{name}'s datasheet peak for {precision} (dense)"
    return None
