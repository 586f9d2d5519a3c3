"""First-order MAML on a one-hidden-layer linear network, finite and at infinite width (Tensor Programs IV).

The network ``nn.Sequential(nn.Linear(d, n, bias=False), nn.Linear(n, k, bias=False))``, put in µP by
`mt.parametrize(model, base=base)`: f(x) = W₂ W₁ x. One task is (xs, ys, xq, yq): a support set to adapt
on and a query set to score the adapted net on; the loss is the mean cross-entropy of a set.

**Finite training** (`train_maml`): per task, one inner SGD step of size `step_size` on the support
loss, each layer's step scaled by its factor from ``mt.param_groups(model, lr=1, optimizer="sgd")``; the
gradient of the query loss at the adapted weights (first order: the adaptation's own dependence on the
weights is dropped), averaged over the meta-batch; an outer SGD step on ``mt.param_groups(model,
lr=meta_lr, optimizer="sgd")``.

**The µP limit** (`MAMLLimit(kind="mup")`). Write hidden unit α's parameters as z_α = (u_α, a_α): its
input row u_α ∈ ℝᵈ and its readout column scaled by the width, a_α = n·W₂[:, α] ∈ ℝᵏ. Then
f(x) = (1/n) Σ_α a_α u_αᵀx → E[a uᵀ] x, and an SGD step with per-example output gradients gᵢ moves

    u_α ← u_α − η κ₁ Σᵢ xᵢ (gᵢ·a_α),    a_α ← a_α − η κ₂ Σᵢ gᵢ (u_α·xᵢ)

(κ₁ = lr₁/n and κ₂ = lr₂·n: the groups' factors in their width-free form, read off the model as
`FeatureLimit` reads them). In the limit the gᵢ are deterministic, so every unit moves by the same
linear map of its Gaussian start: z_α = A z⁰_α, and f(x) = A_a Σ₀ A_uᵀ x, with Σ₀ the covariance of
z⁰ (the scaled init variances, observed). The state is the (d + k) × (d + k) matrix A: exact, no
sampling, float64. An inner step adapts A; the query gradient at the adapted A moves A.

**The kernel limits** (`kind="ntk" | "gp"`): the same network in the NTK parametrization stays in its
kernel regime. Its kernels here are multiples of xᵀx′ (linear features): θ = σ_u² + σ_a² for the NTK
(both layers trained), σ_u² for the GP (the readout alone), with the same scaled init variances. The
function is then f(x) = B x, B a k × d matrix from zero: an inner step adds −η θ Σ gᵢ xᵢᵀ; meta-training
moves B the same way. No feature moves, so the metric a new task is solved in stays xᵀx′.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["MAMLLimit", "Task", "check_tasks", "linear_net", "maml_logits", "train_maml"]

Task = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # (xs, ys, xq, yq)
KINDS = ("mup", "ntk", "gp")


def linear_net(model: nn.Module) -> tuple[int, int, int]:
    """(d, n, k) of the supported network, or a ValueError naming what is not supported.

    Args:
        model: ``nn.Sequential(nn.Linear(d, n, bias=False), nn.Linear(n, k, bias=False))``.

    Returns:
        Its input size, width and number of classes.
    """
    if not isinstance(model, nn.Sequential):
        raise ValueError(
            f"model must be nn.Sequential(nn.Linear(d, n, bias=False), nn.Linear(n, k, bias=False)), got "
            f"{type(model).__name__}; for other modules use mt.limits.FeatureLimit (SGD on MLP-like programs)"
        )
    layers = list(model)
    extra = [type(m).__name__ for m in layers if not isinstance(m, nn.Linear)]
    if extra:
        raise ValueError(
            f"model has {', '.join(extra)} between or after its layers: the MAML limit is exact for the linear "
            "net nn.Linear → nn.Linear only (a nonlinearity makes the units' dynamics nonlinear; "
            "mt.limits.FeatureLimit handles MLPs under plain SGD, not MAML)"
        )
    if len(layers) != 2:
        raise ValueError(f"model has {len(layers)} linear layers; the MAML limit supports exactly 2 (input, readout)")
    first, second = layers
    for name, m in (("0", first), ("1", second)):
        if m.bias is not None:
            raise ValueError(f"layer {name} ({m}) has a bias; build it with bias=False (the limit has none)")
    assert isinstance(first, nn.Linear) and isinstance(second, nn.Linear)  # checked above
    if first.out_features != second.in_features:
        raise ValueError(f"layer 0 gives {first.out_features} features, layer 1 takes {second.in_features}")
    return first.in_features, first.out_features, second.out_features


def check_tasks(tasks: Sequence[Any], d: int, k: int, what: str = "tasks") -> list[Task]:
    """The tasks as float/long tensors, checked: support and query sets of d-vectors, labels in [0, k).

    Args:
        tasks: ``(xs, ys, xq, yq)`` tuples.
        d: the input size.
        k: the number of classes (the readout's size).
        what: how to name them in errors.

    Returns:
        The tasks, each ``(xs float, ys long, xq float, yq long)``.
    """
    out = []
    for i, t in enumerate(tasks):
        if not isinstance(t, (tuple, list)) or len(t) != 4:
            raise ValueError(f"{what}[{i}] must be a tuple (xs, ys, xq, yq), got {type(t).__name__}")
        xs, ys, xq, yq = (torch.as_tensor(v) for v in t)
        for name, x, y in (("support", xs, ys), ("query", xq, yq)):
            if x.dim() != 2 or x.shape[1] != d:
                raise ValueError(f"{what}[{i}]: the {name} inputs must be (examples, {d}), got {tuple(x.shape)}")
            if x.shape[0] == 0:
                raise ValueError(f"{what}[{i}]: the {name} set is empty; a task needs at least one example in each")
            if y.shape != (x.shape[0],) or y.dtype.is_floating_point:
                raise ValueError(
                    f"{what}[{i}]: the {name} labels must be integers, one per example ({x.shape[0]}), got "
                    f"{tuple(y.shape)} {y.dtype}"
                )
            if int(y.min()) < 0 or int(y.max()) >= k:
                raise ValueError(
                    f"{what}[{i}]: {name} labels run {int(y.min())}…{int(y.max())}, but the model has {k} classes "
                    f"(labels 0…{k - 1}): every task must be {k}-way"
                )
        out.append((xs.double(), ys.long(), xq.double(), yq.long()))
    return out


def _checked_batches(meta_batches: Sequence[Sequence[Any]], d: int, k: int) -> list[list[Task]]:
    """Every meta-batch checked before the first step (a bad one late in the list changes nothing)."""
    out = []
    for j, batch in enumerate(meta_batches):
        tasks = check_tasks(batch, d, k, f"meta_batches[{j}]")
        if not tasks:
            raise ValueError(f"meta_batches[{j}] is empty; each meta-batch needs at least one task")
        out.append(tasks)
    return out


def _rate(name: str, value: Any, zero: bool) -> float:
    """A step size (> 0) or a meta lr (≥ 0: `zero`), checked."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or not (value >= 0 if zero else value > 0):
        raise ValueError(f"{name} must be a finite number {'≥ 0' if zero else '> 0'}, got {value!r}")
    return float(value)


def _grad(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """d(mean cross-entropy)/d(logits): (softmax − one-hot) / examples; any leading (task) dims."""
    p = torch.softmax(logits, dim=-1)
    return (p - nn.functional.one_hot(y, p.shape[-1]).to(p.dtype)) / y.shape[-1]


def _stacked(tasks: list[Task]) -> list[tuple[torch.Tensor, ...]]:
    """The tasks in groups of one shape, each group's tensors stacked along a leading task dim."""
    groups: dict[tuple, list[Task]] = {}
    for t in tasks:
        groups.setdefault((t[0].shape, t[2].shape), []).append(t)
    return [tuple(torch.stack([t[i] for t in group]) for i in range(4)) for group in groups.values()]


@contextlib.contextmanager
def _threads_for(size: int) -> Iterator[None]:
    """One torch thread while working on matrices this small (a (69 × 69) step took 0.27 ms on one thread
    and 7.6 ms on two busy cores: the threads' hand-offs cost more than the work); restored after."""
    before = torch.get_num_threads()
    if size < 512 and before > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _layer_factors(model: nn.Module) -> tuple[float, float]:
    """Each layer's SGD factor from ``mt.param_groups(model, lr=1, optimizer="sgd")``."""
    from ._feature.scaling import sgd_factors  # the one place limits/ calls the package's public face

    w1, w2 = _weights(model)
    by_id = sgd_factors(model)
    return by_id[id(w1)], by_id[id(w2)]


def _weights(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    first, second = list(model.children())
    assert isinstance(first, nn.Linear) and isinstance(second, nn.Linear)  # `linear_net` checked it
    return first.weight, second.weight


def _adapt(w1, w2, xs, ys, step: float, c1: float, c2: float):
    """One inner SGD step on the support loss (each layer's step × its factor); xs (tasks, examples, d)."""
    h = xs @ w1.T  # (tasks, examples, n)
    g = _grad(h @ w2.T, ys)  # (tasks, examples, k)
    return w1 - step * c1 * (g @ w2).transpose(1, 2) @ xs, w2 - step * c2 * g.transpose(1, 2) @ h


def train_maml(model: nn.Module, meta_batches: Sequence[Sequence[Any]], step_size: float, meta_lr: float) -> nn.Module:
    """First-order MAML on the µP linear net, in place (see the module docstring).

    Args:
        model: the linear net, parametrized by `mt.parametrize(model, base=...)`.
        meta_batches: a list of meta-batches, each a list of ``(xs, ys, xq, yq)`` tasks.
        step_size: the inner SGD step (× each layer's µP factor).
        meta_lr: the outer SGD lr (× each layer's µP factor).

    Returns:
        `model`, meta-trained.
    """
    d, _, k = linear_net(model)
    step_size, meta_lr = _rate("step_size", step_size, False), _rate("meta_lr", meta_lr, True)
    batches = _checked_batches(meta_batches, d, k)
    c1, c2 = _layer_factors(model)
    w1, w2 = _weights(model)
    with torch.no_grad():
        for tasks in batches:
            g1, g2 = torch.zeros_like(w1), torch.zeros_like(w2)
            for xs, ys, xq, yq in _stacked(tasks):
                xs, xq = xs.to(w1.dtype), xq.to(w1.dtype)
                a1, a2 = _adapt(w1, w2, xs, ys, step_size, c1, c2)  # (tasks, n, d), (tasks, k, n)
                h = xq @ a1.transpose(1, 2)
                g = _grad(h @ a2.transpose(1, 2), yq)
                g1 += ((g @ a2).transpose(1, 2) @ xq).sum(0)
                g2 += (g.transpose(1, 2) @ h).sum(0)
            w1 -= meta_lr * c1 * g1 / len(tasks)
            w2 -= meta_lr * c2 * g2 / len(tasks)
    return model


def maml_logits(
    model: nn.Module, xs: torch.Tensor, ys: torch.Tensor, xq: torch.Tensor, step_size: float
) -> torch.Tensor:
    """The finite net's query logits after one inner step on (xs, ys) (the model itself unchanged).

    Args:
        model: the (meta-trained) µP linear net.
        xs: support inputs (examples, d).
        ys: support labels.
        xq: query inputs.
        step_size: the inner step, as in training.

    Returns:
        (queries, k) logits.
    """
    d, _, k = linear_net(model)
    step_size = _rate("step_size", step_size, False)
    xs, ys, xq, _ = check_tasks([(xs, ys, xq, torch.zeros(len(xq), dtype=torch.long))], d, k)[0]
    c1, c2 = _layer_factors(model)
    w1, w2 = _weights(model)
    with torch.no_grad():
        a1, a2 = _adapt(w1, w2, xs.to(w1.dtype)[None], ys[None], step_size, c1, c2)
        return (xq.to(w1.dtype) @ a1[0].T @ a2[0].T).double()


class MAMLLimit:
    """The infinite-width limit of first-order MAML on the µP linear net: µP ("mup"), NTK or GP.

    Args:
        model: ``nn.Sequential(nn.Linear(d, n, bias=False), nn.Linear(n, k, bias=False))`` (plain: its
            values are only read; it is not modified).
        base: the same net at a smaller base width (µP's constants are read off the pair as
            `mt.parametrize(model, base=base)` and `mt.param_groups(model, lr, "sgd")` make them).
        kind: "mup" (the exact µP limit), "ntk" or "gp" (the kernel limits of the same net in the NTK
            parametrization: both layers trained, or the readout alone).
        step_size: the inner SGD step, as `train_maml` takes it.

    Raises:
        ValueError: an unsupported model (a bias, a nonlinearity, a third layer), a base of another shape,
            an unknown kind, a non-positive step, or µP constants that are not width-independent.

    Example::

        lim = mt.limits.MAMLLimit(model, base=base, step_size=0.5).fit(meta_batches, meta_lr=0.1)
        logits = lim.predict(xs, ys, xq)
    """

    def __init__(self, model: nn.Module, base: nn.Module, kind: str = "mup", step_size: float = 1.0):
        from ._feature.scaling import observe  # the constants, read as FeatureLimit reads them

        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if isinstance(step_size, bool) or not isinstance(step_size, (int, float)) or not step_size > 0:
            raise ValueError(f"step_size must be a positive number, got {step_size!r}")
        d, n, k = linear_net(model)
        d0, n0, k0 = linear_net(base)
        if (d0, k0) != (d, k) or n0 >= n:
            raise ValueError(
                f"base must be the same net at a smaller width: model is {d} → {n} → {k}, base {d0} → {n0} → {k0}"
            )
        laws, _ = observe(model, base, {"0.weight": "input", "1.weight": "output"})
        for name, law in laws.items():
            if law.family == "constant" and law.mean != 0.0:
                raise ValueError(f"parameter {name!r} starts constant ({law.mean:g}); the limit needs a centred init")
        self.kind, self.step_size, self.d, self.k = kind, float(step_size), d, k
        self.kappa = (laws["0.weight"].kappa, laws["1.weight"].kappa)
        self.var = (laws["0.weight"].var, laws["1.weight"].var)  # σ_u², σ_a² (scaled init variances)
        if kind == "mup":
            self.state = torch.eye(d + k, dtype=torch.float64)  # A: z = A z⁰
            self.sigma0 = torch.diag(torch.tensor([self.var[0]] * d + [self.var[1]] * k, dtype=torch.float64))
        else:
            self.theta = self.var[0] + (self.var[1] if kind == "ntk" else 0.0)
            self.state = torch.zeros(k, d, dtype=torch.float64)  # B: f(x) = B x
        self._initial = self.state.clone()
        self.meta_steps = 0

    def restarted(self, step_size: float | None = None) -> MAMLLimit:
        """A fresh limit with the same constants (nothing meta-trained), at `step_size` (default: this one's):
        what a hyperparameter search needs without reading the model again.

        Args:
            step_size: the inner step of the new limit.

        Returns:
            A new `MAMLLimit`.
        """
        step = self.step_size if step_size is None else step_size
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not step > 0:
            raise ValueError(f"step_size must be a positive number, got {step!r}")
        new = copy.copy(self)
        new.step_size, new.meta_steps = float(step), 0
        new.state = self._initial.clone()
        return new

    # ---------------------------------------------------------------- the function and its steps

    def _matrix(self, state: torch.Tensor) -> torch.Tensor:
        """The k × d matrix M of f(x) = M x (any leading task dims)."""
        if self.kind != "mup":
            return state
        d = self.d
        return state[..., d:, :] @ self.sigma0 @ state[..., :d, :].transpose(-1, -2)

    def _step(self, state: torch.Tensor, x: torch.Tensor, y: torch.Tensor, lr: float) -> torch.Tensor:
        """`state` after one SGD step of `lr` on the mean cross-entropy of (x, y); x (tasks, examples, d)."""
        g = _grad(x @ self._matrix(state).transpose(-1, -2), y)  # (tasks, examples, k)
        p = g.transpose(-1, -2) @ x  # Σᵢ gᵢ xᵢᵀ: (tasks, k, d)
        if self.kind != "mup":
            return state - lr * self.theta * p
        d = self.d
        au, aa = state[..., :d, :], state[..., d:, :]
        return torch.cat([au - lr * self.kappa[0] * p.transpose(-1, -2) @ aa, aa - lr * self.kappa[1] * p @ au], dim=-2)

    def fit(self, meta_batches: Sequence[Sequence[Any]], meta_lr: float) -> MAMLLimit:
        """Meta-train: per meta-batch, each task's query gradient at its adapted state, averaged, one step.

        Args:
            meta_batches: a list of meta-batches, each a list of ``(xs, ys, xq, yq)`` tasks.
            meta_lr: the outer SGD lr, as `train_maml` takes it.

        Returns:
            self.
        """
        if isinstance(meta_lr, bool) or not isinstance(meta_lr, (int, float)) or not meta_lr >= 0:
            raise ValueError(f"meta_lr must be a number ≥ 0, got {meta_lr!r}")
        with _threads_for(self.d + self.k):
            self._fit(meta_batches, meta_lr)
        return self

    def _fit(self, meta_batches: Sequence[Sequence[Any]], meta_lr: float) -> None:
        for tasks in _checked_batches(meta_batches, self.d, self.k):
            move = torch.zeros_like(self.state)
            for xs, ys, xq, yq in _stacked(tasks):
                adapted = self._step(self.state, xs, ys, self.step_size)
                # first order: the query step's move, taken at the adapted state, applied to the state
                move += (self._step(adapted, xq, yq, 1.0) - adapted).sum(0)
            self.state = self.state + meta_lr * move / len(tasks)
            self.meta_steps += 1

    def predict(self, xs: Any, ys: Any, xq: Any) -> torch.Tensor:
        """The adapted query logits: one inner step on (xs, ys) from the meta-trained state.

        Args:
            xs: support inputs (examples, d).
            ys: support labels in [0, k).
            xq: query inputs (queries, d).

        Returns:
            (queries, k) float64 logits.
        """
        xs, ys, xq, _ = check_tasks([(xs, ys, xq, torch.zeros(len(xq), dtype=torch.long))], self.d, self.k)[0]
        adapted = self._step(self.state, xs[None], ys[None], self.step_size)[0]
        return xq @ self._matrix(adapted).T

    def accuracy(self, tasks: Sequence[Any]) -> float:
        """The mean query accuracy of the adapted predictions over `tasks`."""
        checked = check_tasks(tasks, self.d, self.k)
        right = 0
        with _threads_for(self.d + self.k):
            for xs, ys, xq, yq in _stacked(checked):  # every task of one shape at once
                adapted = self._step(self.state, xs, ys, self.step_size)
                logits = xq @ self._matrix(adapted).transpose(-1, -2)
                right += int((logits.argmax(-1) == yq).sum())
        return right / max(1, sum(len(t[3]) for t in checked))

    def __repr__(self) -> str:
        return f"MAMLLimit(kind={self.kind!r}, d={self.d}, k={self.k}, step_size={self.step_size:g}, meta_steps={self.meta_steps})"
