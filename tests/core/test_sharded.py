"""µP on sharded models, on 2 gloo processes (tests/core/sharded_job.py under torchrun, one run for all checks):
tensor parallel and FSDP2 train like one process; a meta-built target is parametrized, sharded, materialised
and given µP's init shard by shard; a sharded model exports to the plain class and round-trips through DCP."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("sharded_job.py")


def _torchrun(*args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(JOB)]
    run = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0 and Path(args[0]).exists(), (run.stdout[-2000:], run.stderr[-4000:])
    return json.loads(Path(args[0]).read_text())


def _check_sharded_runs_fit_in_the_time_box(measured):
    assert measured["seconds"] < 60


def _check_a_materialised_model_trains_sharded_like_one_process(measured):
    for how in ("tp", "fsdp"):
        assert measured[f"{how}_adamw"] <= 1e-6, (how, measured[f"{how}_adamw"])
        assert measured[f"{how}_muon"] <= 5e-4, (how, measured[f"{how}_muon"])
    assert measured["ref_adamw"][-1] < measured["ref_adamw"][0]  # the reference does train


def _check_meta_target_is_parametrized_without_values_and_gets_the_same_groups(measured):
    assert measured["meta_params_on_meta"] is True
    assert measured["meta_groups_equal"] is True


def _check_init_weights_on_shards_draws_the_one_process_tensors(measured):
    assert measured["check_before_init"] is False  # to_empty's memory is not µP's init, and check says so
    assert measured["check_after_init"] is True
    assert measured["same_full_tensors"] is True  # tensor parallel (2-D mesh) + FSDP2: same seed, same tensors
    assert measured["fsdp_same_full_tensors"] is True  # FSDP2 alone
    assert measured["replicas_equal"] is True  # plain replicas: seed=None is rank 0's on every rank


def _check_init_weights_matches_eager_parametrize_in_every_tensors_rms(measured):
    gaps = measured["rms_log_gaps"]
    assert len(gaps) == 21
    worst = max(gaps, key=gaps.get)
    assert gaps[worst] < 0.1, (worst, gaps[worst])  # 0.008 measured: two independent draws of the same law


def _check_shards_are_uncorrelated(measured):
    z = measured["shard_corr_z"]  # corr(rank 0's half, rank 1's half) × √n: N(0, 1) when independent
    assert len(z) >= 14
    assert max(abs(v) for v in z.values()) < 5.0


def _check_the_meta_built_target_trains(measured):
    losses = measured["meta_trained"]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0] - 0.05, losses


def _check_a_sharded_model_exports_to_the_plain_class(measured):
    assert measured["export_class"] == "Llama" and measured["export_is_plain"] is True
    assert measured["export_rel"] <= 1e-5
    assert measured["export_reload_rel"] <= 1e-5
    assert measured["fsdp_export_rel"] <= 1e-5  # FSDP2 alone: each rank held half of every tensor


def _check_a_dcp_checkpoint_round_trips_and_a_fresh_job_gets_mup_back_from_the_shapes(measured):
    assert measured["dcp_rel"] <= 1e-6
    assert measured["dcp_groups_equal"] is True


def _check_bad_input_is_named(measured):
    assert "'layers.0.attention.wq.weight' is split by tensor parallel" in measured["head_split_error"]
    assert "divides 3" in measured["head_split_error"]
    assert "never parametrized" in measured["plain_error"]


CHECKS = [
    _check_sharded_runs_fit_in_the_time_box,
    _check_a_materialised_model_trains_sharded_like_one_process,
    _check_meta_target_is_parametrized_without_values_and_gets_the_same_groups,
    _check_init_weights_on_shards_draws_the_one_process_tensors,
    _check_init_weights_matches_eager_parametrize_in_every_tensors_rms,
    _check_shards_are_uncorrelated,
    _check_the_meta_built_target_trains,
    _check_a_sharded_model_exports_to_the_plain_class,
    _check_a_dcp_checkpoint_round_trips_and_a_fresh_job_gets_mup_back_from_the_shapes,
    _check_bad_input_is_named,
]


def _measure(folder: Path) -> dict:
    out = _torchrun(str(folder / "out.json"), str(folder))
    out.update(_torchrun(str(folder / "reload.json"), str(folder), "--reload"))  # fresh processes
    return out


@pytest.mark.slow
def test_sharded_mup_on_two_gloo_processes(tmp_path):
    """One test for the two torchrun jobs (a module fixture would run once per xdist worker)."""
    pytest.importorskip("torch.distributed.fsdp")
    measured = _measure(tmp_path)
    for check in CHECKS:
        check(measured)


@pytest.mark.slow
def test_the_worked_example_runs_under_torchrun(tmp_path):
    pytest.importorskip("torch.distributed.fsdp")
    example = Path(__file__).resolve().parents[2] / "examples" / "train_sharded.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(example)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([*cmd, "--out", str(tmp_path)], capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    out = run.stdout
    assert "init check: FAILED" in out  # after to_empty: the memory is not µP's init, and the check says so
    assert "mt.init_weights drew µP's init on every shard; init check: passed" in out
    first, last = (float(v) for v in re.search(r"loss ([\d.]+) → ([\d.]+)", out).groups())
    assert last < first - 1.0, out
    assert float(re.search(r"fresh meta-built model: logits rel. diff ([\d.e+-]+)", out).group(1)) <= 1e-6
    assert float(re.search(r"loads it: logits rel. diff ([\d.e+-]+)", out).group(1)) <= 1e-5
    assert (tmp_path / "plain.pt").exists() and (tmp_path / "shapes.json").exists() and (tmp_path / "dcp").is_dir()
    assert float(re.search(r"done in ([\d.]+) s", out).group(1)) < 60
