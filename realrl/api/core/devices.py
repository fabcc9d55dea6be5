"""Which device each model worker uses, and which torch.distributed backends connect them.

One device per worker: with ``device=cuda`` worker ``i`` of a node takes GPU ``i`` (its local
rank), so a model sharded over four workers runs on four GPUs. Fewer GPUs than workers is an
error naming both counts, unless ``colocate=true`` lets workers share GPUs round-robin (two
workers on one GPU: time-shared, the way a small experiment fits on one card). Under Ray every
actor asks for its GPU (``num_gpus``) and sees only the one Ray gives it, as ``cuda:0``.

NCCL moves CUDA tensors between processes that own distinct GPUs; gloo moves CPU tensors (the
data-transfer path and the small control reductions) and every tensor when GPUs are shared, which
NCCL does not allow.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess

GLOO = "gloo"
GLOO_AND_NCCL = "cpu:gloo,cuda:nccl"
RAY_RESOURCE_UNITS = 10_000  # Ray keeps resource amounts as multiples of 1e-4


class DeviceAssignmentError(ValueError):
    """The workers cannot each get the device they need."""


def is_cuda(device: str) -> bool:
    return device == "cuda" or device.startswith("cuda:")


def visible_gpu_count() -> int:
    """NVIDIA GPUs this process may use, found without importing torch or CUDA: the launching
    process stays free of both (docs/runtime.md). ``CUDA_VISIBLE_DEVICES`` when set (as CUDA reads
    it: entries up to the first invalid one), else the driver's ``/proc/driver/nvidia/gpus``, else
    ``nvidia-smi -L``; 0 where none answers."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for entry in visible.split(","):
            entry = entry.strip()
            if not entry or entry.startswith("-"):
                break
            count += 1
        return min(count, _driver_gpu_count()) if count else 0
    return _driver_gpu_count()


def _driver_gpu_count() -> int:
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def local_devices(device: str, n_workers: int, n_gpus: int, colocate: bool) -> list[str]:
    """The device of each of ``n_workers`` workers on one node with ``n_gpus`` visible GPUs.

    ``device`` is "cpu", "cuda" (one GPU each) or "cuda:<k>" (every worker on GPU k, shared).
    """
    if not is_cuda(device):
        return [device] * n_workers
    if n_gpus == 0:
        raise DeviceAssignmentError(f"device={device}: no CUDA device is visible on this machine")
    if device != "cuda":
        index = int(device.split(":", 1)[1])
        if index >= n_gpus:
            raise DeviceAssignmentError(
                f"device={device}: this machine has {n_gpus} GPU(s), cuda:0..{n_gpus - 1}"
            )
        return [device] * n_workers
    if n_workers > n_gpus and not colocate:
        raise DeviceAssignmentError(
            f"device=cuda: the layouts use {n_workers} model workers but {n_gpus} GPU(s) are visible; "
            "one GPU per worker needs fewer workers (allocation_mode) or more GPUs, or set colocate=true "
            "to let workers share GPUs"
        )
    return [f"cuda:{i % n_gpus}" for i in range(n_workers)]


def ray_gpus_per_worker(device: str, n_workers: int, cluster_gpus: float, colocate: bool) -> float:
    """What each Ray actor asks for: one GPU, or, colocated, a share Ray can place.

    Ray puts an actor that asks for a fraction of a GPU on one GPU, so the share must divide a
    GPU: ``1 / k`` with ``k = ceil(workers / GPUs)`` actors per GPU (3 workers on 2 GPUs ask for
    0.5 each, two on one GPU and one on the other; 2/3 each would leave the third unplaced).
    Rounded down to Ray's resource precision (1e-4) so that k shares never exceed one GPU."""
    if not is_cuda(device):
        return 0.0
    if cluster_gpus <= 0:
        raise DeviceAssignmentError(f"device={device}: the Ray cluster has no GPUs")
    if n_workers <= cluster_gpus:
        return 1.0
    if not colocate:
        raise DeviceAssignmentError(
            f"device=cuda: the layouts use {n_workers} model workers but the Ray cluster has {cluster_gpus:g} "
            "GPU(s); use fewer workers or a larger cluster, or set colocate=true to share GPUs"
        )
    per_gpu = math.ceil(n_workers / max(1, math.floor(cluster_gpus)))  # a fraction of one GPU: one
    return math.floor(RAY_RESOURCE_UNITS / per_gpu) / RAY_RESOURCE_UNITS


def check_shared_gpus(devices: list[str], backend: str, sharded: list[str]) -> None:
    """Refuse layouts that shard a model (tensor parallelism, pipeline stages, FSDP) on workers
    that share GPUs.

    Sharded layers gather and scatter CUDA tensors in every forward and backward, and pipeline
    stages send them to each other. NCCL does that but refuses two ranks on one GPU; gloo, the
    backend of workers that share GPUs, all-reduces and broadcasts CUDA tensors but does not
    gather, scatter, send or receive them. Data parallelism (gradients
    all-reduced through host memory) and reallocation (messages through host memory) still work
    on shared GPUs. ``sharded`` names each such layout ("actor in d1m2p1")."""
    shared = any(is_cuda(d) for d in devices) and backend == GLOO
    if shared and sharded:
        raise DeviceAssignmentError(
            f"{', '.join(sharded)}: tensor parallelism, pipeline stages and FSDP need a GPU per worker (NCCL), but these "
            f"workers share GPUs ({', '.join(sorted(set(devices)))}); use data parallelism (d<n>) on "
            "shared GPUs, or more GPUs"
        )


def dist_backend(devices: list[str]) -> str:
    """NCCL for CUDA tensors only when no two workers share a GPU (same node: same name)."""
    if all(is_cuda(d) for d in devices) and len(set(devices)) == len(devices):
        return GLOO_AND_NCCL
    return GLOO
