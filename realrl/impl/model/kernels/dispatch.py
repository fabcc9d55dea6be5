"""Which code runs an op, its C kernel or its torch code: one rule for every native kernel.

``choose_kernel`` is the rule; ``use_native`` hands it the facts of one call. A C kernel runs when

1. the call is on the CPU in fp32, the kernel covers it (``Kernel.covers``: no sliding window or
   attention dropout, head dims up to 256, plain tensors: the kernels read raw pointers, which a
   tensor subclass such as a collective's not-yet-waited output does not offer) and, where autograd
   needs a gradient, the kernel has a backward;
2. it uses as many threads as torch would for the same call: the kernel spreads its own work over
   ``torch.get_num_threads()`` threads, or there is one thread, or torch would keep this call on
   one thread anyway (at most ``Kernel.torch_serial_up_to`` elements);
3. its library is built (a C compiler works, ``REALRL_NO_NATIVE`` is unset) and ``torch_only``
   is not in force;
4. it is not traced by ``torch.compile`` (``nn/compiled_blocks.py``): there the torch code runs,
   which Inductor fuses with its neighbours (the attention kernels run eagerly behind a graph break).

What was measured (``benchmarks/bench_cpu_kernels.py``, inside the toy RLHF steps, CPU time):

- ``varlen_attention`` (training, prefill, inference): spreads over the torch threads itself, so
  it always runs; on one thread ~1.1-1.3x faster than ``sdpa`` per step. A call goes on fewer
  threads than it has when it has under ``MIN_TRIPLES_PER_THREAD`` (query, key, head) triples per
  thread: smaller pieces cost more in thread hand-offs than they save (``kernel_threads``).
- ``decode_attention`` (one decoding step, reading the KV cache in place): one thread. SDPA
  spreads a step's (row, head) pairs over every thread, so the kernel runs on one thread only
  (``bench_generate.py``, 2 threads: SDPA ahead by 5-10 %; 1 thread: the kernel ahead).
- ``rms_norm``: one thread, one pass forward and one backward where the torch expression makes
  five and eight (~1.1x on a reward-model step). Torch runs an elementwise op on one thread up to
  ATen's grain size (32,768 elements) and on all of them above it, so with several threads the
  kernel takes only calls up to that size.

On a GPU, ``use_triton`` is the rule, for dense CUDA tensors (plain ones, or a module's
``nn.Parameter`` of one: not a DTensor) with Triton importable, ``REALRL_NO_NATIVE`` unset and
``torch_only`` not in force: ``rms_norm`` runs one Triton kernel (``triton_norm.py``) where the
call needs no gradient (decoding, prefill, inference; a training forward keeps the torch
expression, whose backward autograd knows), and ``decode_attention`` (``triton_attention.py``)
reads each row's filled cache slots only, in fp16/bf16 without a sliding window (SDPA otherwise).
Under Triton's interpreter (``TRITON_INTERPRET=1``) ``rms_norm`` runs its kernel on CPU tensors
too, where the C kernel does not take the call: how the CPU tests run it inside a model.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import torch

from realrl.impl.model.kernels import native, triton_attention, triton_norm

NATIVE, TORCH = "native", "torch"
# torch runs an elementwise op on one thread up to this many elements (ATen's GRAIN_SIZE)
TORCH_GRAIN_SIZE = 32768
# below this many (query, key, head) triples per thread an attention call uses fewer threads
MIN_TRIPLES_PER_THREAD = 200_000
MAX_HEAD_DIM = 256  # the attention kernel's buffers (varlen_attention.c)


def _attention_covers(x: torch.Tensor, weight, window: int | None, dropout_p: float) -> bool:
    return not window and dropout_p == 0.0 and x.shape[-1] <= MAX_HEAD_DIM


def _rms_norm_covers(x: torch.Tensor, weight, window: int | None, dropout_p: float) -> bool:
    return weight is not None and weight.dtype == torch.float32 and x.shape[-1] == weight.shape[0]


@dataclasses.dataclass(frozen=True)
class Kernel:
    library: str  # the C file ``<library>.c`` in this folder (``native.PROTOTYPES``)
    threaded: bool  # spreads its own work over torch.get_num_threads() threads
    torch_serial_up_to: int | None  # the largest call (elements) torch runs on one thread; None: none
    differentiable: bool  # has a backward
    covers: Callable[[torch.Tensor, torch.Tensor | None, int | None, float], bool]


KERNELS = {
    "varlen_attention": Kernel("varlen_attention", True, None, True, _attention_covers),
    "decode_attention": Kernel("varlen_attention", False, None, False, _attention_covers),
    "rms_norm": Kernel("rms_norm", False, TORCH_GRAIN_SIZE, True, _rms_norm_covers),
}

# the ops with a Triton kernel for CUDA (triton_norm.py, triton_attention.py)
TRITON_OPS = ("rms_norm", "decode_attention")

_torch_only: set[str] = set()


def available(op: str) -> bool:
    """Whether ``op``'s C kernel is built (or builds now) here and ``torch_only`` is not in force."""
    return op not in _torch_only and native.library(KERNELS[op].library) is not None


@contextlib.contextmanager
def torch_only(*ops: str) -> Iterator[None]:
    """Inside the block ``ops`` (every kernel if none are named) run their torch code, as where no
    compiler works: to measure the kernels against it."""
    names = set(ops or KERNELS) - _torch_only
    unknown = names - set(KERNELS)
    if unknown:
        raise ValueError(f"unknown kernels {sorted(unknown)}; expected some of {sorted(KERNELS)}")
    _torch_only.update(names)
    try:
        yield
    finally:
        _torch_only.difference_update(names)


def choose_kernel(
    op: str,
    *,
    device: str | torch.device,
    dtype: torch.dtype,
    n_elements: int,
    threads: int,
    needs_grad: bool = False,
    covered: bool = True,
    built: bool | None = None,
) -> str:
    """``"native"`` or ``"torch"`` for one call of ``op`` (a key of ``KERNELS``); the rule and what
    it rests on are in this module's docstring. ``covered``: whether the kernel covers the call's
    arguments (``Kernel.covers``); ``built``: whether its library loads (None: look, now).
    Given ``built`` it is a pure function."""
    kernel = KERNELS.get(op)
    if kernel is None:
        raise ValueError(f"unknown kernel {op!r}; expected one of {sorted(KERNELS)}")
    if getattr(device, "type", device) != "cpu" or dtype != torch.float32 or not covered:
        return TORCH
    if needs_grad and not kernel.differentiable:
        return TORCH
    if not kernel.threaded and threads > 1:
        if kernel.torch_serial_up_to is None or n_elements > kernel.torch_serial_up_to:
            return TORCH  # one thread against torch's several
    if built is None:
        built = available(op)
    return NATIVE if built else TORCH


def use_native(
    op: str,
    x: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    window: int | None = None,
    dropout_p: float = 0.0,
) -> bool:
    """Whether ``op`` on ``x`` (the queries, or the normalised rows with ``weight``) runs its C
    kernel: ``choose_kernel`` with this call's facts. Never inside a ``torch.compile`` region: the
    kernels are opaque to Dynamo, and there the torch code is what Inductor fuses."""
    if torch.compiler.is_compiling():
        return False
    kernel = KERNELS[op]
    return (
        choose_kernel(
            op,
            device=x.device,
            dtype=x.dtype,
            n_elements=x.numel(),
            threads=torch.get_num_threads(),
            needs_grad=not kernel.differentiable and torch.is_grad_enabled() and x.requires_grad,
            covered=type(x) is torch.Tensor and kernel.covers(x, weight, window, dropout_p),
        )
        == NATIVE
    )


def use_triton(
    op: str,
    x: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
    window: int | None = None,
) -> bool:
    """Whether ``op`` on ``x`` runs its Triton kernel: on CUDA (``rms_norm`` also on the CPU under
    Triton's interpreter), Triton available, ``torch_only`` not in force, and covered: ``rms_norm``
    (``weight``: a plain tensor or a module's parameter, not a DTensor) where no gradient is needed,
    ``decode_attention`` (queries ``x`` on a KV ``cache`` layer) in half precision, no window."""
    if op not in TRITON_OPS:
        raise ValueError(f"no Triton kernel for {op!r}; there are {TRITON_OPS}")
    if op in _torch_only or torch.compiler.is_compiling():  # compiled: Inductor's code
        return False
    if op == "rms_norm":
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return False
        return triton_norm.runs_on(x.device) and triton_norm.covers(x, weight) and triton_norm.available()
    if x.device.type != "cuda":
        return False
    return triton_attention.covers(x, cache, window) and triton_attention.available()


def kernel_threads(work: int, threads: int) -> int:
    """How many of ``threads`` a threaded kernel uses for ``work`` (query, key, head) triples."""
    return min(threads, work // MIN_TRIPLES_PER_THREAD) if threads > 1 else threads
