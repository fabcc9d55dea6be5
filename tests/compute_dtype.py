"""A compute-dtype check for CPU runs: every matmul and attention of a model worker runs in the
dtype its engines were configured with.

A bf16 engine that silently computes in fp32 passes every CPU test (the CPU computes either) and
on a GPU spends twice the memory the plan counted, or fails where a bf16 activation meets an
fp32 one (FSDP2 fixes the dtype it gathers weights in at its first forward: a module cast after
sharding keeps gathering fp32 weights). This check makes the configured dtype a rule:

- with ``REALRL_CHECK_COMPUTE_DTYPE=bf16`` (or ``fp16``, ``fp32``) in the environment of a
  quickstart run, each model worker (``python -m realrl.apps.remote``) that imports this file as a
  plugin (``import_modules``) watches every matrix product and attention kernel
  (``TorchDispatchMode``, below autocast, so a train engine's autocast counts as computing in
  its dtype) and raises ``ComputeDtypeError`` naming the op and its operands' dtypes when a
  floating operand is of another dtype;
- it counts the ops it checked in ``compute-dtype-<pid>.json`` beside the worker's log, so a test
  can tell a run that kept the rule from a run that computed nothing under the check.
"""

from __future__ import annotations

import atexit
import json
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ENV = "REALRL_CHECK_COMPUTE_DTYPE"
MARKER = "compute-dtype check: on"
RECORDS_PREFIX = "compute-dtype-"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
aten = torch.ops.aten
# where a model spends its FLOPs: the matrix products linear layers decompose into, and attention
CHECKED = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
}


class ComputeDtypeError(RuntimeError):
    """A matmul or attention computed in a dtype other than its engine's."""


class ComputeDtypeCheck(TorchDispatchMode):
    """Refuses a checked op whose floating operands are not all of ``dtype``; counts the rest."""

    def __init__(self, dtype: torch.dtype, on_count=None):
        super().__init__()
        self.dtype = dtype
        self.checked = 0
        self.on_count = on_count  # told the count now and then: a killed worker writes no atexit

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in CHECKED:
            operands = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            dtypes = [t.dtype for t in operands if t.is_floating_point()]
            if any(d != self.dtype for d in dtypes):
                raise ComputeDtypeError(
                    f"{func} computes in {sorted(map(str, set(dtypes)))} with operands "
                    f"{[tuple(t.shape) for t in operands]}: the engine's dtype is {self.dtype}"
                )
            self.checked += 1
            if self.on_count is not None and self.checked % 256 == 1:
                self.on_count(self.checked)
        return func(*args, **kwargs)


def start(dtype_name: str, records_dir: str) -> ComputeDtypeCheck:
    """Switch the check on for the rest of this process's life; its count is written as it grows."""
    if dtype_name not in DTYPES:
        raise ValueError(f"{ENV}={dtype_name!r}: expected one of {sorted(DTYPES)}")
    path = os.path.join(records_dir, f"{RECORDS_PREFIX}{os.getpid()}.json")

    def write(checked: int) -> None:
        with open(path, "w") as f:
            json.dump({"dtype": dtype_name, "checked": checked}, f)

    check = ComputeDtypeCheck(DTYPES[dtype_name], on_count=write)
    check.__enter__()
    atexit.register(lambda: write(check.checked))
    return check


def read_counts(logs_dir: str) -> list[dict]:
    """What each checked worker of a run wrote: its dtype and how many ops it checked."""
    out = []
    for name in sorted(os.listdir(logs_dir)):
        if name.startswith(RECORDS_PREFIX):
            with open(os.path.join(logs_dir, name)) as f:
                out.append(json.load(f))
    return out


def in_model_worker() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec is not None and spec.name == "realrl.apps.remote"


if in_model_worker() and os.environ.get(ENV):
    # the worker's output is its log file in the run's logs/ folder: the count goes beside it
    start(os.environ[ENV], os.path.dirname(os.path.realpath(f"/proc/{os.getpid()}/fd/2")))
    print(MARKER, file=sys.stderr, flush=True)


def engine_overrides(roles: tuple[str, ...], dtype_name: str, prerequisite_overrides: list[str]) -> list[str]:
    """The quickstart options that put every engine of a run, and of the phases it builds on, in
    ``dtype_name`` (``prerequisite_overrides``: the options those phases already take)."""
    pre = [*prerequisite_overrides, f"model.engine.dtype={dtype_name}"]
    return [
        *(f"{role}.engine.dtype={dtype_name}" for role in roles),
        "prerequisite_overrides=[" + ",".join(pre) + "]",
    ]


def assert_computed_in(run_dir: str, dtype_name: str) -> int:
    """Every model worker of the run carried the check for ``dtype_name`` and checked some ops;
    the number of ops checked, over the workers (a lower bound: a worker killed at the end of
    the run wrote its count as it grew)."""
    logs = os.path.join(run_dir, "logs")
    workers = [f for f in os.listdir(logs) if f.startswith("model_worker")]
    assert workers and all(MARKER in open(os.path.join(logs, f)).read() for f in workers), workers
    counts = read_counts(logs)
    assert len(counts) >= len(workers) and all(c["dtype"] == dtype_name for c in counts), counts
    assert all(c["checked"] > 0 for c in counts), counts
    return sum(c["checked"] for c in counts)
