"""``ppo_advantages``: the advantages, returns and KL rewards of a batch, computed once.

The ``compute_adv`` call of every PPO-family graph: it runs after the rollout's scores, reference
log-probs and values are in, on the whole batch, and both updates read what it writes, so the
actor's advantages and the critic's targets come from one computation. It owns the run's KL
controller and the running moments of the returns (value normalisation); they are saved once,
in recover points, as this call's state. Reading top to bottom:

1. the score of each answer (``ppo_rollout.shape_scores``: scaling, penalties, clipping) and
   DAPO's overlong shaping;
2. the per-token KL to the reference, -kl_coef * KL on each response token, the score added at
   the last one ("The N Implementation Details of RLHF with PPO", PPO detail 8);
3. the registered estimator ``adv_estimator`` turns them into advantages and returns
   (``realrl.impl.model.utils.advantages``), with critic values de-normalised first;
4. advantages whitened over the batch (``adv_norm``; per minibatch instead with
   ``whiten_scope="minibatch"``, done by the update);
5. the KL controller sees the batch's KL; the value moments absorb its returns.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import SAMPLES_KEY, Model, ModelInterface, register_interface
from realrl.impl.interface.common import INPUT_KEY, require_keys, token_minus_one_sample, token_sample
from realrl.impl.interface.ppo_config import PPOHyperparameters, make_ppo_hyperparameters
from realrl.impl.interface.ppo_keys import REF_LOGPROBS, advantage_inputs, eval_inputs
from realrl.impl.interface.ppo_rollout import (
    overlong_penalties,
    resolve_token_id,
    rollout_kl,
    shape_scores,
    task_rewards,
)
from realrl.impl.interface.texts import prompts_and_completions, turn_texts
from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.advantages import AdvantageInputs


def make_kl_controller(hp: PPOHyperparameters) -> F.FixedKLController | F.AdaptiveKLController:
    if hp.adaptive_kl_ctl:
        return F.AdaptiveKLController(hp.kl_ctl, hp.adaptive_kl_target, hp.adaptive_kl_horizon)
    return F.FixedKLController(hp.kl_ctl)


@dataclasses.dataclass
class AdvantageInterface(ModelInterface):
    ppo: PPOHyperparameters | dict[str, Any] | None = None
    preset: str | None = None
    scores: tuple[str, ...] = ("rewards",)  # the graph's scores, summed (ppo_keys.score_keys)

    def __post_init__(self) -> None:
        self.ppo = make_ppo_hyperparameters(self.ppo, self.preset)
        unknown = sorted(set(self.ppo.gdpo_reward_keys or ()) - set(self.scores))
        if unknown:
            raise ValueError(
                f"ppo.gdpo_reward_keys {unknown} are not scores of this graph: {list(self.scores)}"
            )
        self.kl_ctl = make_kl_controller(self.ppo)
        self.rms = F.RunningMeanStd(beta=self.ppo.value_norm_beta)

    @property
    def hp(self) -> PPOHyperparameters:
        return self.ppo

    @property
    def normalizes_values(self) -> bool:
        return self.hp.value_norm and self.hp.uses_critic

    def inference(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        hp = self.hp
        require_keys(data, advantage_inputs(hp, tuple(self.scores)), "ppo_advantages.inference")
        truncate_id = resolve_token_id(model.tokenizer, hp.truncate_token, "truncate_token")
        ids = data.data[INPUT_KEY]
        cu = data.cu_seqlens(INPUT_KEY).to(ids.device)
        loss_mask = F.response_loss_mask(data.data["prompt_mask"], cu)
        old_logp = data.data["packed_logprobs"].float()
        # no KL term reads the reference (``uses_reference``): its log-probs are the policy's own,
        # a KL of zero under a coefficient of zero
        ref_logp = data.data[REF_LOGPROBS].float() if hp.uses_reference else old_logp

        # 1. scores
        score, stats = shape_scores(hp, data, truncate_id)
        if hp.overlong_buffer_ratio:
            buffer = max(1, round(hp.overlong_buffer_ratio * hp.gen.max_new_tokens))
            penalty = overlong_penalties(loss_mask, cu, hp.gen.max_new_tokens, buffer, hp.overlong_penalty)
            score = score - penalty
            stats["overlong_penalty"] = float(penalty.mean())
        # 2. KL rewards
        kl_rewards, token_rewards = F.packed_kl_rewards(
            self.kl_ctl.value, old_logp, ref_logp, score, cu, loss_mask, hp.kl_estimator
        )
        # 3. the estimator (values in return units: the critic's head learns normalised ones)
        values = None
        if hp.uses_critic:
            values = data.data["values"].float()
            if self.normalizes_values:
                values = self.rms.denormalize(values)
        baseline = None
        if hp.estimator.needs_baseline:  # ReMax: the greedy answer's score, scaled like the others'
            greedy = data.data["baseline_rewards"].float() * hp.reward_output_scaling + hp.reward_output_bias
            per_prompt = F.clip_rewards(greedy, hp.max_reward_clip)
            sizes = torch.tensor(_group_sizes(data), device=per_prompt.device)
            baseline = torch.repeat_interleave(per_prompt, sizes)
        est = hp.estimator
        no_eos = data.data["seq_no_eos_mask"].float()
        advantages, returns = est(
            AdvantageInputs(
                token_rewards=token_rewards,
                scores=score,
                loss_mask=loss_mask,
                cu_seqlens=cu,
                group_sizes=_group_sizes(data),
                values=values,
                bootstrap=no_eos if hp.bootstrap_no_eos else torch.zeros_like(no_eos),
                baseline_scores=baseline,
                old_logprobs=old_logp if est.needs_logprobs else None,
                reward_components=_reward_components(data, hp) if est.needs_reward_components else None,
                reward_weights=hp.gdpo_reward_weights,
                discount=hp.discount,
                gae_lambda=hp.gae_lambda,
                scale_by_std=hp.grpo_scale_by_std,
                reward_whiten=hp.reward_whiten,
            )
        )
        # 4. whitening over the batch
        if hp.adv_norm and hp.whiten_scope == "batch":
            advantages = F.whiten(advantages, shift_mean=True, mask=loss_mask)
        # 5. the controller and the value moments
        kl_coef = float(self.kl_ctl.value)  # what this batch was penalised with
        if hp.uses_reference:
            mean_kl, n_seqs = rollout_kl(data)
            self.kl_ctl.update(mean_kl, n_seqs)
            stats["ref_kl"] = mean_kl
        parts = [
            token_minus_one_sample(data, "advantages", advantages.float()),
            token_minus_one_sample(data, "ppo_loss_mask", loss_mask),
            token_minus_one_sample(data, "kl_rewards", kl_rewards.float()),
        ]
        if hp.uses_critic:
            if self.normalizes_values:
                self.rms.update(returns, loss_mask)
                returns, values = self.rms.normalize(returns), self.rms.normalize(values)
            parts += [
                token_minus_one_sample(data, "returns", returns.float()),
                token_sample(data, "old_values", values),
            ]
        n_tok = loss_mask.float().sum().clamp(min=1)
        n = cu.shape[0] - 1
        stats.update(
            kl_coef=kl_coef,
            kl_coef_next=float(self.kl_ctl.value),
            kl_reward=float(kl_rewards.sum() / n),
            advantage_mean=float((advantages * loss_mask).sum() / n_tok),
            response_length=float(loss_mask.float().sum() / n),
        )
        if hp.log_samples and model.tokenizer is not None:
            stats[SAMPLES_KEY] = _examples(data, model.tokenizer, score, hp.log_samples)
        return _merged(parts), stats

    def state_dict(self) -> dict[str, Any]:
        """The KL coefficient and value-normalisation moments (what a resumed run needs)."""
        return {"kl_coef": float(self.kl_ctl.value), "value_norm": dataclasses.asdict(self.rms)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kl_ctl.value = float(state["kl_coef"])
        self.rms = F.RunningMeanStd(**state["value_norm"])


@dataclasses.dataclass
class RolloutEvalInterface(ModelInterface):
    """``ppo_eval``: the statistics of rollouts on held-out prompts (an RL run's evaluation): the
    task reward, the shaped score, the response length, the KL to the reference and the share cut
    by the length limit. It changes no state: the KL controller and value moments are
    ``compute_adv``'s."""

    ppo: PPOHyperparameters | dict[str, Any] | None = None
    preset: str | None = None
    scores: tuple[str, ...] = ("rewards",)

    def __post_init__(self) -> None:
        self.ppo = make_ppo_hyperparameters(self.ppo, self.preset)

    def inference(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        require_keys(data, eval_inputs(self.ppo, tuple(self.scores)), "ppo_eval.inference")
        truncate_id = resolve_token_id(model.tokenizer, self.ppo.truncate_token, "truncate_token")
        _, stats = shape_scores(self.ppo, data, truncate_id)
        cu = data.cu_seqlens(INPUT_KEY)
        loss_mask = F.response_loss_mask(data.data["prompt_mask"], cu)
        if self.ppo.uses_reference:
            stats["ref_kl"], _ = rollout_kl(data)
        stats["response_length"] = float(loss_mask.float().sum() / (cu.shape[0] - 1))
        stats["n_prompts"] = float(data.bs)
        return None, stats


def _examples(data: SequenceSample, tokenizer: Any, score: torch.Tensor, n_prompts: int) -> list[dict]:
    """The first ``n_prompts`` prompts' answers, decoded, with their reward and shaped score."""
    head = SequenceSample.gather(data.unpack()[:n_prompts])
    _, prompts, completions = prompts_and_completions(head, tokenizer)
    rewards = task_rewards(head).tolist()
    rows = [
        {"prompt": p, "completion": c, "reward": round(r, 4), "score": round(float(s), 4)}
        for p, c, r, s in zip(prompts, completions, rewards, score[: len(rewards)].tolist())
    ]
    for row, turns in zip(rows, turn_texts(head, tokenizer)):
        if any("env" in t for t in turns):  # a multi-turn trajectory: each turn marked
            row["turns"] = turns
    return rows


def _reward_components(data: SequenceSample, hp: PPOHyperparameters) -> torch.Tensor | None:
    """GDPO's components: the scores ``gdpo_reward_keys`` names, one row each [C, N] (None: the
    estimator takes the summed score alone)."""
    if not hp.gdpo_reward_keys:
        return None
    return torch.stack([data.data[k].float() for k in hp.gdpo_reward_keys])


def _group_sizes(data: SequenceSample) -> list[int]:
    """Answers per prompt: the sequences each sample holds."""
    return [len(row) for row in data.seqlens[INPUT_KEY]]


def _merged(parts: list[SequenceSample]) -> SequenceSample:
    out = parts[0]
    for p in parts[1:]:
        out.update_(p)
    return out


register_interface("ppo_advantages", AdvantageInterface)
register_interface("ppo_eval", RolloutEvalInterface)
