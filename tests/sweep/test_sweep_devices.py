"""Sweeps placed on devices without GPUs: fake GPU ids, slots per device, thread split, placement errors."""

import json
import textwrap

import pytest
import torch

from mutransfer.cli import main
from mutransfer.sweep.config.placement import available_cores, plan
from placed_sweeps import complete_trials, write_config

OBJECTIVE = textwrap.dedent('''
    import math, os, time
    import torch

    def train(hp, scale):
        """Sleeps so that trials overlap; records what the worker saw."""
        time.sleep(float(hp.get("sleep", 0)))
        assert scale.device.type == "cpu"  # no GPU here: fake ids run on the CPU
        return (math.log2(hp["lr"]) + 6) ** 2
''')


def _config(tmp_path, extra: str = "", grid: int = 6, sleep: float = 0.3):
    return write_config(tmp_path, OBJECTIVE, "placed", extra, grid, sleep)


@pytest.mark.slow
def test_two_fake_gpus_two_trials_each(tmp_path, capsys):
    """devices [0, 1], 2 trials per device: 4 workers, each trial records its CUDA_VISIBLE_DEVICES;
    both ids are used and no id ever runs more than 2 trials at once."""
    cfg = _config(tmp_path, "devices = [0, 1]\ntrials_per_device = 2", grid=8, sleep=0.3)
    run = tmp_path / "run"
    with pytest.warns(UserWarning, match="sees no GPU"):
        assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    trials = complete_trials(run)[1]
    assert len(trials) == 16
    ids = [t.user_attrs["cuda_visible_devices"] for t in trials]
    assert set(ids) == {"0", "1"}
    assert all(t.user_attrs["device"] == "cpu" and t.user_attrs["precision"] == "fp32" for t in trials)
    assert len({t.user_attrs["worker"] for t in trials}) >= 3  # the work was spread over the slots
    for gpu in ("0", "1"):
        spans = [
            (t.user_attrs["started"], t.user_attrs["ended"])
            for t in trials
            if t.user_attrs["cuda_visible_devices"] == gpu
        ]
        for start, _ in spans:  # trials running at each trial's start on the same GPU (itself included)
            assert sum(s <= start < e for s, e in spans) <= 2
    # the parent only watched: 4 workers of one thread each (2 cores / 4 slots → 1)
    assert {t.user_attrs["threads"] for t in trials} == {1}
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["devices"] == ["0", "1"] and run_json["threads"] == 1
    assert main(["report", str(run)]) == 0  # summary.json and the report say where each trial ran
    summary = json.loads((run / "summary.json").read_text())
    assert summary["precision"] == "fp32"
    assert {k: v["trials"] for k, v in summary["placements"].items()} == {
        "cpu (CUDA_VISIBLE_DEVICES=0), fp32": ids.count("0"),
        "cpu (CUDA_VISIBLE_DEVICES=1), fp32": ids.count("1"),
    }
    assert len(summary["trial_list"]) == 16
    assert {t["cuda_visible_devices"] for t in summary["trial_list"]} == {"0", "1"}
    assert "Trained on: cpu (CUDA_VISIBLE_DEVICES=0), fp32: " in (run / "report.html").read_text()


def test_parent_cuda_visible_devices_maps_ids(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    with pytest.warns(UserWarning):
        p = plan([1, 0], trials_per_device=2, cores=8)
    assert p.gpus == ("6", "6", "4", "4") and p.threads == 2 and not p.local_worker
    with pytest.raises(ValueError, match=r"GPU id\(s\) \[2\] are not visible here \(CUDA_VISIBLE_DEVICES=4,6"):
        plan([0, 2], gpu_count=2)


def test_plan_cpu_and_auto():
    cpu = plan(None, workers=4, cores=2)
    assert cpu.gpus == (None,) * 4 and cpu.threads == 1 and cpu.local_worker
    assert plan("cpu", cores=8).threads == 8
    assert plan(None, cores=3, gpu_count=0).slots == 1
    auto = plan("auto", trials_per_device=3, cores=12, gpu_count=2)
    assert auto.gpus == ("0",) * 3 + ("1",) * 3 and auto.threads == 2
    assert plan(None, workers=2, cores=2, gpu_count=2).gpus == (None, None)  # --workers alone: CPU, as before
    with pytest.raises(ValueError, match="workers .* is for CPU sweeps"):
        plan("auto", workers=2, gpu_count=2)
    with pytest.raises(ValueError, match=r"this process sees 2 GPU\(s\)"):
        plan([0, 3], gpu_count=2)
    assert plan([0], threads=5, gpu_count=1).threads == 5
    assert available_cores() >= 1


@pytest.mark.parametrize(
    "extra, message",
    [
        ("devices = []", "devices is empty"),
        ('devices = "gpu"', 'devices must be "auto", "cpu"'),
        ("devices = [0, 0]", "devices has duplicates"),
        ("trials_per_device = 0", "trials_per_device must be a positive integer"),
        ('precision = "fp16"', "precision must be one of 'fp32', 'bf16'"),
    ],
)
def test_bad_placement_exits_2_and_leaves_nothing(tmp_path, capsys, extra, message):
    cfg = _config(tmp_path, extra)
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not run.exists()


def test_bad_devices_flag(tmp_path, capsys):
    cfg = _config(tmp_path)
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--devices", "0,x"]) == 2
    assert "--devices must be 'auto', 'cpu' or GPU ids like 0,1,2,3; got '0,x'" in capsys.readouterr().err
    assert not run.exists()


@pytest.mark.slow
def test_cpu_workers_split_threads(tmp_path):
    """--workers 2 on this machine: each worker (the parent included) uses cores // 2 threads, and
    the parent gets its own thread count back afterwards."""
    before = torch.get_num_threads()
    cfg = _config(tmp_path, grid=4, sleep=0.05)
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress", "--workers", "2"]) == 0
    trials = complete_trials(run)[1]
    assert {t.user_attrs["threads"] for t in trials} == {max(1, available_cores() // 2)}
    assert all(t.user_attrs["device"] == "cpu" for t in trials)
    assert torch.get_num_threads() == before
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run3"), "--no-progress", "--threads", "3"]) == 0
    assert {t.user_attrs["threads"] for t in complete_trials(tmp_path / "run3")[1]} == {3}
