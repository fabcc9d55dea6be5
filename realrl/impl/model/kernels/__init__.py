"""Native kernels (C on the CPU, Triton on a GPU) and the one rule that picks them.

The model code (``modules/``, ``nn/``) calls the entry points here and never asks which device
it is on: ``rms_norm`` runs its C kernel, its Triton kernel or the torch expression; the attention backends ask
``use_native("varlen_attention" | "decode_attention", q, ...)`` and otherwise run ``sdpa``;
``DecodeWeights`` holds the projection weights a generate call prepares once.

- ``dispatch.py``: ``choose_kernel`` (C kernel or torch, and why), ``use_native``, ``torch_only``
- ``native.py``: builds ``*.c`` here with the system C compiler on first use, cached on disk
- ``attention.py`` + ``varlen_attention.c``: packed varlen attention, and decoding on a KV cache;
  ``triton_attention.py``: decoding on a KV cache on a GPU (``dispatch.use_triton``)
- ``norm.py`` + ``rms_norm.c``: RMSNorm; ``triton_norm.py``: its GPU kernel for calls without a
  gradient (``dispatch.use_triton``)
- ``weights.py``: ``DecodeWeights``

Without a C compiler or Triton (or with ``REALRL_NO_NATIVE=1``) every op runs its torch code, with
the same results up to float rounding.
"""

from realrl.impl.model.kernels.attention import decode_attention, varlen_attention
from realrl.impl.model.kernels.dispatch import (
    KERNELS,
    NATIVE,
    TORCH,
    available,
    choose_kernel,
    torch_only,
    use_native,
    use_triton,
)
from realrl.impl.model.kernels.native import DISABLE_ENV
from realrl.impl.model.kernels.norm import rms_norm
from realrl.impl.model.kernels.triton_attention import triton_decode_attention
from realrl.impl.model.kernels.weights import DecodeWeights

__all__ = [
    "DISABLE_ENV",
    "KERNELS",
    "NATIVE",
    "TORCH",
    "DecodeWeights",
    "available",
    "choose_kernel",
    "decode_attention",
    "rms_norm",
    "torch_only",
    "triton_decode_attention",
    "use_native",
    "use_triton",
    "varlen_attention",
]
