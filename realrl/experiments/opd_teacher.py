"""The phases that build an embedded task's distillation teacher when ``opd`` is given none:
``opd_teacher_sft`` (supervised fine-tuning of a larger model than the task's, from random
weights) and ``opd_teacher`` (GRPO from it on the task's true reward). Their checkpoints are
kept under their own run folders and reused by later ``opd`` runs, as SFT's are by RL runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from realrl.api.core.system_api import ExperimentConfig
from realrl.api.quickstart.entrypoint import register_quickstart_exp
from realrl.experiments.grpo import GRPOConfig
from realrl.experiments.sft import SFTConfig


@dataclasses.dataclass
class ModelShapeConfig:
    """A resized model config: each field > 0 replaces the task model's (0 keeps it)."""

    n_layers: int = 0
    hidden_dim: int = 0
    intermediate_dim: int = 0
    n_heads: int = 0  # query and key/value heads alike

    def __post_init__(self) -> None:
        for name, value in dataclasses.asdict(self).items():
            if value < 0:
                raise ValueError(f"model_shape.{name} must be >= 0 (0 keeps the task model's), got {value}")

    def resized(self, config: dict[str, Any]) -> dict[str, Any]:
        out = dict(config)
        for name in ("n_layers", "hidden_dim", "intermediate_dim"):
            out[name] = getattr(self, name) or out[name]
        if self.n_heads:
            out["n_q_heads"] = out["n_kv_heads"] = self.n_heads
        if out["hidden_dim"] % out["n_q_heads"]:
            raise ValueError(
                f"model_shape: hidden_dim={out['hidden_dim']} is not a multiple of the {out['n_q_heads']} heads"
            )
        return out


@dataclasses.dataclass
class TeacherSFTConfig(SFTConfig):
    """SFT of the teacher: the embedded task's model resized by ``model_shape``."""

    model_shape: ModelShapeConfig = dataclasses.field(default_factory=ModelShapeConfig)

    SUMMARY = "SFT of a distillation teacher, the task's model resized (model_shape.*)"

    def initial_setup(self) -> ExperimentConfig:
        self.experiment_name = self.experiment_name or "opd_teacher_sft"
        exp = super().initial_setup()
        args = exp.models["default"].model.args
        if "config" in args:  # random weights of the task's model: resized; a checkpoint stays as it is
            args["config"] = self.model_shape.resized(args["config"])
        return exp


@dataclasses.dataclass
class TeacherRLConfig(GRPOConfig):
    """GRPO of the teacher from its SFT checkpoint."""

    SUMMARY = "GRPO of a distillation teacher from opd_teacher_sft's checkpoint"

    def initial_setup(self) -> ExperimentConfig:
        self.experiment_name = self.experiment_name or "opd_teacher"
        return super().initial_setup()


register_quickstart_exp("opd_teacher_sft", TeacherSFTConfig)
register_quickstart_exp("opd_teacher", TeacherRLConfig)
