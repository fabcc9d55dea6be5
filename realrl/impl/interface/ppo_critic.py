"""``ppo_critic``: the value model's inference (``values``) and clipped value update.

The critic reads query + response ("The N Implementation Details of RLHF with PPO", general
detail 1). ``values`` are the head's raw outputs; with ``value_norm`` they are in normalised
units. Its update regresses on the ``returns`` and clips around the ``old_values`` that
``compute_adv`` wrote for the batch (``ppo_advantages``, which keeps the running moments of the
returns, as ReaL does), both already in the head's units. The value after a sequence's last token
is only read when the sequence was cut by the length limit (bootstrapping).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import Model, ModelInterface, register_interface
from realrl.impl.interface.common import (
    INPUT_KEY,
    cu_seqlens_on,
    drop_last_token,
    mean_stats,
    require_keys,
    save_model,
    scalar_output,
    token_sample,
)
from realrl.impl.interface.ppo_config import PPOHyperparameters, make_ppo_hyperparameters
from realrl.impl.interface.ppo_keys import CRITIC_TRAIN_KEYS
from realrl.impl.interface.ppo_updates import run_epochs
from realrl.impl.model.nn.moe_stats import add_router_aux_loss
from realrl.impl.model.utils import ppo_functional as F


@dataclasses.dataclass
class PPOCriticInterface(ModelInterface):
    ppo: PPOHyperparameters | dict[str, Any] | None = None
    preset: str | None = None
    token_normalize_scope: str = "global"

    def __post_init__(self) -> None:
        self.ppo = make_ppo_hyperparameters(self.ppo, self.preset)
        if not self.ppo.uses_critic:
            raise ValueError(
                f"ppo_critic: adv_estimator={self.ppo.adv_estimator!r} needs no critic; drop the critic from the graph"
            )

    @property
    def hp(self) -> PPOHyperparameters:
        return self.ppo

    def inference(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        """``values``: the head's output after every token (normalised units with ``value_norm``)."""
        require_keys(data, (INPUT_KEY,), "ppo_critic.inference")
        values = model.module.forward(
            data, mb_spec or MicroBatchSpec(), post_hook=lambda out, mb: scalar_output(out)
        )
        return token_sample(data, "values", values.float())

    def _loss_fn(self, output: torch.Tensor, mb: SequenceSample):
        """Clipped value loss against the returns; the head, the old values and the returns are
        all in the head's units (normalised with ``value_norm``); a Mixture-of-Experts critic adds
        its router's load-balancing loss."""
        values = drop_last_token(scalar_output(output), cu_seqlens_on(mb, output.device))
        dev = values.device
        old = drop_last_token(mb.data["old_values"].float().to(dev), cu_seqlens_on(mb, dev))
        returns = mb.data["returns"].float().to(dev)
        mask = mb.data["ppo_loss_mask"].to(dev)
        loss, st = F.critic_loss(values, old, returns, self.hp.value_eps_clip, mask)
        stats = {k: float(v) for k, v in st.items()}
        stats["value_mean"] = float(F.masked_mean(values.detach(), mask))
        return add_router_aux_loss(loss, stats, output)

    def train_step(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        require_keys(data, CRITIC_TRAIN_KEYS, "ppo_critic.train_step")
        step_stats = run_epochs(
            self.hp,
            model,
            data,
            self._loss_fn,
            lambda m: float(m.data["ppo_loss_mask"].sum()),
            mb_spec,
            self.token_normalize_scope,
        )
        model.inc_version()
        out = {f"critic_{k}": v for k, v in mean_stats(step_stats).items()}
        out["returns_mean"] = float(F.masked_mean(data.data["returns"], data.data["ppo_loss_mask"]))
        return out

    def save(self, model: Model, save_dir: str) -> None:
        save_model(model, save_dir)


register_interface("ppo_critic", PPOCriticInterface)
