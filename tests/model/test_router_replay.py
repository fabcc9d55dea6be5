"""Router replay ("Stabilizing MoE Reinforcement Learning by Aligning Training and Inference
Routers"): the decoder records every token's experts, and a packed forward given them routes there.

Every Mixture-of-Experts family (mixtral, qwen2_moe, qwen3_moe): the recomputed log-probs of a
generated batch equal the decoder's under replay; with a near-tie in the router that the trainer
breaks the other way (two experts' router rows 2e-6 apart, their order swapped between decoder
and trainer, as a kernel or precision difference would), the recomputation without replay strays
where a token's experts flip, and with replay it does not. The router still gets gradients.
"""

from __future__ import annotations

import copy

import pytest
import torch
from model_fixtures import MOE_HF_CONFIGS, make_hf_model, packed, tiny_config

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.nn.moe import MoE
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.nn.router_replay import FREE, ExpertRouting

FAMILIES = sorted(MOE_HF_CONFIGS)
EOS = 1


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tmp_path_factory) -> ReaLModel:
    path = tmp_path_factory.mktemp(request.param) / "hf"
    make_hf_model(request.param).save_pretrained(path)
    return ReaLModel.from_pretrained(str(path)).eval()


@pytest.fixture(scope="module")
def generated(model):
    """One recorded generation per family, shared by the tests that only read it."""
    return generate(model)


def generate(model: ReaLModel, record: bool = True, n: int = 3):
    ids, cu = packed([5, 9, 2], seed=7)
    g = GenerationHyperparameters(n=n, max_new_tokens=8, record_experts=record)
    return model.generate(ids, cu, g, eos_token_id=EOS, prompt_keys=torch.tensor([11, 12, 13]))


def cu_of(seqlens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *seqlens]).cumsum(0).int()


def answer_logprobs(model: ReaLModel, out, routed=None, prefix_groups=None) -> torch.Tensor:
    """The packed forward's log-probs at the answer tokens (generation's alignment, fp32)."""
    cu = cu_of(out.seqlens)
    with torch.no_grad():
        logp = torch.log_softmax(
            model(out.sequences, cu, routed_experts=routed, prefix_groups=prefix_groups).float(), -1
        )
    parts = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        parts.append(logp[a : b - 1].gather(-1, out.sequences[a + 1 : b, None]).squeeze(-1))
    return torch.cat(parts)


def answer_mask(out) -> torch.Tensor:
    return torch.cat([torch.arange(1, L) >= p for L, p in zip(out.seqlens, out.prompt_lens)])


def test_generation_records_every_token_and_replay_reproduces_the_decoders_logprobs(model, generated):
    out = generated
    cfg = model.config
    routed = out.routed_experts
    assert routed.shape == (out.sequences.shape[0], len(cfg.moe_layers), cfg.n_experts_per_tok)
    # an answer's last token is sampled, never fed: no record; every other token has k distinct experts
    last = cu_of(out.seqlens)[1:].long() - 1
    assert bool((routed[last] == FREE).all())
    fed = torch.ones(routed.shape[0], dtype=torch.bool)
    fed[last] = False
    assert bool((routed[fed] >= 0).all()) and bool((routed[fed] < cfg.n_experts).all())
    assert bool((routed[fed].sort(-1).values.diff(dim=-1) != 0).all())
    # the recorded experts are the top-k a packed forward picks too (same weights, fp32)
    mask = answer_mask(out)
    replayed = answer_logprobs(model, out, routed)
    torch.testing.assert_close(replayed[mask], out.logprobs[mask], atol=2e-5, rtol=0)
    # recording does not change what is sampled
    plain = generate(model, record=False)
    assert plain.routed_experts is None and torch.equal(plain.sequences, out.sequences)


def test_replay_holds_with_shared_prefix_packing(model, generated):
    out = generated
    mask = answer_mask(out)
    shared = answer_logprobs(model, out, out.routed_experts, prefix_groups=[3, 3, 3])
    torch.testing.assert_close(shared[mask], out.logprobs[mask], atol=2e-5, rtol=0)


def near_tie(model: ReaLModel, sign: float) -> ReaLModel:
    """A copy whose routers put expert 2 a hair (``sign`` * 1e-6) above or below expert 1."""
    tied = copy.deepcopy(model)
    with torch.no_grad():
        for i in tied.config.moe_layers:
            w = tied.layers[i].mlp.router.weight
            w[2] = w[1] + sign * 1e-6 * w[1].sign()
    return tied


def test_without_replay_flipped_near_ties_move_the_logprobs_and_with_replay_they_do_not(model):
    decoder, trainer = near_tie(model, +1.0), near_tie(model, -1.0)
    out = generate(decoder)
    mask = answer_mask(out)
    off = (answer_logprobs(trainer, out)[mask] - out.logprobs[mask]).abs().max().item()
    on = (answer_logprobs(trainer, out, out.routed_experts)[mask] - out.logprobs[mask]).abs().max().item()
    assert on < 1e-4, on  # the routers differ by 2e-6: so do the gate weights, no more
    assert off > 1e-2, off  # some token's top-k took expert 1 for expert 2
    assert off > 100 * on


def test_replay_gives_the_router_gradients(model, generated):
    out = generated
    trainer = copy.deepcopy(model).train()
    logits = trainer(out.sequences, cu_of(out.seqlens), routed_experts=out.routed_experts)
    logits.float().logsumexp(-1).sum().backward()
    for i in trainer.config.moe_layers:
        grad = trainer.layers[i].mlp.router.weight.grad
        assert grad is not None and float(grad.abs().sum()) > 0, i


def test_a_block_replays_any_experts_weighted_by_its_router():
    """Given experts (not the top-k): the output is their outputs weighted by the router's
    probabilities there, renormalised; FREE rows route themselves; the router's gradient is the
    reference's."""
    torch.manual_seed(0)
    cfg = tiny_config(n_experts=4, n_experts_per_tok=2, moe_intermediate_dim=16, norm_topk_prob=True)
    block = MoE(cfg)
    x = torch.randn(6, cfg.hidden_dim)
    given = torch.tensor([[3, 0], [2, 1], [0, 3], [FREE, FREE], [1, 2], [3, 2]])
    routing = ExpertRouting([0], given[:, None, :])
    out = block(x, routing=routing, layer=0)
    (out**2).sum().backward()
    grad = block.router.weight.grad.clone()
    block.zero_grad()

    probs = torch.softmax(block.router(x).float(), -1)
    chosen = given.clone()
    chosen[3] = probs[3].topk(2).indices
    w = probs.gather(-1, chosen)
    w = w / w.sum(-1, keepdim=True)
    ref = torch.stack(
        [sum(w[t, j] * block.experts[str(int(chosen[t, j]))](x[t]) for j in range(2)) for t in range(6)]
    )
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    (ref**2).sum().backward()
    torch.testing.assert_close(grad, block.router.weight.grad, atol=1e-6, rtol=1e-5)


def test_a_dense_model_refuses_replayed_experts():
    dense = ReaLModel(tiny_config(vocab_size=97)).eval()
    ids, cu = packed([4, 3])
    with pytest.raises(ValueError, match="dense"):
        dense(ids, cu, routed_experts=torch.zeros(7, 1, 2, dtype=torch.int16))
    out = dense.generate(ids, cu, GenerationHyperparameters(max_new_tokens=3, record_experts=True))
    assert out.routed_experts is None


def test_decoding_in_pieces_records_what_one_call_does(model, generated):
    """Interruptible generation (partial rollouts): paused and its cache rebuilt in between
    (``refresh``, same weights), the record equals an uninterrupted call's; and recording
    decodes eagerly even where fixed-shape steps were asked for."""
    ids, cu = packed([5, 9, 2], seed=7)
    g = GenerationHyperparameters(n=3, max_new_tokens=8, record_experts=True)
    decoding = model.start_generation(ids, cu, g, eos_token_id=EOS, prompt_keys=torch.tensor([11, 12, 13]))
    with torch.no_grad():  # as the engine's session runs it
        decoding.advance(3)
        decoding.refresh()
        decoding.advance()
    out = decoding.output()
    assert torch.equal(out.sequences, generated.sequences)
    assert torch.equal(out.routed_experts, generated.routed_experts)
    static = generate_with(
        model, GenerationHyperparameters(n=3, max_new_tokens=8, record_experts=True, decoding="static")
    )
    assert torch.equal(static.routed_experts, generated.routed_experts)


def generate_with(model: ReaLModel, g: GenerationHyperparameters):
    ids, cu = packed([5, 9, 2], seed=7)
    return model.generate(ids, cu, g, eos_token_id=EOS, prompt_keys=torch.tensor([11, 12, 13]))
