"""Writes tests/data/neural_tangents_reference.npz: NNGP and NTK values from neural-tangents
itself for the architectures that tests/test_limits_model.py builds in PyTorch.

neural-tangents is JAX-only and archived; it runs here with jax 0.4.23 and neural-tangents 0.6.5
in float64, in its own virtual environment (it is not a dependency of this package):

    python -m venv /tmp/ntenv
    /tmp/ntenv/bin/pip install "jax==0.4.23" "jaxlib==0.4.23" "neural-tangents==0.6.5" "numpy<2" "scipy<1.13"
    /tmp/ntenv/bin/python tests/data/make_neural_tangents_reference.py

Conventions: σ_w² = 2.0, σ_b² = 0.1 everywhere, NTK parametrization; images NHWC here (the
test moves channels to axis 1); conv and pooling paddings chosen where both libraries mean the
same (SAME at stride 1 for odd filters, VALID, CIRCULAR).
"""

import pathlib

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)
from neural_tangents import stax  # noqa: E402

W, B = np.sqrt(2.0), np.sqrt(0.1)
rng = np.random.default_rng(0)
out = {}


def run(name, layers, x1, x2):
    _, _, kernel_fn = stax.serial(*layers)
    k = kernel_fn(x1, x2, ("nngp", "ntk"))
    out[f"{name}_nngp"], out[f"{name}_ntk"] = np.asarray(k.nngp), np.asarray(k.ntk)
    out[f"{name}_x1"], out[f"{name}_x2"] = x1, x2


def block():
    branch = stax.serial(stax.Relu(), stax.Dense(64, W, B), stax.Relu(), stax.Dense(64, W, B))
    return stax.serial(stax.FanOut(2), stax.parallel(stax.Identity(), branch), stax.FanInSum())


v1, v2 = rng.standard_normal((7, 6)), rng.standard_normal((5, 6))
run(
    "mlp",
    [
        stax.Dense(64, W, B),
        stax.Relu(),
        stax.Dense(64, W, B),
        stax.Erf(),
        stax.Dense(64, W, B),
        stax.Gelu(),
        stax.Dense(1, W, B),
    ],
    v1,
    v2,
)
run(
    "leaky_abs",
    [stax.Dense(64, W, B), stax.LeakyRelu(0.2), stax.Dense(64, W, B), stax.Abs(), stax.Dense(1, W, B)],
    v1,
    v2,
)
run(
    "layernorm",
    [
        stax.Dense(64, W, B),
        stax.LayerNorm(eps=1e-5),
        stax.Relu(),
        stax.Dense(64, W, B),
        stax.LayerNorm(eps=1e-5),
        stax.Dense(1, W, B),
    ],
    v1,
    v2,
)
run("resnet", [stax.Dense(64, W, B), block(), block(), stax.Relu(), stax.Dense(1, W, B)], v1, v2)
i1, i2 = rng.standard_normal((4, 8, 8, 3)), rng.standard_normal((3, 8, 8, 3))
run(
    "cnn_gap",
    [
        stax.Conv(32, (3, 3), padding="SAME", W_std=W, b_std=B),
        stax.Relu(),
        stax.Conv(32, (3, 3), padding="SAME", W_std=W, b_std=B),
        stax.Relu(),
        stax.Conv(32, (3, 3), strides=(2, 2), padding="VALID", W_std=W, b_std=B),
        stax.Relu(),
        stax.GlobalAvgPool(),
        stax.Dense(1, W, B),
    ],
    i1,
    i2,
)
run(
    "cnn_flatten",
    [
        stax.Conv(32, (3, 3), padding="SAME", W_std=W, b_std=B),
        stax.Relu(),
        stax.Conv(32, (2, 2), strides=(2, 2), padding="VALID", W_std=W, b_std=B),
        stax.Erf(),
        stax.Flatten(),
        stax.Dense(64, W, B),
        stax.Relu(),
        stax.Dense(1, W, B),
    ],
    i1,
    i2,
)
run(
    "cnn_pool",
    [
        stax.Conv(32, (3, 3), padding="SAME", W_std=W, b_std=B),
        stax.Relu(),
        stax.AvgPool((2, 2), (2, 2)),
        stax.Conv(32, (3, 3), padding="CIRCULAR", W_std=W, b_std=B),
        stax.Relu(),
        stax.AvgPool((3, 3), strides=(1, 1), padding="SAME"),
        stax.Flatten(),
        stax.Dense(1, W, B),
    ],
    i1,
    i2,
)
s1, s2 = rng.standard_normal((4, 10, 3)), rng.standard_normal((3, 10, 3))
run(
    "conv1d",
    [
        stax.Conv(32, (3,), padding="SAME", W_std=W, b_std=B),
        stax.Gelu(),
        stax.Conv(32, (3,), strides=(2,), padding="VALID", W_std=W, b_std=B),
        stax.Relu(),
        stax.GlobalAvgPool(),
        stax.Dense(1, W, B),
    ],
    s1,
    s2,
)
run(
    "no_bias",
    [
        stax.Conv(32, (3, 3), padding="VALID", W_std=W, b_std=None),
        stax.Abs(),
        stax.Conv(32, (1, 1), W_std=W, b_std=None),
        stax.Relu(),
        stax.GlobalAvgPool(),
        stax.Dense(1, W, B),
    ],
    i1,
    i2,
)
target = pathlib.Path(__file__).with_name("neural_tangents_reference.npz")
np.savez_compressed(target, **out)
print(f"wrote {target} ({len(out) // 4} architectures)")
