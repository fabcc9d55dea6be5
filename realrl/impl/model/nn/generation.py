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
only, not on which other prompts share the batch.
"""

from __future__ import annotations

import torch

from realrl.api.core.model_api import GenerationHyperparameters, GenerationOutput
from realrl.base import logging
from realrl.impl.model.kernels import DecodeWeights
from realrl.impl.model.modules.attention import activation_dtype
from realrl.impl.model.modules.kv_cache import DecodeContext, KVCache, decode_attention_kernels
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
    eos = eos_tensor(eos_token_id, device)
    ctx = model.packed_context(input_ids, cu_seqlens)
    prompt_lens = ctx.meta.seqlens
    if min(prompt_lens) < 1:
        raise ValueError(f"generate() needs non-empty prompts; got prompt lengths {prompt_lens}")
    n_prompts, max_new = len(prompt_lens), g.max_new_tokens
    model.check_length(max(prompt_lens) + max_new, "prompt + max_new_tokens")
    if prompt_keys is None:  # greedy reads no randomness: the global RNG is left as it was
        prompt_keys = torch.zeros(n_prompts, dtype=torch.long) if g.greedy else random_keys(n_prompts)
    elif prompt_keys.shape != (n_prompts,) or prompt_keys.dtype != torch.long:
        raise ValueError(
            f"prompt_keys must be int64 [{n_prompts}] (one per prompt); got {prompt_keys.dtype} "
            f"{tuple(prompt_keys.shape)}"
        )
    keys = answer_keys(prompt_keys.to(device), n)  # row of the cache -> its sequence's key
    dtype = activation_dtype(model.dtype, device)  # bf16 under autocast with fp32 weights
    lens_t = torch.tensor(prompt_lens, device=device)
    mode = decoding_mode(model, g, device)
    if mode == "eager":
        return _eager_decode(model, input_ids, ctx, lens_t, keys, g, eos, dtype)
    n_seqs = n_prompts * n
    capacity = cache_capacity(max(prompt_lens), max_new)
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


def decoding_mode(model, g: GenerationHyperparameters, device: torch.device) -> str:
    """How ``model``'s decoding steps run on ``device``: ``choose_decoding`` with the model's facts
    (split by tensor parallelism: its layers' weights are DTensors; sharded by FSDP: ``is_fsdp``,
    also inside ``gathered()``, where the weights are whole and plain)."""
    tensor_parallel = len(model.layers) > 0 and is_dtensor(model.layers[0].attn.q.weight)
    return choose_decoding(g.decoding, device.type, tensor_parallel, is_fsdp(model))


def choose_decoding(
    requested: str, device_type: str, tensor_parallel: bool = False, fsdp: bool = False
) -> str:
    """The decoding mode for ``decoding=requested`` on ``device_type``: "auto" is "cuda_graph" on a
    CUDA device for a model split neither by tensor parallelism nor by FSDP, else "eager".

    Tensor parallelism: a step's collectives run inside the layers, and the fixed-shape step does
    not lay its inputs out over the mesh; only "eager" runs such a model. FSDP: generation runs
    with every unit's weights gathered (``parallel/fsdp.gathered``), yet FSDP's hooks still run
    around each block's forward, and a block called outside the root's forward (as decoding calls
    them) makes FSDP's all-gather streams wait on the current one: inside a capture that forks
    streams the graph never joins. So under FSDP no graph is captured: "auto" decodes eagerly,
    "static" (the same fixed-shape steps, uncaptured) runs, and "cuda_graph" is refused. A pure
    function: the choice is tested without a GPU."""
    if requested == "auto":
        return "cuda_graph" if device_type == "cuda" and not (tensor_parallel or fsdp) else "eager"
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
    cfg, device, n, max_new = model.config, input_ids.device, g.n, g.max_new_tokens
    prompt_lens = ctx.meta.seqlens
    n_prompts = len(prompt_lens)
    cache = KVCache(
        cfg.n_layers, n_prompts, model.local_kv_heads, max(prompt_lens) + max_new, cfg.head_dim, dtype, device
    )
    logits = _prefill(model, input_ids, ctx, lens_t, cache)
    cache.repeat_interleave(n)
    logits = logits.repeat_interleave(n, dim=0)
    lens = lens_t.repeat_interleave(n)
    max_len = max(prompt_lens)

    weights = DecodeWeights()  # decode-time projection weights, prepared once (kernels/weights.py)
    n_seqs = n_prompts * n
    live = torch.arange(n_seqs, device=device)  # row of the cache -> output sequence index
    out_tokens = torch.zeros(n_seqs, max_new, dtype=torch.long, device=device)
    out_logp = torch.zeros(n_seqs, max_new, dtype=torch.float32, device=device)
    gen_lens = torch.full((n_seqs,), max_new, dtype=torch.long, device=device)
    with decode_attention_kernels(device):
        for step in range(max_new):
            tokens, logp = next_tokens(logits, g, eos, step, keys)
            out_tokens[live, step] = tokens
            out_logp[live, step] = logp
            if step == max_new - 1:
                break
            if eos.numel() and not g.fixed_length:
                done = torch.isin(tokens, eos)
                if bool(done.any()):
                    gen_lens[live[done]] = step + 1
                    keep = (~done).nonzero().squeeze(-1)  # indices: one host sync, not one per tensor
                    if keep.numel() == 0:
                        break
                    live, keys, tokens, lens = live[keep], keys[keep], tokens[keep], lens[keep]
                    cache.select(keep)
                    max_len = int(lens.max())  # the longest row may have finished: attend less
            h = model.hidden_states(tokens, DecodeContext(cache, lens, max_len + 1, weights, ctx.impl))
            logits = linear(h, weights, model.head)
            lens = lens + 1
            max_len += 1
    return _assemble(input_ids, prompt_lens, n, out_tokens, out_logp, gen_lens, eos)


def _assemble(input_ids, prompt_lens, n, out_tokens, out_logp, gen_lens, eos) -> GenerationOutput:
    """Prompt-major packed sequences and log-probs aligned like ``packed_logprobs``."""
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
    )
