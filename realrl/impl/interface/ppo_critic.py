"""``ppo_critic``: the value model's inference (``values``) and clipped value update.

The critic reads query + response ("The N Implementation Details of RLHF with PPO", general
detail 1) and computes its returns with the same ``prepare_advantages`` as the actor, from the
same options (pass it the same ``ppo`` and ``preset``). ``values`` are the head's raw outputs;
with ``value_norm`` they are in normalised units, and both train steps (actor and critic)
de-normalise them with the running moments of the returns that each keeps
(``ppo_state.PPOTrainState``), as ReaL does. The value after a sequence's last token is only read
when the sequence was cut by the length limit (bootstrapping).
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
from realrl.impl.interface.ppo_rollout import ROLLOUT_KEYS, resolve_token_id
from realrl.impl.interface.ppo_state import PPOTrainState
from realrl.impl.model.utils import ppo_functional as F


@dataclasses.dataclass
class PPOCriticInterface(ModelInterface):
    ppo: PPOHyperparameters | dict[str, Any] | None = None
    preset: str | None = None
    token_normalize_scope: str = "global"

    def __post_init__(self) -> None:
        self.ppo = make_ppo_hyperparameters(self.ppo, self.preset)
        if self.ppo.adv_estimator != "gae":
            raise ValueError(
                "ppo_critic: adv_estimator='grpo' needs no critic; drop the critic from the graph"
            )
        self.state = PPOTrainState(self.ppo)

    @property
    def hp(self) -> PPOHyperparameters:
        return self.ppo

    @property
    def kl_ctl(self):
        return self.state.kl_ctl

    @property
    def rms(self) -> F.RunningMeanStd:
        return self.state.rms

    def inference(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        """``values``: the head's output after every token (normalised units with ``value_norm``)."""
        require_keys(data, (INPUT_KEY,), "ppo_critic.inference")
        values = model.module.forward(
            data, mb_spec or MicroBatchSpec(), post_hook=lambda out, mb: scalar_output(out).cpu()
        )
        return token_sample(data, "values", values.float())

    def _loss_fn(self, output: torch.Tensor, mb: SequenceSample):
        """Clipped value loss against the returns; with ``value_norm`` the head, the old values
        and the returns are all compared in normalised units."""
        values = drop_last_token(scalar_output(output), cu_seqlens_on(mb, output.device))
        dev = values.device
        old = drop_last_token(mb.data["values"].float().to(dev), cu_seqlens_on(mb, dev))
        returns = mb.data["returns"].float().to(dev)
        if self.state.normalizes_values:
            old, returns = self.rms.normalize(old), self.rms.normalize(returns)
        mask = mb.data["ppo_loss_mask"].to(dev)
        loss, st = F.critic_loss(values, old, returns, self.hp.value_eps_clip, mask)
        stats = {k: float(v) for k, v in st.items()}
        stats["value_mean"] = float(F.masked_mean(values.detach(), mask))
        return loss, stats

    def train_step(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        needed = ROLLOUT_KEYS + ("packed_ref_logprobs", "rewards", "values")
        require_keys(data, needed, "ppo_critic.train_step")
        truncate_id = resolve_token_id(model.tokenizer, self.hp.truncate_token, "truncate_token")
        data, full, _ = self.state.begin_step(data, truncate_id)
        step_stats, _ = self.state.run_epochs(
            model, data, full, truncate_id, self._loss_fn, mb_spec, self.token_normalize_scope
        )
        self.state.end_step(full)  # keeps the KL coefficient equal to the actor's
        model.inc_version()
        out = {f"critic_{k}": v for k, v in mean_stats(step_stats).items()}
        out["returns_mean"] = float(F.masked_mean(full.data["returns"], full.data["ppo_loss_mask"]))
        return out

    def state_dict(self) -> dict:
        return self.state.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.state.load_state_dict(state)

    def save(self, model: Model, save_dir: str) -> None:
        save_model(model, save_dir, {"ppo_critic_state": self.state_dict()})


register_interface("ppo_critic", PPOCriticInterface)
