"""Learning-rate schedules: constant, linear and cosine, with warmup and annealing to a floor.

The LR of an update is a function of the model version it trains (``version_steps``), not of
how many optimizer steps ran: PPO may take several minibatch steps per version, and all of them
share one LR, as in lm-human-preferences where ``lr = lr0 * (1 - (update - 1) / num_updates)``
("The N Implementation Details of RLHF with PPO", general detail 5: ``linear`` with
``min_lr_ratio=0`` reproduces it exactly).
"""

from __future__ import annotations

import math

import torch

from realrl.impl.model.backend.config import OptimizerConfig


def lr_factor(step: int, total_steps: int, cfg: OptimizerConfig) -> float:
    """Multiplier of the base LR at 0-based ``step`` of ``total_steps``."""
    if step < 0:
        raise ValueError(f"lr_factor: step must be >= 0, got {step}")
    total = max(int(total_steps), 1)
    warmup = int(cfg.warmup_steps_proportion * total)
    if step < warmup:
        return (step + 1) / warmup
    if cfg.lr_scheduler_type == "constant":
        return 1.0
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    floor = cfg.min_lr_ratio
    if cfg.lr_scheduler_type == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine


class LRScheduler:
    """Sets every param group's LR to ``base_lr * lr_factor(version_steps)`` once per update."""

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: OptimizerConfig, total_steps: int) -> None:
        self.optimizer = optimizer
        self.cfg = cfg
        self.total_steps = int(total_steps)
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.n_updates = 0
        self.last_step = -1
        self.apply(0)

    def apply(self, version_steps: int) -> float:
        factor = lr_factor(version_steps, self.total_steps, self.cfg)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * factor
        return self.base_lrs[0] * factor

    def step(self, version_steps: int) -> float:
        """Set the LR for the update of model version ``version_steps``; return it."""
        lr = self.apply(version_steps)
        self.last_step = int(version_steps)
        self.n_updates += 1
        return lr

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {
            "base_lrs": list(self.base_lrs),
            "total_steps": self.total_steps,
            "n_updates": self.n_updates,
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: dict) -> None:
        self.base_lrs = list(state["base_lrs"])
        self.total_steps = int(state["total_steps"])
        self.n_updates = int(state["n_updates"])
        self.last_step = int(state["last_step"])
        self.apply(max(self.last_step, 0))
