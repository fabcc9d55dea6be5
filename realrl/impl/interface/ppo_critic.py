"""``ppo_critic``: the value model's inference (``values``) and clipped value update.

The critic reads query + response (seed 002 general detail 1) and computes its returns with the
same ``prepare_advantages`` as the actor, from the same options (pass it the same ``ppo`` and
``preset``). With ``value_norm`` the head learns normalised returns; ``values`` handed to others
are always de-normalised (in return units).
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
from realrl.impl.interface.ppo_actor import make_kl_controller
from realrl.impl.interface.ppo_config import PPOHyperparameters, make_ppo_hyperparameters
from realrl.impl.interface.ppo_rollout import (
    prepare_advantages,
    resolve_token_id,
    rollout_kl,
    shuffled_minibatches,
)
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
        self.kl_ctl = make_kl_controller(self.ppo)
        self.rms = F.RunningMeanStd(beta=self.ppo.value_norm_beta)

    @property
    def hp(self) -> PPOHyperparameters:
        return self.ppo

    def inference(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        """``values`` [L per sequence]; the value after a final EOS is 0 (nothing follows it)."""
        require_keys(data, (INPUT_KEY,), "ppo_critic.inference")
        values = model.module.forward(
            data, mb_spec or MicroBatchSpec(), post_hook=lambda out, mb: scalar_output(out).cpu()
        )
        if self.hp.value_norm:
            values = self.rms.denormalize(values)
        if "seq_no_eos_mask" in data.keys and data.data["seq_no_eos_mask"] is not None:
            last = (data.cu_seqlens(INPUT_KEY)[1:] - 1).long()
            ended = ~data.data["seq_no_eos_mask"].bool().cpu()
            values[last[ended]] = 0.0
        return token_sample(data, "values", values.float())

    def _loss_fn(self, output: torch.Tensor, mb: SequenceSample):
        values = drop_last_token(scalar_output(output), cu_seqlens_on(mb, output.device))
        dev = values.device
        old = drop_last_token(mb.data["values"].float().to(dev), cu_seqlens_on(mb, dev))
        returns = mb.data["returns"].float().to(dev)
        if self.hp.value_norm:
            old, returns = self.rms.normalize(old), self.rms.normalize(returns)
        mask = mb.data["ppo_loss_mask"].to(dev)
        loss, st = F.critic_loss(values, old, returns, self.hp.value_eps_clip, mask)
        stats = {k: float(v) for k, v in st.items()}
        stats["value_mean"] = float(F.masked_mean(values.detach(), mask))
        return loss, stats

    def train_step(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        hp = self.hp
        needed = (
            "packed_input_ids",
            "packed_logprobs",
            "packed_ref_logprobs",
            "prompt_mask",
            "rewards",
            "seq_no_eos_mask",
            "values",
        )
        require_keys(data, needed, "ppo_critic.train_step")
        truncate_id = resolve_token_id(model.tokenizer, hp.truncate_token, "truncate_token")
        full, _ = prepare_advantages(hp, self.kl_ctl.value, data, truncate_id)
        if hp.value_norm:  # running moments of the returns, updated once per train step
            self.rms.update(full.data["returns"], full.data["ppo_loss_mask"])
        if hp.whiten_scope == "batch":
            data = full
        generator = torch.Generator().manual_seed(hp.shuffle_seed * 1_000_003 + model.version.global_step)
        step_stats = []
        for _ in range(hp.ppo_n_epochs):
            for mb in shuffled_minibatches(data, hp.ppo_n_minibatches, generator):
                if hp.whiten_scope == "minibatch":
                    mb, _ = prepare_advantages(hp, self.kl_ctl.value, mb, truncate_id)
                step_stats.append(
                    model.module.train_batch(
                        input_=mb,
                        mb_spec=mb_spec or MicroBatchSpec(),
                        loss_fn=self._loss_fn,
                        loss_weight_fn=lambda m: float(m.data["ppo_loss_mask"].sum()),
                        token_normalize_scope=self.token_normalize_scope,
                        version_steps=model.version.global_step,
                    )
                )
        mean_kl, n_seqs = rollout_kl(full)
        self.kl_ctl.update(mean_kl, n_seqs)  # stays equal to the actor's controller
        model.inc_version()
        out = {f"critic_{k}": v for k, v in mean_stats(step_stats).items()}
        out["returns_mean"] = float(F.masked_mean(full.data["returns"], full.data["ppo_loss_mask"]))
        return out

    def save(self, model: Model, save_dir: str) -> None:
        state = dataclasses.asdict(self.rms)
        save_model(
            model, save_dir, {"ppo_critic_state": {"value_norm": state, "kl_coef": float(self.kl_ctl.value)}}
        )


register_interface("ppo_critic", PPOCriticInterface)
