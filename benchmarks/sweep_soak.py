"""Sweep soak: thousands of 1-ms trials with 4 local workers, one worker killed every 30 s.

Runs ``mutransfer sweep`` (a grid of N points of a 1-ms objective, ``--workers 4``: the main
process and 3 worker processes) on SQLite and, with --storage or MUTRANSFER_TEST_POSTGRES, on
PostgreSQL, while a killer sends SIGKILL to one live worker process every --kill-every seconds
(its trial goes stale and is run again by the others) and starts a ``mutransfer worker`` joining
the sweep in its place (--no-respawn: none, so after 3 kills the main process works alone).
Then it checks every grid point in the database and prints a table: trials/s, lost trials (grid
points without a completed trial: must be 0), duplicate trials (points completed more than once:
must be 0), workers killed, "database is locked" errors printed (must be 0), trials/s over the
first and the last 1,000 completions (the per-trial cost must not grow with the study), the main
process's RSS during those two stretches (flat) and its peak RSS (VmHWM); "setup s" is the time
to the first trial's start (imports, opening the storage, enqueueing the grid). Exit 1 when a
trial was lost or duplicated, a lock error was printed or the sweep failed.

    python benchmarks/sweep_soak.py [--trials 5000] [--kill-every 30] [--storage postgresql://...]
    python benchmarks/sweep_soak.py --quick        # 120 trials, a kill every 5 s
    python benchmarks/sweep_soak.py --trials 500 --workers 2 --kill-every 0 --sqlite-only   # no kills
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import optuna
from optuna.trial import TrialState

OBJECTIVE = textwrap.dedent("""
    import time

    def train(hp, scale):
        time.sleep(0.001)
        return hp["x"] * 1e-3 + 1.0 / scale.width
""")

CONFIG = """name = "{name}"
objective = "{objective}:train"
widths = [16]
parametrizations = ["mup"]
sampler = "grid"
[space.x]
type = "uniform"
low = 0
high = {high}
grid = {n}
"""


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _started(url: str, name: str, db: Path) -> bool:
    """Has a trial of the sweep started (every worker released)?"""
    if url.startswith("sqlite") and not db.exists():
        return False
    try:
        study = optuna.load_study(study_name=f"{name}/mup/w16", storage=url)
        return bool(study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.COMPLETE)))
    except Exception:
        return False


def _rss_mb(pid: int, field: str = "VmHWM") -> float | None:
    """The process's peak (VmHWM) or current (VmRSS) resident memory in MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _rates(ends: list[float], chunk: int) -> tuple[float, float]:
    """Trials/s over the first and the last `chunk` completions (their end times, sorted)."""
    if len(ends) < max(chunk, 2):
        return float("nan"), float("nan")
    first = (chunk - 1) / max(ends[chunk - 1] - ends[0], 1e-9)
    last = (chunk - 1) / max(ends[-1] - ends[-chunk], 1e-9)
    return first, last


def _rss_during(samples: list[tuple[float, float]], start: float, end: float) -> float:
    """The largest current RSS sampled between two times (nan when none)."""
    inside = [rss for t, rss in samples if start <= t <= end]
    return max(inside) if inside else float("nan")


def soak(storage: str | None, n: int, kill_every: float, root: Path, workers: int = 4, respawn: bool = True) -> dict:
    """One soak run; returns its row of the table. With `respawn`, each killed worker is replaced by
    a `mutransfer worker` joining the sweep, so that `workers` processes keep working."""
    name = f"soak-{uuid.uuid4().hex[:8]}"
    (root / "obj.py").write_text(OBJECTIVE)
    cfg = root / f"{name}.toml"
    cfg.write_text(CONFIG.format(name=name, objective=root / "obj.py", high=n - 1, n=n))
    run = root / name
    cmd = [sys.executable, "-m", "mutransfer.cli", "sweep", str(cfg), "--run", str(run), "--workers", str(workers)]
    cmd += ["--no-progress"]
    # The URL (and its password) through the environment, not on command lines that `ps` shows
    env = {**os.environ, "MUTRANSFER_STORAGE": storage} if storage else None
    start, start_wall = time.perf_counter(), time.time()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    killed: list[int] = []
    joined: list[subprocess.Popen] = []  # replacements of killed workers (`mutransfer worker`)
    joined_err = root / f"{name}.workers.err"
    peak = [0.0]
    samples: list[tuple[float, float]] = []  # (time, current RSS of the main process)
    stop = threading.Event()

    def watch() -> None:
        next_kill = None  # the first kill comes `kill_every` after the first trial started
        db = run / "sweep.db"
        while not stop.wait(0.2):
            peak[0] = max(peak[0], _rss_mb(proc.pid) or 0.0)
            rss = _rss_mb(proc.pid, "VmRSS")
            if rss is not None:
                samples.append((time.time(), rss))
            if kill_every <= 0:
                continue
            if next_kill is None:
                if _started(storage or f"sqlite:///{db}", name, db):
                    next_kill = time.monotonic() + kill_every
                continue
            if time.monotonic() >= next_kill:
                live = [p for p in _children(proc.pid) + [j.pid for j in joined] if p not in killed]
                if live:
                    os.kill(live[0], signal.SIGKILL)
                    killed.append(live[0])
                    if respawn:
                        join = [sys.executable, "-m", "mutransfer.cli", "worker", str(run), "--no-progress"]
                        with open(joined_err, "a") as errors:
                            joined.append(
                                subprocess.Popen(
                                    join, stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True, env=env
                                )
                            )
                next_kill = time.monotonic() + kill_every

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        _out, err = proc.communicate(timeout=24 * 3600)
    finally:
        stop.set()
        watcher.join()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for j in joined:  # they leave when no trial is left
            try:
                j.wait(timeout=120)
            except subprocess.TimeoutExpired:
                j.kill()
                j.wait()
    wall = time.perf_counter() - start
    err += joined_err.read_text() if joined_err.exists() else ""
    url = storage or f"sqlite:///{run / 'sweep.db'}"
    study = optuna.load_study(study_name=f"{name}/mup/w16", storage=url)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    done = collections.Counter(round(t.params["x"]) for t in complete)
    ends = sorted(t.datetime_complete.timestamp() for t in complete if t.datetime_complete is not None)
    starts = [t.datetime_start.timestamp() for t in complete if t.datetime_start is not None]
    chunk = min(1000, n // 2)
    first, last = _rates(ends, chunk)
    window = (ends[chunk - 1], ends[-chunk]) if len(ends) >= chunk else (0.0, 0.0)
    return {
        "storage": "PostgreSQL" if storage else "SQLite",
        "trials": n,
        "workers": workers,
        "seconds": wall,
        "setup": (min(starts) - start_wall) if starts else float("nan"),  # imports, storage, enqueueing
        "trials/s": len(complete) / wall,
        "chunk": chunk,
        "first/s": first,
        "last/s": last,
        "rss_first_mb": _rss_during(samples, ends[0] if ends else 0.0, window[0]),
        "rss_last_mb": _rss_during(samples, window[1], ends[-1] if ends else 0.0),
        "lock_errors": sum(line.count("database is locked") for line in err.splitlines()),
        "lost": sum(1 for x in range(n) if done[x] == 0),
        "duplicates": sum(1 for c in done.values() if c > 1),
        "killed": len(killed),
        "peak_rss_mb": peak[0],
        "exit": proc.returncode,
        "stderr": err.strip().splitlines()[-3:],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=5000, help="grid points (trials) per run (default 5000)")
    p.add_argument("--kill-every", type=float, default=30.0, help="seconds between worker kills (default 30)")
    p.add_argument("--storage", default=os.environ.get("MUTRANSFER_TEST_POSTGRES"), help="a PostgreSQL URL too")
    p.add_argument("--sqlite-only", action="store_true", help="skip PostgreSQL even when a URL is set")
    p.add_argument("--quick", action="store_true", help="120 trials, a kill every 5 s (a test runs it)")
    p.add_argument("--workers", type=int, default=4, help="--workers of the sweep (default 4)")
    p.add_argument("--no-respawn", action="store_true", help="do not replace a killed worker")
    args = p.parse_args()
    if args.quick:
        args.trials, args.kill_every = 120, 5.0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for url in [None] + ([args.storage] if args.storage and not args.sqlite_only else []):
            rows.append(soak(url, args.trials, args.kill_every, Path(tmp), args.workers, not args.no_respawn))
    chunk = rows[0]["chunk"]
    print(
        f"{'storage':<11} {'workers':>7} {'trials':>6} {'seconds':>8} {'setup s':>7} {'trials/s':>8} {f'first {chunk}/s':>13} "
        f"{f'last {chunk}/s':>12} {'lost':>5} {'dups':>5} {'killed':>6} {'lock errs':>9} "
        f"{'RSS first/last MB':>17} {'peak RSS MB':>11}"
    )
    for r in rows:
        rss = f"{r['rss_first_mb']:.0f}/{r['rss_last_mb']:.0f}"
        print(
            f"{r['storage']:<11} {r['workers']:>7} {r['trials']:>6} {r['seconds']:>8.1f} {r['setup']:>7.1f} "
            f"{r['trials/s']:>8.1f} "
            f"{r['first/s']:>13.1f} {r['last/s']:>12.1f} {r['lost']:>5} {r['duplicates']:>5} {r['killed']:>6} "
            f"{r['lock_errors']:>9} {rss:>17} {r['peak_rss_mb']:>11.0f}"
        )
        if r["exit"] != 0:
            print(f"  {r['storage']}: mutransfer sweep exited with {r['exit']}: {' / '.join(r['stderr'])}")
    return 1 if any(r["lost"] or r["duplicates"] or r["lock_errors"] or r["exit"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
