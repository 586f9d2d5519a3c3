"""Running a repository script (an example, a benchmark) inside the test process."""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def run_here(args: list[str]) -> str:
    """`python SCRIPT ARGS` from the repository root, in this test process; returns its stdout.

    The script's own code runs as `python` runs it (as `__main__`, its folder first on sys.path,
    OMP_NUM_THREADS=1 for the processes it starts), without a new Python that imports torch again
    (~3-5 s of CPU each here; torch's optimizers import torch._dynamo on first use). A non-zero
    exit fails the test with the output's tail. What a script changes in this process is put back:
    torch's default dtype and RNG state, the warnings filters (its warnings are recorded and dropped,
    as a subprocess's stderr was), sys.argv, sys.path, the working directory, the environment and the
    modules it imported from its folder (its torch threads: conftest's `_one_thread_again`)."""
    script = ROOT / args[0]
    saved_path, saved_argv, cwd = list(sys.path), sys.argv, os.getcwd()
    saved_modules = set(sys.modules)
    dtype, rng = torch.get_default_dtype(), torch.random.get_rng_state()
    environ = dict(os.environ)  # a script may set variables (torch._inductor sets its cache dir)
    out = io.StringIO()
    try:
        sys.argv = [str(script), *args[1:]]
        sys.path.insert(0, str(script.parent))
        os.environ["OMP_NUM_THREADS"] = "1"
        os.chdir(ROOT)
        with warnings.catch_warnings(record=True), contextlib.redirect_stdout(out):
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as e:
                assert e.code in (0, None), f"exit {e.code}: " + out.getvalue()[-2000:]
    finally:
        os.chdir(cwd)
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.environ.clear()
        os.environ.update(environ)
        torch.set_default_dtype(dtype)
        torch.random.set_rng_state(rng)
        for name in set(sys.modules) - saved_modules:
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(script.parent)):
                del sys.modules[name]
    return out.getvalue()
