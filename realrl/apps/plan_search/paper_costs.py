"""Call costs on paper: what a plan search needs for a GPU cluster one does not have.

Each call's seconds in each layout follow from its FLOPs and the bytes it moves, with datasheet
figures for the device (``Hardware``) and assumed efficiencies. ``P`` is a role's parameters in
matmuls (every layer and the LM / critic head; the embedding lookup is no matmul), of a
Mixture-of-Experts model those a token runs through (attention, router, its top-k experts, the
shared expert: ``model_size.count_params``'s active count), while the bytes of weights read,
gathered, reduced and moved are those of every expert (the total), ``T`` the
tokens of the call's batch: ``n_seqs x answers x (prompt_len + new_tokens)``, every sequence at
full length (the memory plan's ``batch_shape``). Compute is spread over ``dp x tp`` devices at
``train_mfu``; communication is a ring: an all-reduce moves ``2 (n-1)/n`` of its bytes per rank,
an all-gather or reduce-scatter ``(n-1)/n``, at ``comm_efficiency`` of the link, plus a latency.
Nothing overlaps (the train engine all-reduces its gradients after the backward), so these are
upper bounds on a tuned run.

- train_step: ``6 P T`` FLOPs per epoch ("Scaling Laws for Neural Language Models", Kaplan et al.
  2020: C = 6 N D), ``8 P T`` with gradient checkpointing (the forward recomputed: "Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", Narayanan et al. 2021,
  appendix on FLOPs; "Reducing Activation Recomputation in Large Transformer Models"), plus
  attention: ``2 n_layers s q_dim`` per token forward (``s``: the sequence length; the causal
  half of Narayanan et al.'s term), likewise 3x (4x). Tensor parallelism: 2 all-reduces of the bf16
  activations per layer in each forward and each backward ("Megatron-LM: Training Multi-Billion
  Parameter Language Models Using Model Parallelism", Shoeybi et al. 2019, Section 3) and the fp32
  logits gathered over tp. Data parallelism: one all-reduce of the fp32 gradients per optimizer
  step; under FSDP instead two all-gathers of the fp32 weights (forward, backward) and one
  reduce-scatter of the gradients per micro-batch. Counted from the call's interface:
  ``ppo_n_epochs`` passes over the batch, ``ppo_n_epochs x ppo_n_minibatches`` optimizer steps
  (1 and 1 where it has no such settings). Not counted: the decoupled objective's extra forward,
  LoRA's smaller gradients.
- inference: ``2 P T`` FLOPs plus attention forward, the 2 all-reduces per layer, the logits'
  gather; FSDP: one all-gather of the weights per micro-batch.
- generate: the prompts' prefill as an inference call (the logits of each sequence's last token
  only); then, per micro-batch, ``new_tokens`` decode steps at the mean context
  ``c = prompt_len + new_tokens / 2``, each ``max(bytes read / (HBM x hbm_efficiency), FLOPs /
  (peak x decode_mfu))``, bytes = bf16 weights / tp + the KV cache of the rank's sequences
  (``2 n_layers kv_heads head_dim`` bf16 values per token, / tp), plus, when tp > 1, the step's
  ``2 n_layers`` all-reduces and one logits gather (latency-bound); dp splits the sequences. FSDP
  gathers every unit once per micro-batch.
- a call of a role with no model (the advantages): a memory-bound pass over the batch, 64 bytes
  per token, plus a millisecond. A whole-batch call of a model is costed as above, in d1m1p1.
- reallocation: bf16 weights (2 bytes per parameter) over NVLink when every worker is on one node,
  else the NIC of one GPU.

A layout of at most ``gpus_per_node`` ranks is taken to sit on one node; tp above it is not in
the plan space (``call_options(..., per_node)``) and gets no cost. Device figures: "NVIDIA H100
Tensor Core GPU" datasheet (SXM5 80GB: 989 dense BF16 TFLOP/s, 3.35 TB/s HBM3, NVLink 900 GB/s
both directions), "NVIDIA DGX H100" datasheet (8 x ConnectX-7 400 Gb/s: 50 GB/s per GPU), "NVIDIA
A100 Tensor Core GPU" datasheet (SXM4 80GB: 312 TFLOP/s BF16, 2,039 GB/s HBM2e, NVLink 600 GB/s),
"NVIDIA DGX A100" datasheet (8 x ConnectX-6 200 Gb/s: 25 GB/s per GPU). The efficiencies are
assumptions: the Megatron-LM paper sustains 44-52 % of A100 peak on large GPT models, hence 40 %.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping

from realrl.api.core.config import setting_holder
from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.layout import Layout
from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.core.model_size import count_params, param_counts
from realrl.api.core.system_api import ExperimentConfig
from realrl.api.quickstart.memory_plan import batch_shape
from realrl.apps.plan_search.simulator import Costs
from realrl.apps.plan_search.space import call_options

BF16, FP32 = 2, 4


@dataclasses.dataclass(frozen=True)
class Hardware:
    """A device kind's datasheet figures (sources in the module docstring) and the efficiencies
    assumed for them."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bandwidth: float  # bytes/s
    intra_node_bandwidth: float  # bytes/s per GPU per direction (NVLink)
    inter_node_bandwidth: float  # bytes/s per GPU (its InfiniBand / RoCE NIC)
    gpus_per_node: int
    train_mfu: float = 0.40  # fraction of peak in training and prefill matmuls
    decode_mfu: float = 0.30  # fraction of peak in the skinny matmuls of a decode step
    hbm_efficiency: float = 0.80  # fraction of HBM bandwidth a decode step's reads reach
    comm_efficiency: float = 0.80  # fraction of link bandwidth a NCCL collective reaches
    intra_node_latency: float = 10e-6  # seconds per collective over NVLink
    inter_node_latency: float = 30e-6  # seconds per collective across nodes


HARDWARE: Mapping[str, Hardware] = types.MappingProxyType(
    {
        "h100": Hardware("H100 SXM5 80GB", 989e12, 3.35e12, 450e9, 50e9, 8),
        "a100": Hardware("A100 SXM4 80GB", 312e12, 2.039e12, 300e9, 25e9, 8),
    }
)


@dataclasses.dataclass(frozen=True)
class _Model:
    """What the formulas read of a role's architecture."""

    params: int  # all parameters, every expert (the weights moved and read)
    matmul: int  # parameters in a token's matmuls (its top-k experts): 2 FLOPs per token each in forward
    layers: int
    hidden: int
    q_dim: int  # n_q_heads x head_dim
    kv_token_bytes: int  # bf16 KV cache of one token, all layers
    vocab: int  # logits per token (0 for a critic)

    @classmethod
    def of(cls, cfg: ReaLModelConfig) -> _Model:
        counts = count_params(cfg)  # total: every expert; active: a token's top-k experts
        head = cfg.hidden_dim + 1 if cfg.is_critic else cfg.vocab_size * cfg.hidden_dim  # tied: a matmul too
        kv, q = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * BF16, cfg.n_q_heads * cfg.head_dim
        vocab = 0 if cfg.is_critic else cfg.vocab_size
        matmul = counts.active - counts.root + head  # the blocks' active parameters and the head
        return cls(counts.total, matmul, cfg.n_layers, cfg.hidden_dim, q, kv, vocab)


@dataclasses.dataclass(frozen=True)
class _Net:
    """Collectives of one group, as rings over one kind of link."""

    hw: Hardware
    inter: bool  # across nodes (the NICs) or within one (NVLink)

    def seconds(self, nbytes: float, ranks: int, factor: float, times: int = 1) -> float:
        """``times`` collectives of ``nbytes`` in all over ``ranks``: each rank moves ``factor x
        (ranks-1)/ranks`` of the bytes (factor 2: all-reduce, 1: all-gather, reduce-scatter)."""
        if ranks <= 1:
            return 0.0
        hw = self.hw
        bw = (hw.inter_node_bandwidth if self.inter else hw.intra_node_bandwidth) * hw.comm_efficiency
        latency = hw.inter_node_latency if self.inter else hw.intra_node_latency
        return factor * (ranks - 1) / ranks * nbytes / bw + times * latency


def _forward_flops(m: _Model, tokens: float, seqlen: float) -> float:
    """Matmuls and causal attention of a forward over ``tokens`` in sequences of ``seqlen``."""
    return 2 * m.matmul * tokens + 2 * m.layers * seqlen * m.q_dim * tokens


def _tp_seconds(
    m: _Model, hw: Hardware, tp: int, tokens: float, chunks: int, passes: int, rows: float | None = None
) -> float:
    """Tensor parallelism over ``passes`` traversals (forward, backward, recomputed forward) of
    ``tokens`` in ``chunks`` micro-batches: 2 all-reduces of the bf16 activations per layer, one
    gather of the fp32 logits of ``rows`` tokens (all of them unless given)."""
    net, n, rows = _Net(hw, inter=False), passes * chunks, tokens if rows is None else rows
    acts = net.seconds(passes * BF16 * m.hidden * tokens * 2 * m.layers, tp, 2, n * 2 * m.layers)
    return acts + (net.seconds(passes * FP32 * m.vocab * rows, tp, 1, n) if m.vocab else 0.0)


@dataclasses.dataclass(frozen=True)
class _Call:
    """One call of a role with a model, in one layout."""

    mfc: MFCDef
    m: _Model
    layout: Layout
    shape: dict[str, int]
    hw: Hardware
    fsdp: bool  # the role's engine shards over dp (and dp > 1)
    checkpointing: bool
    gathered: float  # bytes of the tp-local weights FSDP gathers (fp32 in the train engine)

    @property
    def dp_net(self) -> _Net:
        return _Net(self.hw, inter=self.layout.world_size > self.hw.gpus_per_node)

    def compute(self, flops: float) -> float:
        return flops / (self.layout.tp * self.hw.peak_flops * self.hw.train_mfu)

    def seconds(self) -> float:
        layout, kind, n = self.layout, self.mfc.interface_type, self.shape["n"]
        seqs = math.ceil(self.mfc.n_seqs / layout.dp) * n  # sequences on one rank
        if kind is ModelInterfaceType.GENERATE:
            return self.generate(seqs)
        seqlen = self.shape["prompt_len"] + self.shape["new_tokens"]
        tokens, forward = seqs * seqlen, _forward_flops(self.m, seqs * seqlen, seqlen)
        train, args = kind is ModelInterfaceType.TRAIN_STEP, self.mfc.interface_impl.args
        limit = self.mfc.mb_spec.max_tokens_per_mb
        epochs = int(setting_holder(args, "ppo_n_epochs").get("ppo_n_epochs", 1)) if train else 1
        minibatches = (
            int(setting_holder(args, "ppo_n_minibatches").get("ppo_n_minibatches", 1)) if train else 1
        )
        chunks = max(self.mfc.mb_spec.n_mbs, math.ceil(tokens / minibatches / limit) if limit else 1)
        if not train:
            gather = self.dp_net.seconds(chunks * self.gathered, layout.dp, 1, chunks) if self.fsdp else 0.0
            return self.compute(forward) + _tp_seconds(self.m, self.hw, layout.tp, tokens, chunks, 1) + gather
        ckpt = self.checkpointing  # forward, backward (two forwards' FLOPs), the recomputed forward
        flops, passes = epochs * (3 + ckpt) * forward, minibatches * chunks
        tp = epochs * _tp_seconds(self.m, self.hw, layout.tp, tokens, passes, 2 + ckpt)
        updates, grads = epochs * minibatches, FP32 * self.m.params / layout.tp
        if self.fsdp:  # per micro-batch: weights gathered for forward and backward, gradients scattered
            n = updates * chunks
            sync = self.dp_net.seconds(n * (2 * self.gathered + grads), layout.dp, 1, 3 * n)
        else:  # one all-reduce of the gradients per optimizer step
            sync = self.dp_net.seconds(updates * grads, layout.dp, 2, updates)
        return self.compute(flops) + tp + sync

    def generate(self, seqs: int) -> float:
        """The prompts' prefill, then per micro-batch ``new_tokens`` decode steps at the mean context."""
        m, hw, tp, n_mbs = self.m, self.hw, self.layout.tp, self.mfc.mb_spec.n_mbs
        prompt, new = self.shape["prompt_len"], self.shape["new_tokens"]
        tokens = seqs * prompt
        prefill = self.compute(_forward_flops(m, tokens, prompt))
        prefill += _tp_seconds(m, hw, tp, tokens, n_mbs, 1, rows=seqs)  # logits of the last token only
        per_mb, context = math.ceil(seqs / n_mbs), prompt + new / 2
        read = (BF16 * m.params + per_mb * m.kv_token_bytes * context) / tp
        flops = per_mb * (2 * m.matmul + 4 * m.layers * context * m.q_dim) / tp
        step = max(read / (hw.hbm_bandwidth * hw.hbm_efficiency), flops / (hw.peak_flops * hw.decode_mfu))
        step += _tp_seconds(m, hw, tp, per_mb, 1, 1)
        gather = self.dp_net.seconds(n_mbs * self.gathered, self.layout.dp, 1, n_mbs) if self.fsdp else 0.0
        return prefill + n_mbs * new * step + gather


def _small_call(mfc: MFCDef, shape: dict[str, int], hw: Hardware) -> float:
    """A call of a role with no model (the advantages): one memory-bound pass, 64 bytes a token."""
    tokens = mfc.n_seqs * shape["n"] * (shape["prompt_len"] + shape["new_tokens"])
    return 1e-3 + 64 * tokens / (hw.hbm_bandwidth * hw.hbm_efficiency)


def paper_costs(
    exp: ExperimentConfig,
    configs: Mapping[str, ReaLModelConfig | None],
    n_workers: int,
    hardware: Hardware,
) -> Costs:
    """Seconds of every call of ``exp`` in every layout the plan space gives it on ``n_workers``
    (``call_options`` with ``gpus_per_node`` per node: tp only within a node; no other layout
    gets a cost),
    from FLOPs and bytes; and the reallocations' bytes and bandwidth."""
    shape = batch_shape(exp)
    calls: dict[tuple[str, str], float] = {}
    for mfc in exp.mfcs:
        cfg, spec = configs.get(mfc.role), exp.models.get(mfc.role)
        econf = dict(spec.backend.args.get("engine") or {}) if spec is not None else {}
        train_engine = spec is not None and spec.backend.type_ == "train"
        model = _Model.of(cfg) if cfg is not None else None
        for layout in {p.layout for p in call_options(mfc, n_workers, hardware.gpus_per_node)}:
            if model is None:
                calls[(mfc.name, str(layout))] = _small_call(mfc, shape, hardware)
                continue
            fsdp = bool(econf.get("fsdp")) and layout.dp > 1
            gathered = (FP32 if train_engine else BF16) * model.params / layout.tp
            ckpt = bool(econf.get("gradient_checkpointing"))
            call = _Call(mfc, model, layout, shape, hardware, fsdp, ckpt, gathered)
            calls[(mfc.name, str(layout))] = call.seconds()
    one_node = n_workers <= hardware.gpus_per_node
    bandwidth = hardware.intra_node_bandwidth if one_node else hardware.inter_node_bandwidth
    return Costs(
        calls=calls,
        model_bytes={r: float(BF16 * param_counts(c, 1)[0]) for r, c in configs.items() if c is not None},
        bandwidth=bandwidth * hardware.comm_efficiency,
        latency=hardware.intra_node_latency if one_node else hardware.inter_node_latency,
    )
