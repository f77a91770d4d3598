"""The model tier: tiny configs of transformers families in their default settings (use_cache,
default attention), random weights, never from a hub. `build(name)` gives (model, input, kind)."""

from __future__ import annotations

import torch
import transformers as tf

DECODERS = ("gpt2", "llama", "opt", "bloom", "gpt_neox", "mistral", "qwen2", "phi", "gemma", "falcon", "mixtral")
VOCAB = 256

# the tiny sizes, in each family's own config names
_LM = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB)
_FFN = dict(intermediate_size=128, max_position_embeddings=256)
_GQA = dict(num_key_value_heads=2)


def families() -> dict[str, tuple[type, object, str]]:
    """name -> (model class, config, input kind)."""
    return {
        "gpt2": (tf.GPT2LMHeadModel, tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=256,
                                                   bos_token_id=0, eos_token_id=0), "text"),
        "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(**_LM, **_FFN, **_GQA), "text"),
        "opt": (tf.OPTForCausalLM, tf.OPTConfig(**_LM, ffn_dim=128, max_position_embeddings=256,
                                                word_embed_proj_dim=64), "text"),
        "bloom": (tf.BloomForCausalLM, tf.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=VOCAB), "text"),
        "gpt_neox": (tf.GPTNeoXForCausalLM, tf.GPTNeoXConfig(**_LM, **_FFN), "text"),
        "mistral": (tf.MistralForCausalLM, tf.MistralConfig(**_LM, **_FFN, **_GQA), "text"),
        "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config(**_LM, **_FFN, **_GQA), "text"),
        "phi": (tf.PhiForCausalLM, tf.PhiConfig(**_LM, **_FFN), "text"),
        "gemma": (tf.GemmaForCausalLM, tf.GemmaConfig(**_LM, **_FFN, **_GQA, head_dim=16), "text"),
        "falcon": (tf.FalconForCausalLM, tf.FalconConfig(**_LM), "text"),
        # mixture of experts: top-2 routing, each expert's tokens gathered by data-dependent indices
        "mixtral": (tf.MixtralForCausalLM, tf.MixtralConfig(**_LM, **_FFN, **_GQA, num_local_experts=4,
                                                            num_experts_per_tok=2), "text"),
        # a state-space model: its cache holds convolution and SSM states (linear-attention cache layers)
        "mamba": (tf.MambaForCausalLM, tf.MambaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                                      state_size=8), "text"),
        "bert": (tf.BertModel, tf.BertConfig(**_LM, **_FFN), "text"),
        "roberta": (tf.RobertaModel, tf.RobertaConfig(**_LM, intermediate_size=128, max_position_embeddings=130),
                    "text"),
        "distilbert": (tf.DistilBertModel, tf.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                                               vocab_size=VOCAB, max_position_embeddings=256), "text"),
        "albert": (tf.AlbertModel, tf.AlbertConfig(**_LM, **_FFN, embedding_size=32), "text"),
        "electra": (tf.ElectraModel, tf.ElectraConfig(**_LM, **_FFN, embedding_size=32), "text"),
        "t5_encoder": (tf.T5EncoderModel, tf.T5Config(d_model=64, num_layers=2, num_heads=4, d_kv=16, d_ff=128,
                                                      vocab_size=VOCAB), "text"),
        "vit": (tf.ViTModel, tf.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=128, image_size=32, patch_size=8), "image"),
        "resnet": (tf.ResNetModel, tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                                   layer_type="basic"), "image"),
        "convnext": (tf.ConvNextModel, tf.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2,
                                                         num_channels=3), "image"),
    }


def build(name: str, batch: int = 2, seq: int = 12):
    """The model in eval mode (weights from seed 0) and a seeded input."""
    cls, cfg, kind = families()[name]
    torch.manual_seed(0)
    model = cls(cfg).eval()
    g = torch.Generator().manual_seed(0)
    if kind == "text":
        x = torch.randint(0, VOCAB, (batch, seq), generator=g)
    else:
        x = torch.randn(batch, 3, 32, 32, generator=g)
    return model, x, kind
