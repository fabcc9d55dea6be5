"""Parameter reallocation talks over the group of the move's own workers, never the default group.

On 3 gloo processes, moves that leave a worker out ({0,1} -> {1}, {0} -> {2}, {0,1} -> {2} with
worker 1 holding nothing that moves) run with every ``torch.distributed`` collective and
point-to-point call recorded, each with the group it was given. Gloo would carry a message sent
on the default group just as well; NCCL would not (a batch of messages uses its group's
communicator, whose first use needs every member, and the workers outside the move are busy
elsewhere), so the recording is what tells them apart. Each move must use only its own group,
and its copies must still be bit-exact. The same holds from a gradient-checkpointed source
(``CheckpointWrapper`` renames the parameters of every block), directly and through
``ModelCopies``, from a trained role's home with ``gradient_checkpointing=true`` to a
tensor-parallel copy. All cases run in one spawn.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from _ranks import TIMEOUT, run_ranks
from model_fixtures import tiny_config

from realrl.api.core import model_api
from realrl.api.core.config import ModelAbstraction, ModelBackendAbstraction
from realrl.api.core.layout import Layout, Placement
from realrl.api.core.system_api import ModelShardSpec, ModelSpec, copy_name
from realrl.impl.model.backend.activation_checkpointing import enable_gradient_checkpointing
from realrl.impl.model.backend.config import EngineConfig
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.comm.realloc import build_copy, model_param_specs, reallocate, side_for
from realrl.impl.model.comm.realloc_plan import ReallocPlan, plan_realloc
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.apply import parallelize
from realrl.impl.model.parallel.dtensor import local
from realrl.impl.model.parallel.mesh import build_contexts
from realrl.system.model_copies import ModelCopies
from realrl.system.protocol import ReallocOrder

N = 3
CFG = tiny_config(tied_embedding=True, use_attention_bias=True)
PLACEMENTS = {
    "d1m2@0,1": Placement(Layout(tp=2), (0, 1)),
    "d2m1@0,1": Placement(Layout(dp=2), (0, 1)),
    "d1m1@0": Placement(Layout(), (0,)),
    "d1m1@1": Placement(Layout(), (1,)),
    "d1m1@2": Placement(Layout(), (2,)),
}
# (source, destination, source gradient-checkpointed): each leaves a worker out of its messages
CASES = [
    ("d1m2@0,1", "d1m1@1", False),  # worker 1 keeps its half and receives the other; 2 is idle
    ("d1m1@0", "d1m1@2", False),  # worker 1 is idle
    ("d2m1@0,1", "d1m1@2", False),  # worker 1 is in the move but the plan sends nothing from it
    ("d1m2@0,1", "d1m1@2", True),  # blocks wrapped in CheckpointWrapper
]
# through ModelCopies: a trained role's home on worker 0, checkpointed, and its copy on 0 and 2
HOME = Placement(Layout(), (0,))
COPY = Placement(Layout(tp=2), (0, 2))
TIMEOUT_S = 30.0
RECORDED = (
    *("send", "recv", "isend", "irecv", "batch_isend_irecv"),
    *("barrier", "monitored_barrier", "all_reduce", "reduce", "broadcast", "all_gather"),
    *("all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter"),
    *("all_to_all", "all_to_all_single", "all_gather_object", "broadcast_object_list"),
    *("gather_object", "scatter_object_list"),
)


def case_name(a: str, b: str, ckpt: bool) -> str:
    return f"{a}->{b}" + ("[ckpt]" if ckpt else "")


def _workers(*placements: Placement) -> tuple[int, ...]:
    return tuple(sorted({w for p in placements for w in p.workers}))


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[str, dist.ProcessGroup | None]]]:
    """Every collective and point-to-point call made through ``torch.distributed`` in the block
    (as realrl makes them), with the group it was given (None: the default group); a batch of
    messages is recorded op by op, each with its own group."""
    calls: list[tuple[str, dist.ProcessGroup | None]] = []

    def wrap(name: str, fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        def record(*args, **kwargs):
            if name == "batch_isend_irecv":
                calls.extend((f"batch {op.op.__name__}", op.group) for op in args[0])
            else:
                calls.append((name, signature.bind(*args, **kwargs).arguments.get("group")))
            return fn(*args, **kwargs)

        return record

    with contextlib.ExitStack() as stack:
        for name in RECORDED:
            stack.enter_context(mock.patch.object(dist, name, wrap(name, getattr(dist, name))))
        yield calls


def _described(calls: list, group: dist.ProcessGroup) -> list[tuple[str, str]]:
    """Each call's group in words: "own" (the move's group itself), "default", or its ranks."""

    def words(g: dist.ProcessGroup | None) -> str:
        if g is group:
            return "own"
        if g is None or g is dist.group.WORLD:
            return "default"
        return f"another group of {dist.get_process_group_ranks(g)}"

    return [(name, words(g)) for name, g in calls]


def _check(module: torch.nn.Module, plan: ReallocPlan, rank: int, ref: dict) -> list[str]:
    """This rank's shards of the copy are its planned boxes of the whole weights."""
    named = dict(module.named_parameters())
    return [
        f"{n} differs"
        for n in plan.params
        if not torch.equal(
            local(named[n]), ref[n][tuple(slice(lo, hi) for lo, hi in plan.dst_boxes[n][rank])]
        )
    ]


def run_case(rank: int, index: int, a: str, b: str, ckpt: bool, contexts: dict, groups: dict) -> dict | None:
    pa, pb = PLACEMENTS[a], PLACEMENTS[b]
    torch.manual_seed(index)  # every rank builds the same whole model, A's ranks keep their part
    src = ReaLModel(CFG)
    ref = {n: p.detach().clone() for n, p in src.named_parameters()}
    if rank not in _workers(pa, pb):
        return None
    if rank in pa.workers:
        parallelize(src, contexts.get(a))
        if ckpt:
            assert enable_gradient_checkpointing(src) == "layers"
    else:
        src = None
    params = model_param_specs(CFG, torch.float32)
    plan = plan_realloc(params, side_for(CFG, pa), side_for(CFG, pb))
    dst = build_copy(CFG, contexts.get(b), "cpu", torch.float32) if rank in pb.workers else None
    group = groups[_workers(pa, pb)]
    with recording() as calls:
        stats = reallocate(plan, rank, src, dst, TIMEOUT_S, first_tag=100 * index, group=group)
    return {
        "calls": _described(calls, group),
        "errors": [] if dst is None else _check(dst, plan, rank, ref),
        "bytes": (stats.bytes_received, stats.bytes_sent),
        "planned": (plan.bytes_received(rank), plan.bytes_sent(rank)),
    }


def run_copies(rank: int, groups: dict) -> dict | None:
    """A reallocation order as a model worker runs it: the home a checkpointed TrainEngine that
    took one optimizer step, the copy built by ``ModelCopies`` in the call's layout."""
    name = copy_name("actor", COPY)
    contexts = build_contexts({name: COPY}, rank, "cpu", TIMEOUT)  # collective: every rank
    spec = ModelSpec(
        ModelAbstraction("real_model", {"config": CFG}),
        ModelBackendAbstraction("train", {"engine": {"gradient_checkpointing": True}}),
    )
    home, wrapped = None, False
    ref = {n: torch.empty(s.shape) for n, s in model_param_specs(CFG, torch.float32).items()}
    if rank in HOME.workers:
        torch.manual_seed(0)
        engine = TrainEngine(ReaLModel(CFG), engine_config=EngineConfig(gradient_checkpointing=True))
        module = engine.module
        wrapped = any("_checkpoint_wrapped_module" in n for n, _ in module.named_parameters())
        ids = torch.arange(12) % CFG.vocab_size
        module(ids, torch.tensor([0, 5, 12], dtype=torch.int32)).float().pow(2).mean().backward()
        torch.optim.SGD(module.parameters(), lr=0.5).step()
        home = model_api.Model(model_api.ModelName("actor"), engine, None)
        ref = {n: p.detach().clone() for n, p in module.state_dict().items() if n in ref}
    for n in sorted(ref):  # outside the recording: every rank gets the trained weights to check
        dist.broadcast(ref[n], src=HOME.workers[0])
    order = ReallocOrder("actor", HOME, COPY, first_tag=7)
    if rank not in order.workers:
        return None
    mine = {ws: g for ws, g in groups.items() if rank in ws}
    copies = ModelCopies(rank, "cpu", [ModelShardSpec("actor", HOME, spec, 0)], contexts, mine, TIMEOUT)
    with recording() as calls:
        stats = copies.reallocate(order, home, tokenizer=None)
    return {
        "wrapped": wrapped,
        "calls": _described(calls, groups[tuple(order.workers)]),
        "errors": _check(copies[name].module.module, copies.plans[(name, False)], rank, ref),
        "bytes": (stats["bytes_received"], stats["bytes_sent"]),
    }


def run_wrong_group(rank: int) -> str | None:
    """A move of workers 0 and 1 given the default group is refused before anything moves."""
    pa, pb = PLACEMENTS["d1m2@0,1"], PLACEMENTS["d1m1@1"]
    if rank not in _workers(pa, pb):
        return None
    plan = plan_realloc(model_param_specs(CFG, torch.float32), side_for(CFG, pa), side_for(CFG, pb))
    try:
        reallocate(plan, rank, None, None, TIMEOUT_S, group=dist.group.WORLD)
    except ValueError as e:
        return str(e)
    return None


def worker(rank: int) -> dict:
    contexts = build_contexts(PLACEMENTS, rank, "cpu", TIMEOUT)
    # like model workers, every rank creates every move's group in one order and keeps its own
    sets = sorted({*(_workers(PLACEMENTS[a], PLACEMENTS[b]) for a, b, _ in CASES), _workers(HOME, COPY)})
    groups = {ws: dist.new_group(list(ws), timeout=TIMEOUT) for ws in sets}
    out: dict = {case_name(*c): run_case(rank, i, *c, contexts, groups) for i, c in enumerate(CASES)}
    out["copies"] = run_copies(rank, groups)
    out["wrong group"] = run_wrong_group(rank)
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(worker, tmp_path_factory.mktemp("realloc_groups"), n=N)


@pytest.mark.parametrize("case", CASES, ids=[case_name(*c) for c in CASES])
def test_a_move_uses_only_its_own_workers_group_and_is_exact(ranks, case):
    a, b, _ = case
    workers = _workers(PLACEMENTS[a], PLACEMENTS[b])
    results = {rank: r[case_name(*case)] for rank, r in enumerate(ranks)}
    assert [rank for rank, r in results.items() if r is not None] == list(workers)
    for rank in workers:
        r = results[rank]
        assert r["errors"] == [], (rank, r["errors"])
        assert r["bytes"] == r["planned"], rank
        assert [(n, g) for n, g in r["calls"] if g != "own"] == [], rank
    senders = [rank for rank in workers if results[rank]["bytes"][1] > 0]
    assert senders and all(("isend", "own") in results[rank]["calls"] for rank in senders)


def test_model_copies_move_a_checkpointed_home_over_the_orders_group(ranks):
    assert ranks[1]["copies"] is None  # not in the order: it never hears of it
    home, other = ranks[0]["copies"], ranks[2]["copies"]
    assert home["wrapped"]  # the home's blocks are wrapped: their parameters are renamed
    for rank, r in ((0, home), (2, other)):
        assert r["errors"] == [], (rank, r["errors"])
        assert [(n, g) for n, g in r["calls"] if g != "own"] == [], rank
        assert ("barrier", "own") in r["calls"]
    assert home["bytes"][1] == other["bytes"][0] > 0
    assert ("isend", "own") in home["calls"] and ("irecv", "own") in other["calls"]


def test_a_group_of_other_workers_than_the_moves_is_refused(ranks):
    assert ranks[2]["wrong group"] is None
    for r in ranks[:2]:
        assert "workers [0, 1] must use a group of exactly them, got one of [0, 1, 2]" in r["wrong group"]
