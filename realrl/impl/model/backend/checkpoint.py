"""Atomic training checkpoints: HF-format weights plus everything needed to resume exactly.

Layout of ``<dir>``:
  config.json, model.safetensors ...  the module's ``save_pretrained`` output (loads with HF), or
  model.safetensors                   the state dict when the module has no ``save_pretrained``
  adapters.safetensors                instead of both above for a module with LoRA adapters: the
                                      parameters it trains only (the base is rebuilt from its
                                      checkpoint, and checked against a fingerprint kept here)
  sharded/                            instead of both above for a sharded (tensor-parallel or FSDP)
                                      module: every rank's shards of weights and optimizer state
                                      (``torch.distributed.checkpoint``), loadable with the same layout
  engine_state.pt                     optimizer (unsharded), LR scheduler and grad-scaler state
  rng_state_rank{r}.pt                python / numpy / torch RNG of the model's rank r, and its own
                                      CUDA device's
  extra_state_rank{r}.pt              what the caller passed (data position, model version, ...)

Everything is written into ``<dir>.tmp`` and renamed onto ``<dir>`` only once every rank has
finished writing, so a crash never leaves a half-written checkpoint under the final name, and a
write that fails (a full or read-only disk) leaves the previous checkpoint as it was and raises on
every rank (none waits for the others in a collective). A file that cannot be read back raises
``CheckpointError`` naming it. With several ranks all of them must see one file system.

Trust: the weights are safetensors and every ``*.pt`` file loads with ``weights_only=True``:
tensors, numbers, strings, containers and numpy's RNG arrays, nothing that runs code, so a
recover point from someone else can hold wrong numbers but cannot run a program. What engines and
interfaces save must be made of those types: ``save_state`` refuses anything else when it is
written (naming the types), not when a resume needs it (docs/security.md).
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import safetensors.torch
import torch
import torch.distributed as dist

from realrl.base import logging
from realrl.impl.model.backend import dp
from realrl.impl.model.backend.activation_checkpointing import own_named_parameters
from realrl.impl.model.backend.integrity import CheckpointError, check_file, replace_dir

logger = logging.getLogger("checkpoint")

ENGINE_STATE = "engine_state.pt"
WEIGHTS = "model.safetensors"
ADAPTERS = "adapters.safetensors"
SHARDED = "sharded"


def device_rng_state(device: torch.device | str, cuda: Any = torch.cuda) -> torch.Tensor | None:
    """The RNG state of ``device`` alone (None for a host device). Only the worker's own device:
    which devices a worker sees differs between launchers (every GPU of the node in a local run,
    its own under Ray) and between runs, so every visible device's state would not restore in a
    run that sees another number of them. ``cuda``: ``torch.cuda``, or what stands in for it."""
    device = torch.device(device)
    return cuda.get_rng_state(device) if device.type == "cuda" else None


def set_device_rng_state(state: Any, device: torch.device | str, cuda: Any = torch.cuda) -> None:
    """Restore ``device``'s RNG from ``device_rng_state``'s ``state``. An older recover point holds
    the list of every visible device's state: this device's entry is restored when this run sees
    as many devices (the same ones, in all likelihood), else none is."""
    device = torch.device(device)
    if device.type != "cuda" or state is None:
        return
    if isinstance(state, list | tuple):
        if len(state) != cuda.device_count():
            logger.warning(
                "the recover point holds the RNG states of %d CUDA devices, this worker sees %d: "
                "which one was %s's is unknown; its RNG is not restored",
                len(state),
                cuda.device_count(),
                device,
            )
            return
        state = state[cuda.current_device() if device.index is None else device.index]
    cuda.set_rng_state(state, device)


def rng_state(device: torch.device | str | None = None) -> dict[str, Any]:
    """Python, numpy and torch's RNG state, and ``device``'s own (a CUDA device's)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    own = None if device is None else device_rng_state(device)
    if own is not None:
        state["cuda"] = own
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | str | None = None) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device is not None:
        set_device_rng_state(state.get("cuda"), device)


def save_module_weights(
    module: torch.nn.Module, path: str, state_dict: dict[str, torch.Tensor] | None = None
) -> None:
    """HF format through ``module.save_pretrained`` when available, else a safetensors state dict.
    ``state_dict``: the weights to write instead of the module's own (whole weights gathered from
    a sharded module)."""
    os.makedirs(path, exist_ok=True)
    if hasattr(module, "save_pretrained"):
        if state_dict is None:
            module.save_pretrained(path)
        else:
            module.save_pretrained(path, state_dict=state_dict)
    elif state_dict is None:
        safetensors.torch.save_model(module, os.path.join(path, WEIGHTS))
    else:
        safetensors.torch.save_file(_untied(state_dict), os.path.join(path, WEIGHTS))


def _untied(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory: give each its own."""
    seen: set[int] = set()
    out = {}
    for k, v in state_dict.items():
        ptr = v.data_ptr()
        out[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    return out


def _adapted(module: torch.nn.Module) -> bool:
    """A model with LoRA adapters (``nn/lora.py``): it trains those only."""
    return getattr(module, "lora", None) is not None


def _base_fingerprint(module: torch.nn.Module) -> str:
    """The frozen weights' sum per tensor, summed in float64: a resume onto another base (another
    checkpoint, another seed) would otherwise continue silently from the wrong weights."""
    total = sum(
        float(p.detach().double().sum()) for _, p in own_named_parameters(module) if not p.requires_grad
    )
    return repr(total)


def _save_adapters(module: torch.nn.Module, path: str) -> None:
    trained = {n: p.detach() for n, p in own_named_parameters(module) if p.requires_grad}
    meta = {"format": "pt", "base_fingerprint": _base_fingerprint(module)}
    safetensors.torch.save_file(_untied(trained), os.path.join(path, ADAPTERS), metadata=meta)


def _load_adapters(module: torch.nn.Module, path: str) -> None:
    file = os.path.join(path, ADAPTERS)
    if not os.path.exists(file):
        raise FileNotFoundError(
            f"checkpoint {path!r} has no {ADAPTERS}: it was not saved by a model with adapters"
        )
    check_file(file)
    with safetensors.safe_open(file, "pt") as f:
        saved = (f.metadata() or {}).get("base_fingerprint")
    mine = _base_fingerprint(module)
    if saved != mine:
        raise CheckpointError(
            f"{file}: the adapters were trained on other base weights (fingerprint {saved}, this model's "
            f"{mine}); resume with the model path and seed the run was saved with"
        )
    trained = {n for n, p in own_named_parameters(module) if p.requires_grad}
    loaded = safetensors.torch.load_file(file, device=str(next(module.parameters()).device))
    if set(loaded) != trained:
        raise CheckpointError(
            f"{file}: holds {sorted(set(loaded) ^ trained)[:4]}... unlike this model's adapters"
        )
    params = dict(own_named_parameters(module))
    with torch.no_grad():
        for name, value in loaded.items():
            params[name].copy_(value)


def load_module_weights(module: torch.nn.Module, path: str) -> None:
    """Load weights written by ``save_module_weights`` into ``module`` in place."""
    if hasattr(module, "save_pretrained") and hasattr(type(module), "from_pretrained"):
        cfg = getattr(module, "config", None)
        kwargs = {"is_critic": cfg.is_critic} if hasattr(cfg, "is_critic") else {}
        for name in sorted(os.listdir(path)):
            if name.endswith(".safetensors"):
                check_file(os.path.join(path, name))
        loaded = type(module).from_pretrained(path, **kwargs)
        module.load_state_dict(loaded.state_dict(), strict=True)
        return
    file = os.path.join(path, WEIGHTS)
    if not os.path.exists(file):
        raise FileNotFoundError(f"checkpoint {path!r} has no {WEIGHTS}")
    check_file(file)
    safetensors.torch.load_model(module, file, strict=True, device=str(next(module.parameters()).device))


def _numpy_rng_globals() -> list:
    """What numpy's RNG state (``np.random.get_state()``) unpickles through: numeric arrays."""
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def save_state(state: Any, file: str, what: str) -> None:
    """``torch.save`` of state a recover point holds, refused (``CheckpointError`` naming ``what``
    and the types) when it holds anything that ``load_state`` would not load without running code."""
    torch.save(state, file)
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(file)
    if unsafe:
        raise CheckpointError(
            f"{what} holds {', '.join(sorted(unsafe))}: a recover point holds only tensors, numbers, "
            "strings and containers of them (it loads with torch.load(weights_only=True))"
        )


def load_state(file: str) -> Any:
    """``torch.load`` of a file this module wrote, or ``CheckpointError`` naming it: tensors,
    numbers, strings, containers and numpy's RNG arrays, nothing that runs code."""
    check_file(file)
    try:
        with torch.serialization.safe_globals(_numpy_rng_globals()):
            return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a damaged file
        raise CheckpointError(f"{file}: cannot be read back ({type(e).__name__}: {e})") from e


def _write_rank_files(path: str, rank: int, extra_state: Any, device: torch.device | str) -> None:
    torch.save(rng_state(device), os.path.join(path, f"rng_state_rank{rank}.pt"))
    save_state(
        extra_state, os.path.join(path, f"extra_state_rank{rank}.pt"), f"the extra state of rank {rank}"
    )


def _collective_try(what: str, path: str, group: dist.ProcessGroup | None, fn, cleanup) -> None:
    """Run ``fn`` on every rank; if it fails anywhere, run ``cleanup`` and raise everywhere."""
    n = dp.world_size(group)
    ok = 1.0
    try:
        fn()
    except BaseException:
        ok = 0.0
        if n == 1:
            cleanup()
            raise
        logger.exception("rank %d failed %s for checkpoint %s", dp.rank(group), what, path)
    if dp.all_reduce_sum(ok, group) < n:
        cleanup()
        raise RuntimeError(f"{what} for checkpoint {path!r} failed on a rank; the checkpoint was not written")


def save_checkpoint(
    path: str,
    module: torch.nn.Module | None,
    engine_state: dict[str, Any],
    extra_state: Any = None,
    group: dist.ProcessGroup | None = None,
    sharded_state: dict[str, Any] | None = None,
    device: torch.device | str = "cpu",
) -> None:
    """Write a checkpoint to ``path`` atomically (see the module docstring). Collective over ``group``
    (every rank of the model).

    Rank 0 writes the shared part (weights, optimizer) first, since a module's own
    ``save_pretrained`` may replace the folder it writes to; then every rank adds its own files.
    ``sharded_state``: this rank's shards (``parallel.state.sharded_state``), written by every rank
    in place of ``module``'s whole weights. ``device``: the rank's own device, whose RNG it saves.
    """
    path = os.path.abspath(path)
    tmp = path + ".tmp"
    r = dp.rank(group)

    def cleanup() -> None:
        if r == 0:
            shutil.rmtree(tmp, ignore_errors=True)

    def write_shared() -> None:
        if r == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            if sharded_state is None and _adapted(module):
                _save_adapters(module, tmp)
            elif sharded_state is None:
                save_module_weights(module, tmp)
            torch.save(engine_state, os.path.join(tmp, ENGINE_STATE))

    _collective_try("writing weights and optimizer state", path, group, write_shared, cleanup)
    if sharded_state is not None:
        from realrl.impl.model.parallel.state import save_sharded

        _collective_try(
            "writing sharded weights and optimizer state",
            path,
            group,
            lambda: save_sharded(os.path.join(tmp, SHARDED), sharded_state, group),
            cleanup,
        )
    _collective_try(
        "writing RNG and extra state",
        path,
        group,
        lambda: _write_rank_files(tmp, r, extra_state, device),
        cleanup,
    )

    def publish() -> None:
        if r == 0:
            replace_dir(tmp, path)

    _collective_try("renaming the finished checkpoint into place", path, group, publish, cleanup)


def load_checkpoint(
    path: str,
    module: torch.nn.Module,
    group: dist.ProcessGroup | None = None,
    load_shards: Callable[[str], None] | None = None,
    device: torch.device | str = "cpu",
) -> tuple[dict[str, Any], Any]:
    """Load weights and this rank's RNG (its own ``device``'s included); return
    ``(engine_state, extra_state)``.

    ``load_shards(folder)`` restores a sharded module (and its optimizer) from the ``sharded/``
    folder instead of reading whole weights."""
    path = os.path.abspath(path)
    if not os.path.isdir(path) and os.path.isdir(path + ".old"):
        # A crash between the two renames of save_checkpoint: the previous checkpoint is intact.
        logger.warning("checkpoint %s missing; resuming from the previous one at %s.old", path, path)
        path = path + ".old"
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no checkpoint at {path!r}")
    state_file = os.path.join(path, ENGINE_STATE)
    if not os.path.exists(state_file):
        raise FileNotFoundError(f"{path!r} holds no {ENGINE_STATE}: it is not a training checkpoint")
    if load_shards is None and _adapted(module):
        _load_adapters(module, path)
    elif load_shards is None:
        load_module_weights(module, path)
    else:
        shards = os.path.join(path, SHARDED)
        if not os.path.isdir(shards):
            raise FileNotFoundError(
                f"{path!r} holds no {SHARDED}/ folder: it was saved by an unsharded model; "
                "resume with the layout and engine.fsdp setting it was saved with"
            )
        load_shards(shards)
    engine_state = load_state(state_file)
    r = dp.rank(group)
    rng_file = os.path.join(path, f"rng_state_rank{r}.pt")
    if os.path.exists(rng_file):
        set_rng_state(load_state(rng_file), device)
    else:
        logger.warning("checkpoint %s has no RNG state for rank %d; RNG not restored", path, r)
    extra_file = os.path.join(path, f"extra_state_rank{r}.pt")
    extra = load_state(extra_file) if os.path.exists(extra_file) else None
    return engine_state, extra
