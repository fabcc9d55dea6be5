"""Decoding with fixed shapes, so that a step is captured once as a CUDA graph and replayed.

The eager loop (``nn/generation.py``) launches every layer's kernels from Python at each step and
shrinks its tensors as sequences finish. On a GPU that per-step overhead, not the bandwidth the
weights need, sets its speed: a 1.1B model in bf16 took ~25 ms per step for 64 sequences on an
H100, where reading the 2.2 GB of weights takes under 1 ms. Here every tensor a step touches has a
fixed shape and address for the whole call:

- the KV cache is allocated once, one row per sequence, ``cache_capacity`` slots long;
- each row's last token, length (the next position), sampling key, finished flag and output row,
  and the step counter, are tensors: sampling (``nn/sampling.py``, counter-based, so it needs no
  generator state), the EOS bookkeeping and the writes of tokens and log-probs happen inside the
  step;
- attention reads the whole capacity under a mask built from the lengths.

A finished sequence keeps its row, writing to a spare output row, until the live sequences fit a
smaller batch bucket (``batch_buckets``: the batch, then powers of two); then the live rows move
to the front (``DecodeState.compact_``) and that bucket's step runs. The host reads the finished
flags only every ``check_every`` steps, so it can queue steps ahead of the device.

On CUDA each bucket's step is a ``torch.cuda.CUDAGraph`` (``StepGraphs``), captured per generate
call; elsewhere the same step runs eagerly (``decoding="static"``), which is how its logic is
tested on a CPU: it gives the tokens of the eager loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.kernels import DecodeWeights
from realrl.impl.model.modules.kv_cache import DecodeContext, KVCache, decode_attention_kernels
from realrl.impl.model.nn.sampling import is_eos, next_tokens
from realrl.impl.model.nn.transformer_block import linear

DEFAULT_CHECK_EVERY = 8  # steps between two looks at the finished flags (each one a host sync)
CAPTURE_ERROR_MODE = "thread_local"  # see ``capture``


def batch_buckets(n: int) -> tuple[int, ...]:
    """The batch sizes a step is built for, largest first: ``n``, then every power of two below
    it. The live sequences always fit one no more than twice their number."""
    if n < 1:
        raise ValueError(f"batch_buckets needs n >= 1, got {n}")
    out = [n]
    b = 1 << ((n - 1).bit_length() - 1) if n > 1 else 0
    while b >= 1:
        out.append(b)
        b //= 2
    return tuple(out)


def bucket_for(n_live: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds ``n_live`` rows."""
    fits = [b for b in buckets if b >= n_live]
    if not fits:
        raise ValueError(f"{n_live} rows fit no bucket of {buckets}")
    return min(fits)


def cache_capacity(max_prompt_len: int, max_new_tokens: int) -> int:
    """Cache slots per row: the longest prompt and every generated token but the last, which is
    sampled and never fed back."""
    return max_prompt_len + max_new_tokens - 1


def cache_bytes(
    rows: int, capacity: int, n_layers: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Memory of a static KV cache (keys and values of every layer)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * n_layers * rows * n_kv_heads * capacity * head_dim * itemsize


@dataclasses.dataclass
class DecodeState:
    """Everything a step reads and writes besides the cache, at fixed addresses. Row r of the
    batch is sequence ``seq[r]``; padding rows (and finished ones) write to the spare output row
    ``n_seqs``."""

    tokens: torch.Tensor  # long [B]: each row's last token, the next step's input
    lens: torch.Tensor  # long [B]: tokens in the row's cache, the position of its next token
    keys: torch.Tensor  # long [B]: the row's sampling key
    finished: torch.Tensor  # bool [B]
    seq: torch.Tensor  # long [B]: the row's output sequence
    logits: torch.Tensor  # [B, V]: the row's next-token logits
    step: torch.Tensor  # long []: the decoding step about to sample
    out_tokens: torch.Tensor  # long [n_seqs + 1, max_new]
    out_logp: torch.Tensor  # float [n_seqs + 1, max_new]
    gen_lens: torch.Tensor  # long [n_seqs + 1]

    @property
    def spare(self) -> int:
        return self.out_tokens.shape[0] - 1

    @classmethod
    def empty(cls, rows: int, vocab: int, max_new: int, logits_dtype: torch.dtype, device) -> DecodeState:
        long = dict(dtype=torch.long, device=device)
        return cls(
            tokens=torch.zeros(rows, **long),
            lens=torch.zeros(rows, **long),
            keys=torch.zeros(rows, **long),
            finished=torch.ones(rows, dtype=torch.bool, device=device),
            seq=torch.full((rows,), rows, **long),
            logits=torch.zeros(rows, vocab, dtype=logits_dtype, device=device),
            step=torch.zeros((), **long),
            out_tokens=torch.zeros(rows + 1, max_new, **long),
            out_logp=torch.zeros(rows + 1, max_new, dtype=torch.float32, device=device),
            gen_lens=torch.full((rows + 1,), max_new, **long),
        )

    def start(self, logits: torch.Tensor, lens: torch.Tensor, keys: torch.Tensor) -> None:
        """Step 0 after prefill, written in place (a captured step keeps reading these tensors)."""
        n = logits.shape[0]
        self.logits.copy_(logits)
        self.lens.copy_(lens)
        self.keys.copy_(keys)
        self.tokens.zero_()
        self.finished.zero_()
        self.seq.copy_(torch.arange(n, device=self.seq.device))
        self.step.zero_()
        self.out_tokens.zero_()
        self.out_logp.zero_()
        self.gen_lens.fill_(self.out_tokens.shape[1])

    def rewind(self) -> None:
        """Back to the empty state's counters: step 0, empty rows, every row finished and writing
        to the spare row. A rehearsal step run from here stays inside the output columns and the
        cache, however few tokens the call generates."""
        self.step.zero_()
        self.lens.zero_()
        self.finished.fill_(True)
        self.seq.fill_(self.spare)

    def compact_(self, cache: KVCache, live: torch.Tensor, bucket: int) -> None:
        """Move the ``live`` rows (indices, in order) to the front; rows ``len(live)..bucket - 1``
        become padding (finished, writing to the spare row)."""
        n = live.numel()
        for t in (self.tokens, self.lens, self.keys, self.finished, self.seq, self.logits):
            t[:n] = t[live]
        self.finished[n:bucket] = True
        self.seq[n:bucket] = self.spare
        cache.compact_(live)


def sample_and_record(
    state: DecodeState, rows: int, g: GenerationHyperparameters, eos: torch.Tensor, stops_at_eos: bool
) -> None:
    """Sample the next token of rows ``0..rows - 1`` and write it (and its log-prob) to their
    sequences; a row whose token is an EOS finishes, its length recorded."""
    tokens, logp = next_tokens(state.logits[:rows], g, eos, state.step, state.keys[:rows])
    finished = state.finished[:rows]
    out_row = torch.where(finished, state.spare, state.seq[:rows])
    column = state.step.expand(rows)
    state.out_tokens.index_put_((out_row, column), tokens)
    state.out_logp.index_put_((out_row, column), logp)
    if stops_at_eos:
        done = is_eos(tokens, eos) & ~finished
        ended = torch.where(done, state.seq[:rows], state.spare)
        state.gen_lens.index_put_((ended,), (state.step + 1).expand(rows))
        finished |= done
    state.tokens[:rows] = tokens


def advance(
    model, state: DecodeState, cache: KVCache, rows: int, capacity: int, weights: DecodeWeights
) -> None:
    """Feed rows ``0..rows - 1`` their last token: their next logits, one more cached token each."""
    ctx = DecodeContext(cache.rows(rows), state.lens[:rows], capacity, weights, "sdpa")
    hidden = model.hidden_states(state.tokens[:rows], ctx)
    state.logits[:rows] = linear(hidden, weights, model.head)
    state.lens[:rows] += 1
    state.step += 1


def rehearse(run: Callable[[int], None], buckets: tuple[int, ...], rewind: Callable[[], None]) -> None:
    """Run each bucket's step once, each from a rewound state: a step advances the step counter
    and the rows' lengths, and one rehearsal per bucket in a row would write past the output
    columns of a call that generates fewer tokens than there are buckets (64 rows have 7 buckets;
    a 4-token warm-up call then indexed column 4 on an H100)."""
    for b in buckets:
        rewind()
        run(b)
    rewind()


class StepGraphs:
    """``run(b)`` captured as one CUDA graph per bucket ``b``, after a rehearsal on a side stream
    (lazily built things: prepared weights, rotary tables, library workspaces). The rehearsal
    writes the state and the cache ``run`` reads: set both before the first replay."""

    def __init__(
        self,
        run: Callable[[int], None],
        buckets: tuple[int, ...],
        device: torch.device,
        rewind: Callable[[], None],
    ):
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side), _autocast_without_cache(device):
            rehearse(run, buckets, rewind)
        current.wait_stream(side)
        self.graphs = {b: capture(run, b, device) for b in buckets}

    def __call__(self, b: int) -> None:
        self.graphs[b].replay()


def capture(run: Callable[[int], None], b: int, device: torch.device, cuda: Any = torch.cuda) -> Any:
    """``run(b)`` captured as a CUDA graph, in the thread-local capture mode. A model worker's
    other threads (NCCL's watchdog, gloo's, the request and heartbeat threads) call the CUDA API
    while this one captures; in the default, global mode a call that is unsafe during a capture
    from any thread of the process invalidates it, in the thread-local mode only this thread's
    calls do. ``cuda``: ``torch.cuda`` (its ``CUDAGraph`` and ``graph``), or what stands in for it."""
    graph = cuda.CUDAGraph()
    with cuda.graph(graph, capture_error_mode=CAPTURE_ERROR_MODE), _autocast_without_cache(device):
        run(b)
    return graph


def _autocast_without_cache(device: torch.device) -> contextlib.AbstractContextManager:
    """Under autocast, keep casting inside the graph: a cached cast made outside it would be freed
    when the autocast region ends, under a graph that still reads it."""
    if not torch.is_autocast_enabled(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, torch.get_autocast_dtype(device.type), cache_enabled=False)


@dataclasses.dataclass
class DecodeTrace:
    """What a static decode did, for tests and benchmarks."""

    buckets: list[int] = dataclasses.field(default_factory=list)  # the bucket of each step
    captured: tuple[int, ...] = ()  # buckets captured as CUDA graphs (none when eager)


class StaticDecoder:
    """Fixed-shape decoding over ``cache`` (one row per sequence, ``cache_capacity`` slots). Built
    (and, with ``use_graphs``, captured) before the prefill fills the cache: the capture's warm-up
    writes into the cache, which is cleared after it."""

    def __init__(
        self,
        model,
        cache: KVCache,
        vocab: int,
        logits_dtype: torch.dtype,
        g: GenerationHyperparameters,
        eos: torch.Tensor,
        use_graphs: bool,
        check_every: int = DEFAULT_CHECK_EVERY,
        trace: DecodeTrace | None = None,
    ):
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.model, self.cache, self.g, self.eos, self.check_every = model, cache, g, eos, check_every
        device = eos.device
        self.buckets = batch_buckets(cache.batch)
        self.state = DecodeState.empty(cache.batch, vocab, g.max_new_tokens, logits_dtype, device)
        self.weights = DecodeWeights()
        self.stops_at_eos = eos.numel() > 0 and not g.fixed_length
        self.trace = trace if trace is not None else DecodeTrace()
        self.step: Callable[[int], None] = self._step
        if use_graphs:
            with decode_attention_kernels(device):
                self.step = StepGraphs(self._step, self.buckets, device, self.state.rewind)
            self.trace.captured = self.buckets
            cache.zero_()

    def _step(self, rows: int) -> None:
        sample_and_record(self.state, rows, self.g, self.eos, self.stops_at_eos)
        advance(self.model, self.state, self.cache, rows, self.cache.capacity, self.weights)

    def decode(
        self, logits: torch.Tensor, lens: torch.Tensor, keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """From the prefill's next-token ``logits`` [N, V], cache lengths ``lens`` [N] and sampling
        ``keys`` [N]: (tokens [N, max_new], their log-probs, generated lengths [N])."""
        state, buckets, n_seqs = self.state, self.buckets, self.cache.batch
        state.start(logits, lens, keys)
        bucket = buckets[0]
        with decode_attention_kernels(logits.device):
            for k in range(self.g.max_new_tokens - 1):
                self.step(bucket)
                self.trace.buckets.append(bucket)
                if self.stops_at_eos and (k + 1) % self.check_every == 0:
                    live = (~state.finished[:bucket]).nonzero().squeeze(-1)  # the host sync
                    if live.numel() == 0:
                        break
                    smaller = bucket_for(live.numel(), buckets)
                    if smaller < bucket:
                        state.compact_(self.cache, live, smaller)
                        bucket = smaller
            else:  # the last token: sampled, never fed back
                sample_and_record(state, bucket, self.g, self.eos, self.stops_at_eos)
                self.trace.buckets.append(bucket)
        return state.out_tokens[:n_seqs], state.out_logp[:n_seqs], state.gen_lens[:n_seqs]
