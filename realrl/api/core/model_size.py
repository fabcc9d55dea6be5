"""A model's size without its weights: its architecture read from ``config=`` or a folder's
``config.json`` (``model_config``), the parameters of a ReaLModel on one device, dense or Mixture of
Experts (what it holds and what one token runs through), and the runtime's cut of its blocks into
pipeline stages (``stage_layers``). The runtime (``system/model_copies.py``,
``impl/model/parallel/pipeline.py``) and the planners (the memory plan, the plan search) all read
them here.

Pure arithmetic on a ``ReaLModelConfig`` (nothing is built, no torch). The memory plan multiplies
the held count by bytes; the paper costs take FLOPs from the active one ("Switch Transformers:
Scaling to Trillion Parameter Models with Simple and Efficient Sparsity", Fedus et al.: a sparse
model's compute per token follows the experts a token visits, its memory every expert).

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
import json
import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from realrl.api.core.layout_fit import check_tensor_parallel
from realrl.api.core.model_api import ReaLModelConfig

if TYPE_CHECKING:
    from realrl.api.core.system_api import ExperimentConfig, ModelSpec


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


def _ends(cfg: ReaLModelConfig, tp: int, pp: int) -> tuple[int, int]:
    """(first stage's extra, last stage's extra): the embedding (and learned positions) on the
    first stage; the final norm and the head on the last. A tied LM head shares the embedding's
    weight on one stage; over several stages the last holds its own copy."""
    h = cfg.hidden_dim
    vocab = cfg.vocab_size // tp if cfg.vocab_size % tp == 0 else cfg.vocab_size
    embed = vocab * h + cfg.n_positions * h * cfg.abs_position_embedding
    head = h + 1 if cfg.is_critic else vocab * h if (not cfg.tied_embedding or pp > 1) else 0
    return embed, norm_params(cfg) + head


def stage_layers(cfg: ReaLModelConfig, pp: int) -> list[range]:
    """The blocks of each of ``pp`` pipeline stages: contiguous, at least one each, chosen so the
    fullest stage holds as few of the whole model's parameters as possible, the embedding counted
    on the first stage and the final norm and head on the last (exact, by dynamic programming over
    the cut points). The same split whatever the tensor parallelism within the stages."""
    n = cfg.n_layers
    if not 1 <= pp <= n:
        raise ValueError(f"a pipeline of p{pp} stages needs 1 <= p <= the model's {n} layers")
    held = [block_params(cfg, i)[0] for i in range(n)]
    first, last = _ends(cfg, 1, pp)
    prefix = [0]
    for x in held:
        prefix.append(prefix[-1] + x)

    def cost(stage: int, lo: int, hi: int) -> int:
        return prefix[hi] - prefix[lo] + (first if stage == 0 else 0) + (last if stage == pp - 1 else 0)

    # best[s][i]: the smallest fullest stage when stages 0..s-1 hold blocks 0..i-1; cut: where s-1 starts
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(pp + 1)]
    cut = [[0] * (n + 1) for _ in range(pp + 1)]
    best[0][0] = 0
    for s in range(1, pp + 1):
        for i in range(s, n - (pp - s) + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], cost(s - 1, j, i))
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    bounds, i = [], n
    for s in range(pp, 0, -1):
        bounds.append(range(cut[s][i], i))
        i = cut[s][i]
    return bounds[::-1]


def count_params(
    cfg: ReaLModelConfig, tp: int = 1, pp: int = 1, expert_parallel: bool = False, stage: int | None = None
) -> ParamCount:
    """One device's parameters under tensor / pipeline / expert parallelism (``expert_parallel``
    places whole experts on the ``tp`` ranks). Pipeline stages are the runtime's split
    (``stage_layers`` of the whole model); ``stage`` is counted (default: the fullest) with what
    it holds besides its blocks (the embedding on the first, the final norm and head on the last).
    A tied LM head is counted once on one stage (the last stage of a pipeline holds its own copy);
    a critic's scalar head is ``hidden + 1``."""
    blocks = [block_params(cfg, i, tp, expert_parallel) for i in range(cfg.n_layers)]
    first, last = _ends(cfg, tp, pp)
    if cfg.n_layers == 0:
        stages, extras = [range(0)], [first + last]
    else:
        stages = stage_layers(cfg, pp)  # the split the runtime makes (parallel/pipeline.py)
        extras = [
            (first if s == 0 else 0) + (last if s == len(stages) - 1 else 0) for s in range(len(stages))
        ]
    totals = [extra + sum(blocks[i][0] for i in r) for r, extra in zip(stages, extras)]
    s = max(range(len(stages)), key=totals.__getitem__) if stage is None else stage
    return ParamCount(
        total=totals[s],
        active=extras[s] + sum(blocks[i][1] for i in stages[s]),
        layer=max((held for held, _ in blocks), default=0),
        root=extras[s],
    )


def param_counts(
    cfg: ReaLModelConfig, tp: int, pp: int = 1, expert_parallel: bool = False, stage: int | None = None
) -> tuple[int, int]:
    """(parameters per device, parameters of the largest layer) under tensor / pipeline (/ expert)
    parallelism, of pipeline stage ``stage`` (default: the fullest); ``count_params`` has the
    active count too."""
    check_tensor_parallel(cfg, tp, "tensor parallelism", expert_parallel)
    counts = count_params(cfg, tp, pp, expert_parallel, stage)
    return counts.total, counts.layer


def model_config(spec: ModelSpec, fallback: Mapping[str, Any] | None = None) -> ReaLModelConfig | None:
    """A role's architecture from ``config=`` or ``path/config.json`` (``fallback`` fields when that
    folder does not exist yet, e.g. a toy checkpoint not trained yet); None for a "null" model."""
    if spec.model.type_ == "null":
        return None
    if spec.model.type_ != "real_model":
        raise ValueError(f"cannot plan model type {spec.model.type_!r} (only 'real_model' and 'null')")
    args = spec.model.args
    cfg = args.get("config")
    if cfg is None:
        path = str(args.get("path"))
        has_file = os.path.isfile(os.path.join(path, "config.json"))
        cfg = fallback if fallback is not None and not has_file else _config_from_folder(path)
    cfg = ReaLModelConfig(**cfg) if isinstance(cfg, Mapping) else cfg
    return dataclasses.replace(cfg, is_critic=bool(args.get("is_critic", False)))


def _config_from_folder(path: str) -> ReaLModelConfig:
    """As ``hf_io.load_pretrained`` reads it (config.json only, by its family: no weights, no
    transformers)."""
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise ValueError(f"model path {path!r} has no config.json (a Hugging Face model folder is needed)")
    import realrl.api.from_hf  # noqa: F401  (registers the families)
    from realrl.api.core.hf_family import hf_family_for_model_type

    with open(file) as f:
        raw = json.load(f)
    return hf_family_for_model_type(raw.get("model_type", "")).config_from_hf(raw)


def model_configs(exp: ExperimentConfig, fallback: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every role's ``model_config``."""
    return {role: model_config(spec, fallback) for role, spec in exp.models.items()}
