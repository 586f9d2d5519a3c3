"""The zoo: tiny, offline, deterministic factories for real architectures.

Every entry builds a randomly initialised model from a config (no downloads, no hub) with
``make(width, seed=0)``. *Width* is the model's hidden size (d_model / embed_dim; for the CNNs the
channels of the last stage, earlier stages have width/2); the number of attention heads is FIXED
(``HEADS``), so the head dim grows with width (the hard case for µP's attention scale);
intermediate sizes are proportional to width; vocab, classes, image size, sequence length and
depth are finite. Dropout is 0 everywhere. Every factory works at widths 32, 64, 128, 256 (head
dim ≥ 8). A forward+backward at width 256 takes 10-40 ms on one free CPU thread (T5 and Mamba are
the slowest); with torch.set_num_threads(2) while another process holds a core, OpenMP contention
makes it 0.7-2.7 s.

    from zoo import ZOO
    e = ZOO["llama"]
    model = e.make(256)
    inputs, targets = e.batch()          # one (inputs, targets) batch for mt.coord_check(data=...)
    out = model(**inputs) if isinstance(inputs, dict) else model(inputs)

``inputs`` is a dict of keyword arguments for the Hugging Face models (they carry ``labels``, so the
model's own ``.loss`` is the loss) and for nanoGPT (``idx``/``targets``: its forward returns
``(logits, loss)``); a tensor of images for timm. ``targets`` is always a tensor (token ids or class
ids), so a default cross-entropy works where a model has no ``.loss``.

timm needs ``torchvision`` at import (``timm.layers.create_norm`` imports
``torchvision.ops.misc.FrozenBatchNorm2d``; ``timm.data`` imports ``torchvision.transforms`` and
``torchvision.datasets``). PyPI's torchvision is a CUDA build: its ``_C.so`` needs
``libtorch_cuda.so`` and does not load beside torch ``+cpu``, and then ``import torchvision`` dies in
``torchvision/_meta_registrations.py`` (``RuntimeError: operator torchvision::nms does not exist``).
Installed into the venv's site-packages that breaks *every* ``transformers`` model import (they
probe torchvision). So torchvision's pure-Python code is installed into a separate directory
(``pip install --no-deps --target .venv/torchvision-pyonly torchvision==0.28.0``), added to
``sys.path`` only when a timm model is built, after defining the schemas of the two custom ops that
torchvision registers fake kernels for at import (``nms``, ``qnms``; their C kernels stay absent).
Set ``ZOO_TORCHVISION_DIR`` to use another directory.

An entry is *available* where its package is installed (``importlib.util.find_spec``); only an absent
package skips its tests. An installed timm that fails to import raises from ``make``, naming the cause,
so a broken shim fails the zoo tests instead of skipping them. CI (``CI`` set) requires every entry:
``tests/core/test_zoo_collected.py``.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 128
SEQ = 16
BATCH = 4
HEADS = 4  # fixed across widths: head dim = width / 4
KV_HEADS = 2  # grouped-query attention where the architecture has it
LAYERS = 2
IMAGE = 16  # 16x16 RGB images
PATCH = 4  # 16 patches (+ cls token)
CLASSES = 10
WIDTHS = (32, 64, 128, 256)


# ---------------------------------------------------------------------------------------------
# inputs


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tokens(seed: int = 0, batch: int = BATCH, seq: int = SEQ) -> torch.Tensor:
    """Random token ids in [2, VOCAB): 0 is pad/bos/eos, 1 is [MASK]."""
    return torch.randint(2, VOCAB, (batch, seq), generator=_gen(seed))


def images(seed: int = 0, batch: int = BATCH, size: int = IMAGE) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=_gen(seed))


def classes(seed: int = 0, batch: int = BATCH) -> torch.Tensor:
    return torch.randint(0, CLASSES, (batch,), generator=_gen(seed + 1))


def _causal_lm_batch(seed: int = 0):
    x = tokens(seed)
    return {"input_ids": x, "labels": x}, x


def _mlm_batch(seed: int = 0):
    x = tokens(seed)
    masked = torch.rand(x.shape, generator=_gen(seed + 1)) < 0.25
    masked[:, 0] = True  # at least one masked token per row
    inputs = x.masked_fill(masked, 1)
    labels = x.masked_fill(~masked, -100)
    return {"input_ids": inputs, "labels": labels}, labels


def _seq2seq_batch(seed: int = 0):
    x, y = tokens(seed), tokens(seed + 1)
    return {"input_ids": x, "labels": y}, y


def _image_cls_batch(seed: int = 0):
    x, y = images(seed), classes(seed)
    return {"pixel_values": x, "labels": y}, y


def _image_batch(seed: int = 0):
    return images(seed), classes(seed)


def _image32_batch(seed: int = 0):  # ConvNeXt: stem /4 and three /2 downsamples need ≥ 32 pixels
    return images(seed, size=32), classes(seed)


def _nanogpt_batch(seed: int = 0):
    x = tokens(seed, seq=SEQ + 1)
    idx, targets = x[:, :-1], x[:, 1:]
    return {"idx": idx, "targets": targets}, targets


@dataclass
class Entry:
    """One architecture: ``make(width, seed=0)``, ``batch(seed=0) -> (inputs, targets)``."""

    make: Callable[..., nn.Module]
    batch: Callable[..., tuple]
    requires: str | None = "transformers"  # the package the factory needs (None: torch only)
    family: str = "causal_lm"
    notes: str = ""

    def inputs(self, seed: int = 0) -> Any:
        return self.batch(seed)[0]

    def data(self, n: int = 2, seed: int = 0) -> list:
        """``n`` (inputs, targets) batches for ``mt.coord_check(data=...)``."""
        return [self.batch(seed + i) for i in range(n)]

    def available(self) -> bool:
        """Whether the package the factory needs is installed. Only an absent package makes an entry
        unavailable (and its tests skip): an installed one that fails to import (a broken torchvision
        shim, a missing dependency) raises from ``make``, so its tests fail and name the cause."""
        return self.requires is None or _installed(self.requires)


def run(model: nn.Module, inputs) -> Any:
    """Call ``model`` on ``inputs`` (a dict of keyword arguments or a tensor)."""
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def loss_of(output, targets: torch.Tensor) -> torch.Tensor:
    """The model's own ``.loss`` / ``(logits, loss)``, else cross-entropy of its logits."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], torch.Tensor):
        loss = output[1]
    if loss is None:
        logits = getattr(output, "logits", output)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
    return loss


# ---------------------------------------------------------------------------------------------
# nanoGPT (the structure of Karpathy's nanoGPT model.py, written here: fused c_attn, inline SDPA)


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, bias: bool = True):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)  # q, k, v for all heads, fused
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.n_head = n_head  # deliberately no self.n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd: int, bias: bool = True):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, bias: bool = True):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, bias)
        self.ln_2 = LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """nanoGPT: tied wte/lm_head, N(0, 0.02) init, c_proj scaled by 1/sqrt(2 n_layer)."""

    def __init__(
        self,
        n_embd: int,
        n_head: int = HEADS,
        n_layer: int = LAYERS,
        vocab_size: int = VOCAB,
        block_size: int = SEQ,
        bias: bool = True,
    ):
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab_size, n_embd),
                wpe=nn.Embedding(block_size, n_embd),
                h=nn.ModuleList([Block(n_embd, n_head, bias) for _ in range(n_layer)]),
                ln_f=LayerNorm(n_embd, bias=bias),
            )
        )
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        _b, t = idx.size()
        assert t <= self.block_size
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # inference: only the last position
            loss = None
        return logits, loss


def nanogpt(width: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return GPT(width)


# ---------------------------------------------------------------------------------------------
# Hugging Face transformers


def _tf():
    import transformers

    return transformers


_TOKENS = dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)


def gpt2(width: int, seed: int = 0) -> nn.Module:
    tf = _tf()
    torch.manual_seed(seed)
    cfg = tf.GPT2Config(
        n_embd=width,
        n_head=HEADS,
        n_layer=LAYERS,
        n_inner=4 * width,
        vocab_size=VOCAB,
        n_positions=SEQ,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **_TOKENS,
    )
    return tf.GPT2LMHeadModel(cfg)


def llama(width: int, seed: int = 0) -> nn.Module:
    """Llama with GQA (4 query heads, 2 kv heads), untied embeddings, RMSNorm, SwiGLU."""
    tf = _tf()
    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        tie_word_embeddings=False,
        **_TOKENS,
    )
    return tf.LlamaForCausalLM(cfg)


def qwen2(width: int, seed: int = 0) -> nn.Module:
    """Qwen2: GQA, q/k/v biases, tied embeddings (as Qwen2-0.5B/1.5B)."""
    tf = _tf()
    torch.manual_seed(seed)
    cfg = tf.Qwen2Config(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        tie_word_embeddings=True,
        **_TOKENS,
    )
    return tf.Qwen2ForCausalLM(cfg)


def mistral(width: int, seed: int = 0) -> nn.Module:
    """Mistral: GQA, sliding window 8 (< SEQ, so the window is active), untied."""
    tf = _tf()
    torch.manual_seed(seed)
    cfg = tf.MistralConfig(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        sliding_window=SEQ // 2,
        tie_word_embeddings=False,
        **_TOKENS,
    )
    return tf.MistralForCausalLM(cfg)


def gpt_neox(width: int, seed: int = 0) -> nn.Module:
    """GPT-NeoX: fused query_key_value (interleaved per head), partial rotary, parallel residual."""
    tf = _tf()
    torch.manual_seed(seed)
    cfg = tf.GPTNeoXConfig(
        hidden_size=width,
        intermediate_size=4 * width,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tie_word_embeddings=False,
        **_TOKENS,
    )
    return tf.GPTNeoXForCausalLM(cfg)


def bert(width: int, seed: int = 0) -> nn.Module:
    """BertForMaskedLM: post-LN encoder, MLM head tied to the word embeddings."""
    tf = _tf()
    torch.manual_seed(seed)
    cfg = tf.BertConfig(
        hidden_size=width,
        intermediate_size=4 * width,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
    )
    return tf.BertForMaskedLM(cfg)


def t5(width: int, seed: int = 0) -> nn.Module:
    """T5 (v1.0 layout): d_kv = d_model / heads, relu FFN of 4·d_model, tied embeddings (so the decoder
    output is multiplied by d_model**-0.5 before lm_head), relative position bias, attention scaling 1."""
    tf = _tf()
    torch.manual_seed(seed)
    cfg = tf.T5Config(
        d_model=width,
        d_kv=width // HEADS,
        d_ff=4 * width,
        num_heads=HEADS,
        num_layers=LAYERS,
        num_decoder_layers=LAYERS,
        vocab_size=VOCAB,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=SEQ,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=0,
    )
    return tf.T5ForConditionalGeneration(cfg)


def vit(width: int, seed: int = 0) -> nn.Module:
    """ViTForImageClassification on 16x16 images, patch 4 (16 patches + cls)."""
    tf = _tf()
    torch.manual_seed(seed)
    cfg = tf.ViTConfig(
        hidden_size=width,
        intermediate_size=4 * width,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        image_size=IMAGE,
        patch_size=PATCH,
        num_channels=3,
        num_labels=CLASSES,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return tf.ViTForImageClassification(cfg)


def mixtral(width: int, seed: int = 0) -> nn.Module:
    """Mixtral: 4 experts, top-2, fused 3-D expert weights (gate_up_proj, down_proj), GQA, untied."""
    tf = _tf()
    torch.manual_seed(seed)
    cfg = tf.MixtralConfig(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=None,
        tie_word_embeddings=False,
        **_TOKENS,
    )
    return tf.MixtralForCausalLM(cfg)


def mamba(width: int, seed: int = 0) -> nn.Module:
    """MambaForCausalLM: d_inner = 2·width, state 16, conv 4, time_step_rank 8 at every width; tied.

    The default time_step_rank "auto" (= ceil(width/16)) makes x_proj's output mix a part that grows
    with width (dt) with finite parts (B, C) in one dim; µP would need a different rule for each
    part of that one weight, so the zoo keeps the rank fixed (then x_proj is output-like and
    dt_proj input-like)."""
    tf = _tf()
    torch.manual_seed(seed)
    cfg = tf.MambaConfig(
        hidden_size=width,
        num_hidden_layers=LAYERS,
        vocab_size=VOCAB,
        state_size=16,
        expand=2,
        conv_kernel=4,
        time_step_rank=8,
        **_TOKENS,
    )
    return tf.MambaForCausalLM(cfg)


# ---------------------------------------------------------------------------------------------
# timm (see the module docstring for torchvision)

_TV_OPS = ("nms", "qnms")


def _torchvision_dir() -> str:
    return os.environ.get("ZOO_TORCHVISION_DIR", os.path.join(sys.prefix, "torchvision-pyonly"))


def _prepare_torchvision() -> None:
    """Make ``import torchvision`` work beside a CPU torch whose torchvision ``_C.so`` cannot load."""
    if "torchvision" in sys.modules:
        return
    spec = importlib.util.find_spec("torchvision")
    if spec is None and os.path.isdir(os.path.join(_torchvision_dir(), "torchvision")):
        sys.path.append(_torchvision_dir())
        importlib.invalidate_caches()
        spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return
    folder = os.path.dirname(spec.origin)
    so = [f for f in os.listdir(folder) if f.startswith("_C") and f.endswith(".so")]
    if so:
        try:
            torch.ops.load_library(os.path.join(folder, so[0]))
            return  # a working torchvision: its ops are registered
        except OSError:
            pass
    for op in _TV_OPS:
        try:
            getattr(torch.ops.torchvision, op)
        except (AttributeError, RuntimeError):
            torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _timm():
    """``import timm`` after the torchvision shim. timm is installed here (``Entry.available``), so any
    failure is a broken install or shim, not an absent package: it raises, naming the cause and the fix."""
    try:
        _prepare_torchvision()
        import timm
    except Exception as e:
        raise RuntimeError(
            f"timm is installed but importing it failed: {type(e).__name__}: {e}. The zoo's timm models need "
            f"torchvision's pure-Python code in {_torchvision_dir()} (the test install of the Makefile: "
            "`pip install --no-deps --target .venv/torchvision-pyonly torchvision==0.28.0`; or set "
            "ZOO_TORCHVISION_DIR) or a torchvision that loads beside this torch; if that is in place, the shim "
            "in tests/zoo.py (_prepare_torchvision) needs fixing for this torch/torchvision. Uninstall timm "
            "to skip these models instead."
        ) from e
    return timm


def _timm_vit(width: int, seed: int, fused: bool) -> nn.Module:
    timm = _timm()
    torch.manual_seed(seed)
    m = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=IMAGE,
        patch_size=PATCH,
        embed_dim=width,
        depth=LAYERS,
        num_heads=HEADS,
        mlp_ratio=4.0,
        num_classes=CLASSES,
        init_values=0.1,
    )  # LayerScale (ls1.gamma, ls2.gamma), as DeiT-III / CaiT
    for mod in m.modules():
        if hasattr(mod, "fused_attn"):
            mod.fused_attn = fused  # True: F.scaled_dot_product_attention; False: q * self.scale @ k^T
    return m


def timm_vit(width: int, seed: int = 0) -> nn.Module:
    """timm VisionTransformer, fused attention (F.scaled_dot_product_attention without scale=)."""
    return _timm_vit(width, seed, fused=True)


def timm_vit_unfused(width: int, seed: int = 0) -> nn.Module:
    """timm VisionTransformer, attn.fused_attn = False: ``q = q * self.scale; attn = q @ k.transpose(-2, -1)``."""
    return _timm_vit(width, seed, fused=False)


def timm_resnet(width: int, seed: int = 0) -> nn.Module:
    """timm ResNet-D (resnet18d: deep 3-conv stem, avg-pool downsample; BasicBlock, BatchNorm, zero-init
    last BN of each block), 4 stages of 1 block (its forward needs layer1..layer4), channels (width/2,
    width/2, width, width), stem width/4 → width/2. (The plain stem of resnet18 is a fixed 64 channels:
    a finite dim, and layer1 then has a downsample only where channels[0] != 64.)"""
    timm = _timm()
    torch.manual_seed(seed)
    return timm.create_model(
        "resnet18d",
        pretrained=False,
        layers=(1, 1, 1, 1),
        channels=(width // 2, width // 2, width, width),
        stem_width=width // 4,
        num_classes=CLASSES,
    )


def timm_convnext(width: int, seed: int = 0) -> nn.Module:
    """timm ConvNeXt (convnext_tiny layout: channels-last LayerNorm + Linear MLP, LayerScale gamma
    1e-6): 4 stages of 1 block (timm hard-codes 4), dims (width/2, width/2, width, width); 32x32 images."""
    timm = _timm()
    torch.manual_seed(seed)
    return timm.create_model(
        "convnext_tiny",
        pretrained=False,
        depths=(1, 1, 1, 1),
        dims=(width // 2, width // 2, width, width),
        num_classes=CLASSES,
    )


# ---------------------------------------------------------------------------------------------

ZOO: dict[str, Entry] = {
    "nanogpt": Entry(nanogpt, _nanogpt_batch, requires=None, notes="tied wte/lm_head; F.sdpa inline, no n_embd"),
    "gpt2": Entry(gpt2, _causal_lm_batch, notes="Conv1D (in, out) weights; tied"),
    "llama": Entry(llama, _causal_lm_batch, notes="GQA 4/2; untied"),
    "qwen2": Entry(qwen2, _causal_lm_batch, notes="GQA 4/2; qkv bias; tied"),
    "mistral": Entry(mistral, _causal_lm_batch, notes="GQA 4/2; sliding window 8; untied"),
    "gpt_neox": Entry(gpt_neox, _causal_lm_batch, notes="fused interleaved qkv; rotary 25%; untied"),
    "bert": Entry(bert, _mlm_batch, family="masked_lm", notes="post-LN; tied MLM decoder"),
    "t5": Entry(t5, _seq2seq_batch, family="seq2seq", notes="d_kv = width/4; scaling 1.0; tied, decoder out × d^-0.5"),
    "vit": Entry(vit, _image_cls_batch, family="image", notes="HF ViT; cls_token, position_embeddings"),
    "mixtral": Entry(mixtral, _causal_lm_batch, family="causal_lm", notes="MoE 4 experts top-2; 3-D expert tensors"),
    "mamba": Entry(mamba, _causal_lm_batch, notes="SSM; A_log, D, conv1d, x_proj, dt_proj; tied"),
    "timm_vit": Entry(timm_vit, _image_batch, requires="timm", family="image", notes="fused attention; LayerScale"),
    "timm_vit_unfused": Entry(
        timm_vit_unfused, _image_batch, requires="timm", family="image", notes="fused_attn=False: q * self.scale"
    ),
    "timm_resnet": Entry(
        timm_resnet, _image_batch, requires="timm", family="image", notes="ResNet-D; BatchNorm; zero-init last BN"
    ),
    "timm_convnext": Entry(
        timm_convnext, _image32_batch, requires="timm", family="image", notes="LayerScale gamma; dwconv"
    ),
}

HF = [n for n, e in ZOO.items() if e.requires == "transformers"]
TIMM = [n for n, e in ZOO.items() if e.requires == "timm"]


def _installed(package: str) -> bool:
    """Whether ``package`` is installed (found without importing it)."""
    return importlib.util.find_spec(package) is not None


def available() -> list[str]:
    """Names of the entries whose package is installed (importing it may still fail: that raises)."""
    return [n for n, e in ZOO.items() if e.available()]


def missing() -> dict[str, str]:
    """{entry name: the package it needs} for the entries whose package is not installed."""
    return {n: e.requires for n, e in ZOO.items() if e.requires is not None and not e.available()}


def params() -> list:
    """Every entry as a ``pytest.param`` for ``@pytest.mark.parametrize("name", params())``: an entry
    whose package is not installed is collected and skipped (a visible skip, not a dropped test)."""
    import pytest

    return [
        pytest.param(
            n,
            id=n,
            marks=pytest.mark.skipif(not e.available(), reason=f"{e.requires} is not installed"),
        )
        for n, e in ZOO.items()
    ]


def uncollected(items) -> dict[str, list[str]]:
    """{test function: the zoo entries it did not collect} for every test function that is
    parametrized over zoo entries by an argument ``name`` (a module that imports ``ZOO``): each such
    function must collect every entry (an uninstalled one as a skip). ``items`` are pytest items,
    before ``-m``/``-k`` deselection (tests/conftest.py records this at collection)."""
    seen: dict[str, set[str]] = {}
    for item in items:
        module = getattr(item, "module", None)
        callspec = getattr(item, "callspec", None)
        if getattr(module, "ZOO", None) is not ZOO or callspec is None:
            continue
        name = callspec.params.get("name")
        if isinstance(name, str) and name in ZOO:
            seen.setdefault(item.nodeid.split("[")[0], set()).add(name)
    return {fn: [n for n in ZOO if n not in names] for fn, names in seen.items() if set(ZOO) - names}


if __name__ == "__main__":  # smoke test: shapes, determinism and time of every entry at every width
    import time

    torch.set_num_threads(2)
    for name in available():
        e = ZOO[name]
        for w in WIDTHS:
            m = e.make(w)
            inputs, targets = e.batch()
            loss_of(run(m, inputs), targets).backward()  # warm-up
            t = time.perf_counter()
            loss = loss_of(run(m, inputs), targets)
            loss.backward()
            dt = time.perf_counter() - t
            n = sum(p.numel() for p in m.parameters())
            print(f"{name:18s} w={w:4d} params={n:9d} loss={loss.item():.4f} fwd+bwd={dt * 1000:6.1f} ms")
        a, b = e.make(64, seed=3), e.make(64, seed=3)
        assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values())), name
