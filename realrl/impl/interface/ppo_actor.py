"""``ppo_actor`` (and ``grpo_actor``): the policy's generate, reference inference and PPO update.

One interface serves three MFCs (docs/algorithms.md): ``actor_gen`` (``generate``), ``ref_inf``
(``inference`` on the frozen reference -> ``packed_ref_logprobs``) and ``actor_train``
(``train_step``). Options: ``PPOHyperparameters`` (``ppo_config.py``), chosen by ``preset``
("real", "lm_human_preferences", "grpo") and overridden field by field through ``ppo``.

The update reads the advantages ``compute_adv`` wrote for the batch (``ppo_advantages``) and
minimises the registered policy loss ``ppo.policy_loss`` (PPO's clipped token ratio, with DAPO's
clip-higher and dual clip; GSPO's sequence ratio), aggregated by ``ppo.loss_agg_mode``. GRPO is
``adv_estimator="grpo"``; ``grpo_actor`` is this class with the "grpo" preset.

The training-inference mismatch (``ppo.recompute_logprobs``, ``ppo.rollout_correction``): before
its updates the step recomputes the batch's log-probs with the trainer (one no-grad forward) and
reports ``rollout_corr/*`` against the decoder's (``packed_logprobs``); the recomputation is the
old policy the clip is anchored at, and a rollout correction adds truncated importance weights
(a per-token factor beside the decoupled objective's, detached) and rejection (tokens or answers
off ``ppo_loss_mask``), so it composes with every registered policy loss. Under asynchronous RL
(the decoupled objective) the behaviour policy is the decoder's log-probs and the proximal policy
the trainer's recomputation, for every answer: ``rollout_is`` then stands in for AReaL's
pi_prox / pi_behav weight (the same ratio, truncated verl's way instead of capped), and without
``rollout_is`` AReaL's weight stays. ``bypass_mode`` skips the recomputation: rejection and
``rollout_corr/*`` come from each update's own forward against the decoder's log-probs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import Model, ModelInterface, Rollout, register_interface
from realrl.base import logging
from realrl.impl.interface.agent_rollout import AgentOptions, agent_generate
from realrl.impl.interface.common import (
    INPUT_KEY,
    answer_loss_mask,
    cu_seqlens_on,
    logprob_index,
    mean_stats,
    packed_logprobs,
    per_sequence_sample,
    require_keys,
    save_model,
    token_minus_one_sample,
)
from realrl.impl.interface.env_rollout import EnvOptions, env_generate
from realrl.impl.interface.multi_turn import TurnBudget
from realrl.impl.interface.ppo_config import PPOHyperparameters, make_ppo_hyperparameters
from realrl.impl.interface.ppo_keys import BEHAV_VERSION, actor_train_keys
from realrl.impl.interface.ppo_rollout import (
    answer_version_span,
    resolve_token_id,
    rollout_sample,
    stamp_version,
    truncate_generation,
)
from realrl.impl.interface.ppo_updates import run_epochs
from realrl.impl.interface.rollout_correction import RolloutCorrectionConfig
from realrl.impl.interface.router_replay import check_replay_options, require_recorded, without_routing
from realrl.impl.model.nn.moe_stats import add_router_aux_loss
from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.policy_losses import (
    aggregate_loss,
    aggregation_weight,
    behaviour_weights,
    get_policy_loss,
)
from realrl.impl.model.utils.rollout_correction import rollout_correction

logger = logging.getLogger("ppo_actor")
PROX_LOGPROBS = "packed_prox_logprobs"  # the decoupled objective's proximal policy (train_step only)
# tokens whose proximal log-prob is the update's own forward (one update per step; train_step only)
PROX_IS_CURRENT = "prox_is_current"
# the rollout correction's truncated importance weights pi_train / pi_rollout (train_step only)
ROLLOUT_IS_WEIGHTS = "rollout_is_weights"


class PPORollout(Rollout):
    """The policy's generate call decoded in pieces (asynchronous RL's partial rollouts): when the
    weights changed between two pieces (a newer version arrived), the unfinished answers' caches
    are recomputed under them and decoding goes on; every token keeps the version that sampled it,
    and an answer's ``behav_version`` is its oldest token's."""

    def __init__(
        self, interface: PPOActorInterface, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec
    ):
        self.interface, self.model, self.data, self.mb_spec = interface, model, data, mb_spec
        self.session = model.module.start_generation(data, mb_spec, model.tokenizer, interface.hp.gen)
        self.version: int | None = None

    def advance(self, tokens: int, version: int) -> int:
        if self.version is not None and version != self.version:
            self.session.refresh()
        self.version = version
        return self.session.advance(tokens, version)

    def finish(self) -> tuple[SequenceSample, dict]:
        gen, token_versions = self.session.output()
        oldest, newest = answer_version_span(gen, token_versions)
        out = self.interface.rollout(self.model, self.data, gen, self.mb_spec, oldest)
        stats = {
            # answers continued under newer weights, and how many newer versions reached the call
            "answers_spanning_versions": float((newest > oldest).float().mean()),
            "weight_updates_mid_call": float(len(set(self.session.versions)) - 1),
        }
        return out, stats


@dataclasses.dataclass
class PPOActorInterface(ModelInterface):
    ppo: PPOHyperparameters | dict[str, Any] | None = None
    preset: str | None = None
    recompute_logprobs: bool = False  # re-run the actor after generation for the old log-probs
    token_normalize_scope: str = "global"
    # multi-turn rollouts: the environment (a registered name, module:Class or file.py:Class),
    # its constructor's keyword arguments and the seconds one step may take (env_rollout.py)
    env: str | None = None
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    env_timeout: float = 60.0
    # or a user's agent talking to the policy through the chat endpoint (agent_rollout.py): its
    # async run(client, prompt, **metadata) -> reward, and the seconds one run may take
    agent: str | None = None
    agent_timeout: float = 600.0

    def __post_init__(self) -> None:
        self.ppo = make_ppo_hyperparameters(self.ppo, self.preset)
        if self.hp.recompute_logprobs and self.hp.rollout_correction.bypass_mode:
            raise ValueError(
                "ppo.rollout_correction.bypass_mode keeps the decoder's log-probs as the old policy; "
                "ppo.recompute_logprobs=true replaces them with the trainer's: choose one"
            )
        check_replay_options(self.hp, multi_turn=self.env is not None or self.agent is not None)
        if self.env is None and self.hp.max_turns > 1:
            raise ValueError(
                f"ppo.max_turns={self.hp.max_turns} needs env=<an environment>: it takes turns with one"
            )
        self.env_options = (
            None
            if self.env is None
            else EnvOptions(
                self.env,
                dict(self.env_kwargs),
                self.env_timeout,
                TurnBudget(self.hp.max_turns, self.hp.gen.max_new_tokens, self.hp.max_total_tokens),
            )
        )
        if self.env is not None and self.agent is not None:
            raise ValueError("env=... and agent=... both produce the trajectories: give one of them")
        self.agent_options = (
            None
            if self.agent is None
            else AgentOptions(
                self.agent, self.agent_timeout, self.hp.gen.max_new_tokens, self.hp.max_total_tokens
            )
        )

    @property
    def hp(self) -> PPOHyperparameters:
        return self.ppo

    @property
    def measures_mismatch(self) -> bool:
        """Whether the train step recomputes the batch's log-probs (one extra forward)."""
        corr = self.hp.rollout_correction
        return self.hp.recompute_logprobs or (corr.enabled and not corr.bypass_mode)

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
        if self.env_options is not None or self.agent_options is not None:
            return self._generate_with_env(model, data, mb_spec)
        gen = model.module.generate(data, mb_spec, model.tokenizer, self.hp.decoder_gen)
        versions = torch.full((len(gen.seqlens),), model.version.global_step, dtype=torch.long)
        return self.rollout(model, data, gen, mb_spec, versions)

    def _generate_with_env(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec):
        """Multi-turn trajectories (``env_rollout``, or ``agent_rollout``): the rollout keys,
        ``env_rewards`` (each trajectory's summed step rewards, or its agent's reward) and the
        turns' statistics."""
        if self.agent_options is not None:
            gen, env_rewards, stats = agent_generate(model, data, mb_spec, self.hp.gen, self.agent_options)
        else:
            gen, env_rewards, stats = env_generate(model, data, mb_spec, self.hp.gen, self.env_options)
        versions = torch.full((len(gen.seqlens),), model.version.global_step, dtype=torch.long)
        out = self.rollout(model, data, gen, mb_spec, versions)
        out.update_(per_sequence_sample(out, "env_rewards", env_rewards.to(out.data[INPUT_KEY].device)))
        return out, stats

    def start_rollout(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        """``generate`` in pieces (partial rollouts): ``PPORollout``."""
        require_keys(data, ("packed_prompts",), "ppo_actor.start_rollout")
        if self.env_options is not None or self.agent_options is not None:
            raise ValueError(
                "async_rl.partial_rollout cannot interrupt multi-turn rollouts (env=...): a turn waits on "
                "its environment; use asynchronous RL without partial rollouts"
            )
        return PPORollout(self, model, data, mb_spec or MicroBatchSpec())

    def rollout(
        self, model: Model, data: SequenceSample, gen, mb_spec: MicroBatchSpec, versions: torch.Tensor
    ) -> SequenceSample:
        """The rollout keys of a generation; ``versions``: the policy version that sampled each
        answer's first token, its ``behav_version`` (with partial rollouts the oldest of its
        tokens: the bound applies to it)."""
        require_recorded(self.hp, gen)
        truncate_id = self._truncate_id(model)
        if truncate_id is not None:
            gen = truncate_generation(gen, truncate_id, self.hp.truncate_after)
        out = rollout_sample(data, gen)
        if self.recompute_logprobs or self.logprob_temperature != self.hp.gen.temperature:
            out.data["packed_logprobs"] = self._logprobs(model, out, mb_spec)
        if self.hp.decoupled_loss:
            stamp_version(out, versions)
        return out

    # -- reference inference ------------------------------------------------------------------

    def _logprobs(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec) -> torch.Tensor:
        """Log-probs of the answer tokens, 0 at prompt targets (as generation writes them): the
        last layer and the head run on the answer-predicting tokens only."""
        t = self.logprob_temperature
        return model.module.forward(
            data,
            mb_spec,
            post_hook=lambda out, mb: packed_logprobs(out, mb, t, answer_loss_mask(mb)),
            output_index_fn=_ANSWER_INDEX,
        ).float()

    def inference(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        """``packed_ref_logprobs`` of the answer tokens, temperature-scaled like the actor's
        ("The N Implementation Details of RLHF with PPO", policy detail 1); 0 at prompt targets, where
        no loss or KL penalty reads them."""
        require_keys(data, (INPUT_KEY,), "ppo_actor.inference")
        data = without_routing(data)  # the reference routes by itself
        logp = self._logprobs(model, data, mb_spec or MicroBatchSpec())
        return token_minus_one_sample(data, "packed_ref_logprobs", logp)

    # -- train --------------------------------------------------------------------------------

    def _loss_fn(self, logits: torch.Tensor, mb: SequenceSample):
        """The registered policy loss (+ GRPO's k3 KL term), aggregated by ``loss_agg_mode`` (+ a
        Mixture-of-Experts policy's router load-balancing term), zeroed when the micro-batch's
        importance ratio or approximate KL passes its early-stop threshold."""
        hp = self.hp
        mask = mb.data["ppo_loss_mask"].to(logits.device)
        logp = packed_logprobs(logits, mb, self.logprob_temperature, mask)  # 0 off the mask
        dev = logp.device
        short_cu = F.short_cu_seqlens(cu_seqlens_on(mb, dev))
        behav = mb.data["packed_logprobs"].to(dev)
        corr = hp.rollout_correction
        corr_stats = {}
        if corr.bypass_mode:  # rejection against the current policy, by this forward
            _, kept, corr_stats = _correct(corr, logp.detach(), behav, mask, short_cu, with_weights=False)
            mask = kept
        # the decoupled objective when some answers came from an older policy (train_step adds
        # their proximal log-probs); else the clip is anchored at the behaviour policy itself
        prox = mb.data[PROX_LOGPROBS].to(dev) if PROX_LOGPROBS in mb.data else None
        if PROX_IS_CURRENT in mb.data:  # one update per step: this forward is the proximal policy
            prox = torch.where(mb.data[PROX_IS_CURRENT].to(dev), logp.detach(), prox)
        per_token, st = get_policy_loss(hp.policy_loss)(
            logp,
            behav if prox is None else prox,
            mb.data["advantages"].to(dev),
            mask,
            short_cu,
            hp.loss_config(),
        )
        # the per-token weights: the rollout correction's pi_train / pi_rollout (truncated), or
        # the decoupled objective's pi_prox / pi_behav: the same ratio once prox is recomputed
        if ROLLOUT_IS_WEIGHTS in mb.data:
            per_token = per_token * mb.data[ROLLOUT_IS_WEIGHTS].to(dev)
        elif prox is not None and hp.decoupled_loss:
            weights, weight_stats = behaviour_weights(prox, behav, mask, hp.behav_imp_weight_cap)
            per_token = per_token * weights
            st = {**st, **weight_stats}
        loss = aggregate_loss(per_token, mask, short_cu, hp.loss_agg_mode, hp.norm_const())
        stats = {**{k: float(v) for k, v in st.items()}, **corr_stats}
        # how far the token ratio strays from 1 before any update: generation and training
        # disagreeing about the same tokens' log-probs (train_step reports the first minibatch's)
        old = mb.data["packed_logprobs"].to(dev)
        stray = ((logp.detach() - old).exp() - 1).abs()
        on = mask.bool()
        stats["ratio_dev_max"] = float(stray[on].max()) if bool(on.any()) else 0.0
        if hp.kl_loss_coef > 0:
            kl = F.kl_divergence(logp, mb.data["packed_ref_logprobs"].to(dev), "k3")
            kl_loss = aggregate_loss(kl * mask, mask, short_cu, hp.loss_agg_mode, hp.norm_const())
            loss = loss + hp.kl_loss_coef * kl_loss
            stats["kl_loss"] = float(kl_loss.detach())
        # a Mixture-of-Experts actor's router load-balancing term (before the early stop zeroes all)
        loss, stats = add_router_aux_loss(loss, stats, logits)
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

    def _loss_weight(self, mb: SequenceSample) -> float:
        """A micro-batch's share: its response tokens (token-mean) or answers (the seq-mean modes)."""
        mask = mb.data["ppo_loss_mask"]
        return aggregation_weight(
            mask, F.short_cu_seqlens(cu_seqlens_on(mb, mask.device)), self.hp.loss_agg_mode
        )

    def _whiten_minibatch(self, mb: SequenceSample) -> SequenceSample:
        """PPO detail 9 with ``whiten_scope="minibatch"``: advantages whitened per minibatch."""
        mask = mb.data["ppo_loss_mask"]
        mb.data["advantages"] = F.whiten(mb.data["advantages"], shift_mean=True, mask=mask)
        return mb

    def _add_proximal_logprobs(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec) -> int:
        """The decoupled objective's proximal policy: the weights this step starts from. Answers
        sampled by an older version get their log-probs under these weights (one no-grad forward
        before the update, or, when the step makes one update only, that update's own forward);
        answers of this very version keep their recorded ones, so a batch with no stale answer
        gets no key at all and trains exactly as the standard objective. Returns how many
        answers were stale."""
        stale = _stale_answers(model, data)
        if not bool(stale.any()):
            return 0
        behav = data.data["packed_logprobs"]
        lens = torch.tensor(data.flat_seqlens("packed_logprobs"), device=stale.device)
        stale_tokens = stale.repeat_interleave(lens).to(behav.device)
        if self.hp.ppo_n_epochs * self.hp.ppo_n_minibatches == 1:
            # one update: its own forward runs at the weights the step starts from, so the
            # proximal log-probs are that forward's, detached; no extra forward needed
            data.update_(token_minus_one_sample(data, PROX_LOGPROBS, behav))
            data.update_(token_minus_one_sample(data, PROX_IS_CURRENT, stale_tokens))
            return int(stale.sum())
        prox = self._logprobs(model, data, mb_spec).to(behav.device)
        data.update_(token_minus_one_sample(data, PROX_LOGPROBS, torch.where(stale_tokens, prox, behav)))
        return int(stale.sum())

    def _add_trainer_logprobs(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec):
        """The trainer's log-probs of the batch (one no-grad forward at the weights the step
        starts from) as the old / proximal policy of every answer, the rollout correction's
        weights and rejected tokens, and the ``rollout_corr/*`` statistics."""
        behav, mask = data.data["packed_logprobs"], data.data["ppo_loss_mask"]
        train = self._logprobs(model, data, mb_spec).to(behav.device)
        short_cu = F.short_cu_seqlens(cu_seqlens_on(data, mask.device))
        weights, kept, stats = _correct(self.hp.rollout_correction, train, behav, mask, short_cu)
        data.update_(token_minus_one_sample(data, PROX_LOGPROBS, train))
        if weights is not None:
            data.update_(token_minus_one_sample(data, ROLLOUT_IS_WEIGHTS, weights.to(behav.dtype)))
        if self.hp.rollout_correction.rollout_rs is not None:
            data.update_(token_minus_one_sample(data, "ppo_loss_mask", kept.to(mask.dtype)))
        return stats

    def train_step(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        hp = self.hp
        require_keys(data, actor_train_keys(hp), "ppo_actor.train_step")
        corr_stats, stale = {}, 0
        if self.measures_mismatch:
            corr_stats = self._add_trainer_logprobs(model, data, mb_spec or MicroBatchSpec())
            stale = int(_stale_answers(model, data).sum()) if hp.decoupled_loss else 0
        elif hp.decoupled_loss:
            stale = self._add_proximal_logprobs(model, data, mb_spec or MicroBatchSpec())
        per_minibatch = hp.adv_norm and hp.whiten_scope == "minibatch"
        step_stats = run_epochs(
            hp,
            model,
            data,
            self._loss_fn,
            self._loss_weight,
            mb_spec,
            self.token_normalize_scope,
            output_index_fn=logprob_index(_ppo_loss_mask),
            prepare=self._whiten_minibatch if per_minibatch else None,
        )
        # the first minibatch meets the policy that generated it: its token ratios should be 1
        first_dev = [s.pop("ratio_dev_max", None) for s in step_stats][0]
        stats = mean_stats(step_stats)
        if first_dev is not None:  # None: the minibatch held no answer token
            stats["first_mb_ratio_max_dev"] = first_dev
        stats["n_updates"] = float(len(step_stats))
        stats.update(corr_stats)
        if hp.decoupled_loss:
            stats["stale_answers"] = float(stale)
        model.inc_version()
        return stats

    def save(self, model: Model, save_dir: str) -> None:
        save_model(model, save_dir)


def _ppo_loss_mask(mb: SequenceSample) -> torch.Tensor:
    return mb.data["ppo_loss_mask"]


def _stale_answers(model: Model, data: SequenceSample) -> torch.Tensor:
    """bool [answers]: sampled by a policy version older than the one this step starts from."""
    return data.data[BEHAV_VERSION] < model.version.global_step


def _correct(
    corr: RolloutCorrectionConfig,
    train: torch.Tensor,
    rollout: torch.Tensor,
    mask: torch.Tensor,
    short_cu: torch.Tensor,
    with_weights: bool = True,
):
    """``rollout_correction`` with the options of ``ppo.rollout_correction``."""
    level = corr.rollout_is if with_weights else None
    return rollout_correction(
        train,
        rollout,
        mask,
        short_cu,
        level,
        corr.rollout_is_threshold,
        corr.rollout_is_batch_normalize,
        corr.rejection_rules(),
    )


_ANSWER_INDEX = logprob_index(answer_loss_mask)


@dataclasses.dataclass
class GRPOActorInterface(PPOActorInterface):
    """``ppo_actor`` with the "grpo" preset: K answers per prompt, no critic."""

    preset: str | None = "grpo"


register_interface("ppo_actor", PPOActorInterface)
register_interface("grpo_actor", GRPOActorInterface)
