"""The package's face: lazy public names, old module paths that warn, one module of errors."""

import importlib
import subprocess
import sys
import warnings

import pytest

import mutransfer as mt
from mutransfer import errors


def test_every_public_name_resolves_and_is_listed():
    for name in mt.__all__:
        assert getattr(mt, name) is not None, name
    assert set(mt.__all__) <= set(dir(mt))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        mt.not_a_name  # noqa: B018


def test_functions_are_not_shadowed_by_their_modules():
    # `mt.parametrize` / `mt.export` / `mt.describe` are the functions, wherever the modules live
    assert callable(mt.parametrize) and mt.parametrize.__name__ == "parametrize"
    assert callable(mt.export) and mt.export.__name__ == "export"
    assert callable(mt.describe) and mt.describe.__name__ == "describe"


@pytest.mark.parametrize("old", ["mutransfer.roles", "mutransfer.attention", "mutransfer.spec", "mutransfer.devices"])
def test_moved_modules_import_with_a_deprecation_warning(old):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to mutransfer\._core\."):
        module = importlib.import_module(old)
    assert module is importlib.import_module(old.replace("mutransfer.", "mutransfer._core."))


def test_old_paths_keep_their_names():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from mutransfer.roles import classify  # noqa: F401
        from mutransfer.spec import MuSpec
    assert MuSpec is mt.MuSpec


def test_errors_are_builtin_errors_too():
    for cls in (
        errors.ModelError,
        errors.OptimizerError,
        errors.CoordCheckError,
        errors.ExportError,
        errors.ConfigError,
        errors.UsageError,
    ):
        assert issubclass(cls, errors.MuTransferError) and issubclass(cls, ValueError), cls
    assert issubclass(errors.SweepInterrupted, KeyboardInterrupt)
    assert issubclass(errors.MuPWarning, UserWarning) and mt.MuPWarning is errors.MuPWarning


def test_parametrize_errors_are_model_errors():
    from torch import nn

    with pytest.raises(errors.ModelError, match="width"):
        mt.parametrize(nn.Linear(4, 4), base=nn.Linear(4, 4), delta=nn.Linear(4, 4))


def test_the_command_answers_help_without_torch():
    code = (
        "import sys\n"
        "from mutransfer.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "assert 'torch' not in sys.modules, 'mutransfer --help imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "coord-check" in out.stdout and "sweep" in out.stdout
