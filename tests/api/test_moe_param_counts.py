"""Parameter counts of Mixture-of-Experts models: held (every expert) against active (a token's
top-k experts), by hand and against built ReaLModels; Qwen3-30B-A3B's published figures; what
the memory plan, the LoRA count and the paper costs make of them."""

from __future__ import annotations

import dataclasses
import os

import pytest

from realrl.api.core.lora import LoRAConfig, adapter_param_count
from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.core.model_size import _config_from_folder, count_params
from realrl.api.quickstart.memory_plan import _mlp_token_bytes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# hidden 8, 4 q / 2 kv heads of dim 2, vocab 32, 2 layers; 4 experts of inner size 6, top-2
MIXTRAL_LIKE = dict(
    n_layers=2,
    n_q_heads=4,
    n_kv_heads=2,
    hidden_dim=8,
    intermediate_dim=16,
    vocab_size=32,
    n_experts=4,
    n_experts_per_tok=2,
    moe_intermediate_dim=6,
    norm_topk_prob=True,
)
SHAPES = {
    "mixtral": MIXTRAL_LIKE,
    # a shared expert with its gate, a dense second block, q/k/v biases
    "qwen2_moe": {
        **MIXTRAL_LIKE,
        "shared_expert_intermediate_dim": 10,
        "mlp_only_layers": (1,),
        "use_attention_bias": True,
    },
    # q/k norms, every second block sparse
    "qwen3_moe": {**MIXTRAL_LIKE, "qk_layernorm": True, "decoder_sparse_step": 2, "n_layers": 4},
}


@pytest.mark.parametrize("kind", sorted(SHAPES))
@pytest.mark.parametrize("critic", [False, True])
def test_total_equals_the_built_models_parameters(kind, critic):
    from realrl.impl.model.nn.real_model import ReaLModel

    cfg = ReaLModelConfig(**SHAPES[kind], is_critic=critic)
    assert count_params(cfg).total == sum(p.numel() for p in ReaLModel(cfg).parameters())


def test_active_and_tensor_or_expert_parallel_counts_by_hand():
    cfg = ReaLModelConfig(**MIXTRAL_LIKE)
    # a block: norms 2*8, q/k/v 8*(8+4+4), o 8*8, router 4*8, each expert 3*8*6 = 144
    norms, attn, router, expert = 16, 128 + 64, 32, 144
    root = 32 * 8 + 8 + 32 * 8  # embedding, final norm, head
    whole = count_params(cfg)
    assert whole.total == 2 * (norms + attn + router + 4 * expert) + root == 2152
    assert whole.active == 2 * (norms + attn + router + 2 * expert) + root == 1576
    assert (whole.layer, whole.root) == (norms + attn + router + 4 * expert, root)
    # tp=2: heads and every expert's inner size halved, the router whole, vocab split
    attn2, root2 = 8 * (4 + 2 + 2) + 4 * 8, 16 * 8 + 8 + 16 * 8
    tp = count_params(cfg, tp=2)
    assert tp.total == 2 * (norms + attn2 + router + 4 * expert // 2) + root2
    assert tp.active == 2 * (norms + attn2 + router + 2 * expert // 2) + root2
    # expert parallelism: 2 whole experts per rank; a token's 2 experts are one per rank on average
    ep = count_params(cfg, tp=2, expert_parallel=True)
    assert (ep.total, ep.active) == (tp.total, tp.active)
    odd = ReaLModelConfig(**{**MIXTRAL_LIKE, "moe_intermediate_dim": 5})
    with pytest.raises(ValueError, match="does not divide the model's 5 expert inner size"):
        count_params(odd, tp=2)
    assert (
        count_params(odd, tp=2, expert_parallel=True).total
        == 2 * (norms + attn2 + router + 2 * 3 * 8 * 5) + root2
    )
    with pytest.raises(ValueError, match="3 experts"):
        count_params(ReaLModelConfig(**{**MIXTRAL_LIKE, "n_experts": 3}), tp=2, expert_parallel=True)
    # pipeline stages: one block each, the embedding on the first, the final norm and head on the
    # last (256 + 8 + 256 > 256): the last is the fullest
    block = norms + attn + router + 4 * expert
    assert count_params(cfg, pp=2).total == block + 8 + 32 * 8
    assert count_params(cfg, pp=2).root == 8 + 32 * 8


def test_qwen3_30b_a3b_matches_its_published_counts():
    """Qwen3-30B-A3B's model card: 30.5B parameters, 29.9B without the embedding and the head,
    3.3B activated. Activated by hand: per block attention 18.9M, router 0.26M, 8 experts of
    3 x 2048 x 768, plus the embedding and the head: 3.353B, which the card writes as 3.3B
    (1.6 % below: the card truncates), so that figure is held to 2 %."""
    cfg = _config_from_folder(os.path.join(REPO, "examples", "configs", "qwen3-30b-a3b"))
    c = count_params(cfg)
    h, vocab = 2048, 151936
    block = 2 * h + h * (4096 + 2 * 512) + 4096 * h + 2 * 128 + 128 * h + 8 * 3 * h * 768
    assert c.active == 48 * block + 2 * vocab * h + h == 3_353_032_704
    assert c.total == 30_532_122_624
    assert abs(c.total / 30.5e9 - 1) < 0.01
    assert abs((c.total - c.root) / 29.9e9 - 1) < 0.005
    assert abs(c.active / 3.3e9 - 1) < 0.02


def test_moe_activation_bytes_follow_the_top_k_experts():
    cfg = ReaLModelConfig(**MIXTRAL_LIKE)
    # bf16: router logits and fp32 probabilities (2 + 4) x 4; per pair the gathered row and the
    # output row (2 x 8) and gate / up / activation / product (4 x inner)
    assert _mlp_token_bytes(cfg, 0, 1, False, 2) == 24 + 2 * 2 * (16 + 24)
    assert _mlp_token_bytes(cfg, 0, 2, False, 2) == 24 + 2 * 2 * (16 + 12)  # experts split over tp
    assert _mlp_token_bytes(cfg, 0, 2, True, 2) == 24 + 2 * 1 * (16 + 24)  # half the pairs, whole
    dense = ReaLModelConfig(**{**MIXTRAL_LIKE, "n_experts": 0, "n_experts_per_tok": 0})
    assert _mlp_token_bytes(dense, 0, 1, False, 2) == 2 * 4 * 16


def test_lora_counts_every_experts_adapters():
    from realrl.impl.model.nn.lora import add_adapters
    from realrl.impl.model.nn.real_model import ReaLModel

    cfg = ReaLModelConfig(**SHAPES["qwen2_moe"])
    lora = LoRAConfig(rank=2)
    model = ReaLModel(cfg)
    add_adapters(model, lora)
    held = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert held == adapter_param_count(cfg, lora)
    assert not any("router" in n and "lora_" in n for n, _ in model.named_parameters())
    # whole experts over 2 ranks: each holds the adapters of 2 of the 4 experts
    expert = 2 * ((8 + 6) * 2 + (6 + 8))
    assert adapter_param_count(cfg, lora) - adapter_param_count(cfg, lora, expert_shards=2) == 2 * expert


def test_paper_costs_compute_with_active_and_move_the_total():
    from realrl.apps.plan_search.paper_costs import _Model

    cfg = _config_from_folder(os.path.join(REPO, "examples", "configs", "qwen3-30b-a3b"))
    c, m = count_params(cfg), _Model.of(cfg)
    assert m.params == c.total
    assert m.matmul == c.active - c.root + 151936 * 2048  # the blocks' active weights and the head
    dense = _Model.of(dataclasses.replace(cfg, n_experts=0, n_experts_per_tok=0, moe_intermediate_dim=None))
    assert dense.matmul == dense.params - 151936 * 2048 - 2048  # no embedding lookup, no final norm


def test_plan_command_reports_total_and_active(tmp_path, capsys):
    """``python -m realrl.apps.plan grpo task=sentiment_moe``: the toy MoE actor's line, replicated
    and with its experts placed whole over two ranks."""
    from realrl.apps.plan import plan
    from realrl.experiments.tasks import get_task

    cfg = ReaLModelConfig(**get_task("sentiment_moe").model_config())
    c = count_params(cfg)
    plan(["grpo", "task=sentiment_moe", f"fileroot={tmp_path}"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("actor: Mixture of Experts"))
    assert "2 sparse blocks of 4 experts (top 2)" in line and line.endswith("every expert on every rank")
    assert f"{c.total / 1e6:.2f}M parameters, {c.active / 1e6:.2f}M active per token" in line
    layouts = 'allocation_mode="actor:d1m2p1,ref:d1m2p1,*:d2m1p1"'
    plan(["grpo", "task=sentiment_moe", f"fileroot={tmp_path}", layouts, "actor.engine.expert_parallel=true"])
    out = capsys.readouterr().out.splitlines()
    assert "2 whole experts per rank (expert parallel over m2)" in next(
        x for x in out if x.startswith("actor: ")
    )
    assert "every expert split over m2 like the MLP" in next(x for x in out if x.startswith("ref: "))
    ep = count_params(cfg, 2, expert_parallel=True).total
    assert next(x for x in out if x.startswith("actor ")).split()[3] == f"{ep / 1e6:.2f}M"
    assert not os.listdir(tmp_path)  # the plan writes nothing
