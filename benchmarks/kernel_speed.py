"""Speed of infinite-width kernels of traced modules (`mt.limits.kernels(model, x)`), NNGP + NTK,
float64, on this machine — with neural-tangents side by side where it installs.

neural-tangents is JAX-only; give the script a Python that has it (jax 0.4.23 + neural-tangents
0.6.5 work here, see tests/data/make_neural_tangents_reference.py) and it times the same
architectures there (jit-compiled and `nt.batch`ed in blocks of 20 images for the CNNs and 500
inputs for the ResMLP, as its docs advise for large kernels — unbatched, the 16×16 case asks for
37 GB; the second call, so compilation is not counted; float64):

    python benchmarks/kernel_speed.py [--nt-python /tmp/ntenv/bin/python] [--quick]

Every row also checks that both libraries give the same kernel (max relative difference).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from torch import nn

from mutransfer import limits

# row label: (architecture key, input shape; images NHWC as neural-tangents takes them)
CASES = {
    "CNN-GAP, 5 conv layers (3×3, SAME), 200 × 8×8×3": ("cnn_gap", (200, 8, 8, 3)),
    "CNN-Flatten, 5 conv layers, 200 × 8×8×3": ("cnn_flatten", (200, 8, 8, 3)),
    "CNN-GAP, 3 conv layers, 100 × 16×16×3": ("cnn_gap3", (100, 16, 16, 3)),
    "ResMLP, 4 residual relu blocks, 2000 × 32": ("resmlp", (2000, 32)),
}

NT_SOURCE = r"""
import json, sys, time
import numpy as np, jax
jax.config.update("jax_enable_x64", True)
import neural_tangents as nt
from neural_tangents import stax
W = np.sqrt(2.0)
def cnn(depth, head):
    layers = []
    for _ in range(depth):
        layers += [stax.Conv(64, (3, 3), padding="SAME", W_std=W), stax.Relu()]
    return layers + ([stax.GlobalAvgPool()] if head == "gap" else [stax.Flatten()]) + [stax.Dense(10, W)]
def block():
    return stax.serial(stax.FanOut(2), stax.parallel(stax.Identity(), stax.serial(stax.Relu(), stax.Dense(256, W),
                       stax.Relu(), stax.Dense(256, W))), stax.FanInSum())
ARCH = {"cnn_gap": cnn(5, "gap"), "cnn_flatten": cnn(5, "flatten"), "cnn_gap3": cnn(3, "gap"),
        "resmlp": [stax.Dense(256, W)] + [block() for _ in range(4)] + [stax.Relu(), stax.Dense(1, W)]}
out = {}
for key, path in json.loads(sys.argv[1]).items():
    x = np.load(path)
    _, _, kfn = stax.serial(*ARCH[key])
    # batched as neural-tangents' docs advise for large kernels (unbatched, the 16×16 case needs 37 GB)
    kfn = nt.batch(jax.jit(kfn, static_argnames="get"), batch_size=20 if x.ndim == 4 else 500,
                   store_on_device=False)
    try:
        k = kfn(x, None, get=("nngp", "ntk"))
        t = time.perf_counter(); k = kfn(x, None, get=("nngp", "ntk")); np.asarray(k.ntk)
        seconds = time.perf_counter() - t
    except Exception as e:
        out[key] = repr(e)[:80]
        continue
    np.save(path + ".nngp.npy", np.asarray(k.nngp)); np.save(path + ".ntk.npy", np.asarray(k.ntk))
    out[key] = seconds
print(json.dumps(out))
"""


class Block(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.l1, self.l2 = nn.Linear(w, w, bias=False), nn.Linear(w, w, bias=False)

    def forward(self, x):
        return x + self.l2(torch.relu(self.l1(torch.relu(x))))


def torch_model(key: str, c_in: int) -> nn.Module:
    if key == "resmlp":
        return nn.Sequential(
            nn.Linear(c_in, 256, bias=False), *[Block(256) for _ in range(4)], nn.ReLU(), nn.Linear(256, 1, bias=False)
        )
    depth = 3 if key == "cnn_gap3" else 5
    layers, c = [], c_in
    for _ in range(depth):
        layers += [nn.Conv2d(c, 64, 3, padding=1, bias=False), nn.ReLU()]
        c = 64
    head = (
        [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10, bias=False)]
        if key != "cnn_flatten"
        else [nn.Flatten(), nn.Linear(64 * 64, 10, bias=False)]
    )
    return nn.Sequential(*layers, *head)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--nt-python",
        default=os.environ.get("NT_PYTHON"),
        help="a Python with jax and neural-tangents installed (default: $NT_PYTHON; none: skip)",
    )
    ap.add_argument("--quick", action="store_true", help="a tenth of the inputs (a smoke test)")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    inputs = {}
    for _name, (key, shape) in CASES.items():
        shape = (max(4, shape[0] // 10),) + shape[1:] if args.quick else shape
        inputs[key] = rng.standard_normal(shape)
    nt_seconds, nt_values = {}, {}
    if args.nt_python:
        with tempfile.TemporaryDirectory() as tmp:
            paths = {}
            for key, x in inputs.items():
                paths[key] = os.path.join(tmp, key + ".npy")
                np.save(paths[key], x)
            proc = subprocess.run([args.nt_python, "-c", NT_SOURCE, json.dumps(paths)], capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"neural-tangents run failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            else:
                nt_seconds = json.loads(proc.stdout.strip().splitlines()[-1])
                for key, path in paths.items():
                    nt_values[key] = (np.load(path + ".nngp.npy"), np.load(path + ".ntk.npy"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float64; NNGP + NTK of one output unit")
    print("| architecture | mutransfer (s) | neural-tangents (s) | ratio | max rel. difference |")
    print("|---|---|---|---|---|")
    for name, (key, _) in CASES.items():
        x = torch.from_numpy(inputs[key])
        if x.ndim == 4:
            x = x.permute(0, 3, 1, 2)
        model = torch_model(key, x.shape[1])
        limits.kernels(model, x[:4])  # warm-up (imports, tracing)
        start = time.perf_counter()
        k, t = limits.kernels(model, x)
        seconds = time.perf_counter() - start
        nt = nt_seconds.get(key)
        if isinstance(nt, str):  # it failed on this case
            print(f"neural-tangents failed on {key}: {nt}", file=sys.stderr)
            nt = None
        if key in nt_values:
            kn, tn = (torch.from_numpy(v) for v in nt_values[key])
            diff = max(float((k - kn).abs().max() / kn.abs().max()), float((t - tn).abs().max() / tn.abs().max()))
            diff_s = f"{diff:.1e}"
        else:
            diff_s = "–"
        nt_s = f"{nt:.2f}" if nt is not None else "–"
        ratio = f"{nt / seconds:.2f}×" if nt is not None else "–"
        print(f"| {name if not args.quick else name + ' (÷10)'} | {seconds:.2f} | {nt_s} | {ratio} | {diff_s} |")
    print("ratio: neural-tangents' seconds / mutransfer's (above 1: mutransfer is faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
