"""Layout d2m2 (4 gloo processes: tensor parallelism over "tp", and over "dp" FSDP or replicated
data parallelism) against the whole model on one rank, for every family: one train-engine step
(forward, loss, backward, clipping, AdamW) gives the same loss, the same gradient of every
parameter (gathered whole) and the same updated weights as the whole model trained on the same
global batch.

Each model takes the path a model worker takes: a checkpoint loaded already split over tp, then
the backends' ``parallelize`` adds FSDP. A whole model split by ``parallelize`` itself (random
weights) runs too. qwen3's per-head q/k norms are the case that needs care: each tp rank sees only
its heads, so their gradient is a sum over the tp ranks that no wrapping may lose. The
split-vocabulary case runs again with its FSDP engine compiled (``engine.compile=on``: blocks of
DTensor weights through torch.compile) against the eager whole model. All cases run in one spawn
of 4 processes: starting processes costs more than the models.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from _ranks import TIMEOUT, run_ranks
from model_fixtures import make_hf_model, tiny_config

import realrl.api.from_hf  # noqa: F401  (registers the families)
from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.hf_family import registered_hf_families
from realrl.api.core.layout import Layout, Placement
from realrl.api.core.model_api import ReaLModelConfig
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.apply import parallelize
from realrl.impl.model.parallel.dtensor import is_dtensor
from realrl.impl.model.parallel.mesh import build_contexts

LAYOUT = Layout(dp=2, tp=2)
# every family the HF loader knows, each from its fixture (a new family needs one)
FAMILIES = sorted(registered_hf_families())
# a large epsilon makes AdamW's first update follow the gradient's size, not only its sign, and a
# large rate makes it count against the weights, so the updated weights see a wrong gradient too;
# every case's gradient norm is above the clip
OPT = OptimizerConfig(lr=1.0, eps=1.0, weight_decay=0.1, grad_clip=1.0)
LENGTHS = [[5, 9, 3], [7, 4, 10, 6]]  # dp rank d's sequences: uneven token and sample counts
# a vocabulary that splits over two tp ranks (the fixtures' 97 does not): embedding and head split
# and tied, with q/k norms
SPLIT_VOCAB = tiny_config(tied_embedding=True, qk_layernorm=True)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    family: str | None = None  # load this fixture's checkpoint split over tp, as a model worker does
    config: ReaLModelConfig | None = None  # or draw these random weights whole and split them
    is_critic: bool = False
    gradient_checkpointing: bool = False
    compile: str = "off"  # EngineConfig.compile of the split engines ("on": compiled blocks)


CASES = [
    *(Case(kind, family=kind) for kind in FAMILIES),
    Case("llama-critic", family="llama", is_critic=True),
    Case("qwen3-checkpointed", family="qwen3", gradient_checkpointing=True),
    Case("tied-split-vocab-qk-norm", config=SPLIT_VOCAB),
    Case("tied-split-vocab-qk-norm-compiled", config=SPLIT_VOCAB, compile="on"),
]


def batch(d: int, vocab: int) -> SequenceSample:
    g = torch.Generator().manual_seed(10 + d)
    lens = LENGTHS[d]
    ids = torch.randint(2, vocab, (sum(lens),), generator=g)
    return SequenceSample.from_default(
        ids=[f"d{d}i{i}" for i in range(len(lens))], seqlens=lens, data={"packed_input_ids": ids}
    )


def global_batch(vocab: int) -> SequenceSample:
    return SequenceSample.gather([batch(d, vocab) for d in range(LAYOUT.dp)])


def token_loss(out: torch.Tensor, mb: SequenceSample) -> tuple[torch.Tensor, dict]:
    """The mean over the tokens that predict a next one: their log-likelihood, or a critic's
    squared value."""
    ids = mb.data["packed_input_ids"]
    cu = mb.cu_seqlens("packed_input_ids").tolist()
    keep = torch.ones(len(ids) - 1, dtype=torch.bool)
    keep[torch.tensor(cu[1:-1]) - 1] = False  # a sequence's last token does not predict the next's first
    if out.dim() == 1:  # a critic's values
        per_token = out.float()[:-1] ** 2
    else:
        per_token = -torch.log_softmax(out.float()[:-1], -1).gather(-1, ids[1:, None])[:, 0]
    return (per_token * keep).sum() / keep.sum(), {}


def loss_weight(mb: SequenceSample) -> float:
    lens = mb.flat_seqlens("packed_input_ids")
    return float(sum(lens) - len(lens))  # as ``keep`` counts


def build(case: Case, folder: str, tp_mesh=None) -> ReaLModel:
    torch.manual_seed(0)  # random weights and a critic's new head: the same on every rank and copy
    if case.config is not None:
        return ReaLModel(case.config)
    return ReaLModel.from_pretrained(
        os.path.join(folder, case.family), is_critic=case.is_critic, tp_mesh=tp_mesh
    )


def whole(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if is_dtensor(t) else t).detach().clone()


def train(engine: TrainEngine, data: SequenceSample, mb_spec: MicroBatchSpec) -> dict:
    """``train_batch`` in its two halves, the gradients read (gathered whole) in between."""
    engine.optimizer.zero_grad(set_to_none=True)
    stats = engine.accumulate_gradients(data, mb_spec, token_loss, loss_weight)
    grads = {n: whole(p.grad) for n, p in engine.module.named_parameters()}
    stats.update(engine.optimizer_step())
    weights = {n: whole(p) for n, p in engine.module.named_parameters()}
    return {"stats": stats, "grads": grads, "weights": weights}


def relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    # relative to each tensor's size, with a floor: a key bias's gradient is zero in exact
    # arithmetic (softmax ignores a shift shared by all keys), so both sides hold only rounding
    return {n: float((a[n] - b[n]).abs().max() / (a[n].abs().max() + 1e-3)) for n in a}


def compare(case: Case, folder: str, parallel) -> dict:
    """Both d2m2 engines (FSDP over dp, and replicated dp) against the whole model (eager)."""
    engine_cfg = EngineConfig(gradient_checkpointing=case.gradient_checkpointing)
    reference = TrainEngine(build(case, folder), OPT, engine_cfg)
    cache = os.path.join(folder, ".inductor_cache")
    # compiled with FSDP over tp (tp alone compiles in the pipeline engines' tests)
    compiled_cfg = dataclasses.replace(engine_cfg, compile=case.compile, compile_cache_dir=cache)
    vocab = reference.module.config.vocab_size
    ref = train(reference, global_batch(vocab), MicroBatchSpec())
    d, _ = divmod(parallel.model_rank, LAYOUT.tp)
    out = {}
    for fsdp in (True, False):
        context = dataclasses.replace(parallel, fsdp=fsdp)
        module = build(case, folder, context.tp_mesh)  # a checkpoint loads split; random weights do not
        parallelize(module, context)
        sharded = TrainEngine(module, OPT, compiled_cfg if fsdp else engine_cfg, parallel=context)
        # dp rank 1 cuts its share in two micro-batches: gradients accumulate over two backwards
        got = train(sharded, batch(d, vocab), MicroBatchSpec(n_mbs=1 + d))
        out["fsdp" if fsdp else "replicated"] = {
            "ref_loss": ref["stats"]["loss"],
            "loss": got["stats"]["loss"],  # this dp rank's mean; the parent weighs the ranks
            "loss_weight": got["stats"]["loss_weight"],
            "ref_grad_norm": ref["stats"]["grad_norm"],
            "grad_norm": got["stats"]["grad_norm"],
            "same_names": sorted(ref["grads"]) == sorted(got["grads"]),
            # FSDP shards every parameter; tensor parallelism alone splits some
            "split": (all if fsdp else any)(is_dtensor(p) for p in module.parameters()),
            "grad": relative(ref["grads"], got["grads"]),
            "weight": relative(ref["weights"], got["weights"]),
            "compiled_graphs": sharded.compile_stats().get("compile/graphs", 0.0),
        }
    return out


def worker(rank: int, folder: str) -> dict:
    placement = Placement(LAYOUT, tuple(range(LAYOUT.world_size)))
    parallel = build_contexts({"m": placement}, rank, "cpu", TIMEOUT)["m"]
    return {case.name: compare(case, folder, parallel) for case in CASES}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    for kind in FAMILIES:
        make_hf_model(kind).save_pretrained(folder / kind)
    return run_ranks(worker, tmp_path_factory.mktemp("d2m2"), str(folder), n=LAYOUT.world_size)


@pytest.mark.parametrize("engine", ["fsdp", "replicated"])
@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_a_d2m2_step_equals_the_whole_models(results, name, engine):
    ranks = [r[name][engine] for r in results]
    for r in ranks:
        assert r["same_names"] and r["split"], r
        assert (r["compiled_graphs"] > 0) == (name.endswith("-compiled") and engine == "fsdp")
        worst = max(r["grad"], key=r["grad"].get)
        assert r["grad"][worst] < 1e-5, (worst, r["grad"][worst])
        assert r["grad_norm"] == pytest.approx(r["ref_grad_norm"], rel=1e-5)
        assert r["ref_grad_norm"] > OPT.grad_clip  # the step clipped
        worst = max(r["weight"], key=r["weight"].get)
        assert r["weight"][worst] < 1e-5, (worst, r["weight"][worst])
    # the global loss: each dp rank's mean weighted by its loss tokens (tp ranks hold the same)
    by_dp = ranks[:: LAYOUT.tp]
    total = sum(r["loss_weight"] for r in by_dp)
    loss = sum(r["loss"] * r["loss_weight"] for r in by_dp) / total
    assert loss == pytest.approx(ranks[0]["ref_loss"], rel=1e-5)
