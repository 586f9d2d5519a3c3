"""parametrize a meta-built big target from a real small base: time and peak memory, nothing target-sized.

The target is a Llama written the torchtitan way (`mutransfer.recipes.Llama`: RMSNorm, separate
q/k/v/o with 8 key/value heads, SwiGLU of 2.6875 × width, untied, vocab 32000) at width 4096 and 32
layers, ≈5.9e9 parameters (`--hf`: Hugging Face's LlamaForCausalLM of the same sizes), built on the
meta device; its base is the same at width 256 with real values
(what µP's init laws are read off), its delta at width 512 on meta. Timed: `mt.parametrize` (its probe
forwards run on the base and on meta tensors) and `mt.param_groups`. Memory: the peak resident set of
the process after those two, minus before them (the base already built) — what the target costs.

    python benchmarks/meta_target.py [--width 4096] [--layers 32] [--hf] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
import warnings

import torch

import mutransfer as mt
from mutransfer.recipes import Llama


def build(width: int, layers: int, hf: bool = False) -> torch.nn.Module:
    if not hf:
        return Llama(width, vocab=32000, n_layers=layers, n_heads=32, n_kv_heads=8, ffn_mult=2.6875)
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
    return transformers.LlamaForCausalLM(cfg)


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--base-width", type=int, default=256)
    ap.add_argument("--hf", action="store_true", help="Hugging Face's LlamaForCausalLM instead of recipes.Llama")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    torch.manual_seed(0)
    base = build(args.base_width, args.layers, args.hf)
    with torch.device("meta"):
        delta = build(2 * args.base_width, args.layers, args.hf)
        target = build(args.width, args.layers, args.hf)
    n = sum(p.numel() for p in target.parameters())
    before = peak_rss_gb()
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error", mt.MuPWarning)  # the probes must run (on the base and on meta tensors)
        mt.parametrize(target, base=base, delta=delta)
    t_param = time.perf_counter() - t
    groups = mt.param_groups(target, lr=3e-4, optimizer="adamw", weight_decay=0.1)
    t_all = time.perf_counter() - t
    growth = peak_rss_gb() - before
    still_meta = all(p.is_meta for p in target.parameters())
    spec = target._mutransfer_spec
    verified = bool(spec.attention) and all(a.verified for a in spec.attention)
    row = {
        "model": "transformers.LlamaForCausalLM" if args.hf else "recipes.Llama",
        "parameters": n,
        "width": args.width,
        "layers": args.layers,
        "base_width": args.base_width,
        "parametrize_s": round(t_param, 2),
        "parametrize_and_groups_s": round(t_all, 2),
        "groups": len(groups),
        "peak_rss_growth_gb": round(growth, 3),
        "rss_before_gb": round(before, 3),
        "target_still_on_meta": still_meta,
        "attention_verified": verified,
        "laws": len(spec.init_laws),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
    }
    label = f"{row['model'].split('.')[-1]} {n / 1e9:.2f}e9 (w {args.width}, L {args.layers})"
    print(f"{'target':<44}{'parametrize':>12}{'+ groups':>10}{'peak RSS growth':>17}")
    print(f"{label:<44}{t_param:>11.1f}s{t_all:>9.1f}s{growth:>15.3f} GB")
    print(
        f"base width {args.base_width} (real), target still on meta: {still_meta}; {len(groups)} optimizer groups; "
        f"{len(spec.init_laws)} init laws; attention scales measured on the probe: {verified}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
