"""How long `parametrize` takes on a 1B-parameter-class model built on the meta device.

A Llama-style config (hidden 2048, 16 layers, 32 heads with 8 key/value heads, vocab 32000,
≈0.84B parameters) and its base (hidden 256) and delta (hidden 512) are built on the meta device,
so nothing is allocated; `parametrize` then runs its probe forwards (base, target, perturbation,
verification) on meta tensors. Prints seconds per run and the median.

    python benchmarks/parametrize_speed.py [--runs 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch

import mutransfer as mt


def build(width: int, layers: int = 16):
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=width,
        intermediate_size=int(2.6875 * width),
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="timed runs (each on freshly built meta models)")
    ap.add_argument("--json", help="write the timings to this file")
    args = ap.parse_args()
    times = []
    for _ in range(args.runs):
        target, base, delta = build(2048), build(256), build(512)
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("error", mt.MuPWarning)  # the probes must run on meta tensors
            mt.parametrize(target, base=base, delta=delta)
        times.append(time.perf_counter() - t)
    n = sum(p.numel() for p in target.parameters())
    verified = all(a.verified for a in target._mutransfer_spec.attention)
    print(
        f"parametrize, Llama-style {n / 1e9:.2f}B parameters on meta: "
        + ", ".join(f"{x:.2f} s" for x in times)
        + f" (median {statistics.median(times):.2f} s; "
        f"attention scales verified: {verified})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"params": n, "seconds": times, "verified": verified}, f)


if __name__ == "__main__":
    main()
