"""``EngineConfig.compile``: whether an engine runs its model's blocks through ``torch.compile``.

The model does the compiling (``ReaLModel.compile_blocks``, ``nn/compiled_blocks.py``); this
module decides whether it applies, points Inductor's cache at the run's files so a second run
starts warm, and says so in one log line. It applies to a whole model and to a pipeline stage,
whole or split by tensor parallelism or FSDP; a module without ``compiled_blocks`` runs eagerly,
with a warning.
"""

from __future__ import annotations

import os

import torch

from realrl.base import logging
from realrl.impl.model.backend.config import EngineConfig
from realrl.impl.model.nn.compiled_blocks import compile_blocks

logger = logging.getLogger("compile")

# "auto" compiles a train engine on CUDA of at least this many steps: compiling a model's blocks
# costs up to a minute or two once, a compiled step saves a fraction of a second. On the CPU
# "auto" stays off: bench_train.py --compile measured the toy step at 0.88-1.02x the eager one's
# CPU time (the C attention and RMSNorm kernels already do much of what Inductor would fuse)
AUTO_MIN_STEPS = 200
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
DEFAULT_CACHE_DIR = os.path.join("outputs", ".inductor_cache")


def wants_compile(config: EngineConfig, total_train_steps: int | None, device: torch.device) -> bool:
    """ "on"; or "auto" for a train engine (``total_train_steps`` given) on CUDA of enough steps."""
    if config.compile == "on":
        return True
    if config.compile != "auto" or config.gradient_checkpointing or total_train_steps is None:
        return False
    return device.type == "cuda" and total_train_steps >= AUTO_MIN_STEPS


def compile_module(
    module: torch.nn.Module,
    config: EngineConfig,
    total_train_steps: int | None,
    device: torch.device,
):
    """The module's ``CompiledBlocks`` when compilation applies to it, else None."""
    if not wants_compile(config, total_train_steps, device):
        return None
    why_not = _why_eager(module)
    if why_not:
        logger.warning("engine.compile=%s: %s; its blocks run eagerly", config.compile, why_not)
        return None
    if config.compile_cache_dir:
        os.environ[CACHE_ENV] = os.path.abspath(config.compile_cache_dir)
    else:  # a cache named in the environment wins over the default
        os.environ.setdefault(CACHE_ENV, os.path.abspath(DEFAULT_CACHE_DIR))
    blocks = compile_blocks(module)
    logger.info(
        "engine.compile=%s: %d blocks of %s compiled on first use (token dimension dynamic), "
        "Inductor cache %s; compile/graphs and compile/seconds in the train stats",
        config.compile,
        len(module.layers),
        type(module).__name__,
        os.environ[CACHE_ENV],
    )
    return blocks


def _why_eager(module: torch.nn.Module) -> str:
    if not hasattr(module, "compiled_blocks"):
        return f"{type(module).__name__} has no blocks to compile (no compiled_blocks attribute)"
    return ""
