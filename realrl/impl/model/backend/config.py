"""Configuration of the train and inference engines (plain dataclasses, hydra-friendly)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from realrl.api.core.dtype_names import to_torch

if TYPE_CHECKING:
    import torch

SCHEDULER_TYPES = ("constant", "linear", "cosine")
# option value -> dtype name: this module is a config the master builds, so it imports no torch
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# attention implementations a model may ask for (realrl.impl.model.modules.attention runs them)
ATTN_IMPLS = ("auto", "flash_attn", "torch_varlen", "cpu_varlen", "sdpa")
COMPILE_MODES = ("off", "on", "auto")


@dataclasses.dataclass
class OptimizerConfig:
    """AdamW with decoupled weight decay, gradient clipping and an LR schedule.

    ``tf_style_eps`` switches to TensorFlow's Adam update, where epsilon is added to the raw
    ``sqrt(v_t)`` instead of the bias-corrected one ("The N Implementation Details of RLHF with PPO",
    "PyTorch Adam optimizer numerical issues"). ``min_lr_ratio=0`` with a ``linear`` schedule
    anneals the LR to zero as lm-human-preferences does (same post, general detail 5).
    """

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-5
    tf_style_eps: bool = False
    grad_clip: float = 1.0  # max global grad norm; <= 0 disables clipping
    lr_scheduler_type: str = "constant"  # constant | linear | cosine (str: hydra has no Literal)
    warmup_steps_proportion: float = 0.0
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]
        if self.lr < 0:
            raise ValueError(f"OptimizerConfig.lr must be >= 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"OptimizerConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"OptimizerConfig.betas must be two numbers in [0, 1), got {self.betas}")
        if self.eps <= 0:
            raise ValueError(f"OptimizerConfig.eps must be > 0, got {self.eps}")
        if self.lr_scheduler_type not in SCHEDULER_TYPES:
            raise ValueError(
                f"OptimizerConfig.lr_scheduler_type must be one of {SCHEDULER_TYPES}, "
                f"got {self.lr_scheduler_type!r}"
            )
        if not 0.0 <= self.warmup_steps_proportion <= 1.0:
            raise ValueError(
                f"OptimizerConfig.warmup_steps_proportion must be in [0, 1], got {self.warmup_steps_proportion}"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"OptimizerConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


@dataclasses.dataclass
class EngineConfig:
    """How an engine runs its module.

    ``dtype``: "auto" is fp32 on CPU and bf16 on CUDA. The train engine keeps fp32 parameters
    and optimizer state and runs forward/backward under ``torch.autocast`` in the low precision
    (fp16 adds a dynamic loss scaler); the inference engine casts its module to the dtype.
    ``disable_dropout``: RL policies train without dropout ("The N Implementation Details of RLHF with PPO",
    policy detail 4), so that log-probs computed at inference and at training time agree.
    ``gradient_checkpointing``: recompute activations in backward (see ``activation_checkpointing``:
    the module's ``gradient_checkpointing_enable()``, else its ``layers`` blocks are wrapped).
    ``share_prefixes``: compute the prefix the sequences of one sample share (the prompt of a
    [chosen, rejected] pair, of K GRPO answers) once per forward (``modules/shared_prefix.py``);
    the outputs are the same, the work drops by the repeated prompt tokens.
    ``fsdp``: shard parameters, gradients and optimizer state over the layout's data-parallel
    ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``), on top of any tensor parallelism.
    ``expert_parallel``: in a layout with m > 1, a Mixture-of-Experts model's sparse blocks place
    whole experts on the m ranks (n_experts / m each) instead of splitting every expert; attention,
    dense blocks and the shared expert stay split by tensor parallelism (docs/model.md, "Expert
    placement"). Only for MoE models, with n_experts divisible by m (``layout_fit``).
    ``compile``: run the transformer blocks of packed forwards (training, inference) through
    ``torch.compile`` (``nn/compiled_blocks.py``, ``backend/compile.py``): "off" (default), "on",
    or "auto": on for a train engine on CUDA of at least ``compile.AUTO_MIN_STEPS`` steps, where
    the one-off compilation is repaid, off otherwise (on the CPU, where it measured no steady gain
    on the toy model, and for an inference engine).
    ``compile_cache_dir``: Inductor's cache (``TORCHINDUCTOR_CACHE_DIR``), so a second run starts
    warm; "" is ``$TORCHINDUCTOR_CACHE_DIR`` when set, else ``outputs/.inductor_cache`` under the
    working folder (the default fileroot). Inductor sets that variable itself once it has used its
    cache, so a process that compiled something before names its folder explicitly.
    """

    dtype: str = "auto"  # auto | fp32 | bf16 | fp16
    disable_dropout: bool = True
    gradient_checkpointing: bool = False
    share_prefixes: bool = True
    fsdp: bool = False
    expert_parallel: bool = False
    compile: str = "off"  # off | on | auto
    compile_cache_dir: str = ""

    def __post_init__(self) -> None:
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"EngineConfig.compile must be one of {COMPILE_MODES}, got {self.compile!r}")
        if self.compile == "on" and self.gradient_checkpointing:
            raise ValueError(
                "EngineConfig.compile='on' does not combine with gradient_checkpointing=True yet; "
                "turn one of them off"
            )
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(
                f"EngineConfig.dtype must be 'auto' or one of {sorted(DTYPES)}, got {self.dtype!r}"
            )

    def resolve_dtype(self, device: torch.device | str) -> torch.dtype:
        """The engine's dtype on ``device`` ("auto": bf16 on CUDA, fp32 elsewhere); engines call it."""
        if self.dtype != "auto":
            return to_torch(DTYPES[self.dtype])
        return to_torch("bfloat16" if str(device).startswith("cuda") else "float32")


def coerce(cls: type, value: Any, what: str) -> Any:
    """Accept a config dataclass, a dict of its fields (from a YAML/hydra config) or None."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(value) - names
        if unknown:
            raise ValueError(
                f"{what}: unknown {cls.__name__} fields {sorted(unknown)}; known: {sorted(names)}"
            )
        return cls(**value)
    raise ValueError(f"{what} must be a {cls.__name__} or a dict, got {type(value).__name__}")
