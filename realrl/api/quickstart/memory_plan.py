"""A per-device memory plan of an experiment: does this layout fit on these GPUs?

Pure arithmetic on an ``ExperimentConfig`` and each role's ``ReaLModelConfig`` (nothing is built,
no torch.distributed). What is counted and how is in ``docs/memory_plan.md``; in short:

- weights: fp32 master weights in the train engine, the engine dtype in the inference engine
  (``auto`` = bf16: the plan is for CUDA devices); gradients fp32; AdamW 2 x fp32 per parameter.
- tp splits attention heads, the MLP and (when divisible) embedding / LM head; norms, row-parallel
  biases and the critic head are replicated. pp > 1: one row per stage (``role/s<k>``), on that
  stage's workers, with its blocks (the runtime's balanced split), the embedding on the first and
  the norm and head on the last; training keeps up to ``p - k`` micro-batches' activations on
  stage k (1F1B), generation every micro-batch's KV cache at once (they take turns).
- Mixture of Experts (``api/core/model_size.py``): every expert is held (split by tp like the MLP, or
  placed whole with ``engine.expert_parallel``); activations follow a token's top-k experts.
- ``engine.fsdp`` shards weights, gradients and optimizer state over dp; a call gathers one block
  and the root unit (embedding, final norm, head), a generate call every unit (``parallel/fsdp.py``),
  in the engine's dtype (a bf16/fp16 train engine's fp32 shards too).
- LoRA (``<role>.lora.rank`` > 0): the adapters' fp32 weights beside the base, which a trained
  model keeps in the engine's dtype (fp32 under FSDP); gradients and optimizer state for the
  adapters (and a critic's head) only.
- Resident between calls: weights + optimizer state (offloaded roles: nothing). Only during a
  call: gradients (set to None after each step), the KV cache, activations (an estimate) and the
  weights of an offloaded role.
- A call placed outside its model's home runs on a copy (``role@<placement>`` in the tables): weights
  in the engine's dtype split by the call's layout, no optimizer, on the call's workers; present
  only during its calls unless ``keep_gen_copy`` keeps it resident. Filling a copy
  (``realloc``) holds the send and receive buffers of the move on top of the copy's weights
  (``api/core/comm_memory.py``: the reallocation plan's rule on the layouts).
- NCCL: every process group a worker joins keeps a communicator's buffers for the whole run.
  A worker runs one call or move at a time, so its peak is the sum of its roles' resident bytes
  and its communicators plus the largest call or move.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

from realrl.api.core.comm_memory import Holding, communicator_bytes, communicator_sizes, staging_bytes
from realrl.api.core.config import setting_holder
from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.layout import Layout, Placement
from realrl.api.core.layout_fit import check_pipeline, check_tensor_parallel
from realrl.api.core.lora import adapter_param_count, lora_of
from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.core.model_size import count_params, param_counts, stage_layers
from realrl.api.core.system_api import ExperimentConfig

GiB = 1024**3
GEN, INF, TRAIN = ModelInterfaceType.GENERATE, ModelInterfaceType.INFERENCE, ModelInterfaceType.TRAIN_STEP
_DTYPE_BYTES = {"auto": 2, "bf16": 2, "fp16": 2, "fp32": 4}  # auto: bf16 on CUDA


@dataclasses.dataclass(frozen=True)
class RoleMemory:
    """Bytes one device holds for one rank of a role (every rank of a layout holds the same)."""

    role: str
    layout: Layout
    workers: tuple[int, ...]
    engine: str  # train | inference | null
    offload: bool
    params: int  # parameters per device, after tp / pp / fsdp sharding
    weights: int
    grads: int
    optimizer: int
    kv_cache: int  # largest generate call
    fsdp_gather: int  # FSDP: the largest gathered (unsharded) weights of a call
    activations: int  # estimate, largest call
    calls: dict[str, int]  # MFC name -> bytes that exist only while that call runs

    @property
    def resident(self) -> int:
        """What stays on the device between calls (an offloaded role lives in host memory)."""
        return 0 if self.offload else self.weights + self.optimizer

    @property
    def peak(self) -> int:
        return self.resident + max(self.calls.values(), default=0)


@dataclasses.dataclass(frozen=True)
class WorkerMemory:
    worker: int
    roles: tuple[str, ...]
    resident: int  # its roles' resident bytes
    peak: int  # resident + nccl + the largest call or move
    peak_call: str  # "role/mfc" of the largest call on this worker, "role@copy/realloc" of a move
    communicators: int = 0  # process groups it joins
    nccl: int = 0  # their NCCL buffers (none when workers share GPUs over gloo)
    staging: int = 0  # send + receive buffers of its largest move (a copy's fill)


@dataclasses.dataclass(frozen=True)
class ExpertParams:
    """A Mixture-of-Experts role's whole model: what it holds against what a token runs through."""

    total: int  # every expert, router, shared expert, attention, embedding, head
    active: int  # attention, router, top-k experts, shared expert, embedding, head
    n_experts: int
    top_k: int
    sparse_blocks: int
    expert_parallel: bool  # whole experts per tp rank, else every expert split over tp
    tp: int  # the role's tensor-parallel size at home

    def describe(self, role: str) -> str:
        if self.expert_parallel and self.tp > 1:
            where = f"{self.n_experts // self.tp} whole experts per rank (expert parallel over m{self.tp})"
        elif self.tp > 1:
            where = f"every expert split over m{self.tp} like the MLP"
        else:
            where = "every expert on every rank"
        return (
            f"{role}: Mixture of Experts, {self.sparse_blocks} sparse blocks of {self.n_experts} experts "
            f"(top {self.top_k}): {_count(self.total)} parameters, {_count(self.active)} active per "
            f"token; {where}"
        )


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    roles: dict[str, RoleMemory]
    workers: list[WorkerMemory]
    shape: dict[str, int]  # n_seqs, n, prompt_len, new_tokens: what the estimates assume
    experts: dict[str, ExpertParams] = dataclasses.field(default_factory=dict)  # MoE roles only


def expert_parallel_of(econf: Mapping[str, Any]) -> bool:
    """``<role>.engine.expert_parallel`` (False where the engine has no such option)."""
    return bool(econf.get("expert_parallel"))


def batch_shape(exp: ExperimentConfig) -> dict[str, int]:
    """Batch geometry the KV cache and activation estimates assume (every sequence at full length)."""
    gen = setting_holder(
        [m.interface_impl.args for m in exp.mfcs if m.interface_type is GEN],
        "max_new_tokens",
    )
    data = exp.datasets[0].args if exp.datasets else {}
    prompt = data.get("max_prompt_len") or data.get("max_length") or 1024
    return {
        "n_seqs": exp.batch_size,
        "n": int(gen.get("n", 1)),
        "prompt_len": int(prompt),
        "new_tokens": int(gen.get("max_new_tokens", 0)),
    }


def _mlp_token_bytes(cfg: ReaLModelConfig, idx: int, tp: int, expert_parallel: bool, b: int) -> float:
    """What block ``idx``'s MLP keeps per token. Dense: gate, up, activation, product (``2i``
    for a plain MLP). Sparse (``nn/moe.py``): router logits and their fp32 softmax; per (token,
    expert) pair the gathered input row, the expert's gate / up / activation / product and its
    output row; the shared expert like a dense MLP, plus its gate and output. Expert parallelism
    gives a rank k / tp of a token's pairs at the whole expert width; tensor parallelism all k
    pairs at 1 / tp of it."""
    if not cfg.is_moe_layer(idx):
        return b * (4 if cfg.mlp_type == "gated" else 2) * cfg.intermediate_dim / tp
    h, k = cfg.hidden_dim, cfg.n_experts_per_tok
    pairs, inner = (
        (k / tp, cfg.moe_intermediate_dim) if expert_parallel else (k, cfg.moe_intermediate_dim / tp)
    )
    out = (b + 4) * cfg.n_experts + b * pairs * (2 * h + 4 * inner)
    if cfg.shared_expert_intermediate_dim:
        out += b * (4 * cfg.shared_expert_intermediate_dim / tp + h + 1)
    return out


def _layer_token_bytes(cfg: ReaLModelConfig, tp: int, expert_parallel: bool, b: int) -> list[int]:
    """Per block, what it keeps per token: the fp32 residual stream both norms read, then in the
    compute dtype the norm outputs, q/k/v, the attention output and the MLP's (above)."""
    h = cfg.hidden_dim
    q, kv = cfg.n_q_heads * cfg.head_dim // tp, cfg.n_kv_heads * cfg.head_dim // tp
    attn = 8 * h + b * (2 * h + 2 * (q + 2 * kv) + 2 * q)
    return [math.ceil(attn + _mlp_token_bytes(cfg, i, tp, expert_parallel, b)) for i in range(cfg.n_layers)]


def _call_bytes(
    mfc: MFCDef,
    cfg: ReaLModelConfig,
    layout: Layout,
    shape: dict[str, int],
    engine: str,
    econf: dict,
    stage: int = 0,
) -> tuple[int, int]:
    """(KV cache, activation estimate) of one call on one device of pipeline stage ``stage``; see
    docs/memory_plan.md."""
    b = _DTYPE_BYTES[econf.get("dtype", "auto")]
    h, tp, pp, ep = cfg.hidden_dim, layout.tp, layout.pp, expert_parallel_of(econf)
    per_layer = _layer_token_bytes(cfg, tp, ep, b)
    blocks = stage_layers(cfg, pp)[stage] if cfg.n_layers else range(0)
    layers = len(blocks)
    held = sum(per_layer[i] for i in blocks)  # what this stage's blocks keep per token
    layer_tok = max(per_layer, default=0)
    last = stage == pp - 1
    logits_tok = 0 if cfg.is_critic or not last else 8 * cfg.vocab_size  # fp32 logits, log-softmax
    params, _ = param_counts(cfg, tp, pp, ep, stage)
    n_mbs = mfc.mb_spec.n_mbs
    prompts = math.ceil(math.ceil(shape["n_seqs"] / layout.dp) / n_mbs)
    seqs, seqlen = prompts * shape["n"], shape["prompt_len"] + shape["new_tokens"]
    # autocast's cached low-precision weights; FSDP gathers a trained role's weights in b already
    fsdp = bool(econf.get("fsdp")) and layout.dp > 1
    copy = b * params if engine == "train" and b < 4 and not fsdp else 0
    if mfc.interface_type is GEN:
        live = n_mbs if pp > 1 else 1  # pipelined, the micro-batches take turns: every cache lives
        kv_cache = live * 2 * layers * (cfg.n_kv_heads // tp) * cfg.head_dim * b * seqs * seqlen
        return kv_cache, prompts * shape["prompt_len"] * layer_tok + seqs * logits_tok + b * params
    if mfc.interface_type is TRAIN:
        minibatches = setting_holder(mfc.interface_impl.args, "ppo_n_minibatches").get("ppo_n_minibatches", 1)
        seqs = math.ceil(seqs / int(minibatches))
    tokens = seqs * seqlen
    if mfc.mb_spec.max_tokens_per_mb:
        tokens = min(tokens, max(mfc.mb_spec.max_tokens_per_mb, seqlen))
    if mfc.interface_type is not TRAIN:
        return 0, tokens * (layer_tok + logits_tok) + copy
    stash = 4 * h * layers + layer_tok if econf.get("gradient_checkpointing") else held
    in_flight = min(pp - stage, n_mbs)  # 1F1B: stage k holds up to p - k micro-batches' activations
    return 0, tokens * (in_flight * stash + logits_tok) + copy


def role_memories(
    exp: ExperimentConfig, role: str, cfg: ReaLModelConfig | None, copy: Placement | None = None
) -> list[RoleMemory]:
    """``role_memory`` of every pipeline stage of ``role`` at home (or of its ``copy``): one for a
    layout without pipeline stages."""
    layout = (copy or exp.placement(role)).layout
    if layout.pp == 1 or cfg is None:
        return [role_memory(exp, role, cfg, copy)]
    return [role_memory(exp, role, cfg, copy, stage) for stage in range(layout.pp)]


def role_memory(
    exp: ExperimentConfig,
    role: str,
    cfg: ReaLModelConfig | None,
    copy: Placement | None = None,
    stage: int | None = None,
) -> RoleMemory:
    """One device's bytes for ``role`` at its home, or for its ``copy`` in another placement (an
    inference-only copy in the engine's dtype, its weights resident only when the role keeps it);
    ``stage``: of that pipeline stage's devices (named ``role/s<stage>``; None: a layout without
    stages). ValueError naming the role and layout if it cannot be split."""
    spec = exp.models[role]
    placement = copy or exp.placement(role)
    layout, workers, name = (
        placement.layout,
        tuple(placement.workers),
        role if copy is None else f"{role}@{copy}",
    )
    if stage is not None:
        workers = tuple(w for r, w in enumerate(placement.workers) if layout.coords(r)[0] == stage)
        name = f"{name}/s{stage}"
    engine, econf = spec.backend.type_, dict(spec.backend.args.get("engine") or {})
    if cfg is None or engine == "null":
        return RoleMemory(name, layout, workers, "null", spec.offload, *[0] * 7, {})
    if spec.offload and engine == "train":
        raise ValueError(f"model {role!r} is trained and offloaded: only frozen models may be offloaded")
    if copy is not None:
        engine, econf = "inference", {**econf, "fsdp": False}
    ep = expert_parallel_of(econf)
    try:
        check_tensor_parallel(cfg, layout.tp, "tensor parallelism", ep)
        check_pipeline(cfg, layout.pp, "pipeline parallelism")
        counts = count_params(cfg, layout.tp, layout.pp, ep, stage)
    except ValueError as e:
        raise ValueError(f"model {role!r} cannot use layout {layout}: {e}") from None
    params, layer = counts.total, counts.layer
    fsdp = bool(econf.get("fsdp")) and layout.dp > 1
    whole, params = params, math.ceil(params / layout.dp) if fsdp else params
    wbytes = 4 if engine == "train" else _DTYPE_BYTES[econf.get("dtype", "auto")]
    train = engine == "train"
    lora = lora_of(spec.model.args)
    if lora is not None:  # the adapters ride beside the base; only they (and a critic's head) train
        adapters = adapter_param_count(cfg, lora, expert_shards=layout.tp if ep else 1)
        adapters = math.ceil(adapters / layout.dp) if fsdp else adapters
        trained = adapters + (cfg.hidden_dim + 1) * cfg.is_critic
        # a trained LoRA model keeps its frozen base in the engine's dtype (not under FSDP)
        base_bytes = _DTYPE_BYTES[econf.get("dtype", "auto")] if train and not fsdp else wbytes
        weights, grads, optimizer = (
            base_bytes * params + 4 * adapters,
            4 * trained * train,
            8 * trained * train,
        )
    else:
        weights, grads, optimizer = wbytes * params, 4 * params * train, 8 * params * train
    offload = spec.offload or (copy is not None and not spec.keep_gen_copy)  # off the device between calls
    root = counts.root  # embedding, final norm, head
    gbytes = _DTYPE_BYTES[econf.get("dtype", "auto")]  # a train engine's fp32 masters gather in b
    gathered = {
        kind: gbytes * n * fsdp for kind, n in ((GEN, whole), (TRAIN, layer + root), (INF, layer + root))
    }
    shape, calls, kv_max, act_max, gather_max = batch_shape(exp), {}, 0, 0, 0
    for mfc in (m for m in exp.mfcs if m.role == role and exp.call_placement(m.name) == placement):
        kv, act = _call_bytes(mfc, cfg, layout, shape, engine, econf, stage or 0)
        kv_max, act_max = max(kv_max, kv), max(act_max, act)
        step_grads = grads if mfc.interface_type is TRAIN else 0
        gather = gathered[mfc.interface_type]
        calls[mfc.name] = kv + act + gather + step_grads + (weights if offload else 0)
        gather_max = max(gather_max, gather)
    sizes = (weights, grads, optimizer, kv_max, gather_max, act_max)
    return RoleMemory(name, layout, workers, engine, offload, params, *sizes, calls)


def plan_memory(exp: ExperimentConfig, configs: Mapping[str, ReaLModelConfig | None]) -> MemoryPlan:
    """Every role's (and copy's) and every worker's bytes: roles on one worker sum, and its
    communicators, its largest call or move on top."""
    roles = {m.role: m for r in sorted(exp.allocations) for m in role_memories(exp, r, configs.get(r))}
    moves: dict[int, dict[str, tuple[int, int]]] = {}  # worker -> move -> (staging, with the copy)
    for r in sorted(exp.allocations):
        for copy in exp.copy_placements(r):
            memories = role_memories(exp, r, configs.get(r), copy)
            roles.update({m.role: m for m in memories})
            for w, staging in copy_fill_staging(exp, r, configs.get(r), copy).items():
                weights = sum(m.weights for m in memories if w in m.workers and m.offload)
                moves.setdefault(w, {})[f"{r}@{copy}/realloc"] = (staging, staging + weights)
    return MemoryPlan(
        roles,
        [_worker(exp, w, roles, moves.get(w, {})) for w in range(exp.n_model_workers)],
        batch_shape(exp),
        _experts(exp, configs),
    )


def _worker(
    exp: ExperimentConfig, w: int, roles: dict[str, RoleMemory], moves: dict[str, tuple[int, int]]
) -> WorkerMemory:
    here = [m for m in roles.values() if w in m.workers]
    events = [(f"{m.role}/{c}", b) for m in here for c, b in m.calls.items()]
    call, extra = max(events + [(n, b) for n, (_, b) in moves.items()], key=lambda x: x[1], default=("-", 0))
    resident = sum(m.resident for m in here)
    sizes = communicator_sizes(exp, w)
    nccl = 0 if exp.colocate else sum(communicator_bytes(n) for n in sizes)
    staging = max((s for s, _ in moves.values()), default=0)
    return WorkerMemory(
        w, tuple(m.role for m in here), resident, resident + nccl + extra, call, len(sizes), nccl, staging
    )


def copy_fill_staging(
    exp: ExperimentConfig, role: str, cfg: ReaLModelConfig | None, copy: Placement
) -> dict[int, int]:
    """Worker -> the send and receive buffers it holds while ``role``'s copy in ``copy`` is filled
    from its home (laid out as its engine lays it: FSDP, whole experts per rank), in the copy's
    dtype; a copy is never FSDP and splits its experts by tensor parallelism."""
    spec = exp.models[role]
    if cfg is None or spec.backend.type_ == "null":
        return {}
    econf = dict(spec.backend.args.get("engine") or {})
    lora = lora_of(spec.model.args)
    home = Holding(exp.placement(role), bool(econf.get("fsdp")), expert_parallel_of(econf))
    itemsize = _DTYPE_BYTES[econf.get("dtype", "auto")]
    return staging_bytes(cfg, home, Holding(copy), itemsize, adapter_param_count(cfg, lora) if lora else 0)


def _experts(exp: ExperimentConfig, configs: Mapping[str, ReaLModelConfig | None]) -> dict[str, ExpertParams]:
    """The whole-model total and active parameters of every Mixture-of-Experts role."""
    out = {}
    for role in sorted(exp.allocations):
        cfg, spec = configs.get(role), exp.models[role]
        if cfg is None or not cfg.n_experts or spec.backend.type_ == "null":
            continue
        whole = count_params(cfg)
        ep = expert_parallel_of(spec.backend.args.get("engine") or {})
        out[role] = ExpertParams(
            whole.total,
            whole.active,
            cfg.n_experts,
            cfg.n_experts_per_tok,
            len(cfg.moe_layers),
            ep,
            exp.placement(role).layout.tp,
        )
    return out


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def _groups(plan: MemoryPlan) -> Iterator[tuple[str, WorkerMemory]]:
    """Workers with the same roles and bytes listed once ("0-7"): 64 identical lines say nothing."""
    seen: dict[tuple, list[int]] = {}
    for w in plan.workers:
        key = (w.roles, w.resident, w.peak, w.peak_call, w.communicators, w.nccl, w.staging)
        seen.setdefault(key, []).append(w.worker)
    for ws in seen.values():
        contiguous = ws == list(range(ws[0], ws[-1] + 1)) and len(ws) > 1
        yield (f"{ws[0]}-{ws[-1]}" if contiguous else ",".join(map(str, ws))), plan.workers[ws[0]]


def format_plan(plan: MemoryPlan, device_memory_bytes: int | None = None) -> str:
    """Two tables in GiB per device: the roles, then the workers' peaks."""
    s = plan.shape
    lines = [
        f"batch: {s['n_seqs']} prompts x {s['n']} answers, {s['prompt_len']} prompt + "
        f"{s['new_tokens']} new tokens; GiB per device (act = activation estimate)",
        f"{'role':<18}{'layout':<9}{'engine':<10}{'params':>8}{'weights':>9}{'grads':>8}{'optim':>8}"
        f"{'kv':>8}{'fsdp':>7}{'act':>8}{'peak':>8}  offload",
    ]
    for m in plan.roles.values():
        cols = (m.weights, m.grads, m.optimizer, m.kv_cache, m.fsdp_gather, m.activations, m.peak)
        widths = (9, 8, 8, 8, 7, 8, 8)
        lines.append(
            f"{m.role:<18}{str(m.layout):<9}{m.engine:<10}{_count(m.params):>8}"
            + "".join(f"{gib(c):>{w}}" for c, w in zip(cols, widths))
            + f"  {'yes' if m.offload else 'no'}"
        )
    lines += [e.describe(role) for role, e in plan.experts.items()]
    lines.append(
        f"{'workers':<10}{'resident':>9}{'groups':>7}{'nccl':>7}{'realloc':>8}{'peak':>8}  {'roles':<24} peak during"
    )
    for ws, w in _groups(plan):
        over = "  OVER" if device_memory_bytes is not None and w.peak > device_memory_bytes else ""
        lines.append(
            f"{ws:<10}{gib(w.resident):>9}{w.communicators:>7}{gib(w.nccl):>7}{gib(w.staging):>8}"
            f"{gib(w.peak):>8}  {','.join(w.roles):<24} {w.peak_call}{over}"
        )
    lines.append(
        "groups: process groups joined, nccl: their NCCL buffers; realloc: send + receive buffers "
        "of the largest copy fill (peak counts it with the copy's weights)"
    )
    return "\n".join(lines)


def check_fits(plan: MemoryPlan, device_memory_bytes: int) -> None:
    """ValueError naming the fullest worker over ``device_memory_bytes``, its roles and layouts."""
    over = [w for w in plan.workers if w.peak > device_memory_bytes]
    if not over:
        return
    w = max(over, key=lambda x: x.peak)
    roles = ", ".join(
        f"{r} {plan.roles[r].layout} {gib(plan.roles[r].resident)} GiB resident" for r in w.roles
    )
    others = f" ({len(over) - 1} more workers over)" if len(over) > 1 else ""
    raise ValueError(
        f"worker {w.worker} needs {gib(w.peak)} GiB ({w.peak} bytes) > {gib(device_memory_bytes)} GiB "
        f"({device_memory_bytes} bytes) at its peak during {w.peak_call}: {roles}{others}"
    )
