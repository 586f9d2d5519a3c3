"""µP with the Hugging Face Trainer: pass the optimizer and scheduler; export before sharing.

The Trainer builds its own optimizer from ``learning_rate`` — one lr for every matrix, which
is standard parametrization. Give it µP's instead through ``optimizers=(opt, scheduler)``:

    opt = torch.optim.AdamW(mt.param_groups(model, lr=..., optimizer="adamw", weight_decay=...))
    sched = transformers.get_cosine_schedule_with_warmup(opt, warmup, total)  # a LambdaLR: µP's
    trainer = Trainer(model=model, args=args, train_dataset=ds, optimizers=(opt, sched))  # ratios kept

Do not use a scheduler that sets one absolute lr for every group (OneCycleLR with a scalar
max_lr): it erases µP's per-layer lrs. Gradient clipping (``max_grad_norm``) clips the global
norm, summed over all layers: it is not a µP rule, and it changes the run when it triggers;
this example turns it off to match a plain loop step for step. ``save_model`` writes the
µP weights (for resuming: build, parametrize, load); ``mt.export(model).save_pretrained(dir)``
writes a checkpoint that plain ``from_pretrained`` loads with the same logits.

    python examples/train_hf_trainer.py [--steps 10] [--out runs/hf]
"""

from __future__ import annotations

import argparse
import warnings

import torch

import mutransfer as mt
from mutransfer._core.devices import resolve_device
from mutransfer.recipes import text_batches


def llama(width: int):
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=256,
            max_position_embeddings=64,
            tie_word_embeddings=False,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
        )
    )


def build(width: int):
    return mt.parametrize(llama(width), base=llama(32), delta=llama(64))


def optimizer(model, lr: float, steps: int):
    import transformers

    opt = torch.optim.AdamW(mt.param_groups(model, lr=lr, optimizer="adamw", weight_decay=0.0))
    return opt, transformers.get_cosine_schedule_with_warmup(opt, max(1, steps // 10), steps)


def dataset(steps: int, batch: int):
    """One batch per step: `steps` × `batch` sequences of bytes, labels = inputs (the model shifts)."""
    x = torch.cat([b[0] for b in text_batches(steps, batch=batch, seq=32, seed=0)])
    return [{"input_ids": row, "labels": row} for row in x]


def with_trainer(
    width: int,
    steps: int,
    batch: int,
    lr: float,
    out: str,
    trainer_class=None,
    device: torch.device = torch.device("cpu"),  # noqa: B008 (immutable)
):
    """Train with the Hugging Face Trainer on `device` (the Trainer moves the model there itself:
    the CPU, or the GPU it picks)."""
    import transformers

    model = build(width)
    opt, sched = optimizer(model, lr, steps)
    args = transformers.TrainingArguments(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=batch,
        max_grad_norm=0.0,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=device.type == "cpu",
        seed=0,
        dataloader_drop_last=True,
        disable_tqdm=True,
    )
    trainer = (trainer_class or transformers.Trainer)(
        model=model, args=args, train_dataset=dataset(steps, batch), optimizers=(opt, sched)
    )
    trainer.train()
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=2**-7)
    p.add_argument("--out", default="runs/hf")
    p.add_argument("--device", default="auto", help="auto (CUDA when present, else the CPU), cpu or cuda")
    args = p.parse_args()
    device = resolve_device(args.device, "--device")
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = with_trainer(args.width, args.steps, args.batch, args.lr, args.out, device=device)
        plain_dir = f"{args.out}/plain"
        mt.export(model).save_pretrained(plain_dir)
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(plain_dir).eval()
    x = dataset(1, 2)[0]["input_ids"][None]
    with torch.no_grad():
        a, b = model.eval()(x.to(model.device)).logits.cpu(), reloaded(x).logits  # the trained model may be on a GPU
    print(
        f"trained {args.steps} Trainer steps; exported to {plain_dir}; plain from_pretrained logits differ by "
        f"{float((a - b).abs().max() / a.abs().max()):.1e} (relative)"
    )


if __name__ == "__main__":
    main()
