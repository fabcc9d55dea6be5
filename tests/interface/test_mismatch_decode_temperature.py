"""``ppo.mismatch_decode_temperature``, the benchmark-only train/rollout mismatch: generation
samples and records its log-probs at that temperature, the trainer keeps ``gen.temperature``, and
the actor's recomputation sees the difference (``rollout_corr/*``)."""

from __future__ import annotations

import pytest
import torch
from interface_fixtures import make_model, prompt_batch

from realrl.api.core.config import ModelInterfaceAbstraction, ModelName
from realrl.api.core.model_api import Model, make_interface
from realrl.impl.interface.common import per_sequence_sample
from realrl.impl.interface.ppo_config import make_ppo_hyperparameters
from realrl.impl.model.utils import ppo_functional as F

PROMPTS = ["w1 w2", "w3"]
GEN = {"max_new_tokens": 6, "min_new_tokens": 2, "top_p": 1.0, "top_k": 0, "n": 4}
BASE = dict(kl_loss_coef=0.0, early_stop_imp_ratio=None, ppo_n_minibatches=1, gen=GEN)


def iface(name, **ppo):
    return make_interface(ModelInterfaceAbstraction(name, {"ppo": {**BASE, **ppo}, "preset": "grpo"}))


def logprobs_at(actor, data, temperature: float) -> torch.Tensor:
    """The answer tokens' log-probs under logits / ``temperature`` (the reference call's)."""
    a = iface("ppo_actor", gen={**GEN, "temperature": temperature})
    return a.inference(actor, data).data["packed_ref_logprobs"]


def test_the_decoder_records_its_own_temperature_and_the_trainer_sees_the_gap(tokenizer):
    actor = make_model(tokenizer)
    a = iface("ppo_actor", mismatch_decode_temperature=2.0, recompute_logprobs=True)
    assert a.hp.gen.temperature == 1.0 and a.hp.decoder_gen.temperature == 2.0
    torch.manual_seed(0)
    data = a.generate(actor, prompt_batch(tokenizer, PROMPTS))
    mask = F.response_loss_mask(data.data["prompt_mask"], data.cu_seqlens("packed_input_ids"))
    recorded = data.data["packed_logprobs"][mask]
    torch.testing.assert_close(recorded, logprobs_at(actor, data, 2.0)[mask], atol=1e-4, rtol=0)
    at_one = logprobs_at(actor, data, 1.0)[mask]
    assert (recorded - at_one).abs().max() > 0.1  # not the trainer's

    data.update_(a.inference(actor, data))
    data.update_(per_sequence_sample(data, "rewards", torch.arange(8, dtype=torch.float32)))
    adv = iface("ppo_advantages")
    data.update_(adv.inference(Model(ModelName("adv"), None, tokenizer), data)[0])
    stats = a.train_step(actor, data)
    log_ratio = (at_one - recorded).double()
    assert stats["rollout_corr/k3_kl"] == pytest.approx(
        float((log_ratio.exp() - 1 - log_ratio).mean()), rel=1e-3
    )
    assert stats["rollout_corr/k3_kl"] > 1e-3


def test_unset_the_decoder_samples_at_gen_temperature_and_a_bad_value_is_refused():
    hp = make_ppo_hyperparameters({"gen": {**GEN, "temperature": 0.7}})
    assert hp.decoder_gen is hp.gen
    with pytest.raises(ValueError, match="mismatch_decode_temperature must be > 0"):
        make_ppo_hyperparameters({"mismatch_decode_temperature": 0.0})
