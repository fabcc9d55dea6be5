"""Dynamic loss scaling for fp16 training that holds under tensor parallelism and FSDP.

``torch.amp.GradScaler`` unscales and checks gradients with a fused per-device kernel that refuses
DTensor gradients, and decides per rank whether to skip a step: a rank whose own shard is finite
would step while the rank holding the overflow skips, and the replicas part. Here the loss is
multiplied by the scale, each rank divides its local gradient shards by it, and the decision to
skip is taken from the whole gradient's norm, which every rank of a model computes alike. The
policy is GradScaler's default one ("Mixed Precision Training", Micikevicius et al., 2018): start
at 2**16, halve on an overflow, double after 2000 clean steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from realrl.impl.model.parallel.dtensor import local


@dataclasses.dataclass
class LossScaler:
    scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    clean_steps: int = 0  # steps since the last overflow or growth

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale

    def unscale_(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Divide every gradient (this rank's shard of it) by the scale, in place."""
        inverse = 1.0 / self.scale
        for p in params:
            if p.grad is not None:
                local(p.grad).mul_(inverse)

    def update(self, finite: bool) -> None:
        """After a step (``finite``) or a skipped one (an overflow somewhere in the gradient)."""
        if not finite:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            return
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0

    def get_scale(self) -> float:
        return self.scale

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Also reads a ``torch.amp.GradScaler`` state (recover points written before this class)."""
        renamed = {"_growth_tracker": "clean_steps"}
        for key, value in state.items():
            key = renamed.get(key, key)
            if key in {f.name for f in dataclasses.fields(self)}:
                setattr(self, key, type(getattr(self, key))(value))
