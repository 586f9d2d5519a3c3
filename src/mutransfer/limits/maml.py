"""Few-shot learning with first-order MAML and its exact infinite-width limits (Tensor Programs IV).

- `linear_net`, `train_maml`, `maml_logits`: the finite µP linear net ``Linear(d, n) → Linear(n, k)``
  (no biases) meta-trained by first-order MAML with µP's per-layer SGD factors;
- `MAMLLimit` (also `mt.limits.MAMLLimit`): its exact µP limit, and the NTK and GP limits of the same net;
- `digits_tasks` (sklearn's 8 × 8 digits, shipped with scikit-learn) and `omniglot_tasks` (the standard
  ``images_background`` / ``images_evaluation`` folders, for users who have them): k-way n-shot tasks;
  `meta_batches` groups tasks into meta-batches.

    import mutransfer as mt
    from mutransfer.limits import maml
    train = maml.meta_batches(maml.digits_tasks("train", 16 * 500, seed=0), 16)
    lim = mt.limits.MAMLLimit(model, base=base, step_size=0.3).fit(train, meta_lr=0.3)
    print(lim.accuracy(maml.digits_tasks("test", 500, seed=1)))
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from ._maml import MAMLLimit, Task, check_tasks, linear_net, maml_logits, train_maml

__all__ = [
    "MAMLLimit",
    "Task",
    "check_tasks",
    "digits_tasks",
    "linear_net",
    "maml_logits",
    "meta_batches",
    "omniglot_tasks",
    "sample_tasks",
    "train_maml",
]


def sample_tasks(
    x: torch.Tensor, y: torch.Tensor, n_tasks: int, ways: int = 5, shots: int = 1, queries: int = 5, seed: int = 0
) -> list[Task]:
    """k-way n-shot tasks from labelled examples: each draws `ways` classes (labelled 0…ways−1 in a random
    order) and, per class, `shots` support and `queries` query examples, without replacement.

    Args:
        x: (examples, d) inputs.
        y: (examples,) integer classes.
        n_tasks: how many tasks.
        ways: classes per task.
        shots: support examples per class.
        queries: query examples per class.
        seed: the draw's seed (the same tasks every time).

    Returns:
        ``(xs, ys, xq, yq)`` tuples.

    Raises:
        ValueError: fewer classes than `ways`, or a class with fewer than shots + queries examples.
    """
    for name, v in (("n_tasks", n_tasks), ("ways", ways), ("shots", shots), ("queries", queries)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    classes = torch.unique(y)
    if len(classes) < ways:
        raise ValueError(f"{ways}-way tasks need {ways} classes; the data has {len(classes)}")
    pools = {int(c): torch.nonzero(y == c).flatten() for c in classes}
    short = [c for c, p in pools.items() if len(p) < shots + queries]
    if short:
        raise ValueError(
            f"classes {short[:5]} have fewer than shots + queries = {shots + queries} examples; lower them"
        )
    g = torch.Generator().manual_seed(seed)
    tasks = []
    for _ in range(n_tasks):
        picked = classes[torch.randperm(len(classes), generator=g)[:ways]]
        xs, ys, xq, yq = [], [], [], []
        for label, c in enumerate(picked.tolist()):
            pool = pools[c]
            idx = pool[torch.randperm(len(pool), generator=g)[: shots + queries]]
            xs.append(x[idx[:shots]])
            xq.append(x[idx[shots:]])
            ys += [label] * shots
            yq += [label] * queries
        tasks.append((torch.cat(xs), torch.tensor(ys), torch.cat(xq), torch.tensor(yq)))
    return tasks


def meta_batches(tasks: Sequence[Task], per_batch: int) -> list[list[Task]]:
    """`tasks` in consecutive meta-batches of `per_batch` (the last, if short, dropped)."""
    if isinstance(per_batch, bool) or not isinstance(per_batch, int) or per_batch < 1:
        raise ValueError(f"per_batch must be a positive integer, got {per_batch!r}")
    return [list(tasks[i : i + per_batch]) for i in range(0, len(tasks) - per_batch + 1, per_batch)]


def _normalised(x: torch.Tensor) -> torch.Tensor:
    """Centred on the mean image and scaled to E|x|² = d (pre-activations of order one under µP's init)."""
    x = x - x.mean(0)
    return x * (x.shape[1] / x.pow(2).sum(1).mean()).sqrt()


def digits_tasks(
    split: str, n_tasks: int, ways: int = 5, shots: int = 1, queries: int = 5, seed: int = 0
) -> list[Task]:
    """Tasks from scikit-learn's handwritten digits (1797 images, 8 × 8, d = 64): "train" tasks draw from
    one half of each class's images, "test" tasks from the other (a fixed split), normalised as a whole.

    Args:
        split: "train" or "test".
        n_tasks: how many tasks.
        ways: classes per task (of 10).
        shots: support images per class.
        queries: query images per class.
        seed: the task draw's seed.

    Returns:
        ``(xs, ys, xq, yq)`` tuples, float64 inputs.

    Raises:
        ValueError: another split. ImportError: scikit-learn is not installed (``pip install scikit-learn``).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # an optional dependency of the example's data only
        raise ImportError("digits_tasks needs scikit-learn: pip install scikit-learn") from e
    images, labels = load_digits(return_X_y=True)
    x = _normalised(torch.tensor(images, dtype=torch.float64) / 16.0)
    y = torch.tensor(labels)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(12345))
    keep = torch.zeros(len(y), dtype=torch.bool)
    for c in range(10):
        members = order[y[order] == c]
        half = members[: len(members) // 2] if split == "train" else members[len(members) // 2 :]
        keep[half] = True
    return sample_tasks(x[keep], y[keep], n_tasks, ways, shots, queries, seed)


def omniglot_tasks(
    root: str | os.PathLike,
    split: str,
    n_tasks: int,
    ways: int = 5,
    shots: int = 1,
    queries: int = 5,
    size: int = 28,
    seed: int = 0,
) -> list[Task]:
    """Tasks from Omniglot's standard files: ``root/images_background`` ("background": the 30 alphabets
    meta-trained on) or ``root/images_evaluation`` ("evaluation": the 20 held out), each
    ``<alphabet>/<character>/<drawing>.png``; every character is a class. Images are read, inverted (ink = 1),
    resized to `size` × `size` by area averaging, flattened (d = size²) and normalised as a whole.

    Args:
        root: the folder holding ``images_background`` and/or ``images_evaluation``.
        split: "background" or "evaluation".
        n_tasks: how many tasks.
        ways: classes (characters) per task.
        shots: support drawings per class.
        queries: query drawings per class (Omniglot has 20 per character: shots + queries ≤ 20).
        size: the side the images are resized to (28, as in MAML's and TP4's Omniglot).
        seed: the task draw's seed.

    Returns:
        ``(xs, ys, xq, yq)`` tuples, float64 inputs.

    Raises:
        ValueError: another split, a missing folder, a character folder without images.
    """
    if split not in ("background", "evaluation"):
        raise ValueError(f"split must be 'background' or 'evaluation', got {split!r}")
    folder = Path(root) / f"images_{split}"
    if not folder.is_dir():
        raise ValueError(
            f"{folder} does not exist: root must hold Omniglot's images_background / images_evaluation folders "
            "(unzipped from the standard images_background.zip / images_evaluation.zip)"
        )
    import matplotlib.image as mpimg

    images, labels = [], []
    characters = sorted(c for a in sorted(folder.iterdir()) if a.is_dir() for c in sorted(a.iterdir()) if c.is_dir())
    if not characters:
        raise ValueError(f"{folder} holds no <alphabet>/<character> folders")
    for label, character in enumerate(characters):
        files = sorted(character.glob("*.png"))
        if not files:
            raise ValueError(f"{character} holds no .png drawing")
        for f in files:
            img = torch.tensor(mpimg.imread(f), dtype=torch.float64)
            if img.dim() == 3:  # RGB(A): the mean of the colour channels
                img = img[..., :3].mean(-1)
            img = 1.0 - img  # Omniglot: black ink on white
            img = torch.nn.functional.adaptive_avg_pool2d(img[None, None], size)[0, 0]
            images.append(img.flatten())
            labels.append(label)
    x = _normalised(torch.stack(images))
    return sample_tasks(x, torch.tensor(labels), n_tasks, ways, shots, queries, seed)
