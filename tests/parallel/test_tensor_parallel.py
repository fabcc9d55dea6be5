"""Tensor parallelism (DTensor, 2 gloo processes) against the whole model, for every family:
the same logits, gradients, greedy tokens and sampled tokens and log-probs.

Every model is loaded from a Hugging Face folder (the path users take), split over a d1m2p1
mesh with the backends' own ``parallelize``, and compared in the same process with a whole copy.
All families run in one spawn: starting processes costs more than the models.
"""

from __future__ import annotations

import os

import pytest
import torch
from _ranks import TIMEOUT, run_ranks
from model_fixtures import make_hf_model, packed, tiny_config

from realrl.api.core.layout import Layout, Placement
from realrl.api.core.layout_fit import check_tensor_parallel
from realrl.api.core.model_api import GenerationHyperparameters, ReaLModelConfig
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.apply import parallelize
from realrl.impl.model.parallel.dtensor import is_dtensor, local
from realrl.impl.model.parallel.mesh import build_contexts

FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gpt2"]
LENGTHS = [7, 3, 11]
PROMPTS = [5, 2, 8]
EOS = 1
# a vocabulary that splits over two ranks (the fixtures' 97 does not): embedding and head sharded
SPLIT_VOCAB = tiny_config(tied_embedding=True)


def _cases(folder: str) -> list[tuple[str, dict]]:
    cases = [(kind, {"path": os.path.join(folder, kind)}) for kind in FAMILIES]
    cases.append(("llama-critic", {"path": os.path.join(folder, "llama"), "is_critic": True}))
    cases.append(("tied-split-vocab", {"config": SPLIT_VOCAB}))
    return cases


def _build(case: dict) -> ReaLModel:
    torch.manual_seed(0)  # a critic's new head is random: the same on every rank and copy
    if "config" in case:
        return ReaLModel(case["config"])
    return ReaLModel.from_pretrained(case["path"], is_critic=case.get("is_critic", False))


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if is_dtensor(t) else t


def _loss(out: torch.Tensor, ids: torch.Tensor, critic: bool) -> torch.Tensor:
    if critic:
        return (out.float() ** 2).mean()
    logp = torch.log_softmax(out.float(), dim=-1)
    return -logp[:-1].gather(-1, ids[1:, None]).mean()


def _compare(case: dict, parallel, result: dict) -> None:
    whole, split = _build(case), _build(case)
    parallelize(split, parallel)
    critic = split.config.is_critic
    assert any(is_dtensor(p) for p in split.parameters())
    ids, cu = packed(LENGTHS)
    ids = ids % split.config.vocab_size
    out_w, out_s = whole(ids, cu), split(ids, cu)
    result["forward"] = float((out_w - _whole(out_s)).detach().abs().max())
    _loss(out_w, ids, critic).backward()
    _loss(out_s, ids, critic).backward()
    grads_s = dict(split.named_parameters())
    result["same_names"] = sorted(grads_s) == sorted(n for n, _ in whole.named_parameters())
    # relative to each gradient's size, with a floor: a key bias's gradient is zero in exact
    # arithmetic (softmax ignores a shift shared by all keys), so both sides hold only rounding
    result["grad"] = max(
        float((p.grad - _whole(grads_s[n].grad)).abs().max() / (p.grad.abs().max() + 1e-3))
        for n, p in whole.named_parameters()
    )
    if critic:
        return
    prompts, pcu = packed(PROMPTS, seed=2)
    prompts = prompts % split.config.vocab_size
    with torch.no_grad():
        greedy = GenerationHyperparameters(max_new_tokens=6, greedy=True)
        g_w, g_s = whole.generate(prompts, pcu, greedy, EOS), split.generate(prompts, pcu, greedy, EOS)
        result["greedy_equal"] = torch.equal(g_w.sequences, g_s.sequences)
        sampled = GenerationHyperparameters(n=2, max_new_tokens=6, temperature=0.7, top_k=20)
        torch.manual_seed(5)
        s_w = whole.generate(prompts, pcu, sampled, EOS)
        torch.manual_seed(5)
        s_s = split.generate(prompts, pcu, sampled, EOS)
    result["sampled_equal"] = torch.equal(s_w.sequences, s_s.sequences)
    result["logprobs"] = float((s_w.logprobs - s_s.logprobs).abs().max())
    result["tokens"] = s_s.sequences.clone()  # compared across ranks by the parent
    result["sampled_logprobs"] = s_s.logprobs.clone()


def _compare_loaded_split(case: dict, parallel, result: dict) -> None:
    """Loading a checkpoint split (each rank reads its slices) gives the shards of splitting the
    whole model, bit for bit, the same gradients, and reads about 1/tp of the file."""
    split = _build(case)
    parallelize(split, parallel)
    torch.manual_seed(0)
    loaded = ReaLModel.from_pretrained(
        case["path"], is_critic=case.get("is_critic", False), tp_mesh=parallel.tp_mesh
    )
    theirs = dict(loaded.named_parameters())
    result["same_shards"] = all(
        torch.equal(local(p), local(theirs[n])) for n, p in split.named_parameters()
    ) and len(theirs) == len(dict(split.named_parameters()))
    ids, cu = packed(LENGTHS)
    out_s, out_l = split(ids, cu), loaded(ids, cu)
    result["forward"] = float((_whole(out_s) - _whole(out_l)).detach().abs().max())
    # and it trains the same: loading allocates new parameters, which no gradient sum may miss
    critic = split.config.is_critic
    _loss(out_s, ids, critic).backward()
    _loss(out_l, ids, critic).backward()
    result["grad"] = max(
        float((_whole(p.grad) - _whole(theirs[n].grad)).abs().max()) for n, p in split.named_parameters()
    )
    files = [f for f in os.listdir(case["path"]) if f.endswith(".safetensors")]
    result["read_fraction"] = loaded.checkpoint_bytes_read / sum(
        os.path.getsize(os.path.join(case["path"], f)) for f in files
    )


def worker(rank: int, folder: str) -> dict:
    parallel = build_contexts({"m": Placement(Layout(1, 2, 1), (0, 1))}, rank, "cpu", TIMEOUT)["m"]
    results = {}
    for name, case in _cases(folder):
        results[name] = {}
        _compare(case, parallel, results[name])
        if "path" in case:
            results[name + "/loaded-split"] = {}
            _compare_loaded_split(case, parallel, results[name + "/loaded-split"])
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    for kind in FAMILIES:
        make_hf_model(kind).save_pretrained(folder / kind)
    return run_ranks(worker, tmp_path_factory.mktemp("tp"), str(folder))


@pytest.mark.parametrize("name", [*FAMILIES, "llama-critic", "tied-split-vocab"])
def test_tensor_parallel_matches_the_whole_model(results, name):
    for rank_results in results:
        r = rank_results[name]
        assert r["forward"] < 1e-5, r
        assert r["same_names"] and r["grad"] < 1e-5, r
        if name != "llama-critic":
            assert r["greedy_equal"] and r["sampled_equal"], r
            assert r["logprobs"] < 1e-5, r
    if name != "llama-critic":  # both ranks of the replica sample the same tokens
        assert torch.equal(results[0][name]["tokens"], results[1][name]["tokens"])
        assert torch.equal(results[0][name]["sampled_logprobs"], results[1][name]["sampled_logprobs"])


@pytest.mark.parametrize("name", [*FAMILIES, "llama-critic"])
def test_a_checkpoint_loads_split_reading_only_each_ranks_slices(results, name):
    for rank_results in results:
        r = rank_results[name + "/loaded-split"]
        assert r["same_shards"] and r["forward"] == 0.0 and r["grad"] == 0.0, r
        # llama-like families are renamed tensors: each rank reads its half of the split ones
        # (the vocabulary of these fixtures does not split: embedding and head are read whole);
        # gpt2's fused, transposed projections are converted whole
        if name != "gpt2":
            assert r["read_fraction"] < 0.8, r
        else:
            assert r["read_fraction"] <= 1.0 + 1e-6, r


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_is_named():
    cfg = ReaLModelConfig(
        n_layers=1, n_q_heads=6, n_kv_heads=3, hidden_dim=48, intermediate_dim=96, vocab_size=32
    )
    check_tensor_parallel(cfg, 3, "model 'actor'")  # divides all three
    with pytest.raises(
        ValueError,
        match=r"model 'actor': tensor-parallel size m2 does not divide the model's 3 key/value heads",
    ):
        check_tensor_parallel(cfg, 2, "model 'actor'")
    with pytest.raises(
        ValueError,
        match=r"m4 does not divide the model's 6 query heads \(n_q_heads\); choose m among \[1, 2, 3, 6\]",
    ):
        check_tensor_parallel(cfg, 4, "model 'actor'")
