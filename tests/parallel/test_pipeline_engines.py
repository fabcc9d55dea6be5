"""The engines on pipeline stages (every family in p2, Mixture-of-Experts ones included, and a
sparse model in p3; d1m2p2, and d2m1p2 with FSDP in each stage; 4 gloo processes) against the
whole model on one process, as a model worker builds them: the checkpoint read stage by stage
through the model factory, the backends' split, the engines' own calls.

Inference (a post-hook's per-token log-probs, micro-batches of different lengths), generation
(greedy, and sampled with two answers per prompt: the same tokens and log-probs), one training
step (loss, clipped gradient norm over the stages, the updated weights: a tied embedding's two
copies included) and the HF save gathered into one ordinary folder all match; every stage reads
only its own layers' tensors and every rank of a replica returns the same result. Under
``-m slow``, d1m2p2 with ``engine.compile=on`` gives the same results with each stage's blocks
compiled.
All cases run in one spawn (starting processes costs more than the models); the families' cases
run two at a time, on workers 0, 1 and 2, 3.
"""

from __future__ import annotations

import dataclasses
import os
import types

import pytest
import torch
import torch.distributed as dist
from _ranks import TIMEOUT, run_ranks
from model_fixtures import FAMILIES, MOE_HF_CONFIGS, make_hf_model, tiny_config

from realrl.api.core.config import ModelName
from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.layout import Layout, Placement
from realrl.api.core.model_api import GenerationHyperparameters
from realrl.api.core.model_size import stage_layers
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.nn.compiled_blocks import GRAPH_BOUND
from realrl.impl.model.nn.factory import make_real_model
from realrl.impl.model.nn.moe_stats import add_router_aux_loss
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.apply import parallelize
from realrl.impl.model.parallel.dtensor import is_dtensor
from realrl.impl.model.parallel.mesh import build_contexts

# tied embedding, q/k norms, a vocabulary that splits over two tp ranks; 5 blocks over 2 stages
CFG = tiny_config(hf_model_type="qwen3", n_layers=5, tied_embedding=True, qk_layernorm=True)
# sparse blocks 1 and 3 of 4 over 3 stages: the middle stage relays the first's routing records;
# a large load-balancing weight, so a lost record would show in the loss and the gradients
MOE_CFG = tiny_config(
    hf_model_type="qwen3_moe",
    n_layers=4,
    n_experts=4,
    n_experts_per_tok=2,
    moe_intermediate_dim=24,
    decoder_sparse_step=2,
    qk_layernorm=True,
    router_aux_loss_coef=0.5,
)
FAMILIES_WITH_MOE = [*FAMILIES, *sorted(MOE_HF_CONFIGS)]
OPT = OptimizerConfig(lr=1.0, eps=1.0, weight_decay=0.1, grad_clip=1.0)


@dataclasses.dataclass(frozen=True)
class Case:
    folder: str  # "tiny" (CFG's checkpoint) or a family's fixture
    placement: Placement
    fsdp: bool = False
    compile: str = "off"  # EngineConfig.compile: "on" runs each stage's blocks through torch.compile


CASES = {
    **{
        f"{family}-p2": Case(family, Placement(Layout(pp=2), (0, 1) if i % 2 == 0 else (2, 3)))
        for i, family in enumerate(FAMILIES_WITH_MOE)
    },
    "moe-p3": Case("tiny_moe", Placement(Layout(pp=3), (0, 1, 2))),
    "p2": Case("tiny", Placement(Layout(pp=2), (0, 1))),
    "d1m2p2": Case("tiny", Placement(Layout(tp=2, pp=2), (0, 1, 2, 3))),
    "d2m1p2-fsdp": Case(
        "tiny", Placement(Layout(dp=2, pp=2), (3, 2, 1, 0)), fsdp=True
    ),  # workers out of order
}
# the d1m2p2 stages compiled (packed forwards; generation stays eager): its own spawn, under -m
# slow (compiling costs each of the 4 processes ~40 s here)
COMPILED = {"d1m2p2-compiled": Case("tiny", CASES["d1m2p2"].placement, compile="on")}
LENGTHS = [[5, 9, 3], [7, 4, 10, 6]]  # dp rank d's sequences
EOS = types.SimpleNamespace(eos_token_id=[3, 7])
GCONFIGS = {
    "greedy": GenerationHyperparameters(n=1, max_new_tokens=5, greedy=True),
    "sampled": GenerationHyperparameters(n=2, max_new_tokens=6, temperature=0.9),
}


def batch(d: int, vocab: int, key: str = "packed_input_ids") -> SequenceSample:
    g = torch.Generator().manual_seed(10 + d)
    lens = LENGTHS[d]
    ids = torch.randint(8, vocab, (sum(lens),), generator=g)
    return SequenceSample.from_default(
        ids=[f"d{d}i{i}" for i in range(len(lens))], seqlens=lens, data={key: ids}
    )


def token_loss(out: torch.Tensor, mb: SequenceSample) -> tuple[torch.Tensor, dict]:
    ids, cu = mb.data["packed_input_ids"], mb.cu_seqlens("packed_input_ids").tolist()
    keep = torch.ones(len(ids) - 1, dtype=torch.bool)
    keep[torch.tensor(cu[1:-1], dtype=torch.long) - 1] = False
    per_token = -torch.log_softmax(out.float()[:-1], -1).gather(-1, ids[1:, None])[:, 0]
    loss = (per_token * keep).sum() / keep.sum()
    # a sparse model's load-balancing term over every block (the output carries the routing)
    return add_router_aux_loss(loss, {"loss_max": float(per_token.detach().max())}, out)


def loss_weight(mb: SequenceSample) -> float:
    lens = mb.flat_seqlens("packed_input_ids")
    return float(sum(lens) - len(lens))


def next_token_logp(out: torch.Tensor, mb: SequenceSample) -> torch.Tensor:
    ids = mb.data["packed_input_ids"]
    return torch.log_softmax(out.float()[:-1], -1).gather(-1, ids[1:, None])[:, 0]


def whole(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if is_dtensor(t) else t).detach().clone()


def calls(engine: TrainEngine, d: int) -> dict:
    """What one replica's engine returns for dp rank ``d``'s data."""
    vocab = engine.module.config.vocab_size
    out = {"logp": engine.forward(batch(d, vocab), MicroBatchSpec(n_mbs=2), post_hook=next_token_logp)}
    for name, g in GCONFIGS.items():
        torch.manual_seed(5)  # the call's base seed, drawn alike on every rank and the reference
        gen = engine.generate(batch(d, vocab, "packed_prompts"), MicroBatchSpec(n_mbs=2), EOS, g)
        out[name] = (gen.sequences.clone(), gen.logprobs.clone(), list(gen.seqlens))
    engine.optimizer.zero_grad(set_to_none=True)
    mb_spec = MicroBatchSpec(n_mbs=3 - d)  # the dp ranks run different numbers of micro-batches
    stats = engine.accumulate_gradients(batch(d, vocab), mb_spec, token_loss, loss_weight)
    stats.update(engine.optimizer_step())
    out["stats"] = stats
    out["weights"] = {n: whole(p) for n, p in engine.module.named_parameters()}
    return out


def reference(folder: str) -> dict:
    """The whole model on this process: each dp rank's calls, and one step on the global batch."""
    out = {}
    for d in (0, 1):
        engine = TrainEngine(ReaLModel.from_pretrained(folder), OPT, EngineConfig())
        out[d] = calls(engine, d)  # its step is this dp rank's batch alone (the d1 layouts')
    engine = TrainEngine(ReaLModel.from_pretrained(folder), OPT, EngineConfig())
    cfg = engine.module.config
    engine.optimizer.zero_grad(set_to_none=True)
    global_batch = SequenceSample.gather([batch(0, cfg.vocab_size), batch(1, cfg.vocab_size)])
    stats = engine.accumulate_gradients(global_batch, MicroBatchSpec(), token_loss, loss_weight)
    stats.update(engine.optimizer_step())
    out["global"] = {"stats": stats, "weights": {n: whole(p) for n, p in engine.module.named_parameters()}}
    out["state_dict"] = {n: p.detach().clone() for n, p in engine.module.state_dict().items()}
    out["whole_bytes"] = os.path.getsize(os.path.join(folder, "model.safetensors"))
    out["layers"] = {
        p: [[str(i) for i in r] for r in stage_layers(cfg, p)] for p in (2, 3) if p <= cfg.n_layers
    }
    return out


def run_case(rank: int, name: str, case: Case, ctx, folder: str, out_dir: str) -> dict:
    """This rank's stage's results; the case's first worker adds the whole model's."""
    ref = reference(folder) if rank == case.placement.workers[0] else None
    model = make_real_model(ModelName("actor"), path=folder, parallel=ctx)
    read = model.module.checkpoint_bytes_read
    ctx = dataclasses.replace(ctx, fsdp=case.fsdp)
    parallelize(model.module, ctx)
    cache = os.path.join(out_dir, ".inductor_cache")
    config = EngineConfig(fsdp=case.fsdp, compile=case.compile, compile_cache_dir=cache)
    engine = TrainEngine(model.module, OPT, config, parallel=ctx)
    d = ctx.coords[1]
    got = calls(engine, d)
    got["compile"] = engine.compile_stats()
    saved = os.path.join(out_dir, name)
    engine.save_pretrained(saved)
    dist.barrier(group=ctx.model_group)
    layers = {n.split(".")[1] for n, _ in engine.module.named_parameters() if n.startswith("layers.")}
    return {
        "reference": ref,
        "dp": d,
        "stage": ctx.stage,
        "bytes_read": read,
        "layers": sorted(layers, key=int),
        "got": got,
        "saved": {n: p.detach().clone() for n, p in ReaLModel.from_pretrained(saved).state_dict().items()},
    }


def worker(rank: int, folders: str, out_dir: str, cases: dict[str, Case]) -> dict:
    # every case's groups, made by every rank in one order (creating a group is collective)
    contexts = {
        name: build_contexts({"m": c.placement}, rank, "cpu", TIMEOUT).get("m") for name, c in cases.items()
    }
    return {
        name: run_case(rank, name, case, contexts[name], os.path.join(folders, case.folder), out_dir)
        for name, case in cases.items()
        if contexts[name] is not None
    }


def run_cases(tmp_path_factory, cases: dict[str, Case]) -> list[dict]:
    folders = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    ReaLModel(CFG).save_pretrained(str(folders / "tiny"))
    ReaLModel(MOE_CFG).save_pretrained(str(folders / "tiny_moe"))
    for family in {c.folder for c in cases.values()} & set(FAMILIES_WITH_MOE):
        make_hf_model(family).save_pretrained(folders / family)
    out_dir = tmp_path_factory.mktemp("saved")
    return run_ranks(worker, tmp_path_factory.mktemp("pp"), str(folders), str(out_dir), cases, n=4)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_cases(tmp_path_factory, CASES)


def ranks_of(results, name):
    return [r[name] for r in results if name in r]


def reference_of(results, name):
    return next(r["reference"] for r in ranks_of(results, name) if r["reference"] is not None)


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return a.shape == b.shape and float((a - b).abs().max()) <= tol * (1.0 + float(b.abs().max()))


def expected_step(ref, name):
    """The d1 layouts train on dp rank 0's batch; d2 on both: the global batch."""
    return ref["global"] if name.startswith("d2") else ref[0]


def same_weight(got: dict, want: dict) -> list[str]:
    """Names whose tensors differ (a last stage's copy of a tied embedding is the embedding)."""
    return [n for n, w in got.items() if not close(w, want[n if n in want else "embed.wte.weight"])]


@pytest.mark.parametrize("name", list(CASES))
def test_every_stage_reads_only_its_layers(results, name):
    ref, ranks = reference_of(results, name), ranks_of(results, name)
    split = ref["layers"][CASES[name].placement.layout.pp]
    assert {r["stage"]: r["layers"] for r in ranks} == dict(enumerate(split))
    if name == "p2":  # balanced by parameters, the embedding and the head counted
        assert split == [["0", "1", "2"], ["3", "4"]]
    if CASES[name].folder == "gpt2":
        return  # its fused, transposed projections are read whole and converted
    for r in ranks:
        assert 0 < r["bytes_read"] < 0.8 * ref["whole_bytes"], (
            r["stage"],
            r["bytes_read"],
            ref["whole_bytes"],
        )


@pytest.mark.parametrize("name", list(CASES))
def test_inference_and_generation_equal_the_whole_models(results, name):
    ref = reference_of(results, name)
    for r in ranks_of(results, name):  # every rank of a replica returns the replica's result
        want = ref[r["dp"]]
        assert close(r["got"]["logp"], want["logp"])
        for g in GCONFIGS:
            tokens, logp, lens = r["got"][g]
            assert lens == want[g][2] and torch.equal(tokens, want[g][0]), (g, r["stage"])
            assert close(logp, want[g][1]), g


@pytest.mark.parametrize("name", list(CASES))
def test_a_training_step_equals_the_whole_models(results, name):
    ref, ranks = reference_of(results, name), ranks_of(results, name)
    want = expected_step(ref, name)
    for r in ranks:
        stats = r["got"]["stats"]
        assert stats["grad_norm"] == pytest.approx(want["stats"]["grad_norm"], rel=1e-5)
        assert stats["grad_norm"] > OPT.grad_clip  # the step clipped
        if not name.startswith("d2"):
            assert stats["loss"] == pytest.approx(want["stats"]["loss"], rel=1e-5)
            assert stats["loss_max"] == pytest.approx(want["stats"]["loss_max"], rel=1e-5)
        assert same_weight(r["got"]["weights"], want["weights"]) == []
    held = set().union(*(r["got"]["weights"] for r in ranks))
    assert held - {"head.weight"} == set(want["weights"]) - {"head.weight"} and "head.weight" in held


@pytest.mark.slow
def test_compiled_stages_equal_the_whole_eager_model(tmp_path_factory):
    results = run_cases(tmp_path_factory, COMPILED)
    ref, ranks = reference_of(results, "d1m2p2-compiled"), ranks_of(results, "d1m2p2-compiled")
    for r in ranks:  # each stage compiled its training and inference forwards, within the bound
        assert 0 < r["got"]["compile"]["compile/graphs"] <= 2 * GRAPH_BOUND, r["got"]["compile"]
        want = ref[r["dp"]]
        assert close(r["got"]["logp"], want["logp"])
        assert r["got"]["stats"]["grad_norm"] == pytest.approx(want["stats"]["grad_norm"], rel=1e-5)
        assert r["got"]["stats"]["loss"] == pytest.approx(want["stats"]["loss"], rel=1e-5)
        assert same_weight(r["got"]["weights"], want["weights"]) == []


@pytest.mark.parametrize("name", list(CASES))
def test_the_hf_save_is_one_ordinary_folder_of_the_trained_weights(results, name):
    ref = reference_of(results, name)
    want = expected_step(ref, name)
    for r in ranks_of(results, name):
        assert set(r["saved"]) == set(ref["state_dict"])
        assert same_weight(r["saved"], want["weights"]) == []
