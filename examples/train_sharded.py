"""The big run, built the way big models are built (torchtitan's order), in µP.

1. build the target on the meta device (no memory for its values), its base (small, real values: µP's
   init laws are read off them) and its delta on meta;
2. ``mt.parametrize`` the meta target: roles, multipliers, attention scale and lr factors from shapes
   and probe forwards; each parameter's init law from the base;
3. parallelize: tensor parallel (q/k/v/gate/up column-wise, o/down row-wise) on the "tp" mesh dim, then
   FSDP2 ``fully_shard`` on the "dp" dim;
4. ``to_empty`` then ``mt.init_weights``: every rank draws its own shards of µP's init (the model's own
   ``init_weights`` would give the standard parametrization's); ``mt.check`` confirms it;
5. train with AdamW over ``mt.param_groups``; save a ``torch.distributed.checkpoint`` (DCP) and the
   width shapes; a fresh meta model gets µP back from the shapes and its values from DCP;
6. ``mt.export``: the plain model (every constant folded), gathered on every rank, saved by rank 0,
   loaded into the plain class with the same logits.

    torchrun --nproc-per-node 2 examples/train_sharded.py [--tp 2] [--width 512] [--steps 20] [--out DIR]

CPU and gloo by default (``--device cuda``: NCCL, one GPU per rank). ``--tp 1``: FSDP2 alone.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import mutransfer as mt
from mutransfer.recipes import Llama, text_batches

TP_PLAN = {
    "attention.wq": ColwiseParallel(),
    "attention.wk": ColwiseParallel(),
    "attention.wv": ColwiseParallel(),
    "attention.wo": RowwiseParallel(),
    "feed_forward.w1": ColwiseParallel(),  # gate
    "feed_forward.w3": ColwiseParallel(),  # up
    "feed_forward.w2": RowwiseParallel(),  # down
}


def llama(width: int, layers: int) -> Llama:
    return Llama(width, vocab=256, n_layers=layers, n_heads=8, n_kv_heads=4)


def parallelize(model: Llama, mesh, tp: int) -> Llama:
    for block in model.layers:
        if tp > 1:
            parallelize_module(block, mesh["tp"], TP_PLAN)
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def say(*args) -> None:
    if dist.get_rank() == 0:
        print(*args, flush=True)


def local_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(tokens)
    return out.full_tensor() if hasattr(out, "full_tensor") else out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel degree (the rest of the world is FSDP)")
    ap.add_argument("--width", type=int, default=512, help="the target's width (base: 64)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=2**-6, help="the base lr (tuned at width 64, transferred by µP)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank)")
    ap.add_argument("--out", help="where the checkpoint and the exported model go (default: a temporary folder)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world % args.tp:
        raise SystemExit(f"--tp {args.tp} does not divide the {world} processes")
    mesh = init_device_mesh(device.type, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))

    # 1-2. meta build, µP from shapes and the base's values
    torch.manual_seed(args.seed)
    base = llama(64, args.layers)  # small, real: µP reads its init laws off these values
    with torch.device("meta"):
        delta, model = llama(128, args.layers), llama(args.width, args.layers)
    mt.parametrize(model, base=base, delta=delta)
    n = sum(p.numel() for p in model.parameters())
    say(f"[1] parametrized a meta Llama of {n / 1e6:.1f}M parameters (width {args.width}) from a real width-64 base")

    # 3-4. shard, materialise, µP's init shard by shard
    parallelize(model, mesh, args.tp)
    model.to_empty(device=device)
    say(f"[2] sharded: dp {world // args.tp} × tp {args.tp}; after to_empty, {mt.check(model)}".splitlines()[0])
    mt.init_weights(model, seed=args.seed)
    report = mt.check(model)
    say(f"[3] mt.init_weights drew µP's init on every shard; {str(report).splitlines()[0]}")
    if not report.passed:
        raise SystemExit(str(report))

    # 5. train
    opt = torch.optim.AdamW(mt.param_groups(model, lr=args.lr, optimizer="adamw", weight_decay=0.1))
    batches = text_batches(args.steps, batch=8, seq=64, seed=args.seed)
    losses = []
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    say(f"[4] trained {args.steps} AdamW steps: loss {losses[0]:.3f} → {losses[-1]:.3f}")

    # DCP checkpoint + the width shapes; a fresh meta model gets µP back from them
    out = [args.out or (tempfile.mkdtemp(prefix="mt-sharded-") if rank == 0 else None)]
    dist.broadcast_object_list(out, src=0)
    folder = out[0]
    shapes = os.path.join(folder, "shapes.json")
    if rank == 0:
        os.makedirs(folder, exist_ok=True)
        mt.save_shapes(base, delta, shapes)
    dcp.save(get_model_state_dict(model), checkpoint_id=os.path.join(folder, "dcp"))
    dist.barrier()
    with torch.device("meta"):
        again = llama(args.width, args.layers)
    mt.parametrize(again, base_shapes=shapes)  # µP's constants and groups; the values come from DCP
    parallelize(again, mesh, args.tp)
    again.to_empty(device=device)
    state = get_model_state_dict(again)
    dcp.load(state, checkpoint_id=os.path.join(folder, "dcp"))
    set_model_state_dict(again, state)
    probe = batches[0][0][:2].to(device)
    ref = local_logits(model, probe)
    rel = float((local_logits(again, probe) - ref).abs().max() / ref.abs().max())
    say(f"[5] DCP checkpoint in {folder}/dcp reloaded into a fresh meta-built model: logits rel. diff {rel:.1e}")

    # 6. export: every rank gathers the plain model; rank 0 saves it
    plain = mt.export(model)
    if rank == 0:
        torch.save(plain.state_dict(), os.path.join(folder, "plain.pt"))
        fresh = llama(args.width, args.layers)
        fresh.load_state_dict(torch.load(os.path.join(folder, "plain.pt"), weights_only=True))
        rel_plain = float((local_logits(fresh, probe.cpu()) - ref.cpu()).abs().max() / ref.abs().max())
        say(f"[6] exported to {folder}/plain.pt; the plain Llama class loads it: logits rel. diff {rel_plain:.1e}")
    dist.barrier()
    say(f"done in {time.perf_counter() - t0:.1f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
