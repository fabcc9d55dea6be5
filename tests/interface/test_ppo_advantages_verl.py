"""compute_adv with verl's further estimators: it fills the inputs an estimator declares (the
rollout's log-probs, GDPO's reward components) and only those; and the CLI accepts every name."""

from __future__ import annotations

import pytest
import torch

from realrl.api.core.config import ModelInterfaceAbstraction, ModelName
from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_api import GenerationOutput, Model, make_interface
from realrl.apps.configs import build_config
from realrl.impl.interface.common import per_sequence_sample, token_minus_one_sample
from realrl.impl.interface.ppo_rollout import rollout_sample
from realrl.impl.model.utils import advantages as A
from realrl.impl.model.utils import ppo_functional as F

VERL_NAMES = (
    "gdpo",
    "grpo_passk",
    "opo",
    "gpg",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "grpo_vectorized",
    "rloo_vectorized",
)
PROMPTS = [[5, 6], [7]]
ANSWERS = [[3, 5, 2], [4, 1, 6]]  # response lengths: 3 answers per prompt
REWARDS = [1.0, 0.0, 2.0, 0.5, 0.5, -1.0]
ENV_REWARDS = [0.0, 1.0, 1.0, 0.0, 1.0, 0.0]


def hand_rollout() -> SequenceSample:
    """Two prompts with three answers each, unequal lengths; log-probs differ from the reference."""
    seqs = [p + [9 + i % 7 for i in range(n)] for p, lens in zip(PROMPTS, ANSWERS) for n in lens]
    lens = [len(s) for s in seqs]
    g = torch.Generator().manual_seed(0)
    n_entries = sum(n - 1 for n in lens)
    gen = GenerationOutput(
        sequences=torch.tensor(sum(seqs, [])),
        seqlens=lens,
        prompt_lens=[len(p) for p in PROMPTS for _ in range(3)],
        logprobs=-2 * torch.rand(n_entries, generator=g),
        no_eos=torch.zeros(6, dtype=torch.bool),
    )
    prompts = SequenceSample.from_default(
        ids=[0, 1], seqlens=[len(p) for p in PROMPTS], data={"packed_prompts": torch.tensor(sum(PROMPTS, []))}
    )
    data = rollout_sample(prompts, gen)
    ref = data.data["packed_logprobs"] - 0.1 * torch.rand(n_entries, generator=g)
    data.update_(token_minus_one_sample(data, "packed_ref_logprobs", ref))
    data.update_(per_sequence_sample(data, "rewards", torch.tensor(REWARDS)))
    data.update_(per_sequence_sample(data, "env_rewards", torch.tensor(ENV_REWARDS)))
    return data


def adv_interface(scores=("rewards", "env_rewards"), **ppo):
    ppo = {"adv_norm": False, "kl_ctl": 0.0, "gen": {"n": 3}, **ppo}
    return make_interface(ModelInterfaceAbstraction("ppo_advantages", {"ppo": ppo, "scores": list(scores)}))


def compute_adv(adv_if, data):
    out, _ = adv_if.inference(Model(ModelName("adv"), None, None), data)
    return out.data["advantages"]


def direct(name, data, **kw):
    cu = data.cu_seqlens("packed_input_ids")
    mask = F.response_loss_mask(data.data["prompt_mask"], cu)
    score = torch.tensor(REWARDS) + torch.tensor(ENV_REWARDS)
    rewards = torch.zeros(mask.shape[0])
    rewards[F.last_indices(F.short_cu_seqlens(cu))] = score
    inp = A.AdvantageInputs(rewards, score, mask, cu, [3, 3], **kw)
    return A.get_adv_estimator(name)(inp)[0]


@pytest.mark.parametrize(
    "name", ["opo", "gpg", "grpo_passk", "optimal_token_baseline", "tir_optimal_token_baseline"]
)
def test_compute_adv_matches_a_direct_call(name):
    data = hand_rollout()
    got = compute_adv(adv_interface(adv_estimator=name), data)
    logp = data.data["packed_logprobs"] if A.get_adv_estimator(name).needs_logprobs else None
    torch.testing.assert_close(got, direct(name, data, old_logprobs=logp))
    assert got.abs().sum() > 0


def test_gdpo_reads_the_scores_gdpo_reward_keys_names():
    data = hand_rollout()
    keys, weights = ["rewards", "env_rewards"], [1.0, 0.5]
    got = compute_adv(
        adv_interface(adv_estimator="gdpo", gdpo_reward_keys=keys, gdpo_reward_weights=weights), data
    )
    comps = torch.tensor([REWARDS, ENV_REWARDS])
    torch.testing.assert_close(got, direct("gdpo", data, reward_components=comps, reward_weights=weights))
    # without keys: the summed score is the one component
    torch.testing.assert_close(compute_adv(adv_interface(adv_estimator="gdpo"), data), direct("gdpo", data))
    with pytest.raises(ValueError, match="not scores of this graph"):
        adv_interface(scores=("rewards",), adv_estimator="gdpo", gdpo_reward_keys=["env_rewards"])


def test_compute_adv_fills_only_the_inputs_an_estimator_declares():
    seen = {}

    def spy(tag):
        def fn(inp):
            seen[tag] = inp
            return inp.token_rewards * 0, inp.token_rewards * 0

        return fn

    A.register_adv_estimator("test_spy_plain", spy("plain"))
    A.register_adv_estimator(
        "test_spy_needs", spy("needs"), needs_logprobs=True, needs_reward_components=True
    )
    data = hand_rollout()
    compute_adv(adv_interface(adv_estimator="test_spy_plain", gdpo_reward_keys=["rewards"]), data)
    compute_adv(adv_interface(adv_estimator="test_spy_needs", gdpo_reward_keys=["rewards"]), data)
    assert seen["plain"].old_logprobs is None and seen["plain"].reward_components is None
    torch.testing.assert_close(seen["needs"].old_logprobs, data.data["packed_logprobs"].float())
    torch.testing.assert_close(seen["needs"].reward_components, torch.tensor([REWARDS]))


@pytest.mark.parametrize("name", VERL_NAMES)
def test_cli_accepts_each_verl_name(name, tmp_path):
    cfg = build_config("grpo", [f"ppo.adv_estimator={name}", f"fileroot={tmp_path}"])
    exp = cfg.initial_setup()
    assert cfg.ppo.adv_estimator == name and exp.mfcs


def test_cli_gdpo_options_and_their_errors(tmp_path):
    cfg = build_config(
        "grpo",
        [
            "ppo.adv_estimator=gdpo",
            "ppo.gdpo_reward_keys=[rewards]",
            "ppo.gdpo_reward_weights=[2.0]",
            f"fileroot={tmp_path}",
        ],
    )
    cfg.initial_setup()
    assert list(cfg.ppo.gdpo_reward_keys) == ["rewards"] and list(cfg.ppo.gdpo_reward_weights) == [2.0]
    with pytest.raises(ValueError, match="one weight per key"):
        build_config("grpo", ["ppo.gdpo_reward_weights=[1.0]", f"fileroot={tmp_path}"]).initial_setup()
    with pytest.raises(Exception, match="adv_estimator must be one of .*gdpo.*tir_optimal_token_baseline"):
        build_config("grpo", ["ppo.adv_estimator=verl_magic", f"fileroot={tmp_path}"]).initial_setup()
