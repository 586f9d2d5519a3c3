"""Data-parallel µP training: DDP (or FSDP2 with --fsdp), gloo on CPU, 2 processes.

µP changes nothing about data parallelism: parametrize the model first (every rank the same
way, the same seed), then wrap it; ``mt.param_groups`` finds the µP spec through the DDP/FSDP
wrapper. Each rank trains on its own slice of every batch; the gradients are averaged, so the
run equals one process on the whole batch.

    python examples/train_ddp.py [--fsdp] [--steps 5]      # starts 2 processes itself
    torchrun --nproc-per-node 2 examples/train_ddp.py      # or under torchrun
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import mutransfer as mt
from mutransfer._core.devices import resolve_device
from mutransfer.recipes import GPT, text_batches


def build(width: int) -> GPT:
    torch.manual_seed(0)  # every rank builds the same model
    return mt.parametrize(GPT(width), base=GPT(32), delta=GPT(64))


def rank_device(device: str, rank: int) -> torch.device:
    """This rank's device: the CPU, or one GPU per rank (rank mod the GPUs this process sees)."""
    where = resolve_device(device, "--device")
    if where.type == "cuda" and where.index is None:
        where = torch.device("cuda", rank % torch.cuda.device_count())
    return where


def run(rank: int, world: int, args, out=None) -> None:
    device = rank_device(args.device, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
    model = build(args.width).to(device)  # built on the CPU under one seed: the same model on every rank
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        wrapped = model
    else:
        wrapped = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None
        )
    opt = torch.optim.AdamW(mt.param_groups(wrapped, lr=args.lr, optimizer="adamw"))
    losses = []
    for x, y in text_batches(args.steps, batch=8, seq=32, seed=0):
        x, y = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)  # this rank's slice of the batch
        loss = F.cross_entropy(wrapped(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        full = loss.detach().clone()
        dist.all_reduce(full)
        losses.append(full.item() / world)
    if args.fsdp:
        from torch.distributed.tensor import DTensor

        state = {k: (v.full_tensor() if isinstance(v, DTensor) else v) for k, v in model.state_dict().items()}
    else:
        state = model.state_dict()
    probe = text_batches(1, batch=4, seq=32, seed=99)[0][0].to(device)
    with torch.no_grad():
        logits = wrapped(probe)
    logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
    if rank == 0:
        print(f"{'FSDP2' if args.fsdp else 'DDP'} × {world}: loss " + " ".join(f"{v:.4f}" for v in losses))
        if out is not None:
            torch.save({"losses": losses, "state": {k: v.cpu() for k, v in state.items()}, "logits": logits.cpu()}, out)
    dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, args, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    run(rank, world, args, out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=2**-7)
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    p.add_argument("--device", default="auto", help="auto (one GPU per rank when present, else the CPU), cpu or cuda")
    p.add_argument("--world", type=int, default=2, help="processes to start (without torchrun)")
    p.add_argument(
        "--save",
        default=None,
        help="rank 0 saves its losses, the full state_dict and the logits on a held-out batch here",
    )
    return p


def main() -> None:
    args = parser().parse_args()
    if "RANK" in os.environ:  # under torchrun
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, args.save)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if args.world == 1:  # the one-process reference: in this process (a spawned one re-imports torch)
        _spawned(0, 1, port, args, args.save)
        return
    mp.spawn(_spawned, args=(args.world, port, args, args.save), nprocs=args.world)


if __name__ == "__main__":
    main()
