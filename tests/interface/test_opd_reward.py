"""opd_reward (on-policy distillation's ``compute_adv``): each answer token's reward is minus the
student's log-prob minus the teacher's, on packed batches of unequal lengths; a teacher equal to
the student gives zero rewards and an update that changes nothing; a different teacher moves the
student's log-probs the advantages' way through the PPO actor's real update."""

from __future__ import annotations

import pytest
import torch
from interface_fixtures import make_model, prompt_batch

from realrl.api.core.config import ModelInterfaceAbstraction, ModelName
from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_api import Model, make_interface
from realrl.impl.interface.common import token_minus_one_sample
from realrl.impl.interface.opd_keys import OPD_OUTPUTS, STUDENT_LOGPROBS, TEACHER_LOGPROBS
from realrl.impl.interface.opd_reward import OPDRewardInterface

PROMPTS = ["w1 w2", "w3", "w4 w5 w6", "w7"]
GEN = {"max_new_tokens": 6, "min_new_tokens": 1, "top_p": 1.0, "top_k": 0}


def packed_batch(prompt_lens, answer_lens, seed=0):
    """Sequences of the given prompt / answer lengths, packed, with random student and teacher
    log-probs (0 at prompt targets, as the actor's inference writes them)."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i, (p, a) in enumerate(zip(prompt_lens, answer_lens)):
        n = p + a
        mask = torch.tensor([True] * p + [False] * a)
        answer = ~mask[1:]  # entry j predicts token j + 1
        logp = {k: -torch.rand(n - 1, generator=g) * 3 * answer for k in (STUDENT_LOGPROBS, TEACHER_LOGPROBS)}
        samples.append(
            SequenceSample.from_default(
                ids=[i],
                seqlens=[n],
                data={
                    "packed_input_ids": torch.randint(5, 30, (n,), generator=g),
                    "prompt_mask": mask,
                    **logp,
                },
            )
        )
    return SequenceSample.gather(samples)


def compute(data, **options):
    out, stats = OPDRewardInterface(**options).inference(Model(ModelName("adv"), None, None), data)
    return out, stats


def test_the_reward_is_minus_the_reverse_kl_on_every_answer_token_of_a_packed_batch():
    prompt_lens, answer_lens = [3, 1, 5, 2], [4, 7, 1, 3]
    data = packed_batch(prompt_lens, answer_lens)
    out, stats = compute(data)
    assert out.keys == set(OPD_OUTPUTS)
    student, teacher = data.data[STUDENT_LOGPROBS], data.data[TEACHER_LOGPROBS]
    mask = out.data["ppo_loss_mask"]
    # per sequence: entries 0 .. p-2 predict prompt tokens, the next a entries the answer's
    expected_mask = torch.cat(
        [torch.tensor([False] * (p - 1) + [True] * a) for p, a in zip(prompt_lens, answer_lens)]
    )
    assert torch.equal(mask, expected_mask)
    expected = torch.where(mask, -(student - teacher), torch.zeros_like(student))
    torch.testing.assert_close(out.data["opd_rewards"], expected)
    torch.testing.assert_close(out.data["advantages"], expected)  # discount 0: A_t = r_t
    assert out.seqlens["advantages"] == [[n - 1] for n in data.flat_seqlens("packed_input_ids")]
    n_tok = sum(answer_lens)
    assert stats["reverse_kl"] == pytest.approx(float((student - teacher)[mask].sum()) / n_tok, rel=1e-5)
    assert stats["response_length"] == pytest.approx(n_tok / len(answer_lens))
    # the coefficient scales the reward, not the reported KL
    scaled, scaled_stats = compute(data, kl_coef=0.5)
    torch.testing.assert_close(scaled.data["advantages"], 0.5 * expected)
    assert scaled_stats["reverse_kl"] == pytest.approx(stats["reverse_kl"], rel=1e-5)


def test_a_discount_sums_the_rewards_ahead_within_each_answer_only():
    prompt_lens, answer_lens = [2, 4, 1], [3, 1, 5]
    data = packed_batch(prompt_lens, answer_lens, seed=1)
    out, _ = compute(data, discount=0.5)
    rewards = out.data["opd_rewards"].split([p + a - 1 for p, a in zip(prompt_lens, answer_lens)])
    advantages = out.data["advantages"].split([p + a - 1 for p, a in zip(prompt_lens, answer_lens)])
    for r, adv in zip(rewards, advantages):
        expected = torch.stack([sum(0.5 ** (k - t) * r[k] for k in range(t, len(r))) for t in range(len(r))])
        torch.testing.assert_close(adv, expected)  # nothing leaks from the next answer
    whitened, _ = compute(data, adv_norm=True)
    on = whitened.data["ppo_loss_mask"]
    assert float(whitened.data["advantages"][on].mean()) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("options", [{"kl_coef": 0.0}, {"discount": 1.5}])
def test_bad_options_are_refused(options):
    with pytest.raises(ValueError, match="kl_coef|discount"):
        OPDRewardInterface(**options)


def actor_interface():
    hp = {"gen": GEN, "kl_loss_coef": 0.0, "adv_norm": False, "discount": 0.0}
    return make_interface(ModelInterfaceAbstraction("ppo_actor", {"ppo": hp, "preset": "grpo"}))


def distillation_batch(tokenizer, student, teacher, actor_if):
    """actor_gen -> teacher_inf, actor_inf -> compute_adv, as the opd graph runs them."""
    torch.manual_seed(0)
    data = actor_if.generate(student, prompt_batch(tokenizer, PROMPTS))
    for model, key in ((teacher, TEACHER_LOGPROBS), (student, STUDENT_LOGPROBS)):
        out = actor_if.inference(model, data)
        out.remap_keys_({"packed_ref_logprobs": key})
        data.update_(out)
    out, stats = compute(data)
    data.update_(out)
    # what actor_train reads: the teacher's log-probs where the PPO actor reads the reference's
    data.update_(token_minus_one_sample(data, "packed_ref_logprobs", data.data[TEACHER_LOGPROBS]))
    return data, stats


def test_a_teacher_equal_to_the_student_gives_zero_rewards_and_an_update_that_changes_nothing(tokenizer):
    student, actor_if = make_model(tokenizer, lr=1e-2), actor_interface()
    teacher = make_model(tokenizer, role="teacher", train=False)  # the same weights (seed 0)
    data, stats = distillation_batch(tokenizer, student, teacher, actor_if)
    assert bool(data.data["ppo_loss_mask"].any())
    assert torch.equal(data.data["opd_rewards"], torch.zeros_like(data.data["opd_rewards"]))
    assert torch.equal(data.data["advantages"], torch.zeros_like(data.data["advantages"]))
    assert stats["reverse_kl"] == 0.0
    before = {k: v.detach().clone() for k, v in student.module.module.state_dict().items()}
    actor_if.train_step(student, data)
    after = student.module.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_update_raises_the_tokens_the_teacher_prefers_and_lowers_the_others(tokenizer):
    student, actor_if = make_model(tokenizer, lr=1e-3), actor_interface()
    teacher = make_model(tokenizer, role="teacher", train=False, seed=7)
    data, stats = distillation_batch(tokenizer, student, teacher, actor_if)
    assert stats["reverse_kl"] != 0.0
    adv, mask = data.data["advantages"], data.data["ppo_loss_mask"]
    before = data.data[STUDENT_LOGPROBS]
    actor_if.train_step(student, data)
    change = actor_if.inference(student, data).data["packed_ref_logprobs"] - before
    up, down = mask & (adv > 0), mask & (adv < 0)
    assert bool(up.any()) and bool(down.any())
    assert float(change[up].mean()) > 0 > float(change[down].mean())
