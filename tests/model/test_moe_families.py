"""Mixture-of-Experts families (mixtral, qwen2_moe, qwen3_moe) against transformers, the router's
load-balancing loss, and what MoE changes around the model (SFT loss, decoding choice, layouts).

Tiny models: 2 layers, hidden 32, 4 experts, top-2. qwen2_moe mixes a sparse block (with its
shared expert) and a dense one through ``mlp_only_layers``, qwen3_moe through
``decoder_sparse_step``; Mixtral is sparse everywhere.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from model_fixtures import MOE_HF_CONFIGS, VOCAB, packed
from safetensors import safe_open

from realrl.api.core.config import ModelName
from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.hf_family import get_hf_family
from realrl.api.core.layout_fit import check_tensor_parallel
from realrl.api.core.model_api import (
    GenerationHyperparameters,
    Model,
    ReaLModelConfig,
    make_interface,
)
from realrl.impl.model.backend.activation_checkpointing import enable_gradient_checkpointing
from realrl.impl.model.backend.config import OptimizerConfig
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.nn.generation import choose_decoding, decoding_mode, generate
from realrl.impl.model.nn.hf_io import infer_hf_model_type
from realrl.impl.model.nn.moe import MoE
from realrl.impl.model.nn.moe_stats import router_stats_of
from realrl.impl.model.nn.real_model import ReaLModel

# the families' tiny configs are the model tests' own (model_fixtures.MOE_HF_CONFIGS)
HF_CONFIGS = MOE_HF_CONFIGS
FAMILIES = sorted(HF_CONFIGS)
LENGTHS = [7, 1, 12, 3, 9]
EOS = 1


def make_hf(kind: str, seed: int = 0) -> transformers.PreTrainedModel:
    """Random weights, every one nonzero and distinct (norms near 1)."""
    torch.manual_seed(seed)
    cfg = HF_CONFIGS[kind]()
    cfg.eos_token_id, cfg.bos_token_id, cfg.pad_token_id = EOS, 0, None
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager"
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)
    return model.eval()


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    """(kind, HF model, its checkpoint folder, ReaLModel loaded from it), built once per family."""
    kind = request.param
    hf = make_hf(kind)
    path = tmp_path_factory.mktemp(kind) / "hf"
    hf.save_pretrained(path)
    return kind, hf, str(path), ReaLModel.from_pretrained(str(path)).eval()


def hf_per_sequence(hf, ids: torch.Tensor, cu: torch.Tensor, **kw) -> list:
    return [hf(ids[a:b][None], **kw) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]


def test_config_reads_the_sparse_layout(pair):
    kind, hf, _, model = pair
    cfg = model.config
    assert (cfg.n_experts, cfg.n_experts_per_tok, cfg.hf_model_type) == (4, 2, kind)
    assert cfg.moe_layers == {"mixtral": [0, 1], "qwen2_moe": [0], "qwen3_moe": [1]}[kind]
    assert cfg.norm_topk_prob == (kind != "qwen2_moe")
    assert [isinstance(layer.mlp, MoE) for layer in model.layers] == [
        cfg.is_moe_layer(i) for i in range(cfg.n_layers)
    ]
    assert cfg.router_aux_loss_coef == pytest.approx(0.1)  # the checkpoint's, not a default


def test_packed_logits_match_transformers(pair):
    kind, hf, _, model = pair
    ids, cu = packed(LENGTHS)
    with torch.no_grad():
        ours = model(ids, cu)
        ref = torch.cat([o.logits[0] for o in hf_per_sequence(hf, ids, cu)])
    assert router_stats_of(ours) is None  # no gradients, no routing statistics
    assert (ours - ref).abs().max().item() < 1e-4, kind


def test_aux_loss_over_packed_sequences_equals_transformers(pair):
    """transformers' ``load_balancing_loss_func`` over the router logits of the same tokens (each
    sequence run alone: no padding to mask)."""
    kind, hf, _, model = pair
    module = transformers.models.mixtral.modeling_mixtral
    ids, cu = packed(LENGTHS, seed=3)
    with torch.no_grad():
        outs = hf_per_sequence(hf, ids, cu, output_router_logits=True)
    per_layer = tuple(torch.cat(layer) for layer in zip(*(o.router_logits for o in outs)))
    ref = module.load_balancing_loss_func(per_layer, 4, 2)
    stats = router_stats_of(model(ids, cu))
    assert stats is not None and stats.coef == pytest.approx(hf.config.router_aux_loss_coef)
    assert abs(stats.aux_loss.item() - ref.item()) < 1e-5, kind
    assert stats.load.shape == (len(model.config.moe_layers), 4)
    torch.testing.assert_close(stats.load.sum(1), torch.full((stats.load.shape[0],), 2.0))  # top-2


def test_gradients_of_loss_plus_aux_match_transformers(pair):
    """Equal-length sequences batched without padding in transformers, packed here: the same
    tokens, the same logits, the same aux loss, so the same gradient of every parameter
    (transformers' fused expert tensors read through the family's converter)."""
    kind, hf, path, _ = pair
    model = ReaLModel.from_pretrained(path).train()
    hf.train()
    try:
        ids = torch.randint(2, VOCAB, (3, 8), generator=torch.Generator().manual_seed(7))
        proj = torch.randn(VOCAB, generator=torch.Generator().manual_seed(8))
        out = hf(ids, output_router_logits=True)
        (out.logits @ proj).square().mean().add(hf.router_aux_loss_coef * out.aux_loss).backward()
        cu = torch.arange(0, 25, 8, dtype=torch.int32)
        logits = model(ids.reshape(-1), cu)
        stats = router_stats_of(logits)
        assert abs(stats.aux_loss.item() - out.aux_loss.item()) < 1e-5
        (logits @ proj).square().mean().add(stats.coef * stats.aux_loss).backward()
        hf_grads = {n: p.grad.clone() for n, p in hf.named_parameters()}
    finally:
        hf.eval()
        hf.zero_grad(set_to_none=True)
    theirs = get_hf_family(kind).sd_from_hf(hf_grads, model.config)
    ours = {n: p.grad for n, p in model.named_parameters()}
    assert sorted(theirs) == sorted(ours)
    for name, grad in ours.items():
        torch.testing.assert_close(grad, theirs[name], atol=1e-5, rtol=1e-4, msg=name)
    router = [g for n, g in ours.items() if n.endswith("router.weight")]
    assert router and all(g.abs().sum() > 0 for g in router)


def test_greedy_generation_equals_transformers(pair):
    kind, hf, _, model = pair
    prompts = [5, 9, 3]
    ids, cu = packed(prompts, seed=5)
    out = model.generate(ids, cu, GenerationHyperparameters(max_new_tokens=8, greedy=True), eos_token_id=EOS)
    ours = [t.tolist() for t in torch.split(out.sequences, out.seqlens)]
    for i, prompt in enumerate(torch.split(ids, prompts)):
        ref = hf.generate(prompt[None], max_new_tokens=8, do_sample=False, eos_token_id=EOS, pad_token_id=0)
        assert ours[i] == ref[0].tolist(), f"{kind} prompt {i}"


def test_save_pretrained_loads_in_transformers(pair, tmp_path):
    kind, hf, _, model = pair
    model.save_pretrained(str(tmp_path / "saved"))
    with safe_open(str(tmp_path / "saved" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    expert = {
        "mixtral": "model.layers.0.block_sparse_moe.experts.3.w2.weight",
        "qwen2_moe": "model.layers.0.mlp.experts.3.down_proj.weight",
        "qwen3_moe": "model.layers.1.mlp.experts.3.down_proj.weight",
    }[kind]
    assert expert in keys  # one tensor per expert: what checkpoints on disk hold
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "saved")).eval()
    assert type(reloaded) is type(hf)
    ids, cu = packed(LENGTHS, seed=2)
    with torch.no_grad():
        ref = torch.cat([o.logits[0] for o in hf_per_sequence(hf, ids, cu)])
        again = torch.cat([o.logits[0] for o in hf_per_sequence(reloaded, ids, cu)])
    assert (again - ref).abs().max().item() <= 1e-5
    assert ReaLModel.from_pretrained(str(tmp_path / "saved")).config == model.config


def test_param_names_and_one_block_alone(pair):
    """The names a pipeline stage loads cover the state dict; one block converts by itself."""
    kind, _, _, model = pair
    family, cfg, sd = get_hf_family(kind), model.config, model.state_dict()
    names = family.embedding_param_names(cfg) + family.head_param_names(cfg)
    for i in range(cfg.n_layers):
        names += family.tblock_param_names(cfg, i)
    assert sorted(names) == sorted(sd)
    for i in cfg.moe_layers:
        block = {n: sd[n] for n in family.tblock_param_names(cfg, i)}
        back = family.sd_from_hf(family.sd_to_hf(block, cfg), cfg)
        assert sorted(back) == sorted(block) and all(torch.equal(back[n], block[n]) for n in block)


def tiny_moe(**fields) -> ReaLModel:
    base = dict(
        n_layers=2,
        n_q_heads=4,
        n_kv_heads=2,
        hidden_dim=32,
        intermediate_dim=48,
        vocab_size=VOCAB,
        n_experts=4,
        n_experts_per_tok=2,
        moe_intermediate_dim=24,
        norm_topk_prob=True,
        router_aux_loss_coef=0.5,
    )
    torch.manual_seed(0)
    return ReaLModel(ReaLModelConfig(**{**base, **fields}))


def test_shared_prefixes_and_checkpointing_keep_the_aux_loss():
    """A shared prompt's rows count once per sequence that shares it; recomputing blocks in
    backward leaves the loss and the gradients as they were."""
    model = tiny_moe(shared_expert_intermediate_dim=16, mlp_only_layers=[1], norm_topk_prob=False).train()
    prompt = torch.randint(2, VOCAB, (10,), generator=torch.Generator().manual_seed(1))
    seqs = [torch.cat([prompt, torch.tensor(t)]) for t in ([5, 6], [7], [8, 9, 10])]
    ids = torch.cat(seqs)
    cu = torch.tensor([0, 12, 23, 36], dtype=torch.int32)
    plain = router_stats_of(model(ids, cu))
    shared = router_stats_of(model(ids, cu, prefix_groups=[3]))
    torch.testing.assert_close(shared.aux_loss, plain.aux_loss)
    torch.testing.assert_close(shared.load, plain.load)

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        out = model(ids, cu, output_index=torch.tensor([3, 20, 30]))
        stats = router_stats_of(out)
        (out.square().mean() + stats.coef * stats.aux_loss).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    before = grads()
    enable_gradient_checkpointing(model)
    after = {n.replace("_checkpoint_wrapped_module.", ""): g for n, g in grads().items()}
    for name, g in before.items():
        torch.testing.assert_close(after[name], g, msg=name)


def test_every_expert_has_a_gradient_even_without_tokens():
    """One token reaches 2 of the 4 experts; the others get zero gradients (as transformers'
    stacked expert tensors do), so the optimizer treats them alike on one replica or many."""
    model = tiny_moe().train()
    ids, cu = packed([1])
    model(ids, cu).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None for g in grads.values())
    idle = [n for n, g in grads.items() if ".experts." in n and not g.abs().sum()]
    assert len(idle) == 2 * 3 * 2  # per block: two idle experts, three projections each


def sft_batch() -> SequenceSample:
    g = torch.Generator().manual_seed(4)
    samples = []
    for i, (p, a) in enumerate([(4, 3), (2, 5), (6, 2)]):
        ids = torch.randint(2, VOCAB, (p + a,), generator=g)
        mask = torch.arange(p + a) < p
        samples.append(
            SequenceSample.from_default(
                ids=[i], seqlens=[p + a], data={"packed_input_ids": ids, "prompt_mask": mask}
            )
        )
    return SequenceSample.gather(samples)


def test_sft_loss_adds_the_aux_loss_with_its_coefficient():
    """The gradient of the SFT step is that of NLL + coef * aux (the aux over every token of the
    call, though the loss reads only answers), and the statistics say so."""
    from realrl.impl.interface.sft_interface import _ANSWER_INDEX

    sft, batch = make_interface("sft"), sft_batch()

    def step_grads(coef: float) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        module = tiny_moe(router_aux_loss_coef=coef)
        engine = TrainEngine(module, OptimizerConfig(lr=1e-3, grad_clip=0.0))
        stats = engine.accumulate_gradients(
            batch, MicroBatchSpec(n_mbs=2), sft._loss_fn, sft._weight, output_index_fn=_ANSWER_INDEX
        )
        return {n: p.grad.clone() for n, p in module.named_parameters()}, stats

    with_aux, stats = step_grads(0.5)
    without, _ = step_grads(0.0)
    # the aux loss's own gradient, micro-batch by micro-batch, weighted like the losses
    module = tiny_moe()
    mbs = batch.split(MicroBatchSpec(n_mbs=2))
    weights = [sft._weight(mb) for mb in mbs]
    for mb, w in zip(mbs, weights):
        out = module(mb.data["packed_input_ids"], mb.cu_seqlens("packed_input_ids"))
        (router_stats_of(out).aux_loss * w / sum(weights)).backward()
    for name, p in module.named_parameters():  # the head and the last experts: no aux gradient
        aux_grad = torch.zeros_like(p) if p.grad is None else p.grad
        torch.testing.assert_close(
            with_aux[name] - without[name], 0.5 * aux_grad, atol=1e-6, rtol=1e-4, msg=name
        )
    assert stats["loss"] == pytest.approx(stats["moe_task_loss"] + 0.5 * stats["moe_aux_loss"], rel=1e-5)
    assert 0.0 <= stats["moe_load_min"] <= 0.5 <= stats["moe_load_max"] <= 1.0  # top-2 of 4: 0.5 balanced

    model = Model(ModelName("actor"), TrainEngine(tiny_moe(), OptimizerConfig(lr=1e-3)), None)
    out = sft.train_step(model, batch)
    assert {"moe_aux_loss", "moe_load_min", "moe_load_max", "moe_task_loss"} <= set(out)
    assert out["ppl"] == pytest.approx(torch.tensor(out["moe_task_loss"]).exp().item(), rel=1e-6)
    dense = Model(ModelName("actor"), TrainEngine(tiny_moe(n_experts=0), OptimizerConfig(lr=1e-3)), None)
    assert not any(k.startswith("moe_") for k in sft.train_step(dense, batch))


def test_decoding_auto_is_eager_for_moe_and_static_gives_its_tokens():
    assert choose_decoding("auto", "cuda", moe=True) == "eager"
    assert choose_decoding("static", "cuda", moe=True) == "static"
    with pytest.raises(ValueError, match="cuda_graph.*Mixture-of-Experts"):
        choose_decoding("cuda_graph", "cuda", moe=True)
    model = tiny_moe(mlp_only_layers=[0]).eval()
    assert decoding_mode(model, GenerationHyperparameters(), torch.device("cuda")) == "eager"
    ids, cu = packed([4, 7, 2], seed=6)
    runs = [
        generate(model, ids, cu, GenerationHyperparameters(max_new_tokens=6, greedy=True, decoding=d), EOS)
        for d in ("eager", "static")
    ]
    assert torch.equal(runs[0].sequences, runs[1].sequences)


def test_config_checks_and_layouts():
    cfg = tiny_moe().config
    assert infer_hf_model_type(cfg) == "mixtral"
    assert infer_hf_model_type(tiny_moe(qk_layernorm=True).config) == "qwen3_moe"
    assert infer_hf_model_type(tiny_moe(mlp_only_layers=[1]).config) == "qwen2_moe"
    check_tensor_parallel(cfg, 2, "model 'actor'")  # split over m2: tests/parallel/test_moe_parallel.py
    base = dict(n_layers=2, n_q_heads=2, n_kv_heads=2, hidden_dim=16, intermediate_dim=32, vocab_size=10)
    bad = [
        (dict(n_experts=4, n_experts_per_tok=5), "n_experts_per_tok"),
        (dict(n_experts=4, n_experts_per_tok=2, mlp_only_layers=[2]), "mlp_only_layers"),
        (dict(n_experts=4, n_experts_per_tok=2, mlp_type="plain"), "gated"),
        (dict(n_experts=4, n_experts_per_tok=2, decoder_sparse_step=0), "decoder_sparse_step"),
        (dict(shared_expert_intermediate_dim=8), "needs routed experts"),
    ]
    for fields, match in bad:
        with pytest.raises(ValueError, match=match):
            ReaLModelConfig(**base, **fields)
    dense = ReaLModelConfig(**base)
    assert dense.moe_layers == [] and dense.moe_intermediate_dim is None
    assert ReaLModelConfig(**json.loads(json.dumps(cfg.__dict__))) == cfg  # through JSON: tuples
