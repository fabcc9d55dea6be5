"""Multi-turn rollouts: the turn loop (``multi_turn.roll_out``), the actor's generate with an
environment on a tiny ReaLModel, and every mask that keeps observations out of training: the
policy loss, the KL penalty, the critic's targets and GAE's recursion."""

import time

import pytest
import torch
from interface_fixtures import ids_of, make_model, prompt_batch

from realrl.api.core.chat_turns import observation_ids
from realrl.api.core.config import ModelInterfaceAbstraction, ModelName
from realrl.api.core.env_api import EnvError, register_env
from realrl.api.core.model_api import Model, make_interface
from realrl.impl.interface.common import per_sequence_sample, token_minus_one_sample, token_sample
from realrl.impl.interface.multi_turn import Sampled, TurnBudget, roll_out
from realrl.impl.interface.ppo_rollout import rollout_sample
from realrl.impl.interface.trajectory import Trajectory, pack_trajectories
from realrl.impl.model.utils import ppo_functional as F


class Script:
    """Answers turn t with ``replies[t]`` = (observation, reward, done); records what it read."""

    replies: list = []

    def __init__(self, prompt: str, **metadata):
        self.prompt, self.metadata, self.read = prompt, metadata, []

    def step(self, completion: str):
        self.read.append(completion)
        return self.replies[len(self.read) - 1]


class Twice(Script):
    replies = [("good great", 0.25, False), (None, 1.0, True)]


class Never(Script):
    replies = [("bad", 0.5, False)] * 10


class Broken(Script):
    def step(self, completion: str):
        raise KeyError("no such tool")


class Slow(Script):
    def step(self, completion: str):
        time.sleep(5)
        return None, 0.0, True


class Wrong(Script):
    def step(self, completion: str):
        return "obs", float("nan"), True


class Recorder:
    """A ``sample`` callable: each context continues with ``reply`` (+ EOS), log-prob -0.5 per token."""

    def __init__(self, reply: list[int], eos: int, no_eos: bool = False):
        self.reply, self.eos, self.no_eos, self.calls = reply, eos, no_eos, []

    def __call__(self, contexts, keys, max_new_tokens):
        self.calls.append((list(map(list, contexts)), list(keys), max_new_tokens))
        tokens = self.reply if self.no_eos else self.reply + [self.eos]
        cut = tokens[:max_new_tokens]  # the engine stops at the limit, without EOS
        return [Sampled(cut, [-0.5] * len(cut), self.no_eos or len(cut) < len(tokens)) for _ in contexts]


def run_turns(tokenizer, env_cls, budget, reply=("w1", "w2"), no_eos=False, timeout=30.0):
    prompt = ids_of(tokenizer, "w5 w6")
    envs = [env_cls("w5 w6") for _ in range(2)]
    sampler = Recorder(ids_of(tokenizer, " ".join(reply)), tokenizer.eos_token_id, no_eos)
    trajs, stats = roll_out([prompt, prompt], ["a/0", "a/1"], envs, tokenizer, budget, sampler, timeout)
    return prompt, envs, sampler, trajs, stats


def test_observations_follow_the_models_turns_and_its_tokens_are_kept_verbatim(tokenizer):
    prompt, envs, sampler, trajs, stats = run_turns(
        tokenizer, Twice, TurnBudget(max_turns=4, max_new_tokens=8)
    )
    eos = tokenizer.eos_token_id
    turn = ids_of(tokenizer, "w1 w2") + [eos]
    obs = observation_ids(tokenizer, "good great")
    t = trajs[0]
    assert t.tokens == prompt + turn + obs + turn
    assert t.model_mask == [False] * len(prompt) + [True] * len(turn) + [False] * len(obs) + [True] * len(
        turn
    )
    assert t.logprobs == [0.0] * len(prompt) + [-0.5] * len(turn) + [0.0] * len(obs) + [-0.5] * len(turn)
    assert (t.turns, t.turn_tokens, t.reward, t.no_eos) == (2, [3, 3], 1.25, False)
    # token in, token out: the second turn continues from the ids, not from re-tokenised text
    assert sampler.calls[1][0] == [prompt + turn + obs] * 2
    assert sampler.calls[0][1] == ["a/0/turn1", "a/1/turn1"] and sampler.calls[1][1] == [
        "a/0/turn2",
        "a/1/turn2",
    ]
    assert envs[0].read == ["w1 w2", "w1 w2"]  # the turn's text, special tokens skipped
    assert stats["turns_mean"] == 2.0 and stats["turns_max"] == 2.0 and stats["env_reward_mean"] == 1.25
    assert stats["tokens_per_turn"] == 3.0 and stats["observation_tokens_mean"] == len(obs)


def test_an_environment_that_never_says_done_stops_at_max_turns(tokenizer):
    *_, trajs, stats = run_turns(tokenizer, Never, TurnBudget(max_turns=3, max_new_tokens=8))
    assert [t.turns for t in trajs] == [3, 3]
    assert trajs[0].reward == pytest.approx(1.5)  # every turn's step counts, the last one's too
    assert trajs[0].model_mask[-1]  # a trajectory ends with the model's turn, never an observation


def test_the_token_budget_cuts_turns_and_observations(tokenizer):
    # 3 tokens a turn, 1 observation token: turn 1 (3) + obs (1) + turn 2 cut to 2 of 3 -> 6 tokens
    *_, trajs, _ = run_turns(tokenizer, Never, TurnBudget(max_turns=5, max_new_tokens=8, max_total_tokens=6))
    t = trajs[0]
    assert len(t.tokens) - t.prompt_len == 6 and t.turn_tokens == [3, 2] and t.no_eos
    # no room for an observation plus one token: the trajectory ends after the model's turn
    *_, trajs, stats = run_turns(
        tokenizer, Never, TurnBudget(max_turns=5, max_new_tokens=8, max_total_tokens=4)
    )
    assert trajs[0].turn_tokens == [3] and not trajs[0].no_eos and stats["cut_by_budget_frac"] == 1.0
    # a turn cut by the per-turn limit has no EOS
    *_, trajs, _ = run_turns(tokenizer, Twice, TurnBudget(max_turns=1, max_new_tokens=2))
    assert trajs[0].turn_tokens == [2] and trajs[0].no_eos


@pytest.mark.parametrize(
    "env, message",
    [
        (Broken, "KeyError: 'no such tool'"),
        (Slow, "no answer within env_timeout=0.3 s"),
        (Wrong, "reward nan"),
    ],
)
def test_an_environment_that_fails_stops_the_rollout_naming_the_trajectory(tokenizer, env, message):
    with pytest.raises(EnvError, match="a/0") as e:
        run_turns(tokenizer, env, TurnBudget(max_turns=2, max_new_tokens=4), timeout=0.3)
    assert message in str(e.value)


def trajectory_batch(tokenizer):
    """Two trajectories: prompt, turn, observation, turn; and a single-turn one."""
    p, m1, o, m2 = [5, 6], [7, 8, 2], [9, 10], [11, 2]
    two = Trajectory(
        tokens=p + m1 + o + m2,
        model_mask=[False] * 2 + [True] * 3 + [False] * 2 + [True] * 2,
        logprobs=[0.0] * 2 + [-0.1, -0.2, -0.3] + [0.0] * 2 + [-0.4, -0.5],
        prompt_len=2,
        turns=2,
    )
    one = Trajectory(
        tokens=[5, 7, 2], model_mask=[False, True, True], logprobs=[0.0, -0.6, -0.7], prompt_len=1
    )
    gen = pack_trajectories([two, one])
    return rollout_sample(prompt_batch(tokenizer, ["w1 w2", "w3"]), gen)


def test_observations_are_off_every_mask_and_their_logprobs_unused(tokenizer):
    data = trajectory_batch(tokenizer)
    pm = data.data["prompt_mask"].tolist()
    assert pm == [1, 1, 0, 0, 0, 1, 1, 0, 0] + [1, 0, 0]
    cu = data.cu_seqlens("packed_input_ids")
    loss_mask = F.response_loss_mask(data.data["prompt_mask"], cu)
    # entry j predicts token j + 1: the observation tokens (positions 5, 6) are never targets
    assert loss_mask.tolist() == [0, 1, 1, 1, 0, 0, 1, 1] + [1, 1]
    assert data.data["packed_logprobs"].tolist() == pytest.approx(
        [0, -0.1, -0.2, -0.3, 0, 0, -0.4, -0.5, -0.6, -0.7]
    )
    # the KL penalty reads the masked positions as zero whatever the log-probs say there
    ref = data.data["packed_logprobs"] - 1.0
    kl, rewards = F.packed_kl_rewards(
        0.1, data.data["packed_logprobs"], ref, torch.tensor([2.0, 3.0]), cu, loss_mask
    )
    assert (kl[~loss_mask] == 0).all() and (kl[loss_mask] != 0).all()
    assert rewards.tolist()[7] == pytest.approx(-0.1 + 2.0)  # the score at the trajectory's last token


def test_gae_skips_observations_as_if_the_model_acted_again_right_after_them():
    """GAE over a trajectory with an observation equals GAE over the same model steps with the
    observation cut out, where the value before the model's next step is the one after the
    observation; the steps off the mask get 0."""
    torch.manual_seed(0)
    # tokens: p p | m m m | o o | m m ; step t predicts token t + 1
    mask = torch.tensor([0, 1, 1, 1, 0, 0, 1, 1], dtype=torch.bool)
    values = torch.randn(9)
    rewards = torch.randn(8) * mask
    cu = torch.tensor([0, 9], dtype=torch.int32)
    for gamma, lam in ((1.0, 1.0), (0.9, 0.8)):
        for boot in (0.0, 1.0):
            adv, ret = F.packed_gae(rewards, values, cu, torch.tensor([boot]), gamma, lam, mask=mask)
            # the same trajectory without the observation: states 0..4 then 6..8 (state 6 is where the
            # model acts next, after reading the observation)
            keep = torch.tensor([0, 1, 2, 3, 6, 7, 8])
            r_cut = torch.cat([rewards[:4], rewards[6:]])
            a_cut, _ = F.packed_gae(
                r_cut, values[keep], torch.tensor([0, 7], dtype=torch.int32), torch.tensor([boot]), gamma, lam
            )
            on = mask.nonzero().squeeze(1)
            torch.testing.assert_close(adv[on], a_cut[1:])
            assert (adv[~mask] == 0).all()
            torch.testing.assert_close(ret[on], adv[on] + values[on])
    # a response in one block at the end: the mask changes nothing on it
    single = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1], dtype=torch.bool)
    a1, _ = F.packed_gae(rewards * single, values, cu, torch.tensor([1.0]), 0.95, 0.9)
    a2, _ = F.packed_gae(rewards * single, values, cu, torch.tensor([1.0]), 0.95, 0.9, mask=single)
    torch.testing.assert_close(a1[single], a2[single])


def test_the_critics_targets_and_the_policy_loss_skip_observations(tokenizer):
    data = trajectory_batch(tokenizer)
    data.update_(per_sequence_sample(data, "rewards", torch.tensor([1.0, -1.0])))
    data.update_(token_minus_one_sample(data, "packed_ref_logprobs", data.data["packed_logprobs"] - 0.05))
    data.update_(
        token_sample(data, "values", torch.linspace(0.1, 1.2, data.data["packed_input_ids"].shape[0]))
    )
    adv_if = make_interface(
        ModelInterfaceAbstraction("ppo_advantages", {"ppo": {"adv_norm": False, "value_norm": False}})
    )
    out, _ = adv_if.inference(Model(ModelName("adv"), None, tokenizer), data)
    mask = out.data["ppo_loss_mask"]
    assert mask.tolist() == [0, 1, 1, 1, 0, 0, 1, 1] + [1, 1]
    # advantages, returns (the critic's targets) and KL rewards: zero where an observation is the target
    for key in ("advantages", "returns", "kl_rewards"):
        assert (out.data[key][~mask] == 0).all(), key
        assert (out.data[key][mask] != 0).any(), key


class Echo:
    """Observes 'good' after the first turn, done after the second; reward 1 per turn."""

    def __init__(self, prompt: str, **metadata):
        self.n = 0

    def step(self, completion: str):
        self.n += 1
        return ("good", 1.0, False) if self.n == 1 else (None, 1.0, True)


register_env("test_echo", Echo)


def test_the_actors_generate_takes_turns_and_records_the_models_own_logprobs(tokenizer):
    actor = make_model(tokenizer)
    gen = {"max_new_tokens": 3, "min_new_tokens": 1, "top_p": 1.0, "top_k": 0, "n": 2, "temperature": 0.8}
    iface = make_interface(
        ModelInterfaceAbstraction("ppo_actor", {"ppo": {"gen": gen, "max_turns": 3}, "env": "test_echo"})
    )
    data = prompt_batch(tokenizer, ["w1 w2", "w3"])
    torch.manual_seed(0)
    out, stats = iface.generate(actor, data)
    assert out.data["env_rewards"].tolist() == [2.0] * 4
    assert stats["turns_mean"] == 2.0 and stats["observation_tokens_mean"] == 1.0
    good = tokenizer.convert_tokens_to_ids("good")
    ids, pm = out.data["packed_input_ids"], out.data["prompt_mask"]
    # the observation sits between the turns, masked like the prompt
    assert all(bool(pm[i]) for i in (ids == good).nonzero().squeeze(1).tolist() if i > 2)
    # the recorded log-probs are the policy's own at the sampling temperature, on its tokens only
    ref = iface.inference(actor, out).data["packed_ref_logprobs"]
    mask = F.response_loss_mask(pm, out.cu_seqlens("packed_input_ids"))
    assert int(mask.sum()) < int((~pm).sum()) + 4  # observations are not targets
    torch.testing.assert_close(ref[mask], out.data["packed_logprobs"][mask], atol=1e-4, rtol=0)
    assert (out.data["packed_logprobs"][~mask] == 0).all()
    # sampling is keyed by trajectory: the same prompt alone gives the same trajectories
    torch.manual_seed(0)
    again, _ = iface.generate(actor, data)
    assert torch.equal(again.data["packed_input_ids"], ids)


def test_max_turns_without_an_environment_is_refused():
    with pytest.raises(ValueError, match="max_turns=2 needs env"):
        make_interface(ModelInterfaceAbstraction("ppo_actor", {"ppo": {"max_turns": 2}}))
