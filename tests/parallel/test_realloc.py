"""Parameter reallocation on 4 gloo processes: a model laid out in layout A is moved to layout B
(an empty copy) and back to a fresh copy in A, and every weight comes back bit for bit, for every
ordered pair of d1m1, d2m1, d1m2, d2m2 (colocated and on disjoint workers), from FSDP and
FSDP + TP sources after an optimizer step, and to and from pipeline stages (p2, d1m2p2 <-> d4,
FSDP in each stage). Each rank moves exactly the bytes the plan says, a
plan that does not match a module's shards is refused, the gather-then-broadcast baseline gives
the same weights with more bytes, a peer that never shows up gives an error within the
timeout, and a move split into halves (a weight push: the sources post and go on, the
destinations receive later) delivers the same weights.

All cases run in one spawn: starting processes costs more than the models.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time

import pytest
import torch
import torch.distributed as dist
from _ranks import TIMEOUT, run_ranks
from model_fixtures import tiny_config

from realrl.api.core.layout import Layout, Placement
from realrl.impl.model.comm.baseline import gather_broadcast
from realrl.impl.model.comm.realloc import (
    build_copy,
    model_param_specs,
    post_sends,
    reallocate,
    receive,
    side_for,
)
from realrl.impl.model.comm.realloc_plan import ReallocPlan, gather_broadcast_bytes, is_empty, plan_realloc
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.apply import parallelize
from realrl.impl.model.parallel.dtensor import is_dtensor, local
from realrl.impl.model.parallel.fsdp import sum_gradients
from realrl.impl.model.parallel.mesh import build_contexts
from realrl.impl.model.parallel.pipeline import PipelineStage, StageSpec

# vocabulary 64: the embedding (and its tied head) split over 2 tp ranks; split and whole biases
CFG = tiny_config(tied_embedding=True, use_attention_bias=True, use_mlp_bias=True)
PLACEMENTS = {
    "d1m1": Placement(Layout(), (0,)),
    "d2m1": Placement(Layout(dp=2), (0, 1)),
    "d1m2": Placement(Layout(tp=2), (0, 1)),
    "d2m2": Placement(Layout(2, 2), (0, 1, 2, 3)),
    "d2m1@2": Placement(Layout(dp=2), (2, 3)),
    "d4m1": Placement(Layout(dp=4), (0, 1, 2, 3)),
    "d1m1p2": Placement(Layout(pp=2), (0, 1)),
    "d1m1p2@2": Placement(Layout(pp=2), (3, 2)),  # the last stage first: stages by layout rank
    "d1m2p2": Placement(Layout(tp=2, pp=2), (0, 1, 2, 3)),
    "d2m1p2": Placement(Layout(dp=2, pp=2), (0, 1, 2, 3)),
}
LAYOUTS = ["d1m1", "d2m1", "d1m2", "d2m2"]
# (A, B, how A is held): "plain" whole or tensor parallel, "fsdp" sharded as built (FSDP2 keeps
# the root unit gathered after its first forward), "fsdp-step" sharded after an optimizer step
CASES = [
    *((a, b, "plain") for a, b in itertools.product(LAYOUTS, LAYOUTS)),
    ("d1m2", "d2m1@2", "plain"),
    ("d2m1@2", "d1m2", "plain"),
    ("d2m1", "d1m2", "fsdp"),
    *((a, b, "fsdp-step") for a, b in itertools.product(["d2m1", "d2m2"], LAYOUTS)),
    # pipeline stages: each holds its layers (a tied embedding on the first and the last)
    ("d1m1p2", "d2m1", "plain"),
    ("d2m1", "d1m1p2", "plain"),
    ("d1m2p2", "d4m1", "plain"),
    ("d4m1", "d1m2p2", "plain"),
    ("d1m1p2", "d1m2p2", "plain"),
    ("d1m1p2", "d1m1p2@2", "plain"),
    ("d1m1p2", "d1m1p2", "plain"),
    ("d2m1p2", "d1m2", "fsdp"),
]
TAGS_PER_CASE = 100
TIMEOUT_S = 30.0
DEAD_PEER_TIMEOUT_S = 3.0


def _workers(*names: str) -> tuple[int, ...]:
    """The workers of a move between placements ``names``: the members of its group."""
    return tuple(sorted({w for n in names for w in PLACEMENTS[n].workers}))


# every move's group: (d1m2, d1m1) is the dead peer's move, (d2m1, d1m1) the refused one's
GROUPS = sorted({*(_workers(a, b) for a, b, _ in CASES), _workers("d1m2", "d1m1"), _workers("d2m1", "d1m1")})


def case_name(a: str, b: str, how: str) -> str:
    return f"{a}->{b}" + ("" if how == "plain" else f"[{how}]")


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if is_dtensor(t) else t


def _box(t: torch.Tensor, box) -> torch.Tensor:
    return t[tuple(slice(lo, hi) for lo, hi in box)]


def _stepped(module: ReaLModel) -> None:
    """One SGD step, so the weights that move are not the ones every rank could rebuild."""
    sum_gradients(module)
    ids = torch.arange(12) % CFG.vocab_size
    loss = module(ids, torch.tensor([0, 5, 12], dtype=torch.int32)).float().pow(2).mean()
    loss.backward()
    torch.optim.SGD(module.parameters(), lr=0.5).step()


@dataclasses.dataclass
class World:
    """What every case of a rank shares: its meshes, the plan's view of each layout, and the
    group of every move's workers (created by every rank in one order, as model workers do)."""

    rank: int
    contexts: dict
    params: dict
    sides: dict  # (placement name, fsdp) -> Side
    groups: dict  # workers -> their group

    @classmethod
    def build(cls, rank: int) -> World:
        sides = {(n, f): side_for(CFG, p, fsdp=f) for n, p in PLACEMENTS.items() for f in (False, True)}
        contexts = build_contexts(PLACEMENTS, rank, "cpu", TIMEOUT)
        groups = {ws: dist.new_group(list(ws), timeout=TIMEOUT) for ws in GROUPS}
        return cls(rank, contexts, model_param_specs(CFG, torch.float32), sides, groups)

    def plan(self, a: str, b: str, fsdp_a: bool = False) -> ReallocPlan:
        return plan_realloc(self.params, self.sides[a, fsdp_a], self.sides[b, False])

    def group(self, a: str, b: str) -> dist.ProcessGroup:
        return self.groups[_workers(a, b)]

    def copy(self, layout: str) -> ReaLModel | None:
        if self.rank not in PLACEMENTS[layout].workers:
            return None
        return build_copy(CFG, self.contexts.get(layout), "cpu", torch.float32)


def _source(world: World, a: str, how: str) -> tuple[ReaLModel | None, dict[str, torch.Tensor]]:
    """A's part of the model on this rank (None outside A) and the whole weights it holds."""
    torch.manual_seed(0)  # every rank builds the same whole model first
    module = ReaLModel(CFG)
    ref = {n: p.detach().clone() for n, p in module.named_parameters()}
    if world.rank not in PLACEMENTS[a].workers:
        module = None
    else:
        layout = PLACEMENTS[a].layout
        if layout.pp > 1:  # this rank's stage: its layers only
            module = PipelineStage(module, StageSpec.of(CFG, world.contexts[a].stage, layout.pp))
        parallelize(
            module,
            dataclasses.replace(world.contexts[a], fsdp=how != "plain") if a in world.contexts else None,
        )
    if how == "fsdp-step":  # new weights: gathered on A's ranks, sent on from A's first
        if module is not None:
            _stepped(module)
            ref = {n: _whole(p).detach().clone() for n, p in module.named_parameters()}
        for name in world.params:
            dist.broadcast(ref[name], src=PLACEMENTS[a].workers[0])
    return module, ref


def _check_layout(
    rank: int, module: ReaLModel, plan: ReallocPlan, ref: dict, what: str, errors: list[str], whole: bool
) -> None:
    """Each local shard is the planned box of the reference (``whole``: and the whole weights,
    gathered over the copy's tp ranks, equal it)."""
    named = dict(module.named_parameters())
    staged = isinstance(module, PipelineStage)
    if staged and module.tied and "head.weight" in named:  # a last stage's copy of the embedding
        named["embed.wte.weight"] = named.pop("head.weight")
    for name in plan.params:
        box = plan.dst_boxes[name][rank]
        if name not in named and staged and is_empty(box):
            continue  # another stage's
        if not torch.equal(local(named[name]), _box(ref[name], box)):
            errors.append(f"{what}: local shard of {name} differs")
        if whole and not torch.equal(_whole(named[name]), ref[name]):
            errors.append(f"{what}: whole {name} differs")
    if not staged and CFG.tied_embedding and module.head.weight is not module.embed.wte.weight:
        errors.append(f"{what}: head not tied")


def _check_bytes(rank: int, plan: ReallocPlan, stats, what: str, errors: list[str]) -> None:
    if (stats.bytes_received, stats.bytes_sent) != (plan.bytes_received(rank), plan.bytes_sent(rank)):
        errors.append(
            f"{what}: moved (received, sent) {(stats.bytes_received, stats.bytes_sent)}, "
            f"planned {(plan.bytes_received(rank), plan.bytes_sent(rank))}"
        )


def run_case(world: World, index: int, a: str, b: str, how: str) -> dict:
    """A -> a new copy in B -> a new copy in A; checks on every rank that holds a copy."""
    rank = world.rank
    src, ref = _source(world, a, how)
    there, back = world.plan(a, b, fsdp_a=how != "plain"), world.plan(b, a)
    tag = index * TAGS_PER_CASE
    errors: list[str] = []
    out = {"errors": errors, "bytes": (0, 0)}
    copy_b = world.copy(b)
    if rank in (*there.src_workers, *there.dst_workers):
        stats = reallocate(there, rank, src, copy_b, TIMEOUT_S, tag, group=world.group(a, b))
        _check_bytes(rank, there, stats, "A->B", errors)
        out["bytes"] = (stats.bytes_received, stats.bytes_sent)
    if copy_b is not None:
        _check_layout(rank, copy_b, there, ref, "copy B", errors, whole=True)
    copy_a = world.copy(a)
    if rank in (*back.src_workers, *back.dst_workers):
        stats = reallocate(back, rank, copy_b, copy_a, TIMEOUT_S, tag + 50, group=world.group(b, a))
        _check_bytes(rank, back, stats, "B->A", errors)
    if copy_a is not None:
        _check_layout(rank, copy_a, back, ref, "copy A", errors, whole=False)
        if how == "plain":  # the very shards A started from, bit for bit
            mine = dict(copy_a.named_parameters())
            errors += [
                f"round trip: {n} differs"
                for n, p in src.named_parameters()
                if not torch.equal(local(p), local(mine[n]))
            ]
    return out


def run_baseline(world: World, tag: int) -> dict:
    """Gather on one rank, then broadcast the whole model: the same weights, more bytes."""
    a, b = "d2m2", "d2m1@2"
    src, ref = _source(world, a, "plain")
    copy_b = world.copy(b)
    stats = gather_broadcast(
        world.params, world.sides[a, False], world.sides[b, False], world.rank, src, copy_b, TIMEOUT_S, tag
    )
    errors = [] if copy_b is None else [n for n, p in copy_b.named_parameters() if not torch.equal(p, ref[n])]
    return {"errors": errors, "received": stats.bytes_received, "sent": stats.bytes_sent}


def run_bad_layout(world: World) -> str | None:
    """A plan that says whole while the module is FSDP-sharded is refused before anything moves."""
    src, _ = _source(world, "d2m1", "fsdp")  # a collective of workers 0 and 1
    if src is None:
        return None
    copy = world.copy("d1m1")
    try:
        plan, group = world.plan("d2m1", "d1m1"), world.group("d2m1", "d1m1")
        reallocate(plan, world.rank, src, copy, TIMEOUT_S, first_tag=10**6, group=group)
    except ValueError as e:
        return str(e)
    return None


def run_push(world: World, tag: int) -> dict:
    """A weight push d1m2 -> d2m1@2: each source posts its sends and, without waiting for them,
    signals the destinations, which only then receive (a source that waited for its receivers
    would never signal: the case would time out). A push between overlapping workers is refused."""
    a, b = "d1m2", "d2m1@2"
    src, ref = _source(world, a, "plain")
    plan, group = world.plan(a, b), world.group(a, b)
    copy_b = world.copy(b)
    signal, errors, refused = torch.zeros(1), [], None
    if src is not None:
        sends = post_sends(plan, world.rank, src, tag, group=group)
        for dst in plan.dst_workers:
            dist.send(signal, dst=dst, tag=tag + 90)
        for work, _, _ in sends:
            work.wait()  # done once the destinations received
        if world.rank == 0:
            try:
                post_sends(world.plan("d2m1", "d1m1"), 0, src, tag + 95, group=world.group("d2m1", "d1m1"))
            except ValueError as e:
                refused = str(e)
    if copy_b is not None:
        for source in plan.src_workers:
            dist.recv(signal, src=source, tag=tag + 90)
        stats = receive(plan, world.rank, copy_b, TIMEOUT_S, tag, group=group)
        _check_bytes(world.rank, plan, stats, "push", errors)
        _check_layout(world.rank, copy_b, plan, ref, "pushed copy", errors, whole=True)
    return {"errors": errors, "refused": refused}


def run_dead_peer(world: World, tag: int) -> dict | None:
    """Worker 1 stays up but never joins; worker 0 waits for its half at most the timeout. Last:
    gloo closes the pair of workers that timed out, so they cannot talk after it."""
    src, _ = _source(world, "d1m2", "plain")
    copy, done = world.copy("d1m1"), torch.zeros(1)
    if world.rank == 1:  # busy elsewhere until worker 0 gives up: told, or its pair closed
        with contextlib.suppress(RuntimeError):
            dist.recv(done, src=0, tag=tag + 1)
    if world.rank != 0:
        return None
    start = time.monotonic()
    try:
        plan, group = world.plan("d1m2", "d1m1"), world.group("d1m2", "d1m1")
        reallocate(plan, 0, src, copy, DEAD_PEER_TIMEOUT_S, first_tag=tag, group=group)
        error = None
    except RuntimeError as e:
        error = str(e)
    seconds = time.monotonic() - start
    with contextlib.suppress(RuntimeError):
        dist.send(done, dst=1, tag=tag + 1)
    return {"error": error, "seconds": seconds}


def worker(rank: int) -> dict:
    world = World.build(rank)
    start = time.monotonic()
    results = {case_name(*c): run_case(world, i, *c) for i, c in enumerate(CASES)}
    results["baseline"] = run_baseline(world, len(CASES) * TAGS_PER_CASE)
    results["bad-layout"] = run_bad_layout(world)
    results["seconds"] = time.monotonic() - start
    results["push"] = run_push(world, (len(CASES) + 2) * TAGS_PER_CASE)
    results["dead-peer"] = run_dead_peer(world, (len(CASES) + 1) * TAGS_PER_CASE)
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(worker, tmp_path_factory.mktemp("realloc"), n=4)


@pytest.mark.parametrize("case", CASES, ids=[case_name(*c) for c in CASES])
def test_a_round_trip_through_another_layout_is_bit_exact(ranks, case):
    name = case_name(*case)
    for rank, r in enumerate(ranks):
        assert r[name]["errors"] == [], (rank, r[name]["errors"])
    received = sum(r[name]["bytes"][0] for r in ranks)
    assert received == sum(r[name]["bytes"][1] for r in ranks)
    if case[0] == case[1] and case[2] == "plain":
        assert received == 0  # the same layout: every worker already holds its part


def test_the_baseline_gives_the_same_weights_and_moves_more(ranks):
    params = model_param_specs(CFG, torch.float32)
    side_a, side_b = side_for(CFG, PLACEMENTS["d2m2"]), side_for(CFG, PLACEMENTS["d2m1@2"])
    assert all(r["baseline"]["errors"] == [] for r in ranks)
    moved = sum(r["baseline"]["received"] for r in ranks)
    assert moved == sum(r["baseline"]["sent"] for r in ranks)
    assert moved == gather_broadcast_bytes(params, side_a, side_b)
    assert moved > plan_realloc(params, side_a, side_b).total_bytes


def test_a_plan_that_does_not_match_the_modules_shards_is_refused(ranks):
    for message in (ranks[0]["bad-layout"], ranks[1]["bad-layout"]):
        assert message is not None and "source parameter" in message and "shape" in message


def test_a_peer_that_never_comes_gives_an_error_within_the_timeout(ranks):
    dead = ranks[0]["dead-peer"]
    assert dead["error"] is not None and "worker 0" in dead["error"] and "[1]" in dead["error"]
    assert DEAD_PEER_TIMEOUT_S - 0.5 <= dead["seconds"] < DEAD_PEER_TIMEOUT_S + 5


def test_a_weight_push_delivers_the_weights_without_its_sources_waiting(ranks):
    for rank, r in enumerate(ranks):
        assert r["push"]["errors"] == [], (rank, r["push"]["errors"])
    assert "disjoint workers" in ranks[0]["push"]["refused"]
