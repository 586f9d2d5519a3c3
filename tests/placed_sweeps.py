"""Small sweep configs for the placement and cluster tests (tests/test_sweep_devices.py,
tests/test_sweep_cluster.py): a one-HP lr grid at widths 16 and 32 over a given objective file."""

import textwrap

from optuna.trial import TrialState

from mutransfer.sweep import Sweep


def write_config(
    tmp_path, objective: str, name: str, extra: str = "", grid: int = 6, sleep: float = 0.3, tail: str = ""
):
    """obj.py (the `objective` source, function `train`) and sweep.toml in `tmp_path`; `extra`: top-level
    keys, `tail`: tables after [fixed] (e.g. [cluster]). Returns the TOML's path."""
    (tmp_path / "obj.py").write_text(objective)
    path = tmp_path / "sweep.toml"
    path.write_text(
        textwrap.dedent(f'''
        name = "{name}"
        objective = "{tmp_path / "obj.py"}:train"
        widths = [16, 32]
        parametrizations = ["mup"]
        {extra}
        [space.lr]
        type = "log"
        low = "2**-8"
        high = "2**-3"
        grid = {grid}
        [fixed]
        sleep = {sleep}
    ''')
        + textwrap.dedent(tail)
    )
    return path


def complete_trials(run, storage=None):
    """(the sweep at `run`, its COMPLETE trials across every study)."""
    sweep = Sweep(run, storage=storage)
    return sweep, [
        t
        for c in sweep.config.all_cells
        for t in sweep.study(*c).get_trials(deepcopy=False)
        if t.state == TrialState.COMPLETE
    ]
