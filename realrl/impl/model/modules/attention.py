"""Causal attention over packed variable-length sequences, with pluggable backends.

Every backend attends only within a sequence (``cu_seqlens`` bounds): packing never leaks
tokens across sequence boundaries. ``sdpa`` is exact on any device; ``flash_attn`` and
``torch_varlen`` are CUDA kernels that take the packed layout directly; ``cpu_varlen`` is the C
kernel of ``realrl.impl.model.kernels``, which runs it where its rule (``kernels.choose_kernel``)
picks it and ``sdpa`` elsewhere.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect

import torch
import torch.nn.functional as F

from realrl.impl.model import kernels
from realrl.impl.model.backend.config import ATTN_IMPLS


@dataclasses.dataclass
class PackedMeta:
    """What every layer needs about the packing, computed once per forward (one host sync)."""

    cu_seqlens: torch.Tensor  # int32 [B+1]
    seqlens: list[int]
    max_seqlen: int
    positions: torch.Tensor  # long [T], restarting at 0 per sequence
    pad_index: torch.Tensor  # long [T]: row * max_seqlen + position, the token's slot in a [B, Lmax] grid

    @functools.cached_property
    def slot_token(self) -> torch.Tensor:
        """long [B * Lmax]: the token in each grid slot (0 in padding slots)."""
        B, L, T = len(self.seqlens), self.max_seqlen, self.pad_index.shape[0]
        tokens = torch.arange(T, device=self.pad_index.device)
        return torch.zeros(B * L, dtype=torch.long, device=tokens.device).index_copy_(
            0, self.pad_index, tokens
        )

    @functools.cached_property
    def key_ranges(self) -> tuple[torch.Tensor, torch.Tensor]:
        """long [T] each: where each token's sequence starts, and how many tokens it attends to
        (itself and those before it): what the ``cpu_varlen`` kernel reads (``_cpu_varlen``)."""
        starts = self.cu_seqlens.long()[torch.div(self.pad_index, self.max_seqlen, rounding_mode="floor")]
        return starts, self.positions + 1

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: torch.Tensor, total: int) -> PackedMeta:
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError(
                f"cu_seqlens must be 1-D with B+1 >= 2 entries, got shape {tuple(cu_seqlens.shape)}"
            )
        bounds = cu_seqlens.tolist()
        seqlens = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
        if bounds[0] != 0 or bounds[-1] != total or min(seqlens) < 0:
            raise ValueError(
                f"cu_seqlens must rise from 0 to len(input_ids)={total}; got {bounds[:4]}...{bounds[-1]}"
            )
        device = cu_seqlens.device
        lens = torch.tensor(seqlens, device=device)
        starts = torch.repeat_interleave(cu_seqlens[:-1].long(), lens, output_size=total)
        positions = torch.arange(total, device=device) - starts
        max_len = max(seqlens)
        rows = torch.repeat_interleave(torch.arange(len(seqlens), device=device), lens, output_size=total)
        return cls(cu_seqlens.to(torch.int32), seqlens, max_len, positions, rows * max_len + positions)


def flash_attn_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def torch_varlen_available() -> bool:
    if not torch.cuda.is_available():
        return False
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


HALF_DTYPES = (torch.float16, torch.bfloat16)  # what the CUDA varlen kernels take


def activation_dtype(weight_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype projections produce: autocast's where it is on for ``device`` (fp32 master
    weights, bf16 compute), else the weights'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return weight_dtype


def resolve_attn_impl(impl: str, device: torch.device | str | None, dtype: torch.dtype | None = None) -> str:
    """``auto`` -> flash_attn, then torch_varlen on CUDA with fp16/bf16 activations; cpu_varlen on
    the CPU with fp32 activations where its kernel builds; sdpa otherwise (fp32 on a GPU
    included: the varlen CUDA kernels have no fp32 path)."""
    if impl not in ATTN_IMPLS:
        raise ValueError(f"unknown attn_impl {impl!r}; expected one of {ATTN_IMPLS}")
    on_cuda = torch.device(device or "cpu").type == "cuda"
    half = dtype is None or dtype in HALF_DTYPES
    if impl == "auto":
        if on_cuda and half and flash_attn_available():
            return "flash_attn"
        if on_cuda and half and torch_varlen_available():
            return "torch_varlen"
        if not on_cuda and dtype in (None, torch.float32) and kernels.available("varlen_attention"):
            return "cpu_varlen"
        return "sdpa"
    if impl == "cpu_varlen":
        if on_cuda:
            raise ValueError(
                f"attn_impl='cpu_varlen' is a CPU kernel; use 'auto' or a CUDA backend on {device}"
            )
        if not kernels.available("varlen_attention"):
            raise ValueError(
                "attn_impl='cpu_varlen' but its C kernel could not be built (it needs a C compiler: cc, "
                f"gcc, clang or $CC; and {kernels.DISABLE_ENV} unset); use attn_impl='sdpa' or 'auto'"
            )
        return impl
    if impl in ("flash_attn", "torch_varlen") and not on_cuda:
        raise ValueError(f"attn_impl={impl!r} needs a CUDA device; use 'sdpa' (or 'auto') on {device}")
    if impl in ("flash_attn", "torch_varlen") and not half:
        raise ValueError(
            f"attn_impl={impl!r} needs fp16 or bf16 activations, got {dtype}: load the model with "
            f"dtype=bfloat16 (or train under the engine's bf16 autocast), or use attn_impl='auto'/'sdpa'"
        )
    if impl == "flash_attn" and not flash_attn_available():
        raise ValueError("attn_impl='flash_attn' but the flash_attn package is not installed")
    return impl


def check_one_dtype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Queries, keys and values reach attention in one dtype: the CUDA varlen kernels and the KV
    cache take nothing else, and SDPA under autocast would cast a mismatch away on the CPU only.
    A mismatch is a bug upstream (a norm or a rotary table that changed the dtype of q or k), so
    it is raised here, on every backend and device, where it shows."""
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(
            f"attention needs queries, keys and values of one dtype; got q {q.dtype}, k {k.dtype}, "
            f"v {v.dtype} (under autocast, whatever produces them must return the activations' dtype)"
        )


def _window_mask(L: int, window: int, device) -> torch.Tensor:
    i = torch.arange(L, device=device)
    d = i[:, None] - i[None, :]
    return (d >= 0) & (d < window)


def _query_grid(meta: PackedMeta, keep: torch.Tensor, window: int | None):
    """Where the kept queries go in a [B, Lq] grid (Lq = most kept tokens of one sequence) and
    the mask [B, 1, Lq, Lmax] that lets each attend to its own sequence up to its position.
    ``keep`` must be ascending (tokens in packed order). Empty grid slots query position 0: they
    attend to one key, never to none (no NaN), and their outputs are dropped."""
    B, L = len(meta.seqlens), meta.max_seqlen
    rows = meta.pad_index[keep] // L
    pos = meta.positions[keep]
    counts = torch.bincount(rows, minlength=B)
    Lq = int(counts.max()) if keep.numel() else 1
    first = torch.cumsum(counts, 0) - counts
    slot = rows * Lq + (torch.arange(keep.numel(), device=keep.device) - first[rows])
    q_pos = torch.zeros(B * Lq, dtype=torch.long, device=keep.device).index_copy(0, slot, pos).view(B, Lq)
    keys = torch.arange(L, device=keep.device)
    mask = keys[None, None, :] <= q_pos[:, :, None]
    if window:
        mask &= keys[None, None, :] > q_pos[:, :, None] - window
    return slot, Lq, mask[:, None]


def _sdpa_packed(
    q, k, v, meta: PackedMeta, scale: float, window: int | None, dropout_p: float, keep=None, shared=None
):
    """Exact on any device: scatter into a right-padded [B, H, Lmax, D] grid, one batched SDPA call.

    With right padding, a causal mask already keeps every real query away from padding (pad keys
    sit after the query), so no key-padding mask is needed and outputs at pad slots are dropped.
    Measured on CPU (benchmarks/bench_forward.py, 32 sequences of 16-128 tokens) this beats one
    SDPA call per sequence by ~2x forward and more in backward, and a block-diagonal mask over all
    T tokens wastes O(T^2) work.

    With ``keep`` only those queries are computed (every token stays a key and value): one query
    per sequence, as a reward model reads, costs a [B, 1, Lmax] attention instead of [B, Lmax, Lmax].

    With ``shared`` (``(expand, represent)`` of shared-prefix packing) q, k and v hold the compressed
    tokens: the grid is one gather from them (no expanded copy, no zero-filled scatter), and the
    output comes back for the compressed tokens.
    """
    B, L = len(meta.seqlens), meta.max_seqlen
    expand, represent = shared if shared is not None else (None, None)
    # Shared prefixes: each slot reads its compressed token in one gather. Pad slots read token
    # 0: causal masking keeps them away from real queries and their outputs are dropped, so the
    # gradient they send back is exactly zero.
    slot_src = None if expand is None else expand[meta.slot_token]

    def scatter_grid(x: torch.Tensor, index: torch.Tensor = meta.pad_index, length: int = L) -> torch.Tensor:
        flat = x.new_zeros(B * length, x.shape[1], x.shape[2]).index_copy(0, index, x)
        return flat.view(B, length, x.shape[1], x.shape[2]).transpose(1, 2)

    def grid(x: torch.Tensor) -> torch.Tensor:
        if slot_src is None:
            return scatter_grid(x)
        return x[slot_src].view(B, L, x.shape[1], x.shape[2]).transpose(1, 2)

    if keep is not None:
        slot, Lq, mask = _query_grid(meta, keep, window)
        out = F.scaled_dot_product_attention(
            scatter_grid(q[keep] if expand is None else q[expand[keep]], slot, Lq),
            grid(k),
            grid(v),
            attn_mask=mask,
            dropout_p=dropout_p,
            scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        return out.transpose(1, 2).reshape(B * Lq, q.shape[1], q.shape[2])[slot]
    mask = _window_mask(L, window, q.device) if window and window < L else None
    out = F.scaled_dot_product_attention(
        grid(q),
        grid(k),
        grid(v),
        attn_mask=mask,
        is_causal=mask is None,
        dropout_p=dropout_p,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    # read the real (or compressed) tokens straight off the [B, L] grid: no copy of the whole grid
    index = meta.pad_index if represent is None else meta.pad_index[represent]
    return out.transpose(1, 2)[index // L, index % L]


def _flash_attn(q, k, v, meta: PackedMeta, scale: float, window: int | None, dropout_p: float, keep=None):
    from flash_attn import flash_attn_varlen_func  # lazily: CUDA-only optional dependency

    cu = meta.cu_seqlens
    win = (window - 1, 0) if window else (-1, -1)
    return flash_attn_varlen_func(
        q,
        k,
        v,
        cu,
        cu,
        meta.max_seqlen,
        meta.max_seqlen,
        dropout_p,
        softmax_scale=scale,
        causal=True,
        window_size=win,
    )


@functools.cache
def _varlen_params() -> frozenset[str]:
    """The keyword arguments this torch's ``varlen_attn`` takes: 2.10 has ``is_causal``, 2.11 adds
    ``window_size``, later releases ``enable_gqa``."""
    from torch.nn.attention.varlen import varlen_attn

    return frozenset(inspect.signature(varlen_attn).parameters)


def _torch_varlen(q, k, v, meta: PackedMeta, scale: float, window: int | None, dropout_p: float, keep=None):
    from torch.nn.attention.varlen import varlen_attn

    if dropout_p > 0:
        raise ValueError(
            "attn_impl='torch_varlen' has no attention dropout; set attn_pdrop=0 or use flash_attn/sdpa"
        )
    params = _varlen_params()
    options: dict = {"scale": scale}
    if "window_size" in params:
        options["window_size"] = (window - 1, 0) if window else (-1, 0)
    elif window:
        raise ValueError(
            f"attn_impl='torch_varlen' needs torch >= 2.11 for sliding-window attention (this is "
            f"{torch.__version__}); use attn_impl='sdpa' or install flash_attn"
        )
    else:
        options["is_causal"] = True
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            options["enable_gqa"] = True
        else:  # older releases want one key/value head per query head
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    cu = meta.cu_seqlens
    return varlen_attn(q, k, v, cu, cu, meta.max_seqlen, meta.max_seqlen, **options)


def _cpu_varlen(q, k, v, meta: PackedMeta, scale: float, keep=None, shared=None) -> torch.Tensor:
    """``packed_attention`` on the C kernel (``kernels.varlen_attention``): each query attends to
    the keys of its sequence up to itself, read in place; under ``shared`` the keys are the
    compressed tokens (``expand`` maps a token to its compressed row)."""
    expand, represent = shared if shared is not None else (None, None)
    starts, counts = meta.key_ranges
    if keep is not None:
        queries = q[keep] if expand is None else q[expand[keep]]
        starts, counts = starts[keep], counts[keep]
    elif represent is not None:
        queries, starts, counts = q, starts[represent], counts[represent]
    else:
        queries = q
    return kernels.varlen_attention(queries, k, v, starts, counts, meta.max_seqlen, scale, expand)


_BACKENDS = {"sdpa": _sdpa_packed, "flash_attn": _flash_attn, "torch_varlen": _torch_varlen}


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: PackedMeta,
    impl: str,
    scale: float,
    window: int | None = None,
    dropout_p: float = 0.0,
    keep: torch.Tensor | None = None,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D], causal within each sequence; with ``keep``
    (ascending token indices) only those queries' outputs, [N, Hq, D]. ``sdpa`` computes only
    those queries; the varlen CUDA kernels compute all and select (they are cheap per query).

    ``shared`` = ``(expand, represent)`` of shared-prefix packing: q, k, v hold the Tc compressed
    tokens and the output is [Tc, Hq, D] (``keep`` still names original tokens)."""
    check_one_dtype(q, k, v)
    if impl == "cpu_varlen" and kernels.use_native("varlen_attention", q, window=window, dropout_p=dropout_p):
        return _cpu_varlen(q, k, v, meta, scale, keep, shared)
    if impl in ("sdpa", "cpu_varlen"):  # what the kernel does not take is sdpa's
        return _sdpa_packed(q, k, v, meta, scale, window, dropout_p, keep, shared)
    if shared is not None:
        expand, represent = shared
        out = _BACKENDS[impl](q[expand], k[expand], v[expand], meta, scale, window, dropout_p)
        return out[keep] if keep is not None else out[represent]
    out = _BACKENDS[impl](q, k, v, meta, scale, window, dropout_p)
    return out if keep is None else out[keep]
