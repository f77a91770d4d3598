"""The benchmark workloads, defined once (shared/ANCHORS.md gives the configurations).

Three kinds:
* inference: transformers GPT2Model / BertModel / LlamaModel built from their configs with
  random weights (`torch.manual_seed(0)`, `AutoModel.from_config`), float32, eval mode, never
  loaded from a hub; input ids from a seeded generator. `-tiny` variants for tests.
* training: the nanoGPT-style GPT of `nanogpt.py` (gpt-42m, gpt-124m, gpt-tiny); batches of
  random token ids from a seeded generator, targets = the ids shifted by one.
* matmul: square sizes 1024..8192 (capped by `max_size`) and the GPT-42M training shapes
  (forward GEMMs of one block and the LM head, plus the LM head's and MLP's backward GEMMs)
  for a given number of tokens.
* generate: GPT2LMHeadModel (124M) and the Llama-style model as LlamaForCausalLM, in their
  default configs (KV cache on), greedy `model.generate` from a seeded prompt.

Invariant: every function here is deterministic: the same name, shape and seed give
bit-identical weights and inputs in every process, so runners in different processes are
compared on the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KINDS = ("inference", "training", "matmul", "generate")


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str
    description: str
    family: str  # gpt2 / bert / llama / gpt / matmul


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("gpt2", "inference", "GPT2Model from GPT2Config(use_cache=False), 124M", "gpt2"),
    Workload("bert", "inference", "BertModel from BertConfig(), base, 110M", "bert"),
    Workload("llama", "inference", "LlamaModel, 768 hidden, 12 layers, 12 heads, 4 KV heads, SwiGLU 2048, vocab 32000",
             "llama"),
    Workload("gpt2-tiny", "inference", "GPT2Model, 2 layers, 64 wide, vocab 128 (tests)", "gpt2"),
    Workload("bert-tiny", "inference", "BertModel, 2 layers, 64 wide, vocab 128 (tests)", "bert"),
    Workload("llama-tiny", "inference", "LlamaModel, 2 layers, 64 wide, 4 heads, 2 KV heads, vocab 128 (tests)",
             "llama"),
    Workload("gpt-42m", "training", "nanoGPT-style GPT: 8 layers, 512 wide, 8 heads, vocab 32000 (42.1M)", "gpt"),
    Workload("gpt-124m", "training", "nanoGPT-style GPT: 12 layers, 768 wide, 12 heads, vocab 50304 (124.5M)", "gpt"),
    Workload("gpt-tiny", "training", "nanoGPT-style GPT: 2 layers, 128 wide, 4 heads, vocab 512 (tests)", "gpt"),
    Workload("matmul", "matmul", "square 1024..8192 (capped) and the GPT-42M training GEMMs", "matmul"),
    Workload("gpt2-generate", "generate", "GPT2LMHeadModel 124M, default config (KV cache), greedy generate",
             "gpt2"),
    Workload("llama-generate", "generate", "the llama workload as LlamaForCausalLM, default config, greedy generate",
             "llama"),
    Workload("gpt2-generate-tiny", "generate", "GPT2LMHeadModel, 2 layers, 64 wide (tests)", "gpt2"),
    Workload("llama-generate-tiny", "generate", "LlamaForCausalLM, 2 layers, 64 wide (tests)", "llama"),
    Workload("matmul-tiny", "matmul", "square 64, 96 and the gpt-tiny training GEMMs (tests)", "matmul"),
]}


def get(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


def default_shapes(w: Workload, device: str) -> tuple[list[int], int]:
    """(batches, seq) used when the command line does not give them."""
    tiny = w.name.endswith("-tiny")
    if w.kind == "inference":
        if tiny:
            return [1], 32
        if device == "cuda":
            return [16], 512 if w.family == "bert" else 1024  # BERT-base has 512 positions
        return [1], 128
    if w.kind == "generate":
        return [1], 8 if tiny else 32  # the prompt length
    if w.kind == "training":
        if tiny:
            return [2], 64
        return ([16], 1024) if device == "cuda" else ([4], 256)
    # matmul: batch x seq = the tokens of the training shapes
    if tiny:
        return [2], 32
    return ([16], 1024) if device == "cuda" else ([4], 256)


def default_dtype(device: str) -> str:
    return "bfloat16" if device == "cuda" else "float32"


# ---------------------------------------------------------------- inference models


def transformers_config(name: str):
    import transformers as tf

    if name == "gpt2":
        return tf.GPT2Config(use_cache=False)
    if name == "bert":
        return tf.BertConfig()
    if name == "llama":
        return tf.LlamaConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                              intermediate_size=2048, vocab_size=32000, use_cache=False)
    if name == "gpt2-tiny":
        return tf.GPT2Config(use_cache=False, n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=128,
                             bos_token_id=0, eos_token_id=0)
    if name == "bert-tiny":
        return tf.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                             vocab_size=128, max_position_embeddings=128)
    if name == "llama-tiny":
        return tf.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              intermediate_size=128, vocab_size=128, max_position_embeddings=128, use_cache=False)
    raise ValueError(f"{name!r} is not an inference workload")


def build_inference_model(name: str, seed: int = 0):
    """The model in float32 eval mode, random weights from `torch.manual_seed(seed)`."""
    import torch
    from transformers import AutoModel

    cfg = transformers_config(name)
    torch.manual_seed(seed)
    model = AutoModel.from_config(cfg)
    return model.float().eval(), cfg.vocab_size


def default_new_tokens(name: str) -> int:
    return 16 if name.endswith("-tiny") else 128


def build_generation_model(name: str, seed: int = 0):
    """A causal LM in its default config (use_cache, default attention), float32 eval mode,
    random weights from `torch.manual_seed(seed)`; returns (model, vocab)."""
    import torch
    import transformers as tf

    base = name.removesuffix("-tiny").removesuffix("-generate")
    cfg = transformers_config(f"{base}-tiny" if name.endswith("-tiny") else base)
    cfg.use_cache = True
    if base == "gpt2":
        cfg.n_positions = max(cfg.n_positions, 1024) if not name.endswith("-tiny") else 256
        cls = tf.GPT2LMHeadModel
    else:
        cfg.max_position_embeddings = 2048 if not name.endswith("-tiny") else 256
        cls = tf.LlamaForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg)
    return model.float().eval(), cfg.vocab_size


def input_ids(vocab: int, batch: int, seq: int, device: str = "cpu", seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g, dtype=torch.long).to(device)


# ---------------------------------------------------------------- training


def build_training_model(name: str, device: str = "cpu", seed: int = 0):
    from .nanogpt import build_gpt

    model = build_gpt(name, seed=seed).to(device)
    model.train()
    return model


def training_batches(vocab: int, batch: int, seq: int, device: str = "cpu", count: int = 4, seed: int = 0):
    """`count` (ids, targets) pairs; targets are the next tokens of the same random stream."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g, dtype=torch.long)
        out.append((tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)))
    return out


# ---------------------------------------------------------------- matmul sweep


@dataclass(frozen=True)
class MatmulShape:
    label: str
    m: int
    k: int
    n: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n


SQUARE_SIZES = (1024, 2048, 4096, 8192)


def matmul_shapes(name: str, tokens: int, max_size: int) -> list[MatmulShape]:
    """Square sizes up to `max_size`, then the training GEMMs of gpt-42m (gpt-tiny for -tiny)."""
    from .nanogpt import CONFIGS

    if name == "matmul-tiny":
        squares, cfg = (64, 96), CONFIGS["gpt-tiny"]
    else:
        squares, cfg = tuple(s for s in SQUARE_SIZES if s <= max_size), CONFIGS["gpt-42m"]
    shapes = [MatmulShape(f"square {s}", s, s, s) for s in squares]
    d, v, m = cfg.n_embd, cfg.vocab_size, tokens
    shapes += [
        MatmulShape("qkv fwd", m, d, 3 * d),
        MatmulShape("attn proj fwd", m, d, d),
        MatmulShape("mlp fc fwd", m, d, 4 * d),
        MatmulShape("mlp proj fwd", m, 4 * d, d),
        MatmulShape("lm head fwd", m, d, v),
        MatmulShape("lm head dX", m, v, d),
        MatmulShape("lm head dW", v, m, d),
        MatmulShape("mlp fc dW", 4 * d, m, d),
    ]
    return shapes


def matmul_operands(shape: MatmulShape, dtype: Any, device: str, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    a = torch.randn(shape.m, shape.k, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(shape.k, shape.n, generator=g).to(device=device, dtype=dtype)
    return a, b
