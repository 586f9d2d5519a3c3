"""A run directory's files: writing the config copy atomically, fetching it from the storage for a
worker elsewhere, and telling what changed when a rerun brings a different config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna

from ..._core.atomic import write_atomically

__all__ = ["differences", "fetch_config", "free_sibling"]


def differences(old: Any, new: Any, key: str = "") -> list[str]:
    """'space.lr.low: "2**-10" → "2**-12"' for every key whose value differs (tables compared key by key)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in list(old) + [k for k in new if k not in old]:
            out += differences(old.get(k, _ABSENT), new.get(k, _ABSENT), f"{key}.{k}" if key else str(k))
        return out
    if old == new and type(old) is type(new):
        return []
    return [f"{key}: {_shown(old)} → {_shown(new)}"]


_ABSENT = object()


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(not set)"
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def free_sibling(run_dir: Path) -> Path:
    """`run_dir` with the first suffix -2, -3, … that names no existing path."""
    for i in range(2, 1000):
        candidate = run_dir.with_name(f"{run_dir.name}-{i}")
        if not candidate.exists():
            return candidate
    return run_dir.with_name(f"{run_dir.name}-new")


def fetch_config(storage: optuna.storages.BaseStorage, name: str, path: Path) -> None:
    """Write the config of the sweep called exactly `name` from its studies in `storage` to `path`.

    A study belongs to the sweep when its name's first segment is `name` (`NAME/mup/w32`) and the
    config stored on it has that `name`: no prefix match, so ``a`` never fetches the config of a
    sweep called ``a/b`` (names hold no ``/`` since they are validated, older sweeps might)."""
    for summary in optuna.study.get_all_study_summaries(storage, include_best_trial=False):
        text = summary.user_attrs.get("config_toml")
        if summary.study_name.split("/", 1)[0] != name or not isinstance(text, str):
            continue
        if _config_name(text) != name:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text)
        return


def _config_name(text: str) -> str | None:
    """The `name` of a stored config's TOML text (default "sweep"), None if it does not parse."""
    from ..config.config import tomllib

    try:
        name = tomllib.loads(text).get("name", "sweep")
    except tomllib.TOMLDecodeError:
        return None
    return name if isinstance(name, str) else None
