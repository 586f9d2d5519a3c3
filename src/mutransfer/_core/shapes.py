"""Width shapes: which dims of each parameter grow with model size, and their base sizes.

A dim is a *width* dim when it differs between the base model and the delta model (or,
without a delta, between the base and the target). Everything downstream is relative to the
base sizes recorded here, so a training job can load them from JSON and never build a base model.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import ModelError
from .atomic import write_atomically
from .attention import base_head_dims
from .depth import DepthMap
from .naming import canonical_name, listed_differences
from .observe import observe_model

__all__ = ["SHAPES_FORMAT_VERSION", "ParamShape", "WidthShapes", "load_shapes", "save_shapes"]

SHAPES_FORMAT_VERSION = 1


@dataclass(frozen=True)
class ParamShape:
    """Base shape of one parameter and which of its dims are width dims."""

    base: tuple[int, ...]
    width: tuple[bool, ...]

    def width_ratios(self, shape: tuple[int, ...]) -> tuple[float, ...]:
        """The width ratio m = size / base size of every dim of a parameter of `shape`.

        Args:
            shape: the parameter's shape in the model.

        Returns:
            One ratio per dim (1.0 for finite dims).
        """
        return tuple(s / b if w else 1.0 for s, b, w in zip(shape, self.base, self.width))

    def multipliers(self, shape: tuple[int, ...]) -> tuple[float, ...]:
        """Deprecated spelling of `width_ratios` (kept one release; "multipliers" are tunable HPs).

        Args:
            shape: the parameter's shape in the model.

        Returns:
            `width_ratios(shape)`.
        """
        warnings.warn(
            "ParamShape.multipliers is deprecated; use ParamShape.width_ratios", DeprecationWarning, stacklevel=2
        )
        return self.width_ratios(shape)


@dataclass
class WidthShapes:
    """Name → `ParamShape` for every parameter, plus the base model's attention: head dim d₀ and,
    when a probe forward of the base ran, the logit scale s₀ it computes (module → (d₀, s₀))."""

    params: dict[str, ParamShape]
    attention_head_dims: dict[str, int] = field(default_factory=dict)
    attention_scales: dict[str, tuple[int, float]] = field(default_factory=dict)
    input_scales: dict[str, float] = field(default_factory=dict)  # constants on module inputs, from the probe
    # constants the base's forward multiplies onto module outputs ("<module>:input" for the input of a module
    # when they come from no module), from its probe; None when not measured (no probe, or an older file)
    output_scales: dict[str, float] | None = None
    # weight → (row dim, offsets where the base's forward cut its product's output) and (fan_in dim, offsets
    # where its input was concatenated): compared with the model's own probe by `row_roles`
    row_cuts: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    col_cuts: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_models(
        cls,
        base: nn.Module | Mapping[str, tuple],
        delta: nn.Module | Mapping[str, tuple] | None = None,
        target: nn.Module | Mapping[str, tuple] | None = None,
        example_inputs: Any = None,
    ) -> WidthShapes:
        """Compare base with delta (or with target when no delta is given).

        A base given as a module (real or meta) also gets a probe forward (on `example_inputs`, or
        inputs made for it) that measures the head dim and logit scale of its attention modules.
        """
        base_shapes = _shapes_of(base, "base")
        if delta is not None:
            other, other_name = _shapes_of(delta, "delta"), "delta"
        elif target is not None:
            other, other_name = _shapes_of(target, "target"), "target"
        else:
            raise ModelError("width shapes need a `delta` model (or a target) to compare `base` with")
        depth = DepthMap.between(base_shapes, other)
        _check_same_names(
            {depth.normalized(n) for n in base_shapes}, {depth.normalized(n) for n in other}, "base", other_name
        )
        params: dict[str, ParamShape] = {}
        for name, bshape in base_shapes.items():
            oshape = other[depth.from_base(name)]
            if len(bshape) != len(oshape):
                raise ModelError(
                    f"parameter '{name}' has rank {len(bshape)} in base but rank {len(oshape)} in "
                    f"{other_name}; base and {other_name} must be the same architecture"
                )
            if other_name == "delta":
                shrunk = [i for i, (b, o) in enumerate(zip(bshape, oshape)) if o < b]
                if shrunk:
                    raise ModelError(
                        f"parameter '{name}': dim {shrunk[0]} shrinks from {bshape[shrunk[0]]} in base "
                        f"to {oshape[shrunk[0]]} in delta; the delta model must be wider than the base "
                        f"in every width dim"
                    )
            params[name] = ParamShape(tuple(bshape), tuple(b != o for b, o in zip(bshape, oshape)))
        if not any(any(p.width) for p in params.values()):
            hint = (
                "base and delta have identical shapes"
                if delta is not None
                else "base and target have identical shapes; pass delta= (a wider copy of the base) "
                "so that the width dims can be found even at base width"
            )
            raise ModelError(f"no width dim found: {hint}")
        shapes = cls(params)
        if isinstance(base, nn.Module):
            shapes.attention_head_dims = base_head_dims(base)
            seen = observe_model(base, example_inputs)
            if not seen.ran and example_inputs is not None:  # inputs of width size (a bare block) do not fit the base
                seen = observe_model(base)
            shapes.input_scales = dict(seen.input_scales)
            if seen.ran and not seen.unreadable_constants:  # a meta base's buffer constants cannot be read
                shapes.output_scales = {m: c for m, (c, _) in seen.carried_constants.items()}
                shapes.output_scales.update({f"{m}:input": c for m, c in seen.unplaced_constants.items()})
            if seen.ran:
                shapes.row_cuts = {n: (d, tuple(sorted(c))) for n, (d, c) in seen.row_cuts.items()}
                shapes.col_cuts = {n: (d, tuple(sorted(c))) for n, (d, c) in seen.col_cuts.items()}
            for module, calls in seen.attention_by_module().items():
                shapes.attention_scales[module] = (calls[0].head_dim, calls[0].scale)
                shapes.attention_head_dims[module] = calls[0].head_dim
        return shapes

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        """The shapes as plain JSON data (the format `from_dict` and `load_shapes` read)."""
        return {
            "format": "mutransfer.width_shapes",
            "version": SHAPES_FORMAT_VERSION,
            "params": {n: {"base": list(p.base), "width": list(p.width)} for n, p in self.params.items()},
            "attention_head_dims": dict(self.attention_head_dims),
            "attention_scales": {m: [d, s] for m, (d, s) in self.attention_scales.items()},
            "input_scales": dict(self.input_scales),
            **({} if self.output_scales is None else {"output_scales": dict(self.output_scales)}),
            **{
                key: {n: [d, list(c)] for n, (d, c) in cuts.items()}
                for key, cuts in (("row_cuts", self.row_cuts), ("col_cuts", self.col_cuts))
                if cuts
            },
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the shapes to `path` as JSON.

        Args:
            path: the file to write.
        """
        write_atomically(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def from_dict(cls, data: dict, source: str = "base_shapes") -> WidthShapes:
        """Shapes from the JSON data `to_dict` makes.

        Args:
            data: the parsed JSON.
            source: what the data came from, for messages.

        Returns:
            The shapes.

        Raises:
            ModelError: the data is not a mutransfer width-shapes file of a version this library reads.
        """
        if not isinstance(data, dict) or data.get("format") != "mutransfer.width_shapes":
            raise ModelError(
                f"{source} is not a mutransfer width-shapes file "
                "(expected the JSON written by WidthShapes.save / mt.save_shapes)"
            )
        if data.get("version") != SHAPES_FORMAT_VERSION:
            raise ModelError(
                f"{source} has format version {data.get('version')}; "
                f"this mutransfer reads version {SHAPES_FORMAT_VERSION}"
            )
        params = {}
        for name, entry in data["params"].items():
            base, width = entry.get("base"), entry.get("width")
            if not isinstance(base, list) or not isinstance(width, list) or len(base) != len(width):
                raise ModelError(f"{source}: entry for '{name}' needs lists 'base' and 'width' of equal length")
            params[name] = ParamShape(tuple(int(b) for b in base), tuple(bool(w) for w in width))
        heads = {k: int(v) for k, v in data.get("attention_head_dims", {}).items()}
        scales = {k: (int(v[0]), float(v[1])) for k, v in data.get("attention_scales", {}).items()}
        inputs = {k: float(v) for k, v in data.get("input_scales", {}).items()}
        outputs = data.get("output_scales")
        outputs = None if outputs is None else {k: float(v) for k, v in outputs.items()}
        rows, cols = (
            {k: (int(v[0]), tuple(int(x) for x in v[1])) for k, v in data.get(key, {}).items()}
            for key in ("row_cuts", "col_cuts")
        )
        return cls(params, heads, scales, inputs, outputs, rows, cols)

    @classmethod
    def load(cls, path: str | os.PathLike) -> WidthShapes:
        """Shapes from a file written by `save` / `save_shapes`.

        Args:
            path: the JSON file.

        Returns:
            The shapes.

        Raises:
            ModelError: the file is missing, not JSON, or not a width-shapes file.
        """
        if not os.path.exists(path):
            raise ModelError(f"base_shapes file '{path}' does not exist")
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise ModelError(f"base_shapes file '{path}' is not valid JSON: {e}") from None
        return cls.from_dict(data, source=f"base_shapes file '{path}'")


def save_shapes(base: nn.Module, delta: nn.Module, path: str | os.PathLike, example_inputs: Any = None) -> WidthShapes:
    """Find the width dims of `base` vs `delta` and write them to `path` (JSON), with the base's attention
    scales measured on a probe forward (on `example_inputs`, or inputs made for it)."""
    shapes = WidthShapes.from_models(base, delta, example_inputs=example_inputs)
    shapes.save(path)
    return shapes


def load_shapes(path: str | os.PathLike) -> WidthShapes:
    """Load width shapes saved by `save_shapes` (what ``parametrize(base_shapes=...)`` also takes).

    Args:
        path: the JSON file.

    Returns:
        The shapes.

    Raises:
        ModelError: the file is missing, not JSON, or not a width-shapes file.
    """
    return WidthShapes.load(path)


def _shapes_of(obj, what: str) -> dict[str, tuple[int, ...]]:
    if isinstance(obj, nn.Module):
        return {canonical_name(n): tuple(p.shape) for n, p in obj.named_parameters()}
    if isinstance(obj, Mapping):
        out = {}
        for n, s in obj.items():
            if isinstance(s, torch.Tensor):
                s = s.shape
            out[canonical_name(n)] = tuple(int(x) for x in s)
        return out
    raise TypeError(f"`{what}` must be an nn.Module or a mapping of parameter name to shape, got {type(obj).__name__}")


def _check_same_names(a, b, a_name: str, b_name: str) -> None:
    only_a = sorted(set(a) - set(b))
    only_b = sorted(set(b) - set(a))
    if only_a or only_b:
        parts = listed_differences((f"only in {a_name}", only_a), (f"only in {b_name}", only_b))
        raise ModelError(
            f"{a_name} and {b_name} have different parameter names ({parts}); "
            "they must be the same architecture at different widths"
        )
