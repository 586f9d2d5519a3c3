"""Residual branches: which child modules of a repeated block add onto its residual stream.

A block's own ``forward`` is traced with torch.fx, its child modules kept opaque: every addition onto
the residual stream (the block's first input, then each sum with it) has a branch operand, and the
child module that produced it is the branch (``x + self.attn(self.ln1(x))`` → ``attn``); a dropout or
identity on the way is looked through. Where fx cannot trace the block (Hugging Face's GPT2Block,
LlamaDecoderLayer: "co_varnames is too small") and a probe input is given, the same is observed on a
probe forward (`probe_branches`): the additions onto the block's first input, and the child whose
output (or its tuple's first element) is the other operand — or two such outputs summed first
(GPT-NeoX's parallel attention + MLP). That module's output is then multiplied by m_L^-α (a subclass of
its class, see `scaled_forward`; nothing else changes). Where tracing cannot see the branches, name them
(``residual_branches=["blocks.*.attn", "blocks.*.mlp"]``, module name patterns) or scale them in the
forward with ``x = x + mt.residual_branch(self, branch_out)``.

A block that fx (and the probe, where it runs) observes adding nothing onto its input has no residual
stream: a *plain stack* (a deep MLP's hidden Linears), unless the parent adds each block's output onto
a stream of its own (then the blocks are the branches). µP refuses to depth-scale a plain stack (there
is no branch to scale: pass depth_alpha=0); u-µP, whose depth rule is for residual branches only, asks
`find_branches` to report it (``report_plain``) and applies no depth rule to it
(`DepthMap.without_depth_rule`).
"""

from __future__ import annotations

import fnmatch
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.fx
from torch import nn

from ..errors import ModelError
from .depth import DepthMap, join_name, traced_helper
from .naming import canonical_name

__all__ = [
    "MUP_BRANCH_FIXES",
    "Branch",
    "FoundBranches",
    "branch_end",
    "find_branches",
    "probe_branches",
    "trace_branches",
]


class _BlockTracer(torch.fx.Tracer):
    """Traces one block's forward with every child module opaque."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return "." not in qualname or super().is_leaf_module(m, qualname)


_ADD_FUNCTIONS = {operator.add, operator.iadd, torch.add}
_ADD_METHODS = {"add", "add_"}


def _is_add(node: torch.fx.Node) -> bool:
    return (node.op == "call_function" and node.target in _ADD_FUNCTIONS) or (
        node.op == "call_method" and node.target in _ADD_METHODS
    )


def trace_branches(block: nn.Module) -> tuple[str, list[tuple[str, bool]]]:
    """How a block's residual branches can be scaled: ("modules", [(child name, tuple output)]),
    ("helper", []) when its forward calls `residual_branch`, or raises ValueError (a `_NoResidual` when
    the traced forward adds nothing onto its input, an `_Untraceable` when fx cannot trace it)."""
    traced_helper(block, clear=True)
    try:
        graph = _BlockTracer().trace(block)
    except Exception as e:  # fx raises many kinds (TraceError, TypeError, NotImplementedError, ...)
        raise _Untraceable(
            f"torch.fx could not trace {type(block).__name__}.forward ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''})"
        ) from None
    if traced_helper(block, clear=True):
        return "helper", []
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not placeholders:
        raise _TraceFailure(f"{type(block).__name__}.forward takes no input")
    stream = {placeholders[0]}
    branches: list[tuple[str, bool]] = []
    for node in graph.nodes:
        if not _is_add(node) or len(node.args) < 2:
            continue
        a, b = node.args[0], node.args[1]
        if a in stream and b not in stream:
            other = b
        elif b in stream and a not in stream:
            other = a
        else:
            continue
        stream.add(node)
        tuple_out = False
        while True:
            if (
                isinstance(other, torch.fx.Node)
                and other.op == "call_function"
                and other.target is operator.getitem
                and other.args[1] == 0
                and isinstance(other.args[0], torch.fx.Node)
            ):
                other, tuple_out = other.args[0], True
            # a dropout (or identity) on the branch: the branch is the module before it (linear: the same
            # function with the multiplier before it, and export can fold it there)
            if (
                isinstance(other, torch.fx.Node)
                and other.op == "call_module"
                and isinstance(block.get_submodule(str(other.target)), (nn.Identity, nn.modules.dropout._DropoutNd))
                and other.args
                and isinstance(other.args[0], torch.fx.Node)
                and other.args[0].op in ("call_module", "call_function")
            ):
                other, tuple_out = other.args[0], False
                continue
            break
        if not isinstance(other, torch.fx.Node) or other.op != "call_module":
            what = other.format_node() if isinstance(other, torch.fx.Node) else repr(other)
            raise _TraceFailure(
                f"a residual addition in {type(block).__name__}.forward adds `{what}`, which is "
                "not the output of a child module"
            )
        branches.append((str(other.target), tuple_out))
    if not branches:
        raise _NoResidual(f"{type(block).__name__}.forward adds nothing onto its input (no residual connection found)")
    return "modules", branches


class _TraceFailure(ValueError):
    """A block's residual branches could not be found (the message says why)."""


class _Untraceable(_TraceFailure):
    """torch.fx could not trace the block's forward: nothing was observed."""


class _NoResidual(_TraceFailure):
    """The block was observed to add nothing onto its input: it has no residual stream."""


@dataclass(frozen=True)
class Branch:
    """A residual branch: the module whose output is added onto the stream."""

    module: str
    tuple_output: bool = False  # the branch is element 0 of the module's tuple output
    end: str | None = None  # a Linear/Conv whose output *is* the branch's (the multiplier can fold into it)


_LINEAR = (nn.Linear, nn.modules.conv._ConvNd)


def branch_end(module: nn.Module, depth: int = 0) -> str | None:
    """Relative name of the Linear/Conv layer whose output is `module`'s output ("" for itself)."""
    if isinstance(module, _LINEAR):
        return ""
    if depth > 4 or type(module).forward is nn.Module.forward:
        return None
    try:
        graph = _BlockTracer().trace(module)
    except Exception:  # untraceable: keep the forward constant on the branch module
        return None
    out = next((n for n in graph.nodes if n.op == "output"), None)
    last = out.args[0] if out is not None else None
    if not isinstance(last, torch.fx.Node) or last.op != "call_module":
        return None
    child = str(last.target)
    inner = branch_end(module.get_submodule(child), depth + 1)
    return None if inner is None else join_name(child, inner)


def probe_branches(block: nn.Module, model: nn.Module, inputs: Any) -> list[tuple[str, bool]]:
    """A block's residual branches observed on one forward of `model` on `inputs` (no grad, eval mode):
    the same answer as `trace_branches`, for blocks torch.fx cannot trace.

    The residual stream is the block's first tensor input (positional, or the ``hidden_states``
    keyword), then every sum of it with another tensor; the other operand of each such addition must be
    the output of one of the block's direct children (or the first element of its tuple output: HF
    attention returns ``(attn_output, weights)``), and that child is a branch.

    Args:
        block: the first block of a depth container (a submodule of `model`).
        model: the model, before parametrize changes anything.
        inputs: the probe inputs parametrize ran (`call_model`'s forms).

    Returns:
        (child name, tuple output) per branch, in forward order.

    Raises:
        ValueError: the forward failed, never ran the block, an addition onto the stream adds
            something that is not a child's output (named), or nothing is added onto the stream (the
            block has none: a `_NoResidual`).
    """
    from torch.overrides import TorchFunctionMode

    from .observe import call_model, probe_mode
    from .op_tables import op_name

    # id(tensor) → (tensor, [(child, tuple output)]): a child's output, a dropout's of one (the same branch: a
    # dropout is the identity in eval and linear in training, so the multiplier may sit before it), or a sum of
    # such outputs (GPT-NeoX's and GPT-J's parallel attention + MLP, added onto the stream together)
    produced: dict[int, tuple[Any, list[tuple[str, bool]]]] = {}
    stream: dict[int, torch.Tensor] = {}
    found: list[tuple[str, bool]] = []
    problems: list[str] = []
    state = {"inside": False, "done": False}

    def source(t: Any) -> list[tuple[str, bool]] | None:
        hit = produced.get(id(t)) if isinstance(t, torch.Tensor) else None
        return hit[1] if hit is not None and hit[0] is t else None

    class _Adds(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not state["inside"] or op_name(func) != "add" or len(args) < 2:
                return out
            a, b = args[0], args[1]
            in_a = isinstance(a, torch.Tensor) and stream.get(id(a)) is a
            in_b = isinstance(b, torch.Tensor) and stream.get(id(b)) is b
            if not isinstance(out, torch.Tensor):
                return out
            if not in_a and not in_b:  # two branches summed before they reach the stream
                sa, sb = source(a), source(b)
                if sa is not None and sb is not None:
                    produced[id(out)] = (out, sa + sb)
                return out
            if in_a == in_b:
                return out
            other = b if in_a else a
            hit = source(other)
            if hit is None:
                problems.append(
                    f"an addition onto the residual stream adds a {type(other).__name__} that no child of "
                    f"{type(block).__name__} returned"
                )
                return out
            stream[id(out)] = out
            found.extend(hit)
            return out

    def child_hook(name: str, module: nn.Module):
        passes = isinstance(module, (nn.Identity, nn.modules.dropout._DropoutNd))

        def hook(mod: nn.Module, args: Any, out: Any) -> None:
            if not state["inside"]:
                return
            upstream = source(args[0]) if passes and args else None
            if isinstance(out, torch.Tensor):
                produced[id(out)] = (out, upstream if upstream is not None else [(name, False)])
            elif isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
                produced[id(out[0])] = (out[0], [(name, True)])

        return hook

    def enter(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if state["done"]:
            return
        first = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("hidden_states")
        if isinstance(first, torch.Tensor):
            stream[id(first)] = first
            state["inside"] = True

    def leave(module: nn.Module, args: Any, out: Any) -> None:
        if state["inside"]:
            state["inside"], state["done"] = False, True

    hooks = [block.register_forward_pre_hook(enter, with_kwargs=True), block.register_forward_hook(leave)]
    hooks += [child.register_forward_hook(child_hook(n, child)) for n, child in block.named_children()]
    try:
        with probe_mode(model), _Adds():
            call_model(model, inputs)
    except Exception as e:  # the probe is best effort: the caller names the fallback
        raise _TraceFailure(
            f"the probe forward that observes {type(block).__name__}'s residual additions failed "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
        ) from None
    finally:
        for h in hooks:
            h.remove()
    if not state["done"]:
        raise _TraceFailure(f"the probe forward never ran {type(block).__name__}")
    if problems:
        raise _TraceFailure(problems[0])
    if not found:
        raise _NoResidual(f"{type(block).__name__} adds nothing onto its input on the probe forward")
    return found


class FoundBranches(NamedTuple):
    """What `find_branches` found: the residual branches to scale, the blocks that scale themselves
    (`residual_branch`), and the containers observed to have no residual stream (when asked for)."""

    branches: list[Branch]
    helpers: list[str]
    plain: list[str]


MUP_BRANCH_FIXES = (
    ", write `x = x + mt.residual_branch(self, branch)` in the block's forward, or pass depth_alpha=0 "
    "to change depth without depth scaling"
)


def find_branches(
    model: nn.Module,
    depth: DepthMap,
    patterns: Iterable[str] | None,
    inputs: Any = None,
    *,
    report_plain: bool = False,
    fixes: str = MUP_BRANCH_FIXES,
) -> FoundBranches:
    """The residual branches to scale, the blocks that scale themselves (`residual_branch`), and (with
    `report_plain`) the containers whose blocks have no residual stream.

    With `patterns`, the named modules are the branches. Otherwise the first block of each
    depth container is traced and the same children of every block are taken; where torch.fx cannot
    trace it and `inputs` (a probe input of the model) is given, they are observed on a probe forward
    (`probe_branches`).

    Args:
        model: the model, before parametrize changes anything.
        depth: its depth containers.
        patterns: module name patterns of the branches (``residual_branches=``), or None to trace.
        inputs: the probe inputs parametrize ran, or None (fx alone).
        report_plain: report a container whose blocks were *observed* to add nothing onto their input
            (fx traced no addition, or could not trace and the probe saw none; and the probe, when it ran,
            saw none either) in ``plain`` instead of raising; with `patterns`, the containers holding no
            named branch are looked at too. Default: raise, as for any container whose branches are not found.
        fixes: the fixes the error names after ``residual_branches=`` (µP's: the `residual_branch` helper or
            depth_alpha=0; pass "" where those do not apply).

    Raises:
        ModelError: a pattern matches nothing or lies outside the containers, or a container's branches
            cannot be found (and it is not reported as plain).
    """
    modules = {canonical_name(n): m for n, m in model.named_modules()}
    found = FoundBranches([], [], [])
    if patterns is not None:
        patterns = [patterns] if isinstance(patterns, str) else list(patterns)
        for pat in patterns:
            if not isinstance(pat, str):
                raise TypeError(f"residual_branches must hold module name patterns (str), got {pat!r}")
            hits = [n for n in modules if fnmatch.fnmatchcase(n, pat)]
            if not hits:
                raise ModelError(f"residual_branches pattern '{pat}' matches no module of the model")
            for n in hits:
                if depth.locate(n) is None:
                    raise ModelError(
                        f"residual_branches: '{n}' is not inside a block of a depth container "
                        f"({', '.join(depth.containers) or 'none found'})"
                    )
                end = branch_end(modules[n])
                found.branches.append(Branch(n, False, None if end is None else join_name(n, end)))
        if report_plain:
            named = {hit[0] for b in found.branches if (hit := depth.locate(b.module)) is not None}
            for prefix in depth.containers:
                first = modules.get(join_name(prefix, 0))
                if prefix not in named and first is not None and _observed_plain(first, model, inputs):
                    blocks = [modules[join_name(prefix, i)] for i in range(depth.containers[prefix][1])]
                    seen = _outputs_added(blocks, model, inputs)
                    if seen is not None and not any(a for a, _ in seen):
                        found.plain.append(prefix)
        return found
    for prefix, (_, l) in depth.containers.items():
        first = modules.get(join_name(prefix, 0))
        if first is None:
            raise ModelError(f"depth container '{prefix}': block 0 is not a module")
        try:
            kind, children = _block_branches(first, model, inputs)
        except _TraceFailure as e:
            if report_plain and isinstance(e, _NoResidual):
                blocks = [modules[join_name(prefix, i)] for i in range(l)]
                seen = _outputs_added(blocks, model, inputs)
                if seen is None or not any(a for a, _ in seen):
                    found.plain.append(prefix)
                    continue
                if all(a for a, _ in seen):  # the parent adds each block onto its stream: the blocks are the branches
                    for i, (_, tuple_out) in enumerate(seen):
                        end = None if tuple_out else branch_end(blocks[i])
                        name = join_name(prefix, i)
                        found.branches.append(Branch(name, tuple_out, None if end is None else join_name(name, end)))
                    continue
                e = _TraceFailure(f"{e}, and only some of its blocks' outputs are added onto a stream outside them")
            names = _branch_suggestion(first, prefix)
            raise ModelError(
                f"depth scaling needs the residual branches of the blocks in '{prefix}', but {e}. Name the branch "
                f"modules with residual_branches=[{names}] (patterns){fixes}"
            ) from None
        if kind == "helper":
            found.helpers.extend(join_name(prefix, i) for i in range(l))
            continue
        ends = {c: (None if tuple_out else branch_end(first.get_submodule(c))) for c, tuple_out in children}
        for i in range(l):
            for child, tuple_out in children:
                end = ends[child]
                found.branches.append(
                    Branch(
                        join_name(prefix, i, child),
                        tuple_out,
                        None if end is None else join_name(prefix, i, child, end),
                    )
                )
    return found


def _block_branches(block: nn.Module, model: nn.Module, inputs: Any) -> tuple[str, list[tuple[str, bool]]]:
    """`trace_branches` of a block, else (with `inputs`) `probe_branches`. Raises a `_TraceFailure` naming what
    each saw: a `_NoResidual` when the block was observed to add nothing onto its input — fx traced no
    addition, or could not trace it and the probe saw none; and the probe, when it ran, saw none either."""
    try:
        return trace_branches(block)
    except _TraceFailure as e:
        if inputs is None:
            raise
        try:
            return "modules", probe_branches(block, model, inputs)
        except _TraceFailure as p:
            why = f"{e}; on the probe forward, {p}"
            plain = isinstance(p, _NoResidual) and isinstance(e, (_NoResidual, _Untraceable))
            raise (_NoResidual if plain else _TraceFailure)(why) from None


def _observed_plain(block: nn.Module, model: nn.Module, inputs: Any) -> bool:
    """Whether `block` was observed to add nothing onto its input (see `_block_branches`)."""
    try:
        _block_branches(block, model, inputs)
    except _NoResidual:
        return True
    except _TraceFailure:
        return False
    return False


def _outputs_added(blocks: list[nn.Module], model: nn.Module, inputs: Any) -> list[tuple[bool, bool]] | None:
    """For each block, whether its output (or the first element of its tuple output) is an operand of an
    addition anywhere on one probe forward of `model` — a stream that the *parent* adds each block onto
    (``x = x + moe(norm(x))`` with ``moes`` a ModuleList): then the blocks themselves are the branches —
    and whether that output was a tuple. None when the forward fails or `inputs` is None."""
    if inputs is None:
        return None
    from torch.overrides import TorchFunctionMode

    from .observe import call_model, probe_mode
    from .op_tables import op_name

    outputs: dict[int, tuple[torch.Tensor, int, bool]] = {}  # id(output) → (output, block index, tuple output)
    added = [False] * len(blocks)
    tupled = [False] * len(blocks)

    class _Adds(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if op_name(func) == "add":
                for a in args[:2]:
                    hit = outputs.get(id(a)) if isinstance(a, torch.Tensor) else None
                    if hit is not None and hit[0] is a:
                        added[hit[1]] = True
            return func(*args, **(kwargs or {}))

    def hook(i: int):
        def record(module: nn.Module, args: Any, out: Any) -> None:
            if isinstance(out, torch.Tensor):
                outputs[id(out)] = (out, i, False)
            elif isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
                outputs[id(out[0])] = (out[0], i, True)
                tupled[i] = True

        return record

    handles = [b.register_forward_hook(hook(i)) for i, b in enumerate(blocks)]
    try:
        with probe_mode(model), _Adds():
            call_model(model, inputs)
    except Exception:
        return None
    finally:
        for h in handles:
            h.remove()
    return list(zip(added, tupled))


def _branch_suggestion(block: nn.Module, prefix: str) -> str:
    """Patterns of the block's own children that look like its branches (those holding parameters and no
    norm), from its real module names: Llama's ``self_attn`` and ``mlp``, GPT-2's ``attn`` and ``mlp``."""
    kids = [
        n
        for n, m in block.named_children()
        if any(True for _ in m.parameters()) and "norm" not in type(m).__name__.lower() and not n.startswith("ln")
    ]
    kids = [n for n in kids if "norm" not in n.lower()] or [n for n, _ in block.named_children()]
    return ", ".join(f"'{prefix}.*.{n}'" for n in kids[:4]) or f"'{prefix}.*.<branch>'"
