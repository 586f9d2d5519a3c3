"""`mutransfer coord-check`: exit codes, files written, factories from modules and files."""

import json
import subprocess
import sys
import textwrap

import pytest

from mutransfer.cli import main


def run(*args):
    return main(list(args))


def test_recipe_mlp_passes_and_writes_plot_csv_json(tmp_path, capsys):
    code = run(
        "coord-check",
        "--recipe",
        "mlp",
        "--widths",
        "64,256,512",  # not 1024: the verdict margins are the same at 512 (tests/conftest.py, "Sizes")
        "--seeds",
        "2",
        "--out",
        str(tmp_path),
        "--no-progress",
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASS" in out
    for name in ("coord_check.png", "coord_check.csv", "coord_check.json"):
        assert (tmp_path / name).stat().st_size > 0
    assert json.loads((tmp_path / "coord_check.json").read_text())["passed"] is True


def test_standard_parametrization_fails_with_exit_1_naming_the_readout(tmp_path, capsys):
    code = run(
        "coord-check",
        "--recipe",
        "mlp",
        "--parametrization",
        "sp",
        "--widths",
        "64,256,512",
        "--seeds",
        "2",
        "--out",
        str(tmp_path),
        "--no-progress",
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL" in out and "readout" in out


FACTORY = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.inp = nn.Linear(8, width)
            self.hid = nn.Linear(width, width)
            self.out = nn.Linear(width, 3)

        def forward(self, x):
            return self.out(torch.tanh(self.hid(torch.tanh(self.inp(x)))))

    def make(width):
        return Net(width)

    def coord_check_data():
        g = torch.Generator().manual_seed(0)
        return [(torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)) for _ in range(2)]
""")


def test_factory_from_a_file_with_its_own_data(tmp_path, capsys):
    path = tmp_path / "mynet.py"
    path.write_text(FACTORY)
    args = [
        "coord-check",
        f"{path}:make",
        "--optimizer",
        "sgd",
        "--lr",
        "0.5",
        "--widths",
        "32,128,512",
        "--seeds",
        "2",
        "--out",
        str(tmp_path / "o"),
        "--no-progress",
    ]
    assert run(*args) == 0, capsys.readouterr().out
    assert run(*args, "--parametrization", "sp") == 1


@pytest.mark.slow
def test_factory_as_module_through_the_installed_command(tmp_path):
    (tmp_path / "mynet.py").write_text(FACTORY)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mutransfer.cli",
            "coord-check",
            "mynet:make",
            "--lr",
            "1e-2",
            "--widths",
            "32,128",
            "--seeds",
            "2",
            "--steps",
            "2",
            "--out",
            "res",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stderr
    assert "coord-check [" in proc.stderr  # the progress bar
    assert (tmp_path / "res" / "coord_check.png").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["coord-check"], "either a factory"),
        (["coord-check", "--recipe", "resnet"], "unknown recipe"),
        (["coord-check", "--recipe", "mlp", "--widths", "64"], "two different"),
        (["coord-check", "--recipe", "mlp", "--widths", "a,b"], "integers"),
        (["coord-check", "--recipe", "mlp", "--optimizer", "shampoo"], "shampoo"),
        (["coord-check", "--recipe", "mlp", "--lr", "-1"], "positive"),
        (["coord-check", "nosuchmodule_xyz:make", "--lr", "0.1"], "cannot import"),
        (["coord-check", "json:nosuchfunction", "--lr", "0.1"], "no function"),
        (["coord-check", "/nonexistent/file.py:make", "--lr", "0.1"], "not found"),
        (["coord-check", "--recipe", "mlp", "--device", "banana"], "--device must be 'auto', 'cpu'"),
        (["coord-check", "--recipe", "mlp", "--device", "cuda:99"], "--device 'cuda:99'"),  # no GPU, or too few
    ],
)
def test_bad_arguments_exit_2_with_a_message(args, message, capsys, tmp_path):
    assert run(*args, "--out", str(tmp_path)) == 2
    assert message in capsys.readouterr().err


def test_factory_without_data_exits_2(tmp_path, capsys):
    path = tmp_path / "nodata.py"
    path.write_text("import torch\ndef make(w):\n    return torch.nn.Linear(w, w)\n")
    assert run("coord-check", f"{path}:make", "--lr", "0.1", "--out", str(tmp_path)) == 2
    assert "coord_check_data" in capsys.readouterr().err


def test_unknown_flag_exits_2():
    with pytest.raises(SystemExit) as e:
        run("coord-check", "--recipe", "mlp", "--frobnicate")
    assert e.value.code == 2


@pytest.mark.slow
def test_coord_check_across_depth_passes_with_depth_scaling_and_fails_without(tmp_path, capsys):
    args = [
        "coord-check",
        "--recipe",
        "resmlp",
        "--depths",
        "2,4,8,16,32",
        "--width",
        "64",
        "--seeds",
        "2",
        "--steps",
        "3",
        "--no-progress",
    ]
    assert run(*args, "--out", str(tmp_path / "on")) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "depths 2, 4, 8, 16, 32, width 64" in out
    data = json.loads((tmp_path / "on" / "coord_check.json").read_text())
    assert data["axis"] == "depth" and data["widths"] == [2, 4, 8, 16, 32]
    assert data["sizes"] == [2, 4, 8, 16, 32]
    assert run(*args, "--depth-alpha", "0", "--out", str(tmp_path / "off")) == 1
    assert "blocks.last" in capsys.readouterr().out
    assert (tmp_path / "off" / "coord_check.png").stat().st_size > 0


def test_coord_check_depths_bad_arguments_exit_2(tmp_path):
    assert run("coord-check", "--recipe", "mlp", "--depths", "2,4", "--out", str(tmp_path), "--no-progress") == 2
    assert run("coord-check", "--recipe", "resmlp", "--depths", "2", "--out", str(tmp_path), "--no-progress") == 2
    assert (
        run(
            "coord-check",
            "--recipe",
            "resmlp",
            "--depths",
            "2,4",
            "--depth-alpha",
            "2",
            "--out",
            str(tmp_path),
            "--no-progress",
        )
        == 2
    )


def _actions(parser, path="mutransfer"):
    """(command path, action) of every argument of `parser` and its subcommands."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_flag_of_every_subcommand_has_help():
    import argparse

    from mutransfer.cli import build_parser as _parser

    actions = list(_actions(_parser()))
    assert len(actions) > 30  # the walk reaches the subcommands
    missing = [
        f"{path} {'/'.join(a.option_strings) or a.dest}"
        for path, a in actions
        if not a.help or a.help == argparse.SUPPRESS
    ]
    assert not missing, missing


def test_every_subcommand_describes_itself_and_its_exit_codes():
    import argparse

    from mutransfer.cli import build_parser as _parser

    subs = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, sub in subs.items():
        text = sub.description or ""
        assert "Exit 0" in text and " 2 " in text and "130" in text, (name, text)
    worker_run = next(a for a in subs["worker"]._actions if a.dest == "run").help
    assert "run directory" in worker_run and "the sweep's name" in worker_run and "--storage" in worker_run


def test_ctrl_c_in_a_command_ends_quietly_with_130_and_import_leaves_sigint_alone(monkeypatch, capsys):
    """A Ctrl-C inside a command prints one line and exits 130; `import mutransfer` (lazy: no torch)
    installs no signal handler, so a library import in another program is left alone."""
    import signal

    from mutransfer.cli import _results

    # compared with the child's own SIGINT at start: a test before may leave it ignored, and children inherit that
    code = (
        "import signal\nbefore = signal.getsignal(signal.SIGINT)\nimport mutransfer, mutransfer.cli\n"
        "print(signal.getsignal(signal.SIGINT) is before)"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert other.returncode == 0 and other.stdout == "True\n", other

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(_results, "_report", interrupted)
    before = signal.getsignal(signal.SIGINT)
    assert main(["report", "somewhere"]) == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert signal.getsignal(signal.SIGINT) is before  # called in-process: SIGINT left as it was


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        run("--version")
    assert e.value.code == 0
    assert capsys.readouterr().out == f"mutransfer {version('mutransfer')}\n"


def test_coord_check_defaults_to_the_library_optimizer():
    import inspect

    import mutransfer as mt
    from mutransfer.cli import build_parser as _parser
    from mutransfer.coord import DEFAULT_OPTIMIZER

    assert inspect.signature(mt.coord_check).parameters["optimizer"].default == DEFAULT_OPTIMIZER
    args = _parser().parse_args(["coord-check", "--recipe", "mlp"])
    assert args.optimizer == DEFAULT_OPTIMIZER


def test_coord_check_with_another_optimizer_passes_mup_and_fails_sp(tmp_path, capsys):
    optimizer = "lion"
    args = [
        "coord-check",
        "--recipe",
        "mlp",
        "--optimizer",
        optimizer,
        "--widths",
        "64,256,512",
        "--seeds",
        "2",
        "--no-progress",
    ]
    assert run(*args, "--out", str(tmp_path / "mup")) == 0
    assert f"{optimizer} lr=" in capsys.readouterr().out
    assert run(*args, "--parametrization", "sp", "--out", str(tmp_path / "sp")) == 1
    assert run("coord-check", "--recipe", "mlp", "--optimizer", "shampoo", "--out", str(tmp_path), "--no-progress") == 2
    assert "unknown optimizer 'shampoo'" in capsys.readouterr().err


def test_the_docs_cli_page_is_generated_from_the_parser():
    """docs/hooks/cli_reference.py expands docs/cli.md's marker into every subcommand's own help."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("cli_reference", root / "docs" / "hooks" / "cli_reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = hook.on_page_markdown((root / "docs" / "cli.md").read_text())
    assert hook.MARKER not in page
    for name in ("coord-check", "sweep", "worker", "status", "cancel", "report", "transfer", "demo", "export"):
        assert f"## `mutransfer {name}`" in page and f"usage: mutransfer {name}" in page
    assert "--retry-failed" in page and "--quick" in page and "--storage" in page
