"""``ppo_actor`` (and ``grpo_actor``): the policy's generate, reference inference and PPO update.

One interface serves three MFCs (docs/algorithms.md): ``actor_gen`` (``generate``), ``ref_inf``
(``inference`` on the frozen reference -> ``packed_ref_logprobs``) and ``actor_train``
(``train_step``). Options: ``PPOHyperparameters`` (``ppo_config.py``), chosen by ``preset``
("real", "lm_human_preferences", "grpo") and overridden field by field through ``ppo``.

GRPO is ``adv_estimator="grpo"`` of this interface; ``grpo_actor`` is the same class with the
"grpo" preset, so a GRPO graph simply has no critic and no ``values`` input.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import Model, ModelInterface, register_interface
from realrl.base import logging
from realrl.impl.interface.common import (
    INPUT_KEY,
    answer_loss_mask,
    logprob_index,
    mean_stats,
    packed_logprobs,
    require_keys,
    save_model,
    token_minus_one_sample,
)
from realrl.impl.interface.ppo_config import PPOHyperparameters, make_ppo_hyperparameters
from realrl.impl.interface.ppo_rollout import (
    ROLLOUT_KEYS,
    resolve_token_id,
    rollout_sample,
    truncate_generation,
)
from realrl.impl.interface.ppo_state import PPOTrainState
from realrl.impl.model.utils import ppo_functional as F

logger = logging.getLogger("ppo_actor")


@dataclasses.dataclass
class PPOActorInterface(ModelInterface):
    ppo: PPOHyperparameters | dict[str, Any] | None = None
    preset: str | None = None
    recompute_logprobs: bool = False  # re-run the actor after generation for the old log-probs
    token_normalize_scope: str = "global"

    def __post_init__(self) -> None:
        self.ppo = make_ppo_hyperparameters(self.ppo, self.preset)
        self.state = PPOTrainState(self.ppo)

    @property
    def kl_ctl(self):
        return self.state.kl_ctl

    @property
    def hp(self) -> PPOHyperparameters:
        return self.ppo

    @property
    def logprob_temperature(self) -> float:
        return self.hp.gen.temperature if self.hp.temperature_scale_logprobs else 1.0

    def _truncate_id(self, model: Model) -> int | None:
        return resolve_token_id(model.tokenizer, self.hp.truncate_token, "truncate_token")

    # -- generate -----------------------------------------------------------------------------

    def generate(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        """``packed_prompts`` -> ``packed_input_ids``, ``packed_logprobs``, ``prompt_mask``,
        ``seq_no_eos_mask`` (``gen.n`` answers per prompt, held by the prompt's sample)."""
        require_keys(data, ("packed_prompts",), "ppo_actor.generate")
        mb_spec = mb_spec or MicroBatchSpec()
        gen = model.module.generate(data, mb_spec, model.tokenizer, self.hp.gen)
        truncate_id = self._truncate_id(model)
        if truncate_id is not None:
            gen = truncate_generation(gen, truncate_id, self.hp.truncate_after)
        out = rollout_sample(data, gen)
        if self.recompute_logprobs or self.logprob_temperature != self.hp.gen.temperature:
            out.data["packed_logprobs"] = self._logprobs(model, out, mb_spec)
        return out

    # -- reference inference ------------------------------------------------------------------

    def _logprobs(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec) -> torch.Tensor:
        """Log-probs of the answer tokens, 0 at prompt targets (as generation writes them): the
        last layer and the head run on the answer-predicting tokens only."""
        t = self.logprob_temperature
        return model.module.forward(
            data,
            mb_spec,
            post_hook=lambda out, mb: packed_logprobs(out, mb, t, answer_loss_mask(mb)).cpu(),
            output_index_fn=_ANSWER_INDEX,
        ).float()

    def inference(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        """``packed_ref_logprobs`` of the answer tokens, temperature-scaled like the actor's
        ("The N Implementation Details of RLHF with PPO", policy detail 1); 0 at prompt targets, where
        no loss or KL penalty reads them."""
        require_keys(data, (INPUT_KEY,), "ppo_actor.inference")
        logp = self._logprobs(model, data, mb_spec or MicroBatchSpec())
        return token_minus_one_sample(data, "packed_ref_logprobs", logp)

    # -- train --------------------------------------------------------------------------------

    def _loss_fn(self, logits: torch.Tensor, mb: SequenceSample):
        """Clipped surrogate (+ GRPO's k3 KL term), zeroed when the micro-batch's importance
        ratio or approximate KL passes its early-stop threshold."""
        hp = self.hp
        mask = mb.data["ppo_loss_mask"].to(logits.device)
        logp = packed_logprobs(logits, mb, self.logprob_temperature, mask)  # 0 off the mask
        dev = logp.device
        loss, st = F.actor_loss(
            logp, mb.data["packed_logprobs"].to(dev), mb.data["advantages"].to(dev), hp.eps_clip, mask
        )
        stats = {k: float(v) for k, v in st.items()}
        if hp.kl_loss_coef > 0:
            kl = F.masked_mean(F.kl_divergence(logp, mb.data["packed_ref_logprobs"].to(dev), "k3"), mask)
            loss = loss + hp.kl_loss_coef * kl
            stats["kl_loss"] = float(kl.detach())
        stop = (
            hp.early_stop_imp_ratio is not None and stats["importance_ratio"] > hp.early_stop_imp_ratio
        ) or (hp.early_stop_kl is not None and stats["approx_kl"] > hp.early_stop_kl)
        if stop:
            logger.info(
                "early stop: importance ratio %.3f, approx KL %.4f: this micro-batch adds no gradient",
                stats["importance_ratio"],
                stats["approx_kl"],
            )
            loss = loss * 0.0
        stats["early_stopped"] = float(stop)
        return loss, stats

    def train_step(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        hp = self.hp
        needed = ROLLOUT_KEYS + ("packed_ref_logprobs", "rewards")
        require_keys(
            data, needed + (("values",) if hp.adv_estimator == "gae" else ()), "ppo_actor.train_step"
        )
        truncate_id = self._truncate_id(model)
        data, full, batch_stats = self.state.begin_step(data, truncate_id)
        step_stats, prep_stats = self.state.run_epochs(
            model,
            data,
            full,
            truncate_id,
            self._loss_fn,
            mb_spec,
            self.token_normalize_scope,
            output_index_fn=logprob_index(_ppo_loss_mask),
        )
        stats = {
            **batch_stats,
            **mean_stats(prep_stats),
            **mean_stats(step_stats),
            **self.state.end_step(full),
        }
        stats["n_updates"] = float(len(step_stats))
        model.inc_version()
        return stats

    def state_dict(self) -> dict:
        """The KL coefficient and value-normalisation moments (what a resumed run needs)."""
        return self.state.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.state.load_state_dict(state)

    def save(self, model: Model, save_dir: str) -> None:
        save_model(model, save_dir, {"ppo_actor_state": self.state_dict()})


def _ppo_loss_mask(mb: SequenceSample) -> torch.Tensor:
    return mb.data["ppo_loss_mask"]


_ANSWER_INDEX = logprob_index(answer_loss_mask)


@dataclasses.dataclass
class GRPOActorInterface(PPOActorInterface):
    """``ppo_actor`` with the "grpo" preset: K answers per prompt, no critic."""

    preset: str | None = "grpo"


register_interface("ppo_actor", PPOActorInterface)
register_interface("grpo_actor", GRPOActorInterface)
