"""What a rule sees of the pass over the graph: the `Pass` protocol, below the rules and `run`.

`run.Run` is the one pass there is; the rules (`rules/*`) and `dispatch`'s tables are typed against this
protocol, so that they do not import `run` (which imports `dispatch`, which imports the rules): `limits/`
reads bottom up, `context` → `rules` → `dispatch` → `run`.
"""

from __future__ import annotations

from typing import Any, NoReturn, Protocol

import torch

from .._fields import Basis, Field, Layout, Term

__all__ = ["Pass"]


class Pass(Protocol):
    """The state and helpers of one pass over a traced graph, as the op rules use them (`run.Run`)."""

    xa: torch.Tensor  # the two sides' inputs (an x1 chunk and x2)
    xb: torch.Tensor
    wv: float  # weight and bias variances
    bv: float
    compute: bool  # False: the structure pass (no kernel tensors)
    want_ntk: bool
    bases: dict[int, Basis]
    node: Any  # the graph node being evaluated
    used_weights: dict[int, str]

    def fail(self, what: str) -> NoReturn: ...

    def need(self, arg: Any, how: str = "pass") -> None: ...

    def layout_here(self, spatial: tuple) -> Layout: ...

    def new_basis(
        self,
        layout: Layout,
        k: dict | None,
        ntk: Any,
        support: frozenset = frozenset(),
        means: dict | None = None,
        gaussian: bool = True,
    ) -> int: ...

    @staticmethod
    def field_of(bid: int, axes: list, sizes: dict, layout: Layout) -> Field: ...

    def as_field(self, v: Any) -> Field: ...

    def blocks(self) -> tuple[str, ...]: ...

    def fill(self, k: dict) -> dict: ...

    @staticmethod
    def input_sides(xa: torch.Tensor, xb: torch.Tensor, blk: str) -> tuple[torch.Tensor, torch.Tensor]: ...

    def combo_var(self, g: tuple, side: str, layout: Layout) -> torch.Tensor: ...

    def opaque(self, t: Term) -> Basis | None: ...

    def input_kernels(self, x: Field) -> tuple[dict, torch.Tensor | None]: ...

    def field_means(self, f: Field, side: str) -> Any: ...

    def check_independent(self, parts: list) -> None: ...
