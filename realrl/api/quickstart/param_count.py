"""Parameters of a ReaLModel on one device, dense or Mixture of Experts: what it holds and what one
token runs through.

Pure arithmetic on a ``ReaLModelConfig`` (nothing is built). The memory plan multiplies the held
count by bytes; the paper costs take FLOPs from the active one ("Switch Transformers: Scaling to
Trillion Parameter Models with Simple and Efficient Sparsity", Fedus et al.: a sparse model's
compute per token follows the experts a token visits, its memory every expert).

Per block, as ``impl/model/parallel/tensor_parallel.py`` splits the dense model: q, k, v, gate and
up column-wise, o and down row-wise, norms whole. A sparse block (``cfg.is_moe_layer``) holds a
router (``n_experts x hidden``, no bias), ``n_experts`` gated experts of ``moe_intermediate_dim``
and, in Qwen2-MoE, a shared expert of ``shared_expert_intermediate_dim`` with a one-output gate.
Under tensor parallelism every expert and the shared expert are split like the dense MLP, the
router and the shared expert's gate stay whole on every rank (like the norms); with expert
parallelism (``<role>.engine.expert_parallel``) the tp ranks of a layout instead hold
``n_experts / tp`` whole experts each. A token's active parameters in a sparse block are the
attention, the norms, the router, ``n_experts_per_tok`` experts and the shared expert; under
expert parallelism its k experts sit on various ranks, so a rank's "active" is the mean over the
ranks (k / tp experts).
"""

from __future__ import annotations

import dataclasses
import math

from realrl.api.core.model_api import ReaLModelConfig


@dataclasses.dataclass(frozen=True)
class ParamCount:
    """Parameters on one device of a layout (every rank holds the same)."""

    total: int  # held: its stage's blocks (every expert they hold), embedding, final norm, head
    active: int  # of those, what one token computes with (equal to total for a dense model)
    layer: int  # the largest block: what FSDP gathers at a time
    root: int  # embedding (and learned positions), final norm, head: the blocks' outside


def _split(n: int, tp: int, what: str) -> int:
    if n % tp:
        raise ValueError(f"tensor-parallel size m{tp} does not divide the model's {n} {what}")
    return n // tp


def _attention_and_norms(cfg: ReaLModelConfig, tp: int) -> int:
    h, d = cfg.hidden_dim, cfg.head_dim
    q, kv = cfg.n_q_heads * d // tp, cfg.n_kv_heads * d // tp
    attn = h * (q + 2 * kv) + q * h + (q + 2 * kv) * cfg.use_attention_bias + h * cfg.use_attn_proj_bias
    return 2 * norm_params(cfg) + attn + 2 * d * cfg.qk_layernorm


def norm_params(cfg: ReaLModelConfig) -> int:
    return cfg.hidden_dim * (2 if cfg.layer_norm_type == "layer" else 1)


def _dense_mlp(cfg: ReaLModelConfig, tp: int) -> int:
    h, i = cfg.hidden_dim, cfg.intermediate_dim // tp
    n_mlp = 3 if cfg.mlp_type == "gated" else 2
    return n_mlp * h * i + ((n_mlp - 1) * i + h) * cfg.use_mlp_bias


def _sparse_mlp(cfg: ReaLModelConfig, tp: int, expert_parallel: bool) -> tuple[int, int]:
    """(held, active) parameters of one sparse block's MLP on one rank."""
    h, e, k = cfg.hidden_dim, cfg.n_experts, cfg.n_experts_per_tok
    router = e * h
    if expert_parallel:
        local = _split(e, tp, "experts (n_experts) over expert-parallel ranks")
        expert = 3 * h * cfg.moe_intermediate_dim  # whole experts
        held, active = local * expert, math.ceil(k * expert / tp)
    else:
        expert = 3 * h * _split(cfg.moe_intermediate_dim, tp, "expert inner size (moe_intermediate_dim)")
        held, active = e * expert, k * expert
    shared = 0
    if cfg.shared_expert_intermediate_dim:
        inner = _split(cfg.shared_expert_intermediate_dim, tp, "shared expert inner size")
        shared = 3 * h * inner + h  # its gated MLP and its one-output gate
    return router + held + shared, router + active + shared


def block_params(
    cfg: ReaLModelConfig, idx: int, tp: int = 1, expert_parallel: bool = False
) -> tuple[int, int]:
    """(held, active) parameters of block ``idx`` on one rank."""
    base = _attention_and_norms(cfg, tp)
    if not cfg.is_moe_layer(idx):
        mlp = _dense_mlp(cfg, tp)
        return base + mlp, base + mlp
    held, active = _sparse_mlp(cfg, tp, expert_parallel)
    return base + held, base + active


def count_params(cfg: ReaLModelConfig, tp: int = 1, pp: int = 1, expert_parallel: bool = False) -> ParamCount:
    """One device's parameters under tensor / pipeline / expert parallelism (``expert_parallel``
    places whole experts on the ``tp`` ranks). Pipeline stages are ``ceil(n_layers / pp)``
    contiguous blocks; the fullest stage is counted, with the embedding and the head on it (an
    upper bound). A tied LM head is counted once; a critic's scalar head is ``hidden + 1``."""
    h = cfg.hidden_dim
    blocks = [block_params(cfg, i, tp, expert_parallel) for i in range(cfg.n_layers)]
    per_stage = max(1, math.ceil(cfg.n_layers / pp))
    stages = [blocks[s : s + per_stage] for s in range(0, cfg.n_layers, per_stage)] or [[]]
    stage = max(stages, key=lambda b: sum(held for held, _ in b))
    vocab = cfg.vocab_size // tp if cfg.vocab_size % tp == 0 else cfg.vocab_size
    embed = vocab * h + cfg.n_positions * h * cfg.abs_position_embedding
    head = h + 1 if cfg.is_critic else 0 if cfg.tied_embedding else vocab * h
    root = embed + norm_params(cfg) + head
    return ParamCount(
        total=root + sum(held for held, _ in stage),
        active=root + sum(active for _, active in stage),
        layer=max((held for held, _ in blocks), default=0),
        root=root,
    )
