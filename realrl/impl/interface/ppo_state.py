"""What the actor's and the critic's train steps share: their state and their update loop.

The model worker builds one interface instance per MFC, so state lives with the train-step
instances only (``actor_train``, ``critic_train``): each keeps a KL controller and, with
``value_norm``, running moments of the returns. Both update them from the same batch by the same
rule, so the two copies stay equal (as in ReaL); ``critic_inf`` hands out raw head outputs and
never needs them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import Model
from realrl.impl.interface.common import token_sample
from realrl.impl.interface.ppo_config import PPOHyperparameters
from realrl.impl.interface.ppo_rollout import prepare_advantages, rollout_kl, shuffled_minibatches
from realrl.impl.model.utils import ppo_functional as F


def make_kl_controller(hp: PPOHyperparameters) -> F.FixedKLController | F.AdaptiveKLController:
    if hp.adaptive_kl_ctl:
        return F.AdaptiveKLController(hp.kl_ctl, hp.adaptive_kl_target, hp.adaptive_kl_horizon)
    return F.FixedKLController(hp.kl_ctl)


class PPOTrainState:
    def __init__(self, hp: PPOHyperparameters):
        self.hp = hp
        self.kl_ctl = make_kl_controller(hp)
        self.rms = F.RunningMeanStd(beta=hp.value_norm_beta)

    @property
    def normalizes_values(self) -> bool:
        return self.hp.value_norm and self.hp.adv_estimator == "gae"

    def begin_step(
        self, data: SequenceSample, truncate_id: int | None
    ) -> tuple[SequenceSample, SequenceSample, dict[str, float]]:
        """(data with values in return units, data + advantages over the whole batch, stats).

        With ``value_norm`` the critic's outputs are de-normalised with the moments from before
        this step, then the moments absorb this batch's returns."""
        if self.normalizes_values:
            data = data.select(sorted(data.keys))
            data.update_(token_sample(data, "values", self.rms.denormalize(data.data["values"].float())))
        full, stats = prepare_advantages(self.hp, self.kl_ctl.value, data, truncate_id)
        if self.normalizes_values:
            self.rms.update(full.data["returns"], full.data["ppo_loss_mask"])
        return data, full, stats

    def end_step(self, full: SequenceSample) -> dict[str, float]:
        """Adaptive KL ("The N Implementation Details of RLHF with PPO", PPO detail 11): the
        controller sees the batch's mean KL per sequence."""
        mean_kl, n_seqs = rollout_kl(full)
        self.kl_ctl.update(mean_kl, n_seqs)
        return {"ref_kl": mean_kl, "kl_coef_next": float(self.kl_ctl.value)}

    def run_epochs(
        self,
        model: Model,
        data: SequenceSample,
        full: SequenceSample,
        truncate_id: int | None,
        loss_fn: Callable,
        mb_spec: MicroBatchSpec | None,
        token_normalize_scope: str,
        output_index_fn: Callable[[SequenceSample], torch.Tensor] | None = None,
    ) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
        """Batches and minibatches ("The N Implementation Details of RLHF with PPO", PPO detail 7):
        ``ppo_n_epochs`` passes, each over a fresh shuffle cut into ``ppo_n_minibatches``
        minibatches, one optimizer step per minibatch. With ``whiten_scope="minibatch"`` advantages
        (and whitened rewards) are recomputed per minibatch (PPO detail 9). The shuffle seed
        follows the model version, so the actor and the critic cut the same minibatches.
        ``output_index_fn``: the tokens the loss reads (see the train engine)."""
        hp = self.hp
        source = full if hp.whiten_scope == "batch" else data
        generator = torch.Generator().manual_seed(hp.shuffle_seed * 1_000_003 + model.version.global_step)
        step_stats, prep_stats = [], []
        engine = model.module
        # one mode switch for all the updates instead of two per update (a module walk each)
        hold_train_mode = engine.mode(training=True) if hasattr(engine, "mode") else contextlib.nullcontext()
        samples = source.unpack()
        with hold_train_mode:
            for _ in range(hp.ppo_n_epochs):
                for mb in shuffled_minibatches(samples, hp.ppo_n_minibatches, generator):
                    if hp.whiten_scope == "minibatch":
                        mb, st = prepare_advantages(hp, self.kl_ctl.value, mb, truncate_id)
                        prep_stats.append(st)
                    step_stats.append(
                        engine.train_batch(
                            input_=mb,
                            mb_spec=mb_spec or MicroBatchSpec(),
                            loss_fn=loss_fn,
                            loss_weight_fn=lambda m: float(m.data["ppo_loss_mask"].sum()),
                            token_normalize_scope=token_normalize_scope,
                            version_steps=model.version.global_step,
                            output_index_fn=output_index_fn,
                        )
                    )
        return step_stats, prep_stats

    def state_dict(self) -> dict[str, Any]:
        return {"kl_coef": float(self.kl_ctl.value), "value_norm": dataclasses.asdict(self.rms)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kl_ctl.value = float(state["kl_coef"])
        self.rms = F.RunningMeanStd(**state["value_norm"])
