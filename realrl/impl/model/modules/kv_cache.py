"""A KV cache for generation, and the two attention contexts a layer can run under.

The cache holds one row per live sequence ([B, Hkv, capacity, D] per layer). Rows of finished
sequences are dropped (``select``) so they stop costing compute; ``lens`` says how many slots of
each row are filled, and decoding masks the rest.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from realrl.impl.model.modules.attention import PackedMeta, packed_attention


class KVCache:
    def __init__(
        self, n_layers: int, batch: int, n_kv_heads: int, capacity: int, head_dim: int, dtype, device
    ):
        shape = (batch, n_kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices or a bool mask), in that order."""
        self.k = [t[rows] for t in self.k]
        self.v = [t[rows] for t in self.v]

    def repeat_interleave(self, n: int) -> None:
        """Each row n times in a row: prompt-major copies for n answers per prompt."""
        if n > 1:
            self.k = [t.repeat_interleave(n, dim=0) for t in self.k]
            self.v = [t.repeat_interleave(n, dim=0) for t in self.v]


@dataclasses.dataclass
class PackedContext:
    """Training forward or prefill: packed varlen attention; prefill also fills the cache."""

    meta: PackedMeta
    impl: str
    dropout_p: float = 0.0
    cache: KVCache | None = None
    cache_rows: torch.Tensor | None = None  # long [T]: which cache row each token goes to

    @property
    def positions(self) -> torch.Tensor:
        return self.meta.positions

    @property
    def max_position(self) -> int:
        return self.meta.max_seqlen

    def attend(self, layer: int, q, k, v, scale: float, window: int | None) -> torch.Tensor:
        if self.cache is not None:
            self.cache.k[layer][self.cache_rows, :, self.meta.positions] = k
            self.cache.v[layer][self.cache_rows, :, self.meta.positions] = v
        return packed_attention(q, k, v, self.meta, self.impl, scale, window, self.dropout_p)


@dataclasses.dataclass
class DecodeContext:
    """One new token per live sequence, attending to its cached prefix."""

    cache: KVCache
    lens: torch.Tensor  # long [B]: filled slots per row == the new token's position
    max_len: int  # max(lens) + 1: how far into the cache any row reaches

    def __post_init__(self) -> None:
        slots = torch.arange(self.max_len, device=self.lens.device)
        self._mask = (slots[None, :] <= self.lens[:, None])[:, None, None, :]  # [B, 1, 1, L]
        self._rows = torch.arange(self.lens.shape[0], device=self.lens.device)
        self._window_masks: dict[int, torch.Tensor] = {}

    @property
    def positions(self) -> torch.Tensor:
        return self.lens

    @property
    def max_position(self) -> int:
        return self.max_len

    def _mask_for(self, window: int | None) -> torch.Tensor:
        if not window:
            return self._mask
        if window not in self._window_masks:
            slots = torch.arange(self.max_len, device=self.lens.device)
            inside = slots[None, :] > self.lens[:, None] - window
            self._window_masks[window] = self._mask & inside[:, None, None, :]
        return self._window_masks[window]

    def attend(self, layer: int, q, k, v, scale: float, window: int | None) -> torch.Tensor:
        """q [B, Hq, D], k/v [B, Hkv, D] -> [B, Hq, D]."""
        ck, cv = self.cache.k[layer], self.cache.v[layer]
        ck[self._rows, :, self.lens] = k
        cv[self._rows, :, self.lens] = v
        keys, vals = ck[:, :, : self.max_len], cv[:, :, : self.max_len]
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),
            keys,
            vals,
            attn_mask=self._mask_for(window),
            scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        return out.squeeze(2)
