"""Generation with a KV cache over packed prompts, no padding.

Prompts are prefilled in one packed forward; then each step feeds one token per live sequence.
Two ways to run the steps (``GenerationHyperparameters.decoding``): the eager loop, where a
sequence that emits EOS leaves the live batch at once (its cache row is dropped), the default on a
CPU; and fixed-shape steps (``nn/static_decode.py``), captured as CUDA graphs on a GPU, where
finished rows leave at batch-bucket boundaries. Log-probs are those of the sampled tokens under
``logits / temperature`` ("The N Implementation Details of RLHF with PPO", policy detail 1, "Scale
the logits by sampling temperature"), before top-k/top-p filtering, so a training forward
recomputes them exactly.

Sampling randomness is counter-based (``nn/sampling.py``): a sequence's tokens depend on its key
only, not on which other prompts share the batch. A model split by tensor parallelism decodes
eagerly, and its ranks take the tokens their first rank sampled (``sampling_group``), so that
they stay in step.

With ``record_experts`` (router replay, ``nn/router_replay.py``) a Mixture-of-Experts model's
prefill and eager steps record each token's experts, returned as ``routed_experts``; recording
decodes eagerly (the fixed-shape steps keep no record).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from realrl.api.core.model_api import GenerationHyperparameters, GenerationOutput
from realrl.base import logging
from realrl.impl.model.kernels import DecodeWeights
from realrl.impl.model.modules.attention import activation_dtype
from realrl.impl.model.modules.kv_cache import DecodeContext, KVCache, decode_attention_kernels
from realrl.impl.model.nn.router_replay import ExpertRouting, free_rows
from realrl.impl.model.nn.sampling import answer_keys, eos_tensor, next_tokens, random_keys
from realrl.impl.model.nn.static_decode import DecodeTrace, StaticDecoder, cache_capacity
from realrl.impl.model.nn.transformer_block import linear
from realrl.impl.model.parallel.dtensor import is_dtensor
from realrl.impl.model.parallel.fsdp import is_fsdp

logger = logging.getLogger("generation")


@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    gconfig: GenerationHyperparameters,
    eos_token_id: int | list[int] | None = None,
    prompt_keys: torch.Tensor | None = None,
    trace: DecodeTrace | None = None,
) -> GenerationOutput:
    """Answers to the packed prompts; ``prompt_keys`` (int64 [n_prompts]) fix each prompt's sampling
    randomness (answer j of prompt i uses ``answer_keys(prompt_keys, n)[i * n + j]``); None draws
    them from torch's global RNG. ``trace``: filled with what fixed-shape decoding did."""
    if model.config.is_critic:
        raise ValueError("generate() needs a language model; this ReaLModel is a critic (scalar head)")
    was_training = model.training
    model.eval()
    try:
        return _generate(model, input_ids, cu_seqlens, gconfig, eos_token_id, prompt_keys, trace)
    finally:
        model.train(was_training)


def _generate(
    model,
    input_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    g: GenerationHyperparameters,
    eos_token_id: int | list[int] | None,
    prompt_keys: torch.Tensor | None,
    trace: DecodeTrace | None,
) -> GenerationOutput:
    cfg, device, n = model.config, input_ids.device, g.n
    eos, ctx, lens_t, keys, dtype = _prepare(model, input_ids, cu_seqlens, g, eos_token_id, prompt_keys)
    prompt_lens = ctx.meta.seqlens
    # the fixed-shape steps keep no record of the experts: recording decodes eagerly
    mode = "eager" if records_experts(model, g) else decoding_mode(model, g, device)
    if mode == "eager":
        return _eager_decode(model, input_ids, ctx, lens_t, keys, g, eos, dtype)
    n_seqs = len(prompt_lens) * n
    capacity = cache_capacity(max(prompt_lens), g.max_new_tokens)
    cache = KVCache(cfg.n_layers, n_seqs, model.local_kv_heads, capacity, cfg.head_dim, dtype, device)
    decoder = static_decoder(model, cache, dtype, g, eos, mode, trace)
    if decoder is None:
        return _eager_decode(model, input_ids, ctx, lens_t, keys, g, eos, dtype)
    # prefill into row i * n of prompt i, then the prompt's other answers get copies of it
    logits = _prefill(model, input_ids, ctx, lens_t, cache, row_stride=n)
    cache.fill_answers_(n)
    out_tokens, out_logp, gen_lens = decoder.decode(
        logits.repeat_interleave(n, dim=0), lens_t.repeat_interleave(n), keys
    )
    return _assemble(input_ids, prompt_lens, n, out_tokens, out_logp, gen_lens, eos)


@torch.no_grad()
def start_decoding(
    model,
    input_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    g: GenerationHyperparameters,
    eos_token_id: int | list[int] | None = None,
    prompt_keys: torch.Tensor | None = None,
) -> EagerDecoding:
    """Prefill the packed prompts and return the paused eager decoding (``EagerDecoding``) that
    interruptible generation advances a few tokens at a time; keys as in ``generate``. The caller
    keeps the model in eval mode while it decodes."""
    if model.config.is_critic:
        raise ValueError("generation needs a language model; this ReaLModel is a critic (scalar head)")
    eos, ctx, lens_t, keys, dtype = _prepare(model, input_ids, cu_seqlens, g, eos_token_id, prompt_keys)
    return EagerDecoding(model, input_ids, ctx, lens_t, keys, g, eos, dtype)


def _prepare(model, input_ids, cu_seqlens, g, eos_token_id, prompt_keys) -> tuple:
    """What both ways of decoding start from: EOS ids, the prompts' packed context, their lengths,
    every answer's sampling key and the activations' dtype."""
    device, n = input_ids.device, g.n
    eos = eos_tensor(eos_token_id, device)
    ctx = model.packed_context(input_ids, cu_seqlens)
    prompt_lens = ctx.meta.seqlens
    if min(prompt_lens) < 1:
        raise ValueError(f"generate() needs non-empty prompts; got prompt lengths {prompt_lens}")
    n_prompts = len(prompt_lens)
    model.check_length(max(prompt_lens) + g.max_new_tokens, "prompt + max_new_tokens")
    if prompt_keys is None:  # greedy reads no randomness: the global RNG is left as it was
        prompt_keys = torch.zeros(n_prompts, dtype=torch.long) if g.greedy else random_keys(n_prompts)
    elif prompt_keys.shape != (n_prompts,) or prompt_keys.dtype != torch.long:
        raise ValueError(
            f"prompt_keys must be int64 [{n_prompts}] (one per prompt); got {prompt_keys.dtype} "
            f"{tuple(prompt_keys.shape)}"
        )
    keys = answer_keys(prompt_keys.to(device), n)  # row of the cache -> its sequence's key
    dtype = activation_dtype(model.dtype, device)  # bf16 under autocast with fp32 weights
    return eos, ctx, torch.tensor(prompt_lens, device=device), keys, dtype


def records_experts(model, g: GenerationHyperparameters) -> bool:
    """Whether this call returns each token's routed experts (asked for, and a sparse model)."""
    return g.record_experts and bool(model.config.moe_layers)


def recorder(model, g: GenerationHyperparameters) -> ExpertRouting | None:
    """A fresh record of one forward's experts, or None when the call records none."""
    return ExpertRouting(model.config.moe_layers, record=True) if records_experts(model, g) else None


def decoding_mode(model, g: GenerationHyperparameters, device: torch.device) -> str:
    """How ``model``'s decoding steps run on ``device``: ``choose_decoding`` with the model's facts
    (split by tensor parallelism: its layers' weights are DTensors; sharded by FSDP: ``is_fsdp``,
    also inside ``gathered()``, where the weights are whole and plain; Mixture of Experts)."""
    tensor_parallel = len(model.layers) > 0 and is_dtensor(model.layers[0].attn.q.weight)
    moe = bool(model.config.moe_layers)
    return choose_decoding(g.decoding, device.type, tensor_parallel, is_fsdp(model), moe)


def sampling_group(model) -> dist.ProcessGroup | None:
    """The tensor-parallel ranks that decode ``model``'s batch together and so must sample the same
    tokens: the "tp" group of the mesh its query projections are split over (``parallel/
    tensor_parallel.py``); None for a model whose blocks are not split, or split over one rank."""
    return block_sampling_group(model.layers[0] if len(model.layers) > 0 else None)


def block_sampling_group(block) -> dist.ProcessGroup | None:
    """``sampling_group`` read from one transformer block (a pipeline stage's first)."""
    weight = block.attn.q.weight if block is not None else None
    if not is_dtensor(weight):
        return None
    mesh = weight.device_mesh
    names = mesh.mesh_dim_names or ()
    if "tp" in names:
        return mesh.get_group("tp") if mesh.size(names.index("tp")) > 1 else None
    return mesh.get_group() if mesh.ndim == 1 and mesh.size() > 1 else None


# why a Mixture-of-Experts model decodes without CUDA graphs (``choose_decoding``)
MOE_NO_GRAPHS = (
    "a Mixture-of-Experts block groups each step's tokens by the experts they are routed to, and "
    "the host reads how many each expert got: shapes a CUDA graph cannot fix in advance"
)


def choose_decoding(
    requested: str, device_type: str, tensor_parallel: bool = False, fsdp: bool = False, moe: bool = False
) -> str:
    """The decoding mode for ``decoding=requested`` on ``device_type``: "auto" is "cuda_graph" on a
    CUDA device for a dense model split neither by tensor parallelism nor by FSDP, else "eager".

    Mixture of Experts (``moe``): ``MOE_NO_GRAPHS``; "auto" decodes eagerly, "static" (the
    fixed-shape steps, uncaptured: the blocks run eagerly inside them) runs, "cuda_graph" is refused.

    Tensor parallelism: a step's collectives run inside the layers, and the fixed-shape step does
    not lay its inputs out over the mesh; only "eager" runs such a model. FSDP: generation runs
    with every unit's weights gathered (``parallel/fsdp.gathered``), yet FSDP's hooks still run
    around each block's forward, and a block called outside the root's forward (as decoding calls
    them) makes FSDP's all-gather streams wait on the current one: inside a capture that forks
    streams the graph never joins. So under FSDP no graph is captured: "auto" decodes eagerly,
    "static" (the same fixed-shape steps, uncaptured) runs, and "cuda_graph" is refused. A pure
    function: the choice is tested without a GPU."""
    if requested == "auto":
        return "cuda_graph" if device_type == "cuda" and not (tensor_parallel or fsdp or moe) else "eager"
    if requested == "cuda_graph" and moe:
        raise ValueError(
            f"decoding='cuda_graph' does not run this model: {MOE_NO_GRAPHS}; use 'auto', 'eager' or 'static'"
        )
    if requested == "cuda_graph" and device_type != "cuda":
        raise ValueError(f"decoding='cuda_graph' needs a CUDA device; the model is on {device_type}")
    if requested != "eager" and tensor_parallel:
        raise ValueError(
            f"decoding={requested!r} does not run a model split by tensor parallelism; use 'eager'"
        )
    if requested == "cuda_graph" and fsdp:
        raise ValueError(
            "decoding='cuda_graph' does not run a model sharded by FSDP (its hooks run on their own "
            "streams, which a CUDA graph capture cannot record); use decoding='auto', 'eager' or 'static'"
        )
    return requested


def static_decoder(
    model, cache: KVCache, dtype: torch.dtype, g: GenerationHyperparameters, eos, mode: str, trace
) -> StaticDecoder | None:
    """The fixed-shape decoder, captured as CUDA graphs in mode "cuda_graph". None when the
    capture failed and the user left ``decoding="auto"``: the reason is logged and the call decodes
    eagerly, so a run does not stop on a device where some step cannot be captured; asked for
    explicitly (``decoding="cuda_graph"``), the failure is raised."""
    vocab = model.head.weight.shape[0]
    try:
        return StaticDecoder(model, cache, vocab, dtype, g, eos, use_graphs=mode == "cuda_graph", trace=trace)
    except RuntimeError as e:
        if mode != "cuda_graph" or g.decoding != "auto":
            raise
        logger.warning("capturing the decoding step as a CUDA graph failed (%s); decoding eagerly", e)
        return None


def _prefill(model, input_ids, ctx, lens: torch.Tensor, cache: KVCache, row_stride: int = 1) -> torch.Tensor:
    """The prompts' forward, filling row ``i * row_stride`` of ``cache`` with prompt i's keys and
    values; the next-token logits [n_prompts, V]. The last layer past attention and the head run
    only on each prompt's last token."""
    rows = torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device) * row_stride, lens)
    ctx.cache, ctx.cache_slots = cache, cache.slots(rows, ctx.meta.positions)
    return model.head(model.hidden_states(input_ids, ctx, ctx.meta.cu_seqlens[1:].long() - 1))


def _eager_decode(model, input_ids, ctx, lens_t, keys, g, eos, dtype) -> GenerationOutput:
    """One Python-driven step per token; a sequence that ends leaves the batch at once."""
    decoding = EagerDecoding(model, input_ids, ctx, lens_t, keys, g, eos, dtype)
    decoding.advance()
    return decoding.output()


class EagerDecoding:
    """The eager loop as an object that can pause between tokens: ``advance`` decodes up to ``n``
    more tokens; after the model's weights changed, ``refresh`` rebuilds the live rows' KV cache
    from their prompt and answer so far, so decoding continues under the new weights; ``output``
    assembles the answers. Interruptible generation (partial rollouts, asynchronous RL) drives
    it; one uninterrupted ``advance`` is the eager decoding every generate call runs. Every token
    is tagged with the ``version`` of the ``advance`` that sampled it (``token_versions``)."""

    def __init__(self, model, input_ids, ctx, lens_t, keys, g, eos, dtype):
        cfg, device, n, max_new = model.config, input_ids.device, g.n, g.max_new_tokens
        self.model, self.input_ids, self.g, self.eos, self.dtype = model, input_ids, g, eos, dtype
        self.prompt_lens = ctx.meta.seqlens
        self.impl = ctx.impl
        n_prompts = len(self.prompt_lens)
        self.capacity = max(self.prompt_lens) + max_new
        self.cache = KVCache(
            cfg.n_layers, n_prompts, model.local_kv_heads, self.capacity, cfg.head_dim, dtype, device
        )
        ctx.routing = recorder(model, g)
        logits = _prefill(model, input_ids, ctx, lens_t, self.cache)
        self.cache.repeat_interleave(n)
        self.logits = logits.repeat_interleave(n, dim=0)
        self.lens = lens_t.repeat_interleave(n)
        self.max_len = max(self.prompt_lens)
        self.weights = DecodeWeights()  # decode-time projection weights, prepared once (kernels/weights.py)
        n_seqs = n_prompts * n
        self.keys = keys
        self.live = torch.arange(n_seqs, device=device)  # row of the cache -> output sequence index
        self.out_tokens = torch.zeros(n_seqs, max_new, dtype=torch.long, device=device)
        self.out_logp = torch.zeros(n_seqs, max_new, dtype=torch.float32, device=device)
        self.out_version = torch.zeros(n_seqs, max_new, dtype=torch.long, device=device)
        self.gen_lens = torch.full((n_seqs,), max_new, dtype=torch.long, device=device)
        self.step = 0  # tokens every live row has sampled so far
        self.group = sampling_group(model)  # the tp ranks that take their first rank's tokens
        # router replay: each answer's prompt experts and each answer token's (FREE until fed)
        self.prompt_experts: list[torch.Tensor] | None = None
        self.out_experts: torch.Tensor | None = None
        if ctx.routing is not None:
            prompt_experts = torch.split(ctx.routing.stacked(), self.prompt_lens)
            self.prompt_experts = [prompt_experts[i // n] for i in range(n_seqs)]
            layers, k = len(cfg.moe_layers), cfg.n_experts_per_tok
            self.out_experts = free_rows(n_seqs * max_new, layers, k, device).view(n_seqs, max_new, layers, k)

    @property
    def n_live(self) -> int:
        """Answers still being decoded."""
        return int(self.live.numel())

    def advance(self, n: int | None = None, version: int = 0) -> int:
        """Decode up to ``n`` more tokens per live answer (None: to the end), tagging them with
        ``version``; the answers still live after it."""
        g, eos, model, max_new = self.g, self.eos, self.model, self.g.max_new_tokens
        stop = max_new if n is None else min(max_new, self.step + n)
        with decode_attention_kernels(self.input_ids.device):
            while self.step < stop and self.n_live:
                step, live = self.step, self.live
                tokens, logp = next_tokens(self.logits, g, eos, step, self.keys, self.group)
                self.out_tokens[live, step] = tokens
                self.out_logp[live, step] = logp
                self.out_version[live, step] = version
                self.step += 1
                if step == max_new - 1:
                    self.live = live[:0]
                    break
                if eos.numel() and not g.fixed_length:
                    done = torch.isin(tokens, eos)
                    if bool(done.any()):
                        self.gen_lens[live[done]] = step + 1
                        keep = (~done).nonzero().squeeze(-1)  # indices: one host sync, not one per tensor
                        self.live, self.keys, tokens, self.lens = (
                            live[keep],
                            self.keys[keep],
                            tokens[keep],
                            self.lens[keep],
                        )
                        if keep.numel() == 0:
                            break
                        self.cache.select(keep)
                        self.max_len = int(self.lens.max())  # the longest row may have finished: attend less
                ctx = DecodeContext(self.cache, self.lens, self.max_len + 1, self.weights, self.impl)
                ctx.routing = recorder(model, g)
                h = model.hidden_states(tokens, ctx)
                self.logits = linear(h, self.weights, model.head)
                if ctx.routing is not None:  # the experts of the tokens just fed (answer token `step`)
                    self.out_experts[self.live, step] = ctx.routing.stacked()
                self.lens = self.lens + 1
                self.max_len += 1
        return self.n_live

    def refresh(self) -> None:
        """The model's weights changed: recompute the live answers' cache and next-token logits
        from their prompt and the tokens sampled so far, under the new weights."""
        if not self.n_live:
            return
        model, cfg, device = self.model, self.model.config, self.input_ids.device
        prompts = torch.split(self.input_ids, self.prompt_lens)
        rows = self.live.tolist()
        seqs = [torch.cat([prompts[r // self.g.n], self.out_tokens[r, : self.step]]) for r in rows]
        lens = [len(s) for s in seqs]
        cu = torch.tensor([0, *lens], device=device).cumsum(0).int()
        packed = torch.cat(seqs)
        ctx = model.packed_context(packed, cu)
        ctx.routing = recorder(model, self.g)
        self.cache = KVCache(
            cfg.n_layers, len(rows), model.local_kv_heads, self.capacity, cfg.head_dim, self.dtype, device
        )
        self.lens = torch.tensor(lens, device=device)
        self.logits = _prefill(model, packed, ctx, self.lens, self.cache)
        if ctx.routing is not None:  # the cache now holds these routings: they are the record
            for r, part in zip(rows, torch.split(ctx.routing.stacked(), lens)):
                p = self.prompt_lens[r // self.g.n]
                self.prompt_experts[r], self.out_experts[r, : self.step] = part[:p], part[p:]
        self.max_len = max(lens)
        self.impl = ctx.impl
        self.weights = DecodeWeights()  # the prepared projections were the old weights'

    def output(self) -> GenerationOutput:
        """The answers so far (all of them once ``advance`` has run to the end)."""
        return _assemble(
            self.input_ids,
            self.prompt_lens,
            self.g.n,
            self.out_tokens,
            self.out_logp,
            self.gen_lens,
            self.eos,
            self.prompt_experts,
            self.out_experts,
        )

    def token_versions(self) -> torch.Tensor:
        """long [sum (L - 1)], aligned like ``output().logprobs``: the version that sampled each
        answer token; a prompt target carries the version of its answer's first token."""
        out, device = [], self.input_ids.device
        for i, L in enumerate(self.gen_lens.tolist()):
            p = self.prompt_lens[i // self.g.n]
            v = self.out_version[i, :L]
            out += [torch.full((p - 1,), int(v[0]) if L else 0, dtype=torch.long, device=device), v]
        return torch.cat(out)


def _assemble(
    input_ids, prompt_lens, n, out_tokens, out_logp, gen_lens, eos, prompt_experts=None, out_experts=None
) -> GenerationOutput:
    """Prompt-major packed sequences and log-probs aligned like ``packed_logprobs``; with the
    recorded experts (per answer: its prompt's, its tokens'), their rows aligned with the tokens."""
    device = input_ids.device
    prompts = torch.split(input_ids, prompt_lens)
    gl = gen_lens.tolist()
    seqs, logps, seqlens, plens = [], [], [], []
    for i, L in enumerate(gl):
        p = prompts[i // n]
        seqs += [p, out_tokens[i, :L]]
        logps += [torch.zeros(len(p) - 1, device=device), out_logp[i, :L]]
        seqlens.append(len(p) + L)
        plens.append(len(p))
    in_response = torch.arange(out_tokens.shape[1], device=device)[None, :] < gen_lens[:, None]
    has_eos = (
        (torch.isin(out_tokens, eos) & in_response).any(dim=1)
        if eos.numel()
        else torch.zeros_like(in_response[:, 0])
    )
    return GenerationOutput(
        sequences=torch.cat(seqs),
        seqlens=seqlens,
        prompt_lens=plens,
        logprobs=torch.cat(logps),
        no_eos=~has_eos,
        routed_experts=None
        if out_experts is None
        else torch.cat([t for i, L in enumerate(gl) for t in (prompt_experts[i], out_experts[i, :L])]),
    )
