"""Training stacks with µP: resume from a checkpoint, DDP/FSDP2, the Hugging Face Trainer, the examples."""

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import mutransfer as mt
from mutransfer.recipes import GPT, text_batches

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
from train_plain import train as steps  # noqa: E402  (the example's own loop: the test runs what users copy)


def build(width=128):
    return mt.parametrize(GPT(width), base=GPT(32), delta=GPT(64))


def make_opt(model):
    opt = torch.optim.AdamW(mt.param_groups(model, lr=2**-7, optimizer="adamw", weight_decay=0.1))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


def test_a_rebuilt_model_resumes_from_its_checkpoint_bit_exactly(tmp_path):
    batches = text_batches(6, batch=4, seq=16, seed=0)
    torch.manual_seed(0)
    model = build()
    opt, sched = make_opt(model)
    steps(model, opt, sched, batches[:3])
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, tmp_path / "c.pt")
    after = steps(model, opt, sched, batches[3:])

    torch.manual_seed(123)  # another init: the checkpoint overwrites it
    again = build()
    ckpt = torch.load(tmp_path / "c.pt")
    again.load_state_dict(ckpt["model"])
    opt2, sched2 = make_opt(again)
    opt2.load_state_dict(ckpt["opt"])
    sched2.load_state_dict(ckpt["sched"])
    assert steps(again, opt2, sched2, batches[3:]) == after
    for (n, p), (_, q) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(p, q), n
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in opt2.param_groups]


@pytest.mark.slow
@pytest.mark.parametrize("flag", [[], ["--fsdp"]], ids=["ddp", "fsdp2"])
def test_two_gloo_processes_match_one_process(tmp_path, flag, monkeypatch):
    import train_ddp

    runs = {}
    # world 1, the reference: the example's own one-process path, in this process (an interpreter
    # fewer to start); world 2: the example's command, which spawns its 2 gloo processes
    argv = ["train_ddp.py", "--world", "1", "--steps", "5", "--save", str(tmp_path / "w1.pt")] + flag
    monkeypatch.setattr(sys, "argv", argv)
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # main() sets the last two
        monkeypatch.delenv(key, raising=False)
    threads = torch.get_num_threads()
    try:
        train_ddp.main()
    finally:
        torch.set_num_threads(threads)
    runs[1] = torch.load(tmp_path / "w1.pt")
    out = tmp_path / "w2.pt"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_ddp.py"), "--world", "2", "--steps", "5", "--save", str(out)]
        + flag,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs[2] = torch.load(out)
    one, two = runs[1], runs[2]
    assert one["losses"] == pytest.approx(two["losses"], rel=1e-5)
    assert one["losses"][-1] < one["losses"][0] - 0.5  # it trained
    a, b = one["logits"], two["logits"]
    assert float((a - b).abs().max() / a.abs().max()) <= 1e-4  # measured 3.7e-7
    # Every parameter to 1e-5: measured max |Δ| ≤ 1.2e-7 (one float32 ulp of the LayerNorm gains) for DDP
    # and FSDP2 alike, while 5 steps move the hidden weights by 0.0098 and the rest by ~0.038, and a 1%
    # wrong lr (2**-7 × 1.01) or an output multiplier of 1.1 in one run moves every parameter by ≥ 3.8e-4.
    # The key slice of each qkv bias only to what 5 Adam steps can move it (5 lr): softmax ignores the
    # key bias, so its gradient is zero in exact arithmetic and Adam turns the float noise into updates
    # (measured 4e-6 and 8.7e-6 here); the logits above carry its effect, which is none.
    for name, p in one["state"].items():
        q = two["state"][name]
        if name.endswith("attn.qkv.bias"):  # [query | key | value]
            n = p.shape[0] // 3
            assert float((p[n : 2 * n] - q[n : 2 * n]).abs().max()) <= 5 * 2**-7, name
            p, q = torch.cat([p[:n], p[2 * n :]]), torch.cat([q[:n], q[2 * n :]])
        assert float((p - q).abs().max()) <= 1e-5, (name, float((p - q).abs().max()))


def test_hugging_face_trainer_steps_equal_a_plain_loop(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import train_hf_trainer as ex
    from torch.utils.data import SequentialSampler

    class InOrder(transformers.Trainer):  # the plain loop below takes the batches in order too
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    n_steps, batch, lr = 4, 4, 2**-7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trained = ex.with_trainer(64, n_steps, batch, lr, str(tmp_path / "hf"), trainer_class=InOrder)
    model = ex.build(64)
    opt, sched = ex.optimizer(model, lr, n_steps)
    data = ex.dataset(n_steps, batch)
    model.train()
    for s in range(n_steps):
        x = torch.stack([d["input_ids"] for d in data[s * batch : (s + 1) * batch]])
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    for (n, p), (_, q) in zip(trained.named_parameters(), model.named_parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-7), (n, float((p - q).abs().max()))
    init = ex.build(64)
    moved = max(float((p - q).detach().abs().max()) for p, q in zip(trained.parameters(), init.parameters()))
    assert moved > 1e-3  # the Trainer did train, with the µP groups


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, expect",
    [
        ("train_plain.py", "resumed run identical: True"),
        ("train_hf_trainer.py", "plain from_pretrained logits differ by"),
    ],
)
def test_examples_run(tmp_path, script, expect):
    if script == "train_hf_trainer.py":
        pytest.importorskip("transformers")
        pytest.importorskip("accelerate")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), "--steps", "6", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert expect in proc.stdout, proc.stdout
    rel = float(proc.stdout.split("(relative)")[0].split()[-1])
    assert rel <= 1e-5, proc.stdout


class _Exploit:
    """A pickle that runs code when loaded: what a tampered checkpoint can hold."""

    def __reduce__(self):
        return (Path.touch, (Path(_Exploit.marker),))


def test_the_example_refuses_a_checkpoint_that_would_run_code(tmp_path):
    """Issue 30: examples/train_plain.py loaded checkpoints with torch.load's full unpickler."""
    from train_plain import load_checkpoint

    _Exploit.marker = str(tmp_path / "pwned")
    torch.save({"model": _Exploit()}, tmp_path / "evil.pt", _use_new_zipfile_serialization=True)
    with pytest.raises(Exception, match="[Ww]eights only"):
        load_checkpoint(tmp_path / "evil.pt")
    assert not (tmp_path / "pwned").exists()


def test_every_torch_load_in_the_package_examples_and_benchmarks_is_weights_only():
    """Issue 30: torch.load without weights_only=True unpickles arbitrary code (grep torch.load)."""
    import ast

    unsafe = []
    for folder in ("src", "examples", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "load"
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "torch"
                    and not any(
                        k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                        for k in node.keywords
                    )
                ):
                    unsafe.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not unsafe, unsafe
