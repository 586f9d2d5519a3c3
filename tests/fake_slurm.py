"""A fake Slurm for tests: `sbatch`, `srun`, `sacct`, `squeue`, `scancel`, `scontrol` on PATH.

`sbatch SCRIPT` records the script, gives it a job id and runs every array task of it locally
(`bash SCRIPT` in its own session, with the SLURM_* variables a task sees and CUDA_VISIBLE_DEVICES
from `--gres=gpu:N`); task states live in $FAKE_SLURM_DIR as files `<job>_<task>.state` (PENDING,
RUNNING, COMPLETED, FAILED, CANCELLED) beside `.pid`. `srun` runs its command with the output
files of its flags. Used by tests/test_sweep_cluster.py through `install(bin_dir, state_dir)`.
"""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

COMMANDS = ("sbatch", "srun", "sacct", "squeue", "scancel", "scontrol")


def install(bin_dir: Path, state_dir: Path) -> dict:
    """Write the commands into `bin_dir`; returns the environment additions to use them."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    for name in COMMANDS:
        path = bin_dir / name
        path.write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            f"import fake_slurm\nsys.exit(fake_slurm.main({name!r}, sys.argv[1:]))\n"
        )
        path.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_SLURM_DIR": str(state_dir)}


def _dir() -> Path:
    return Path(os.environ["FAKE_SLURM_DIR"])


def _sbatch_flags(script: str) -> dict:
    flags = {}
    for line in script.splitlines():
        m = re.match(r"#SBATCH --([\w-]+)(?:=(.*))?$", line.strip())
        if m:
            flags[m.group(1)] = m.group(2)
    return flags


def sbatch(args: list) -> int:
    script_path = Path(args[-1])
    text = script_path.read_text()
    flags = _sbatch_flags(text)
    counter = _dir() / "counter"
    job = int(counter.read_text()) + 1 if counter.exists() else 1000
    counter.write_text(str(job))
    (_dir() / f"{job}.sbatch").write_text(text)
    m = re.match(r"(\d+)-(\d+)", flags.get("array") or "0-0")
    tasks = range(int(m.group(1)), int(m.group(2)) + 1)
    gres = re.match(r"gpu:(\d+)", flags.get("gres") or "")
    gpus = int(gres.group(1)) if gres else 0
    for a in tasks:
        _start_task(job, a, script_path, gpus, array=bool(flags.get("array")))
    print(f"Submitted batch job {job}")
    return 0


def _start_task(job: int, a: int, script_path: Path, gpus: int, array: bool) -> None:
    key = f"{job}_{a}" if array else str(job)
    env = dict(
        os.environ,
        SLURM_JOB_ID=str(job * 100 + a),
        SLURM_NTASKS="1",
        SLURM_JOB_NUM_NODES="1",
        SLURM_NODEID="0",
        SLURM_PROCID="0",
        SLURM_LOCALID="0",
        SLURM_JOB_NODELIST="localhost",
        FAKE_SLURM_KEY=key,
    )
    if array:
        env.update(SLURM_ARRAY_JOB_ID=str(job), SLURM_ARRAY_TASK_ID=str(a))
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(a * gpus + i) for i in range(gpus))
    (_dir() / f"{key}.state").write_text("RUNNING")
    runner = (
        f"import subprocess, sys, pathlib\n"
        f"p = subprocess.run(['bash', {str(script_path)!r}])\n"
        f"state = pathlib.Path({str(_dir() / (key + '.state'))!r})\n"
        f"if state.read_text() == 'RUNNING':\n"
        f"    state.write_text('COMPLETED' if p.returncode == 0 else 'FAILED')\n"
    )
    log = open(_dir() / f"{key}.log", "a")  # not sbatch's stdout: its reader waits for that pipe to close
    proc = subprocess.Popen(
        [sys.executable, "-c", runner],
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    (_dir() / f"{key}.pid").write_text(str(proc.pid))


def srun(args: list) -> int:
    out = err = None
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in ("--output", "--error"):
            if args[i] == "--output":
                out = args[i + 1]
            else:
                err = args[i + 1]
            i += 2
        else:
            i += 1
    command = args[i:]

    def path(p):
        return (
            p.replace("%A", os.environ.get("SLURM_ARRAY_JOB_ID", ""))
            .replace("%a", os.environ.get("SLURM_ARRAY_TASK_ID", ""))
            .replace("%j", os.environ["SLURM_JOB_ID"])
            .replace("%t", "0")
        )

    stdout = open(path(out), "a") if out else None
    stderr = open(path(err), "a") if err else None
    return subprocess.run(command, stdout=stdout, stderr=stderr).returncode


def sacct(args: list) -> int:
    wanted = [args[i + 1] for i, a in enumerate(args) if a == "-j"]
    print("JobID|State|NodeList")
    for state in sorted(_dir().glob("*.state")):
        key = state.name[: -len(".state")]
        if any(key == w or key.startswith(f"{w}_") for w in wanted):
            print(f"{key}|{state.read_text()}|localhost")
    return 0


def squeue(args: list) -> int:
    print("JOBID STATE")
    for state in sorted(_dir().glob("*.state")):
        if state.read_text() in ("PENDING", "RUNNING"):
            print(f"{state.name[: -len('.state')]} {state.read_text()}")
    return 0


def scancel(args: list) -> int:
    target = args[0]
    for pid_file in _dir().glob("*.pid"):
        key = pid_file.name[: -len(".pid")]
        if key == target or key.startswith(f"{target}_"):
            state = _dir() / f"{key}.state"
            if state.read_text() == "RUNNING":
                state.write_text("CANCELLED")
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass
    return 0


def scontrol(args: list) -> int:  # `scontrol requeue ID`: not exercised; accepted
    return 0


def main(name: str, args: list) -> int:
    return {"sbatch": sbatch, "srun": srun, "sacct": sacct, "squeue": squeue, "scancel": scancel, "scontrol": scontrol}[
        name
    ](args)
