"""The sharded µP checks, run on 2 gloo processes by tests/core/test_sharded.py (torchrun --nproc-per-node 2).

    torchrun --standalone --nproc-per-node 2 tests/core/sharded_job.py OUT.json CKPT_DIR            # the checks
    torchrun --standalone --nproc-per-node 2 tests/core/sharded_job.py OUT2.json CKPT_DIR --reload  # a fresh job

Every rank runs every case; rank 0 writes what it measured as JSON. The one-process references are
computed on each rank locally (no communication), from the same seeds. The first job leaves a DCP
checkpoint, the width shapes and reference logits in CKPT_DIR; the second, fresh processes, reloads them.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import mutransfer as mt
from mutransfer.recipes import Llama

WIDTH, BASE, LAYERS, STEPS = 128, 32, 2, 5
HEADS, KV_HEADS = 4, 2
PLAN = {
    "attention.wq": ColwiseParallel(),
    "attention.wk": ColwiseParallel(),
    "attention.wv": ColwiseParallel(),
    "attention.wo": RowwiseParallel(),
    "feed_forward.w1": ColwiseParallel(),
    "feed_forward.w3": ColwiseParallel(),
    "feed_forward.w2": RowwiseParallel(),
}


def llama(width, heads=HEADS, kv=KV_HEADS):
    return Llama(width, vocab=96, n_layers=LAYERS, n_heads=heads, n_kv_heads=kv)


def base_and_delta(heads=HEADS, kv=KV_HEADS, base_width=BASE):
    torch.manual_seed(1)
    base = llama(base_width, heads, kv)
    with torch.device("meta"):
        delta = llama(2 * base_width, heads, kv)
    return base, delta


def eager(seed=0):
    base, delta = base_and_delta()
    torch.manual_seed(seed)
    return mt.parametrize(llama(WIDTH), base=base, delta=delta)


def on_meta(heads=HEADS, kv=KV_HEADS, width=WIDTH, base_width=BASE):
    base, delta = base_and_delta(heads, kv, base_width)
    with torch.device("meta"):
        model = llama(width, heads, kv)
    return mt.parametrize(model, base=base, delta=delta)


def batches():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 96, (4, 17), generator=g)] * STEPS  # one batch again: the loss must fall


def loss_of(model, tokens):
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def train(model, optimizer_name):
    if optimizer_name == "adamw":
        opt = torch.optim.AdamW(mt.param_groups(model, lr=1e-2, optimizer="adamw", weight_decay=0.1))
    else:
        opt = mt.optim.Muon(model, lr=2e-2)
    losses = []
    for tokens in batches():
        loss = loss_of(model, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses


def tensor_parallel(model, mesh):
    for block in model.layers:
        parallelize_module(block, mesh, PLAN)
    return model


def fsdp(model, mesh):
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def full_state(model):
    return {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in model.state_dict().items()
    }


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2,))
    mesh2d = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    out: dict = {}
    t0 = time.perf_counter()

    # 1. a materialised µP model, sharded, trains like one process
    for opt_name in ("adamw", "muon"):
        ref = train(eager(), opt_name)
        out[f"tp_{opt_name}"] = rel(train(tensor_parallel(eager(), mesh), opt_name), ref)
        out[f"fsdp_{opt_name}"] = rel(train(fsdp(eager(), mesh), opt_name), ref)
        out[f"ref_{opt_name}"] = ref

    # 2. meta → parametrize → tensor parallel + fully_shard → to_empty → init_weights
    one = eager()
    mt.init_weights(one, seed=7)  # the one-process draw of the same seed
    model = on_meta()
    out["meta_params_on_meta"] = all(p.is_meta for p in model.parameters())
    out["meta_groups_equal"] = [(g["lr"], len(g["params"])) for g in mt.param_groups(model, 1e-2, "adamw")] == [
        (g["lr"], len(g["params"])) for g in mt.param_groups(one, 1e-2, "adamw")
    ]
    tensor_parallel(model, mesh2d["tp"])
    fsdp(model, mesh2d["dp"])
    model.to_empty(device="cpu")
    out["check_before_init"] = mt.check(model).passed
    mt.init_weights(model, seed=7)
    out["check_after_init"] = mt.check(model).passed
    full = full_state(model)
    ref_state = one.state_dict()
    out["same_full_tensors"] = all(torch.equal(full[k], ref_state[k]) for k in ref_state)
    reference = eager(seed=3)  # an eagerly parametrized model: every tensor's RMS
    gaps = {}
    for k, v in reference.state_dict().items():
        r_eager = float(v.double().pow(2).mean().sqrt())
        r_drawn = float(full[k].double().pow(2).mean().sqrt())
        gaps[k] = abs(math.log(r_drawn / r_eager)) if r_eager > 0 else abs(r_drawn)
    out["rms_log_gaps"] = gaps
    # shards independent: rank 0's and rank 1's halves of every hidden weight, correlated
    corr = {}
    for k, v in full.items():
        if v.ndim == 2 and v.shape[0] % 2 == 0:
            a, b = v.chunk(2, dim=0)
            a, b = a.flatten().double(), b.flatten().double()
            corr[k] = float(torch.corrcoef(torch.stack([a, b]))[0, 1]) * math.sqrt(a.numel())
    out["shard_corr_z"] = corr
    out["meta_trained"] = train(model, "adamw")

    # the same on FSDP2 alone (each rank holds half of every tensor's rows)
    alone = on_meta()
    fsdp(alone, mesh)
    alone.to_empty(device="cpu")
    mt.init_weights(alone, seed=7)
    alone_full = full_state(alone)
    out["fsdp_same_full_tensors"] = all(torch.equal(alone_full[k], ref_state[k]) for k in ref_state)
    probe = batches()[0][:, :-1]
    with torch.no_grad():
        ref_logits = one(probe)
        out["fsdp_export_rel"] = float((mt.export(alone)(probe) - ref_logits).abs().max() / ref_logits.abs().max())

    # 3. export of the sharded model (every rank gathers; the plain model loads into the plain class)
    tokens = batches()[0][:, :-1]
    with torch.no_grad():
        mup_logits = model(tokens).detach()
        if hasattr(mup_logits, "full_tensor"):
            mup_logits = mup_logits.full_tensor()
    plain = mt.export(model)
    out["export_class"] = type(plain).__name__
    out["export_is_plain"] = not any(hasattr(p, "placements") for p in plain.parameters())
    with torch.no_grad():
        out["export_rel"] = float((plain(tokens) - mup_logits).abs().max() / mup_logits.abs().max())
        fresh = llama(WIDTH)
        fresh.load_state_dict(plain.state_dict())
        out["export_reload_rel"] = float((fresh(tokens) - mup_logits).abs().max() / mup_logits.abs().max())

    # 4. a DCP checkpoint of the sharded model and the width shapes (a fresh job reloads them: `reload`)
    ckpt = sys.argv[2]
    if rank == 0:
        base, delta = base_and_delta()
        mt.save_shapes(base, delta, os.path.join(ckpt, "shapes.json"))
        torch.save({"tokens": tokens, "logits": mup_logits}, os.path.join(ckpt, "reference.pt"))
    dcp.save(get_model_state_dict(model), checkpoint_id=os.path.join(ckpt, "dcp"))
    dist.barrier()

    # replicas (DDP): seed=None draws one seed for every rank (rank 0's), whatever each rank's generator
    torch.manual_seed(100 + rank)
    replica = eager()
    mt.init_weights(replica)
    total = torch.tensor([float(sum(p.double().sum() for p in replica.parameters()))], dtype=torch.float64)
    gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, total)
    out["replicas_equal"] = all(torch.equal(g, gathered[0]) for g in gathered)

    # 5. bad input: a tensor-parallel plan that cuts heads (3 heads over 2 ranks), init_weights on a plain model
    bad = on_meta(heads=3, kv=3, width=192, base_width=48)
    tensor_parallel(bad, mesh)
    bad.to_empty(device="cpu")
    try:
        mt.init_weights(bad, seed=1)
        out["head_split_error"] = None
    except mt.errors.ModelError as e:
        out["head_split_error"] = str(e)
    try:
        mt.init_weights(llama(WIDTH))
        out["plain_error"] = None
    except mt.errors.ModelError as e:
        out["plain_error"] = str(e)
    out["seconds"] = time.perf_counter() - t0
    dist.barrier()
    if rank == 0:
        with open(out_path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(out_path + ".tmp", out_path)
    dist.destroy_process_group()


def reload(out_path: str, ckpt: str) -> None:
    """A fresh job: a meta-built model gets µP back from the saved shapes and its values from DCP."""
    dist.init_process_group("gloo")
    mesh2d = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    with torch.device("meta"):
        again = llama(WIDTH)
    mt.parametrize(again, base_shapes=os.path.join(ckpt, "shapes.json"))
    tensor_parallel(again, mesh2d["tp"])
    fsdp(again, mesh2d["dp"])
    again.to_empty(device="cpu")
    state = get_model_state_dict(again)
    dcp.load(state, checkpoint_id=os.path.join(ckpt, "dcp"))
    set_model_state_dict(again, state)
    ref = torch.load(os.path.join(ckpt, "reference.pt"), weights_only=True)
    out = {}
    with torch.no_grad():
        logits = again(ref["tokens"])
        logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
        out["dcp_rel"] = float((logits - ref["logits"]).abs().max() / ref["logits"].abs().max())
    out["dcp_groups_equal"] = [(g["lr"], len(g["params"])) for g in mt.param_groups(again, 1e-2, "adamw")] == [
        (g["lr"], len(g["params"])) for g in mt.param_groups(eager(), 1e-2, "adamw")
    ]
    dist.barrier()
    if dist.get_rank() == 0:
        with open(out_path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(out_path + ".tmp", out_path)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    try:
        if sys.argv[3:] == ["--reload"]:
            reload(sys.argv[1], sys.argv[2])
        else:
            main(sys.argv[1])
    except Exception:
        traceback.print_exc()
        sys.exit(1)
