"""The monitor's scalars read back from a real TensorBoard event file, a W&B offline run, a CSV file;
and the Hugging Face and Lightning callbacks attached in one line."""

import csv
import os

import pytest
import torch
import torch.nn.functional as F
from test_monitor import CTX, V, build, mup_adamw, train

import mutransfer as mt
from mutransfer.monitor import hf_callback, lightning_callback, tag

HIDDEN_TAG = tag("hidden", "blocks.0.fc", "dw_rms")


def test_callable_and_csv(tmp_path):
    got = {}
    model = build(64)
    train(model, mup_adamw(model), steps=5, every=5, log=lambda step, s: got.setdefault(step, s))
    assert sorted(got) == [1, 5] and got[5][HIDDEN_TAG] > 0 and "mup/output/(model output)/act_rms" in got[5]
    model = build(64)
    mon = train(model, mup_adamw(model), steps=5, every=5, log=f"csv:{tmp_path / 'm.csv'}")
    mon.close()
    rows = list(csv.DictReader((tmp_path / "m.csv").open()))
    assert {r["step"] for r in rows} == {"1", "5"}
    assert float(next(r["value"] for r in rows if r["step"] == "5" and r["tag"] == HIDDEN_TAG)) == pytest.approx(
        got[5][HIDDEN_TAG], rel=1e-5
    )


def test_tensorboard_event_file(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = build(64)
    opt = mup_adamw(model)
    mon = train(model, opt, steps=5, every=5, log=f"tensorboard:{tmp_path}")
    mon.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert HIDDEN_TAG in acc.Tags()["scalars"]
    assert [e.step for e in acc.Scalars(HIDDEN_TAG)] == [1, 5]
    wte = dict(model.named_parameters())["wte.weight"]  # the logged lr is the one the optimizer steps wte with
    lr = next(g["lr"] for g in opt.param_groups if any(p is wte for p in g["params"]))
    assert acc.Scalars("mup/input/wte/lr")[0].value == pytest.approx(lr, rel=1e-6)


def test_wandb_offline_run(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="mt-monitor-test", mode="offline", dir=str(tmp_path))
    model = build(64)
    mon = train(model, mup_adamw(model), steps=5, every=5, log="wandb")
    mon.close()
    summary = dict(run.summary)
    run.finish()
    assert summary[HIDDEN_TAG] > 0 and summary["mup/step"] == 5
    files = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".wandb")]
    assert files and HIDDEN_TAG.encode() in open(files[0], "rb").read()


class _Wrapped(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, input_ids, labels=None):
        logits = self.net(input_ids)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), input_ids[:, 1:].reshape(-1))
        return {"loss": loss, "logits": logits}


def _batches(n):
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, V, (CTX,), generator=g)} for _ in range(n)]


@pytest.mark.filterwarnings("ignore")
def test_hugging_face_trainer_callback(tmp_path):
    from transformers import Trainer, TrainingArguments

    net = build(64)
    model = _Wrapped(net)
    opt = torch.optim.AdamW(mt.param_groups(net, lr=1e-3, optimizer="adamw"))
    args = TrainingArguments(
        str(tmp_path), max_steps=6, per_device_train_batch_size=2, report_to=[], use_cpu=True, save_strategy="no"
    )
    cb = hf_callback(every=3)
    Trainer(model=model, args=args, train_dataset=_batches(12), optimizers=(opt, None), callbacks=[cb]).train()
    assert cb.monitor.alarms == []
    assert [r["step"] for r in cb.monitor.trajectory()["steps"]] == [1, 3, 6]
    # Trainer's own optimizer (one lr for a decay and a no-decay group) is what the monitor is for
    cb = hf_callback(every=3)
    Trainer(model=_Wrapped(build(64)), args=args, train_dataset=_batches(12), callbacks=[cb]).train()
    assert "lm_head" in {a.layer for a in cb.monitor.alarms}


@pytest.mark.filterwarnings("ignore")
def test_lightning_callback(tmp_path):
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = build(64)

        def training_step(self, batch, batch_idx):
            x = batch[0]
            return F.cross_entropy(self.net(x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1))

        def configure_optimizers(self):
            return mup_adamw(self.net)

    data = torch.utils.data.TensorDataset(torch.randint(0, V, (12, CTX + 1)))
    cb = lightning_callback(every=2)
    trainer = pl.Trainer(
        max_steps=4,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb],
        default_root_dir=str(tmp_path),
    )
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=2))
    assert cb.monitor.alarms == [] and cb.monitor.model is trainer.lightning_module.net
    steps = cb.monitor.trajectory()["steps"]
    assert [r["step"] for r in steps] == [1, 2, 4] and steps[-1]["loss"] > 0
    assert steps[-1]["layers"]["blocks.0.fc"]["dw_rms"] > 0
