"""A KV cache for generation, and the two attention contexts a layer can run under.

The cache holds one row per live sequence ([B, Hkv, capacity, D] per layer). Rows of finished
sequences are dropped (``select``) so they stop costing compute; ``lens`` says how many slots of
each row are filled, and decoding masks the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from realrl.impl.model import kernels
from realrl.impl.model.modules.attention import PackedMeta, check_one_dtype, packed_attention
from realrl.impl.model.modules.shared_prefix import SharedPrefixes

if TYPE_CHECKING:
    from realrl.impl.model.nn.moe_stats import RouterLog
    from realrl.impl.model.nn.router_replay import ExpertRouting


class KVCache:
    """``first_layer``: the model layer the cache's first entry belongs to (a pipeline stage caches
    its own blocks only: ``n_layers`` entries from ``first_layer`` on)."""

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype,
        device,
        first_layer: int = 0,
    ):
        self.first_layer = first_layer
        shape = (batch, n_kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    # -- in place, for fixed-shape decoding (nn/static_decode.py): the tensors keep their address

    def rows(self, n: int) -> KVCache:
        """The first ``n`` rows, sharing this cache's memory."""
        view = KVCache.__new__(KVCache)
        view.first_layer = self.first_layer
        view.k, view.v = [t[:n] for t in self.k], [t[:n] for t in self.v]
        return view

    def compact_(self, rows: torch.Tensor) -> None:
        """Copy ``rows`` (indices, in order) to the front, in place."""
        n = rows.numel()
        for t in (*self.k, *self.v):
            t[:n] = t[rows]

    def fill_answers_(self, n: int) -> None:
        """Rows ``i * n`` (one per prompt, filled by prefill) copied to rows ``i * n + 1 .. i * n + n
        - 1``: the prompt's cache for each of its ``n`` answers, in place."""
        if n > 1:
            for t in (*self.k, *self.v):
                grouped = t.view(t.shape[0] // n, n, *t.shape[1:])
                grouped[:, 1:] = grouped[:, :1]

    def zero_(self) -> None:
        for t in (*self.k, *self.v):
            t.zero_()

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices or a bool mask), in that order."""
        self.k = [t[rows] for t in self.k]
        self.v = [t[rows] for t in self.v]

    def repeat_interleave(self, n: int) -> None:
        """Each row n times in a row: prompt-major copies for n answers per prompt."""
        if n > 1:
            self.k = [t.repeat_interleave(n, dim=0) for t in self.k]
            self.v = [t.repeat_interleave(n, dim=0) for t in self.v]

    def slots(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Flat indices [N * Hkv] into a layer viewed as [B * Hkv * capacity, D] for (row, position)
        pairs: writing through them is one index_copy_ (advanced-index assignment is far slower)."""
        _, h, cap, _ = self.k[0].shape
        heads = torch.arange(h, device=rows.device)
        return ((rows[:, None] * h + heads[None, :]) * cap + positions[:, None]).reshape(-1)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [N, Hkv, D] into the flat ``slots`` from :meth:`slots`, in the cache's dtype."""
        layer -= self.first_layer
        if k.dtype != self.k[layer].dtype or v.dtype != self.v[layer].dtype:
            raise ValueError(
                f"the KV cache holds {self.k[layer].dtype}; layer {layer} wrote keys in {k.dtype} and "
                f"values in {v.dtype} (the cache takes the activations' dtype: autocast's, else the weights')"
            )
        d = k.shape[-1]
        self.k[layer].view(-1, d).index_copy_(0, slots, k.reshape(-1, d))
        self.v[layer].view(-1, d).index_copy_(0, slots, v.reshape(-1, d))


@dataclasses.dataclass
class PackedContext:
    """Training forward or prefill: packed varlen attention; prefill also fills the cache.

    With ``shared`` (shared-prefix packing, no cache) the layers run on the compressed tokens
    and ``attend`` expands them to the original sequences; ``keep`` indices always name
    original tokens.
    """

    meta: PackedMeta
    impl: str
    dropout_p: float = 0.0
    cache: KVCache | None = None
    cache_slots: torch.Tensor | None = None  # from KVCache.slots: where each token's k/v go
    weight_cache: kernels.DecodeWeights | None = None  # prepared projection weights (decoding only)
    shared: SharedPrefixes | None = None
    router_log: RouterLog | None = None  # where sparse blocks record routing (a training forward)
    routing: ExpertRouting | None = None  # experts to replay or record (nn/router_replay.py)

    def __post_init__(self) -> None:
        if self.shared is not None and self.cache is not None:
            raise ValueError("shared-prefix packing does not fill a KV cache")
        self._positions = (
            self.meta.positions if self.shared is None else self.meta.positions[self.shared.represent]
        )

    @property
    def positions(self) -> torch.Tensor:
        return self._positions

    @property
    def max_position(self) -> int:
        return self.meta.max_seqlen

    def rows(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The rows of ``x`` (one per computed token) for the original tokens ``keep``."""
        return x[keep] if self.shared is None else x[self.shared.expand[keep]]

    def attend(self, layer: int, q, k, v, scale: float, window: int | None, keep=None) -> torch.Tensor:
        """[T, Hq, D], or [N, Hq, D] for the ``keep`` queries only (all tokens' k/v are cached)."""
        shared = None if self.shared is None else (self.shared.expand, self.shared.represent)
        out = packed_attention(q, k, v, self.meta, self.impl, scale, window, self.dropout_p, keep, shared)
        if self.cache is not None:  # after attention, which checks the dtypes first
            self.cache.write(layer, self.cache_slots, k, v)
        return out


def decode_attention_kernels(device: torch.device) -> contextlib.AbstractContextManager:
    """SDPA kernels for decoding steps. On CUDA, not cuDNN's: it builds a new execution plan
    for every new shape, and a decode step's shapes change every step (the cache grows, finished
    rows leave): measured 3 ms of host time per call on an H100 against ~50 us for the
    memory-efficient kernel, which takes the same additive mask (1B model, 64 prompts: 45 -> 28 ms
    per decoding step)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


@dataclasses.dataclass
class DecodeContext:
    """One new token per live sequence, attending to its cached prefix."""

    cache: KVCache
    lens: torch.Tensor  # long [B]: filled slots per row == the new token's position
    max_len: int  # max(lens) + 1: how far into the cache any row reaches
    weight_cache: kernels.DecodeWeights | None = None  # prepared once per generate call
    impl: str = "sdpa"  # the model's attention backend: cpu_varlen reads the cache in place
    routing: ExpertRouting | None = None  # where the step's experts are recorded (router replay)

    def __post_init__(self) -> None:
        rows = torch.arange(self.lens.shape[0], device=self.lens.device)
        self._slots = self.cache.slots(rows, self.lens)
        self._bias: dict[int | None, torch.Tensor] = {}  # by window, built when SDPA first needs one

    def _additive(self, keep: torch.Tensor) -> torch.Tensor:
        """bool [B, L] -> [B, 1, 1, L]: 0 where attended, -inf elsewhere."""
        bias = torch.zeros(keep.shape, dtype=self.cache.k[0].dtype, device=keep.device)
        return bias.masked_fill_(~keep, float("-inf"))[:, None, None, :]

    @property
    def positions(self) -> torch.Tensor:
        return self.lens

    @property
    def max_position(self) -> int:
        return self.max_len

    def _bias_for(self, window: int | None) -> torch.Tensor:
        window = window or None
        if window not in self._bias:
            slots = torch.arange(self.max_len, device=self.lens.device)
            keep = slots[None, :] <= self.lens[:, None]
            if window:
                keep &= slots[None, :] > self.lens[:, None] - window
            self._bias[window] = self._additive(keep)
        return self._bias[window]

    def attend(self, layer: int, q, k, v, scale: float, window: int | None) -> torch.Tensor:
        """q [B, Hq, D], k/v [B, Hkv, D] -> [B, Hq, D]: one query per row against its cached prefix.

        The query heads sharing a kv head (GQA) go in as that head's "query positions" (they
        share one key mask), so a single SDPA call covers them without expanding the cache:
        measured ~20x faster on CPU than baddbmm + softmax + bmm, or SDPA with enable_gqa.
        """
        check_one_dtype(q, k, v)
        self.cache.write(layer, self._slots, k, v)
        i = layer - self.cache.first_layer
        if self.impl == "cpu_varlen" and kernels.use_native("decode_attention", q, window=window):
            return kernels.decode_attention(q, self.cache.k[i], self.cache.v[i], self.lens, scale)
        if kernels.use_triton("decode_attention", q, cache=self.cache.k[i], window=window):
            return kernels.triton_decode_attention(q, self.cache.k[i], self.cache.v[i], self.lens, scale)
        B, hq, d = q.shape
        hkv = k.shape[1]
        keys = self.cache.k[i][:, :, : self.max_len]  # [B, Hkv, L, D], a view
        vals = self.cache.v[i][:, :, : self.max_len]
        out = F.scaled_dot_product_attention(
            q.reshape(B, hkv, hq // hkv, d), keys, vals, attn_mask=self._bias_for(window), scale=scale
        )
        return out.reshape(B, hq, d)
