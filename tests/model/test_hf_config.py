"""Reading and writing Hugging Face configs without transformers gives what transformers gives.

A family reads a checkpoint's ``config.json`` itself (``HFConfig``: the file's values, then the
family's defaults) and writes one as a dict. Here every family reads the same files both ways, a
minimal one (only the sizes: every other field from the defaults), a complete one written by
transformers and a few variants, and must agree with what it reads from transformers' own config
object; and what a family writes, transformers loads back to the same architecture.
"""

from __future__ import annotations

import copy
import json

import pytest
import transformers

from realrl.api.core.hf_family import get_hf_family
from realrl.api.core.model_api import ReaLModelConfig

SIZES = {
    "llama": dict(
        hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=96, vocab_size=50
    ),
    "gpt2": dict(n_embd=64, n_head=4, n_layer=2, vocab_size=50),
}
# as many query heads as the family's default key/value heads, so that a file without
# num_key_value_heads reads as a valid model (and the default is compared)
DEFAULT_KV_HEADS = {"mistral": 8, "qwen2": 32, "qwen3": 32, "mixtral": 8, "qwen2_moe": 16, "qwen3_moe": 4}
for llama_shaped, heads in DEFAULT_KV_HEADS.items():
    SIZES[llama_shaped] = {**SIZES["llama"], "num_attention_heads": heads}

VARIANTS = {
    "llama": [
        {},
        {"num_key_value_heads": 2, "rope_theta": 500000.0, "tie_word_embeddings": True},
        {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
        {
            "attention_bias": True,
            "mlp_bias": True,
            "rms_norm_eps": 1e-5,
            "bos_token_id": 7,
            "eos_token_id": [8, 9],
        },
    ],
    "mistral": [{}, {"sliding_window": None}, {"sliding_window": 16, "max_position_embeddings": 512}],
    "qwen2": [
        {},
        {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0},
        {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1},  # mixed: refused
        {"use_sliding_window": False, "sliding_window": 16},
    ],
    "qwen3": [
        {},
        {"head_dim": 32},
        {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0},
    ],
    "gpt2": [{}, {"n_inner": 128, "n_positions": 256, "activation_function": "gelu"}],
    "mixtral": [
        {},
        {
            "num_local_experts": 4,
            "num_experts_per_tok": 1,
            "sliding_window": 16,
            "router_aux_loss_coef": 0.01,
        },
        {"router_jitter_noise": 0.1},  # refused
    ],
    "qwen2_moe": [
        {},
        {"num_experts": 4, "mlp_only_layers": [1], "norm_topk_prob": True, "qkv_bias": False},
        {"num_experts": 4, "decoder_sparse_step": 2, "shared_expert_intermediate_size": 16},
        {"use_sliding_window": True, "sliding_window": 16},  # every other layer slides: refused
        {"use_sliding_window": True, "sliding_window": 16, "layer_types": ["sliding_attention"] * 2},
    ],
    "qwen3_moe": [
        {},
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 2,
            "head_dim": 32,
            "attention_bias": True,
        },
        {"use_sliding_window": True, "sliding_window": 16, "mlp_only_layers": [0]},
    ],
}
CASES = [(mt, i) for mt, variants in VARIANTS.items() for i in range(len(variants))]


def read_both(model_type: str, raw: dict, tmp_path):
    """(what the family reads from ``raw``, what it reads from transformers' config of the same
    file); an exception stands for its type."""
    family = get_hf_family(model_type)
    folder = tmp_path / "ckpt"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))

    def read(src):
        try:
            return family.config_from_hf(src)
        except ValueError as e:
            return type(e)

    return read(raw), read(transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True))


@pytest.mark.parametrize("model_type,variant", CASES)
def test_a_minimal_config_reads_as_transformers_reads_it(model_type, variant, tmp_path):
    raw = {"model_type": model_type, **SIZES[model_type], **VARIANTS[model_type][variant]}
    mine, theirs = read_both(model_type, raw, tmp_path)
    assert mine == theirs
    assert variant or isinstance(mine, ReaLModelConfig)  # the plain file is a model, not a refusal


@pytest.mark.parametrize("model_type,variant", CASES)
def test_a_config_transformers_wrote_reads_the_same(model_type, variant, tmp_path):
    variant_values = copy.deepcopy(VARIANTS[model_type][variant])  # transformers edits the dicts it is given
    hf = transformers.AutoConfig.for_model(model_type, **SIZES[model_type], **variant_values)
    hf.save_pretrained(str(tmp_path / "written"))
    raw = json.loads((tmp_path / "written" / "config.json").read_text())
    mine, theirs = read_both(model_type, raw, tmp_path)
    assert mine == theirs
    assert variant or isinstance(mine, ReaLModelConfig)


def test_the_reading_cannot_pass_by_chance(tmp_path):
    """A field the file sets is read from it (not from the defaults), and a missing size is an error."""
    family = get_hf_family("llama")
    raw = {"model_type": "llama", **SIZES["llama"], "rms_norm_eps": 1e-3}
    assert family.config_from_hf(raw).layer_norm_epsilon == 1e-3
    with pytest.raises(AttributeError, match="num_hidden_layers"):
        family.config_from_hf({"model_type": "llama", "num_attention_heads": 4})


@pytest.mark.parametrize("model_type", sorted(VARIANTS))
def test_what_a_family_writes_transformers_loads_as_the_same_architecture(model_type, tmp_path):
    family = get_hf_family(model_type)
    for variant in VARIANTS[model_type]:
        try:
            cfg = family.config_from_hf({"model_type": model_type, **SIZES[model_type], **variant})
        except ValueError:  # an architecture realrl refuses (the mixed sliding layout)
            continue
        assert isinstance(cfg, ReaLModelConfig)
        written = family.config_to_hf(cfg)
        assert written["model_type"] == model_type and written["architectures"]
        (tmp_path / "config.json").write_text(json.dumps(written))
        loaded = transformers.AutoConfig.from_pretrained(str(tmp_path), local_files_only=True)
        assert loaded.model_type == model_type
        assert family.config_from_hf(loaded) == family.config_from_hf(written) == cfg
