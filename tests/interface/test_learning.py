"""PPO, GRPO and its relatives (Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++, ReMax) raise a
rule-based reward on a tiny ReaLModel: the whole interface loop, as the PPO-family graph runs it,
with one interface instance per MFC like the model worker builds them.

Run with ``-s`` to see the per-iteration reward and KL printed (the figures in docs/algorithms.md).
"""

import pytest
import torch
from interface_fixtures import make_model, prompt_batch

from realrl.api.core.config import ModelInterfaceAbstraction
from realrl.api.core.model_api import make_interface

REWARD = {
    "fn": "word_sentiment",
    "fn_kwargs": {"positive_words": ["good", "great"], "negative_words": ["bad", "awful"], "end_token": None},
}


CRITIC_FREE = ("grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "remax")


def run(tokenizer, algo: str, iterations: int, n_prompts: int) -> list[float]:
    """``algo``: "ppo" or a critic-free preset. The graph's calls in order, ``compute_adv``
    included: actor_gen (and ReMax's greedy rollout) -> rew_inf -> ref_inf -> critic_inf ->
    compute_adv -> actor_train, critic_train."""
    gen = {"max_new_tokens": 6, "min_new_tokens": 6, "top_p": 1.0, "top_k": 0, "n": 1 if algo == "ppo" else 4}
    if algo == "ppo":
        preset, ppo = (
            None,
            {"gen": gen, "ppo_n_minibatches": 1, "ppo_n_epochs": 2, "kl_ctl": 0.02, "gae_lambda": 0.95},
        )
    else:
        preset, ppo = algo, {"gen": gen, "ppo_n_epochs": 2}
        if algo in ("grpo", "dr_grpo"):
            ppo["kl_loss_coef"] = 0.01
        if algo == "gspo":  # the paper's 3e-4 / 4e-4 clip suits long answers; 6 tokens move further
            ppo.update(eps_clip=0.02, eps_clip_high=0.03)

    def iface(kind, options=None):
        return make_interface(ModelInterfaceAbstraction(kind, {"ppo": options or ppo, "preset": preset}))

    actor, ref = make_model(tokenizer, lr=3e-3), make_model(tokenizer, role="ref", train=False)
    critic = make_model(tokenizer, role="critic", critic=True, lr=3e-3)
    actor_gen, ref_inf, actor_train, adv = (
        iface("ppo_actor"),
        iface("ppo_actor"),
        iface("ppo_actor"),
        iface("ppo_advantages"),
    )
    greedy_gen = iface("ppo_actor", {**ppo, "gen": {**gen, "greedy": True, "n": 1}})
    critic_inf, critic_train = (iface("ppo_critic"), iface("ppo_critic")) if algo == "ppo" else (None, None)
    rew_inf = make_interface(ModelInterfaceAbstraction("reward_fn", REWARD))
    prompts = [f"w{i} w{(i * 7) % 23}" for i in range(n_prompts)]
    torch.manual_seed(0)
    rewards = []
    for it in range(iterations):
        batch = prompt_batch(tokenizer, prompts)
        out = actor_gen.generate(actor, batch)
        out.update_(rew_inf.inference(actor, out))
        out.update_(ref_inf.inference(ref, out))
        if adv.hp.estimator.needs_baseline:
            greedy = greedy_gen.generate(actor, batch)
            scores = rew_inf.inference(actor, greedy)
            scores.remap_keys_({"rewards": "baseline_rewards"})
            out.update_(scores)
        if critic_inf is not None:
            out.update_(critic_inf.inference(critic, out))
        advantages, adv_stats = adv.inference(actor, out)  # reads only the tokenizer
        out.update_(advantages)
        actor_train.train_step(actor, out)
        if critic_train is not None:
            critic_train.train_step(critic, out)
        rewards.append(float(out.data["rewards"].mean()))
        print(f"{algo} iteration {it}: reward {rewards[-1]:.3f} kl {adv_stats['ref_kl']:.3f}")
    return rewards


@pytest.mark.slow
@pytest.mark.parametrize("algo,n_prompts", [("ppo", 32)] + [(a, 8) for a in CRITIC_FREE])
def test_reward_rises(tokenizer, algo, n_prompts):
    rewards = run(tokenizer, algo, iterations=10, n_prompts=n_prompts)
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.4
