"""µP under FSDP2 (fully_shard), one process on the gloo backend: same groups, same outputs."""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os, socket, torch, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    import mutransfer as mt
    from mutransfer.recipes import GPT

    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = mt.parametrize(GPT(128), base=GPT(32), delta=GPT(64))
    before = [(g["lr"], g["eps"], len(g["params"])) for g in mt.param_groups(model, 1e-3, "adam")]
    x = torch.randint(0, 256, (2, 16))
    y0 = model(x)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    groups = mt.param_groups(model, 1e-3, "adam")
    after = [(g["lr"], g["eps"], len(g["params"])) for g in groups]
    assert after == before, (before, after)
    assert torch.allclose(model(x), y0, atol=1e-6)
    opt = torch.optim.Adam(groups)
    model(x).logsumexp(-1).mean().backward()
    opt.step()
    dist.destroy_process_group()
    print("FSDP-OK")
""")


@pytest.mark.slow
def test_param_groups_and_outputs_survive_fully_shard():
    pytest.importorskip("torch.distributed.fsdp")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert "FSDP-OK" in out.stdout, out.stderr[-3000:]
