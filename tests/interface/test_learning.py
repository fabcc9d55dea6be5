"""PPO and GRPO raise a rule-based reward on a tiny ReaLModel: the whole interface loop, as the
PPO graph runs it (actor_gen -> rew_inf -> ref_inf -> critic_inf -> actor_train, critic_train),
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


def run(tokenizer, algo: str, iterations: int, n_prompts: int) -> list[float]:
    gen = {
        "max_new_tokens": 6,
        "min_new_tokens": 6,
        "top_p": 1.0,
        "top_k": 0,
        "n": 4 if algo == "grpo" else 1,
    }
    if algo == "grpo":
        name, ppo = "grpo_actor", {"gen": gen, "ppo_n_epochs": 2, "kl_loss_coef": 0.01}
    else:
        name, ppo = (
            "ppo_actor",
            {"gen": gen, "ppo_n_minibatches": 1, "ppo_n_epochs": 2, "kl_ctl": 0.02, "gae_lambda": 0.95},
        )

    def iface(kind):
        return make_interface(ModelInterfaceAbstraction(kind, {"ppo": ppo}))

    actor, ref = make_model(tokenizer, lr=3e-3), make_model(tokenizer, role="ref", train=False)
    critic = make_model(tokenizer, role="critic", critic=True, lr=3e-3)
    actor_gen, ref_inf, actor_train = iface(name), iface(name), iface(name)
    critic_inf, critic_train = (iface("ppo_critic"), iface("ppo_critic")) if algo == "ppo" else (None, None)
    rew_inf = make_interface(ModelInterfaceAbstraction("reward_fn", REWARD))
    prompts = [f"w{i} w{(i * 7) % 23}" for i in range(n_prompts)]
    torch.manual_seed(0)
    rewards = []
    for it in range(iterations):
        out = actor_gen.generate(actor, prompt_batch(tokenizer, prompts))
        out.update_(rew_inf.inference(actor, out))
        out.update_(ref_inf.inference(ref, out))
        if critic_inf is not None:
            out.update_(critic_inf.inference(critic, out))
        stats = actor_train.train_step(actor, out)
        if critic_train is not None:
            critic_train.train_step(critic, out)
        rewards.append(float(out.data["rewards"].mean()))
        print(f"{algo} iteration {it}: reward {rewards[-1]:.3f} kl {stats['ref_kl']:.3f}")
    return rewards


@pytest.mark.slow
@pytest.mark.parametrize("algo,n_prompts", [("ppo", 32), ("grpo", 8)])
def test_reward_rises(tokenizer, algo, n_prompts):
    rewards = run(tokenizer, algo, iterations=10, n_prompts=n_prompts)
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.4
