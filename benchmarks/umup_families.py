"""u-µP on Hugging Face families it was not built on: what `parametrize(..., parametrization="u-mup")`
warns, how much of the hidden matmuls' operands sits below E4M3's smallest normal at init, whether
`mt.export` gives a plain model with the same logits, and whether `mt.Monitor` stays quiet over 8 AdamW
steps. Tiny configs (2 layers, 4 heads, vocab 128) at width 256, base 64, delta 128; random weights.

    python benchmarks/umup_families.py [--families qwen2,gpt_neox,opt,mixtral,phi3,gemma]

Needs `transformers` (the test extra). Prints one row per family; a failure is printed, not raised.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer.errors import MuPWarning
from mutransfer.precision import fp8_underflow

V = 128


def configs(width: int) -> dict:
    import transformers as T

    h = 4
    return {
        "qwen2": T.Qwen2Config(
            vocab_size=V, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
            num_attention_heads=h, num_key_value_heads=2, max_position_embeddings=64,
        ),
        "gpt_neox": T.GPTNeoXConfig(
            vocab_size=V, hidden_size=width, intermediate_size=4 * width, num_hidden_layers=2,
            num_attention_heads=h, max_position_embeddings=64,
        ),
        "opt": T.OPTConfig(
            vocab_size=V, hidden_size=width, ffn_dim=4 * width, num_hidden_layers=2, num_attention_heads=h,
            max_position_embeddings=64, word_embed_proj_dim=width,
        ),
        "mixtral": T.MixtralConfig(
            vocab_size=V, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
            num_attention_heads=h, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
            max_position_embeddings=64,
        ),
        "phi3": T.Phi3Config(
            vocab_size=V, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
            num_attention_heads=h, num_key_value_heads=h, max_position_embeddings=64, pad_token_id=0,
        ),
        "gemma": T.GemmaConfig(
            vocab_size=V, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
            num_attention_heads=h, num_key_value_heads=1, head_dim=width // h, max_position_embeddings=64,
        ),
    }  # fmt: skip


class Logits(torch.nn.Module):
    """A causal LM as token ids → logits."""

    def __init__(self, family: str, width: int):
        super().__init__()
        import transformers as T

        cfg = configs(width)[family]
        cfg._attn_implementation = "sdpa"
        self.m = T.AutoModelForCausalLM.from_config(cfg)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=idx).logits


def check(family: str, x: torch.Tensor) -> str:
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = mt.parametrize(
            Logits(family, 256), base=Logits(family, 64), delta=Logits(family, 128), parametrization="u-mup",
            example_inputs=x,
        )  # fmt: skip
    said = sorted({str(w.message) for w in caught if issubclass(w.category, MuPWarning)})
    model.eval()
    under = fp8_underflow(model, x)
    try:
        with torch.no_grad():
            gap = float((mt.export(model).eval()(x) - model(x)).abs().max() / model(x).abs().max())
        exported = f"same logits ({gap:.1e})"
    except Exception as e:  # printed, not raised: the row says what failed
        exported = f"{type(e).__name__}: {str(e)[:90]}…"
    model.train()
    opt = torch.optim.AdamW(mt.param_groups(model, lr=0.05, optimizer="adamw"))
    mon = mt.Monitor(model, opt, every=4)
    g = torch.Generator().manual_seed(1)
    for _ in range(8):
        b = torch.randint(0, V, (2, 17), generator=g)
        loss = F.cross_entropy(model(b[:, :-1]).reshape(-1, V), b[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.step(loss)
    alarms = sorted({f"{a.what} ({a.layer})" for a in mon.alarms})
    return (
        f"| {family} | {len(said)}{': ' + said[0][len('parametrize (u-mup): ') :][:110] + '…' if said else ''} | "
        f"{100 * under.fraction:.1f} % | {exported} | "
        f"{len(mon.alarms)}{': ' + alarms[0] if alarms else ''} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="qwen2,gpt_neox,opt,mixtral,phi3,gemma")
    args = ap.parse_args()
    torch.set_num_threads(1)
    x = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    print("| family | parametrize's warnings | below 2^-6 at init | mt.export | monitor alarms (8 AdamW steps) |")
    print("|---|---|---|---|---|")
    for family in args.families.split(","):
        try:
            print(check(family, x), flush=True)
        except Exception as e:  # a family that fails: its row says how
            print(f"| {family} | failed: {type(e).__name__}: {str(e)[:120]} | | | |", flush=True)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
