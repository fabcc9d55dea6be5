"""Mixture-of-Experts models split over workers against the whole model on one worker (4 gloo
processes, one spawn), on tiny mixtral and qwen2_moe checkpoints (qwen2_moe: a shared expert and
a dense block):

- m2, tensor parallel (every expert split like the dense MLP) and expert parallel (whole
  experts, two per rank), loaded as a model worker loads them: packed variable-length logits,
  gradients of a loss plus the router's load-balancing loss, greedy tokens. Loading expert
  parallel reads only the rank's own experts; a model loaded tensor parallel and then asked for
  expert parallelism gathers the same experts.
- d2 (workers 2 and 3, meanwhile; FSDP and replicated) and d2m2 expert parallel (FSDP over dp,
  and replicated with gradient checkpointing): a train-engine step (loss + aux loss over the
  same micro-batches, clipping, AdamW) gives the whole model's gradients, gradient norm and
  updated weights (d2m2 tensor parallel: test_fsdp_tp_families.py).
- saving the trained d2m2 expert-parallel model writes an ordinary HF folder, every expert in it,
  that transformers loads with the whole model's logits; its recover point restores every shard.
- reallocation between m2 expert parallel and d1, d2, m2 tensor parallel and a disjoint d1 round
  trips bit for bit, each move exactly the bytes the plan says, and EP -> m2 exactly what each
  rank lacks; a stepped d2m2 expert-parallel FSDP model moves to d1 whole.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.distributed as dist
import transformers
from _ranks import TIMEOUT, run_ranks
from model_fixtures import make_hf_model, packed
from test_fsdp_tp_families import OPT, batch, loss_weight, relative, token_loss, whole

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.layout import Layout, Placement
from realrl.api.core.layout_fit import check_layouts, check_tensor_parallel
from realrl.api.core.model_api import GenerationHyperparameters, ReaLModelConfig
from realrl.impl.model.backend.activation_checkpointing import own_named_parameters
from realrl.impl.model.backend.config import EngineConfig, coerce
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.comm.realloc import build_copy, model_param_specs, reallocate, side_for
from realrl.impl.model.comm.realloc_plan import plan_realloc
from realrl.impl.model.nn.hf_io import load_pretrained
from realrl.impl.model.nn.moe_stats import add_router_aux_loss, router_stats_of
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.apply import parallelize
from realrl.impl.model.parallel.dtensor import local
from realrl.impl.model.parallel.expert_parallel import placed_whole
from realrl.impl.model.parallel.mesh import build_contexts
from realrl.impl.model.parallel.state import full_state_dict
from realrl.impl.model.parallel.tensor_parallel import expert_owner

KINDS = ["mixtral", "qwen2_moe"]
PLACEMENTS = {
    "m2": Placement(Layout(tp=2), (0, 1)),
    "d2": Placement(Layout(dp=2), (2, 3)),
    "d2m2": Placement(Layout(2, 2), (0, 1, 2, 3)),
    "d1": Placement(Layout(), (0,)),
    "d2@0": Placement(Layout(dp=2), (0, 1)),
    "d1@2": Placement(Layout(), (2,)),
}
# reallocation: the m2 expert-parallel model to each of these and back ("m2-tp": the same
# workers, every expert split instead)
TARGETS = ["d1", "d2@0", "m2-tp", "d1@2"]
REALLOC_KIND = "qwen2_moe"  # experts, a shared expert, a dense block
LENGTHS = [7, 1, 12, 3, 9]
PROMPTS = [5, 9, 3]
EOS = 1
TIMEOUT_S = 30.0


@dataclasses.dataclass
class World:
    rank: int
    folder: str
    contexts: dict
    groups: dict  # workers -> their group

    def path(self, kind: str) -> str:
        return os.path.join(self.folder, kind)

    def ctx(self, name: str, **flags):
        """The context of ``name`` on this rank with engine flags (None: a one-worker layout)."""
        ctx = self.contexts.get(name)
        return None if ctx is None or ctx.mesh is None else dataclasses.replace(ctx, **flags)


def aux_loss(out: torch.Tensor, mb: SequenceSample) -> tuple[torch.Tensor, dict]:
    return add_router_aux_loss(*token_loss(out, mb), out)


def logits_loss(out: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token log-likelihood plus the router's aux loss with the model's coefficient."""
    loss = -torch.log_softmax(out.float(), -1)[:-1].gather(-1, ids[1:, None]).mean()
    stats = router_stats_of(out)
    return loss + stats.coef * stats.aux_loss


def run_model(model: ReaLModel) -> dict:
    """Logits on packed variable-length input, gradients of ``logits_loss``, greedy tokens."""
    ids, cu = packed(LENGTHS)
    out = model(ids, cu)
    logits_loss(out, ids).backward()
    prompts, pcu = packed(PROMPTS, seed=2)
    with torch.no_grad():
        greedy = model.generate(prompts, pcu, GenerationHyperparameters(max_new_tokens=6, greedy=True), EOS)
    return {
        "logits": out.detach(),
        "grads": {n: whole(p.grad) for n, p in model.named_parameters()},
        "tokens": greedy.sequences,
    }


def held_names(cfg: ReaLModelConfig, names: list[str], t: int | None) -> list[str]:
    """The parameters tp rank ``t`` of m2 holds with whole experts (all but the other rank's
    experts; ``t`` None: split experts, every name)."""
    return sorted(n for n in names if t is None or expert_owner(n, cfg.n_experts, 2) in (None, t))


def against(ref: dict, got: dict, names: list[str]) -> dict:
    held = sorted(got["grads"])
    return {
        "logits": float((ref["logits"] - got["logits"]).abs().max()),
        "grad": max(relative({n: ref["grads"][n] for n in held}, got["grads"]).values()),
        "names": held == names,
        "greedy": torch.equal(ref["tokens"], got["tokens"]),
    }


def same_shards(a: ReaLModel, b: ReaLModel) -> bool:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return sorted(pa) == sorted(pb) and all(torch.equal(local(p), local(pb[n])) for n, p in pa.items())


def run_m2(world: World, kind: str) -> tuple[dict, ReaLModel]:
    """m2 tensor parallel and expert parallel against the whole model (workers 0 and 1); returns
    the expert-parallel model too (the reallocation's source)."""
    path, t = world.path(kind), world.rank
    ctx, ep_ctx = world.ctx("m2"), world.ctx("m2", expert_parallel=True)
    ref_model = ReaLModel.from_pretrained(path)
    ref = run_model(ref_model)
    tp_model = ReaLModel.from_pretrained(path, tp_mesh=ctx.tp_mesh)  # a model worker's split load
    parallelize(tp_model, ctx)
    ep_model = load_pretrained(ReaLModel, path, False, None, "auto", None, "reward", ctx.tp_mesh, True)
    parallelize(ep_model, ep_ctx)
    gathered = ReaLModel.from_pretrained(path, tp_mesh=ctx.tp_mesh)  # loaded without the option
    parallelize(gathered, ep_ctx)
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))
    out = {
        "tp": against(ref, run_model(tp_model), held_names(ref_model.config, list(ref["grads"]), None)),
        "ep": against(ref, run_model(ep_model), held_names(ref_model.config, list(ref["grads"]), t)),
        "held": [list(moe.held) for _, moe in placed_whole(ep_model)],
        "gathered_same": same_shards(ep_model, gathered),
        "read_fraction": ep_model.checkpoint_bytes_read / size,
    }
    ep_model.zero_grad(set_to_none=True)
    return out, ep_model


def step(engine: TrainEngine, data: SequenceSample, mb_spec: MicroBatchSpec) -> dict:
    """One train step (loss + aux loss); gradients and weights read whole."""
    engine.optimizer.zero_grad(set_to_none=True)
    stats = engine.accumulate_gradients(data, mb_spec, aux_loss, loss_weight)
    grads = {n: whole(p.grad) for n, p in own_named_parameters(engine.module)}
    stats.update(engine.optimizer_step())
    weights = {n: whole(p) for n, p in own_named_parameters(engine.module)}
    return {"stats": stats, "grads": grads, "weights": weights}


def step_against(ref: dict, got: dict) -> dict:
    names = sorted(got["grads"])
    return {
        "names": names,
        "ref_loss": ref["stats"]["loss"],
        "loss": got["stats"]["loss"],
        "loss_weight": got["stats"]["loss_weight"],
        "aux": got["stats"]["moe_aux_loss"],
        "grad_norm": (ref["stats"]["grad_norm"], got["stats"]["grad_norm"]),
        "grad": max(relative({n: ref["grads"][n] for n in names}, got["grads"]).values()),
        "weight": max(relative({n: ref["weights"][n] for n in names}, got["weights"]).values()),
    }


def reference_step(path: str) -> tuple[dict, TrainEngine]:
    """The whole model's step over the micro-batches the two dp ranks form, each weighted as the
    train engine weighs it: the aux loss is one forward's, so the reference runs the same forwards."""
    engine = TrainEngine(ReaLModel.from_pretrained(path), OPT)
    vocab = engine.module.config.vocab_size
    mbs = [mb for d in range(2) for mb in batch(d, vocab).split(MicroBatchSpec(n_mbs=1 + d))]
    total, loss = sum(loss_weight(mb) for mb in mbs), 0.0
    with engine.mode(training=True):
        for mb in mbs:
            mb_loss, _ = aux_loss(engine.packed_forward(mb), mb)
            (mb_loss * loss_weight(mb) / total).backward()
            loss += float(mb_loss.detach()) * loss_weight(mb) / total
    grads = {n: p.grad.clone() for n, p in engine.module.named_parameters()}
    stats = {**engine.optimizer_step(), "loss": loss}
    weights = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    return {"stats": stats, "grads": grads, "weights": weights}, engine


def run_steps(
    world: World, kind: str, layout: str, flags: list[dict], refs: dict
) -> tuple[dict, dict[str, TrainEngine]]:
    """A train step in ``layout`` (dp 2) with each engine ``flags``, this rank's dp share cut in
    1 + d micro-batches, against the whole model's (``refs[kind]``: made on first use). Results
    and engines by flags."""
    path = world.path(kind)
    if kind not in refs:
        refs[kind] = reference_step(path)
    results, engines = {}, {}
    for f in flags:
        cfg = EngineConfig(**f)
        ctx = world.ctx(layout, fsdp=cfg.fsdp, expert_parallel=cfg.expert_parallel)
        module = ReaLModel.from_pretrained(path, tp_mesh=ctx.tp_mesh if ctx.layout.tp > 1 else None)
        parallelize(module, ctx)  # as the backends do after the factory's split load
        engine = TrainEngine(module, OPT, cfg, parallel=ctx)
        d = ctx.layout.coords(ctx.model_rank)[1]
        got = step(engine, batch(d, module.config.vocab_size), MicroBatchSpec(n_mbs=1 + d))
        key = "+".join(k for k, v in f.items() if v) or "replicated"
        results[key], engines[key] = step_against(refs[kind][0], got), engine
    return results, engines


def run_save(world: World, engine: TrainEngine, ref: TrainEngine, folder: str) -> None:
    """The trained d2m2 expert-parallel model saved as one HF folder (collective over its ranks);
    the whole model after the same step beside it, by worker 0."""
    engine.save_pretrained(os.path.join(folder, "ep"))
    if world.rank == 0:
        ref.module.save_pretrained(os.path.join(folder, "whole"))


def run_recover(world: World, engine: TrainEngine, folder: str) -> bool:
    """A recover point of the stepped model (each rank's shards, its own experts among them)
    restores every shard into a fresh engine of the same layout."""
    engine.save(os.path.join(folder, "recover"))
    ctx = engine.parallel
    module = ReaLModel.from_pretrained(world.path(REALLOC_KIND), tp_mesh=ctx.tp_mesh)
    parallelize(module, ctx)
    fresh = TrainEngine(module, OPT, engine.config, parallel=ctx)
    fresh.load(os.path.join(folder, "recover"))
    return same_shards(engine.module, fresh.module)


def move(world: World, plan, src, dst, tag: int) -> dict:
    workers = tuple(sorted({*plan.src_workers, *plan.dst_workers}))
    if world.rank not in workers:
        return {"received": 0, "sent": 0, "planned": (0, 0)}
    stats = reallocate(plan, world.rank, src, dst, TIMEOUT_S, tag, group=world.groups[workers])
    return {
        "received": stats.bytes_received,
        "sent": stats.bytes_sent,
        "planned": (plan.bytes_received(world.rank), plan.bytes_sent(world.rank)),
    }


def run_realloc(world: World, src: ReaLModel | None) -> dict:
    """m2 expert parallel -> each target -> a new m2 expert-parallel copy."""
    whole_model = ReaLModel.from_pretrained(world.path(REALLOC_KIND))
    cfg, whole_weights = whole_model.config, dict(whole_model.named_parameters())
    specs = model_param_specs(cfg, torch.float32)
    ep = side_for(cfg, PLACEMENTS["m2"], expert_parallel=True)
    out = {}
    for i, target in enumerate(TARGETS):
        name = "m2" if target == "m2-tp" else target
        side = side_for(cfg, PLACEMENTS[name])
        there, back = plan_realloc(specs, ep, side), plan_realloc(specs, side, ep)
        mine = world.rank in PLACEMENTS[name].workers
        copy = build_copy(cfg, world.ctx(name), "cpu", torch.float32) if mine else None
        result = {"there": move(world, there, src, copy, 100 * i)}
        errors = []
        if copy is not None:  # its shards are the whole model's planned boxes
            for n, p in copy.named_parameters():
                box = tuple(slice(lo, hi) for lo, hi in there.dst_boxes[n][world.rank])
                if not torch.equal(local(p), whole_weights[n].detach()[box]):
                    errors.append(f"{target}: {n}")
        again = build_copy(cfg, world.ctx("m2", expert_parallel=True), "cpu", torch.float32) if src else None
        result["back"] = move(world, back, copy, again, 100 * i + 50)
        if src is not None and not same_shards(src, again):
            errors.append(f"{target}: round trip differs")
        result["errors"] = errors
        out[target] = result
    return out


def run_stepped_to_d1(world: World, engine: TrainEngine) -> dict:
    """The stepped d2m2 expert-parallel FSDP model to d1: the whole weights, bit for bit."""
    cfg = engine.module.config
    ref = full_state_dict(engine.module, keep=True)
    plan = plan_realloc(
        model_param_specs(cfg, torch.float32),
        side_for(cfg, PLACEMENTS["d2m2"], fsdp=True, expert_parallel=True),
        side_for(cfg, PLACEMENTS["d1"]),
    )
    copy = build_copy(cfg, None, "cpu", torch.float32) if world.rank == 0 else None
    stats = move(world, plan, engine.module, copy, 1000)
    errors = [] if copy is None else [n for n, p in copy.named_parameters() if not torch.equal(p, ref[n])]
    return {**stats, "errors": errors}


def worker(rank: int, folder: str, out_folder: str) -> dict:
    contexts = build_contexts(PLACEMENTS, rank, "cpu", TIMEOUT)
    groups = {ws: dist.new_group(list(ws), timeout=TIMEOUT) for ws in [(0, 1), (0, 1, 2), (0, 1, 2, 3)]}
    world = World(rank, folder, contexts, groups)
    results, refs, src = {}, {}, None
    for kind in KINDS:  # workers 0 and 1: m2; meanwhile 2 and 3: d2
        if rank in PLACEMENTS["m2"].workers:
            results[f"{kind}/m2"], ep_model = run_m2(world, kind)
            src = ep_model if kind == REALLOC_KIND else src
        else:
            results[f"{kind}/d2"] = run_steps(world, kind, "d2", [dict(fsdp=True), dict()], refs)[0]
    flags = [dict(fsdp=True, expert_parallel=True), dict(expert_parallel=True, gradient_checkpointing=True)]
    engines = {}
    for kind in KINDS:
        results[f"{kind}/d2m2"], engines[kind] = run_steps(world, kind, "d2m2", flags, refs)
    stepped = engines[REALLOC_KIND]["fsdp+expert_parallel"]
    run_save(world, stepped, refs[REALLOC_KIND][1], out_folder)
    results["recovered"] = run_recover(world, stepped, out_folder)
    results["realloc"] = run_realloc(world, src)
    results["stepped->d1"] = run_stepped_to_d1(world, stepped)
    return results


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    for kind in KINDS:
        make_hf_model(kind).save_pretrained(folder / kind)
    out = tmp_path_factory.mktemp("saved")
    ranks = run_ranks(worker, tmp_path_factory.mktemp("moe"), str(folder), str(out), n=4)
    return ranks, out


@pytest.mark.parametrize("how", ["tp", "ep"])
@pytest.mark.parametrize("kind", KINDS)
def test_m2_matches_the_whole_model(setup, kind, how):
    """Logits, gradients of loss + aux loss (each rank: its own experts, the split weights
    gathered, the router whole) and greedy tokens."""
    for rank in PLACEMENTS["m2"].workers:
        r = setup[0][rank][f"{kind}/m2"][how]
        assert r["names"] and r["greedy"], r
        assert r["logits"] < 1e-5 and r["grad"] < 1e-5, r


@pytest.mark.parametrize("kind", KINDS)
def test_expert_parallel_loading_reads_only_each_ranks_experts(setup, kind):
    for t in PLACEMENTS["m2"].workers:
        r = setup[0][t][f"{kind}/m2"]
        assert all(held == [2 * t, 2 * t + 1] for held in r["held"]) and r["held"], r
        assert r["gathered_same"], r  # loaded tensor parallel, then expert parallel: the same
        assert r["read_fraction"] < 0.7, r  # experts are most of these models' bytes


@pytest.mark.parametrize("how", ["fsdp", "replicated"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_d2_step_equals_the_whole_models(setup, kind, how):
    check_steps([setup[0][w][f"{kind}/d2"][how] for w in PLACEMENTS["d2"].workers], dp=2, tp=1)


@pytest.mark.parametrize("how", ["fsdp+expert_parallel", "expert_parallel+gradient_checkpointing"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_d2m2_expert_parallel_step_equals_the_whole_models(setup, kind, how):
    ranks = [setup[0][w][f"{kind}/d2m2"][how] for w in PLACEMENTS["d2m2"].workers]
    check_steps(ranks, dp=2, tp=2)
    # each tp rank trained its own experts: together, every parameter
    assert len({n for r in ranks for n in r["names"]}) > len(ranks[0]["names"])


def check_steps(ranks: list[dict], dp: int, tp: int) -> None:
    for r in ranks:
        assert r["grad"] < 1e-5 and r["weight"] < 1e-5, r
        ref_norm, norm = r["grad_norm"]
        assert norm == pytest.approx(ref_norm, rel=1e-5) and ref_norm > OPT.grad_clip, r
        assert r["aux"] > 0
    by_dp = ranks[::tp]  # the global loss: each dp rank's mean weighted by its loss tokens
    total = sum(r["loss_weight"] for r in by_dp)
    assert len(by_dp) == dp
    loss = sum(r["loss"] * r["loss_weight"] for r in by_dp) / total
    assert loss == pytest.approx(ranks[0]["ref_loss"], rel=1e-5)


def test_a_saved_expert_parallel_model_loads_in_transformers(setup):
    out = setup[1]
    saved = transformers.AutoModelForCausalLM.from_pretrained(str(out / "ep")).eval()
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(out / "whole")).eval()
    assert sorted(saved.state_dict()) == sorted(ref.state_dict())
    ids, _ = packed(LENGTHS)
    with torch.no_grad():
        diff = (saved(ids[None]).logits - ref(ids[None]).logits).abs().max().item()
    assert diff < 1e-5


def test_a_recover_point_of_an_expert_parallel_fsdp_model_restores_every_shard(setup):
    assert all(r["recovered"] for r in setup[0])


@pytest.mark.parametrize("target", TARGETS)
def test_a_round_trip_from_expert_parallel_is_bit_exact(setup, target):
    for rank, r in enumerate(setup[0]):
        case = r["realloc"][target]
        assert not case["errors"], case["errors"]
        for half in ("there", "back"):
            assert (case[half]["received"], case[half]["sent"]) == case[half]["planned"], (rank, half)


def test_expert_parallel_to_tensor_parallel_moves_what_each_rank_lacks(setup):
    """qwen2_moe's one sparse block: each rank has its own 2 experts whole and receives half of
    each of the other 2 (gate, up, down: 32 x 24 each); everything else is split alike."""
    per_rank = 1 * 2 * 3 * (32 * 24 // 2) * 4
    for rank in PLACEMENTS["m2"].workers:
        move = setup[0][rank]["realloc"]["m2-tp"]["there"]
        assert move["received"] == per_rank and move["sent"] == per_rank


def test_a_stepped_expert_parallel_fsdp_model_moves_to_d1_whole(setup):
    r = setup[0][0]["stepped->d1"]
    assert not r["errors"] and r["received"] > 0 and (r["received"], r["sent"]) == r["planned"]


def test_expert_parallel_needs_experts_that_divide_by_m():
    moe = ReaLModelConfig(
        n_layers=1, n_q_heads=12, n_kv_heads=12, hidden_dim=48, intermediate_dim=96, vocab_size=32,
        n_experts=4, n_experts_per_tok=2, moe_intermediate_dim=30, shared_expert_intermediate_dim=18,
    )  # fmt: skip
    check_tensor_parallel(moe, 2, "model 'actor'", expert_parallel=True)  # 4 experts, 2 each
    with pytest.raises(ValueError, match=r"model 'actor'.*m3.*4 experts \(n_experts\).*\[1, 2, 4\]"):
        check_tensor_parallel(moe, 3, "model 'actor'", expert_parallel=True)
    with pytest.raises(ValueError, match=r"model 'actor' in layout d1m3p1.*n_experts"):
        check_layouts({"actor": [Layout(tp=3)]}, {"actor": moe}, {"actor": True})
    check_layouts({"actor": [Layout(tp=3)]}, {"actor": moe}, {"actor": False})  # each expert split in 3
    # split by tensor parallelism, each expert's inner size must divide; placed whole, it need not
    with pytest.raises(ValueError, match=r"m4 .* 30 experts' inner size \(moe_intermediate_dim\)"):
        check_tensor_parallel(moe, 4, "model 'actor'")
    with pytest.raises(ValueError, match=r"m4 .* 18 shared expert's inner size"):
        check_tensor_parallel(moe, 4, "model 'actor'", expert_parallel=True)
    check_tensor_parallel(dataclasses.replace(moe, shared_expert_intermediate_dim=16), 4, "x", True)
    dense = dataclasses.replace(moe, n_experts=0, n_experts_per_tok=0, shared_expert_intermediate_dim=0)
    with pytest.raises(ValueError, match=r"model 'critic'.*no experts"):
        check_tensor_parallel(dense, 2, "model 'critic'", expert_parallel=True)
    assert coerce(EngineConfig, {"expert_parallel": True}, "engine").expert_parallel
