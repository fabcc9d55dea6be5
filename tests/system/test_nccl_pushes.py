"""Weight pushes on the one path NCCL and gloo share: each push's halves are one
``batch_isend_irecv`` on the group of the copy's first fill (no all-reduce first), a push never
uses a group no reallocation has used (on NCCL it would be its communicator's first use, without
the receiver there), several pushes posted before the copy receives any arrive intact and in
order, GPU runs push too, and a step's record shows what pushes cost each side.

The ranks run on 2 gloo processes: home on worker 0, the generation copy on worker 1.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from unittest import mock

import torch
import torch.distributed as dist
from system_graphs import mock_config

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "parallel"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "model"))
from _ranks import TIMEOUT, run_ranks  # noqa: E402
from model_fixtures import tiny_config  # noqa: E402

from realrl.api.core import model_api  # noqa: E402
from realrl.api.core.config import ModelAbstraction, ModelBackendAbstraction  # noqa: E402
from realrl.api.core.layout import Layout, Placement  # noqa: E402
from realrl.api.core.system_api import AsyncRL, ModelShardSpec, ModelSpec, copy_name  # noqa: E402
from realrl.impl.model.backend.train_engine import TrainEngine  # noqa: E402
from realrl.impl.model.nn.real_model import ReaLModel  # noqa: E402
from realrl.impl.model.parallel.mesh import build_contexts  # noqa: E402
from realrl.system.copies import CopyTracker  # noqa: E402
from realrl.system.function_call import CallResult, PushResult  # noqa: E402
from realrl.system.model_copies import ModelCopies  # noqa: E402
from realrl.system.protocol import ReallocOrder  # noqa: E402
from realrl.system.step_log import StepLog  # noqa: E402
from realrl.system.transfer_plan import TagCounter  # noqa: E402
from realrl.system.version_rule import VersionRule  # noqa: E402

CFG = tiny_config(tied_embedding=True)
HOME = Placement(Layout(), (0,))
COPY = Placement(Layout(), (1,))
PUSHES = 3
TAGS = 10  # per order (one pair needs one)


def _version(v: int) -> dict[str, torch.Tensor]:
    """The home weights after ``v`` training steps, as every rank can rebuild them."""
    torch.manual_seed(0)
    base = ReaLModel(CFG)
    return {n: p.detach() + 0.25 * v for n, p in base.named_parameters()}


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """The names of the torch.distributed batch and collective calls made in the block."""
    calls: list[str] = []

    def wrap(name: str, fn):
        def record(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)

        return record

    with contextlib.ExitStack() as stack:
        for name in ("batch_isend_irecv", "all_reduce", "barrier"):
            stack.enter_context(mock.patch.object(dist, name, wrap(name, getattr(dist, name))))
        yield calls


def run_pushes(rank: int) -> dict:
    """Home posts 3 pushes (its weights change after each) and only then tells the copy, which
    receives them one after the other: each lands whole, in the order posted."""
    groups = {(0, 1): dist.new_group([0, 1], timeout=TIMEOUT)}
    name = copy_name("actor", COPY)
    contexts = build_contexts({name: COPY}, rank, "cpu", TIMEOUT)
    spec = ModelSpec(ModelAbstraction("real_model", {"config": CFG}), ModelBackendAbstraction("train", {}))
    copies = ModelCopies(rank, "cpu", [ModelShardSpec("actor", HOME, spec, 0)], contexts, groups, TIMEOUT)
    order = [ReallocOrder("actor", HOME, COPY, TAGS * v, version=v) for v in range(PUSHES + 1)]
    out: dict = {}
    home = None
    if rank == 0:
        engine = TrainEngine(ReaLModel(CFG))
        home = model_api.Model(model_api.ModelName("actor"), engine, None)
    # a push before any reallocation used the group: refused on either side, before any message
    try:
        if rank == 0:
            copies.send_weights(order[1], home)
        else:
            copies.receive_weights(order[1], tokenizer=None)
    except RuntimeError as e:
        out["refused"] = str(e)
    params = dict(home.module.module.named_parameters()) if home is not None else {}

    def load(v: int) -> None:
        with torch.no_grad():
            for n, t in _version(v).items():
                params[n].copy_(t)

    if rank == 0:
        load(0)
    copies.reallocate(order[0], home, tokenizer=None)  # the first fill: every member there
    signal = torch.zeros(1)
    if rank == 0:
        sends, figures = [], []
        for v in range(1, PUSHES + 1):
            load(v)  # the training step that makes version v
            with recording() as calls:
                posted, stats = copies.send_weights(order[v], home)
            sends += posted
            figures.append(stats)
            out.setdefault("calls", []).append(calls)
        dist.send(signal, dst=1, tag=999)  # only now may the copy receive: nothing was waited for
        for work, _, _ in sends:
            work.wait()
        out["figures"] = figures
        return out
    dist.recv(signal, src=0, tag=999)
    copy = copies[name]
    got, figures = [], []
    for v in range(1, PUSHES + 1):
        with recording() as calls:
            figures.append(copies.receive_weights(order[v], tokenizer=None))
        out.setdefault("calls", []).append(calls)
        want = _version(v)
        named = dict(copy.module.module.named_parameters())
        got.append(
            (copy.version.global_step, sorted(n for n, t in want.items() if not torch.equal(named[n], t)))
        )
    out["got"], out["figures"] = got, figures
    return out


def test_pushes_posted_before_any_receive_arrive_whole_and_in_order(tmp_path):
    home, copy = run_ranks(run_pushes, tmp_path)
    for side in (home, copy):
        assert "no reallocation has used the group of workers [0, 1]" in side["refused"], side
        assert "first fill must be a reallocation" in side["refused"]
        # one batch per push on each side, and no all-reduce: the other side is not there
        assert side["calls"] == [["batch_isend_irecv"]] * PUSHES, side["calls"]
    assert copy["got"] == [(v, []) for v in range(1, PUSHES + 1)], copy["got"]
    n_bytes = 4 * sum(p.numel() for p in ReaLModel(CFG, device="meta").parameters())
    assert [f["bytes_sent"] for f in home["figures"]] == [n_bytes] * PUSHES
    assert all(f["send_blocked_s"] >= 0 for f in home["figures"])
    assert [f["bytes_received"] for f in copy["figures"]] == [n_bytes] * PUSHES
    assert all(f["recv_blocked_s"] >= f["seconds"] > 0 for f in copy["figures"])


def test_asynchronous_runs_push_weights_on_gpus_too(tmp_path):
    gen = Placement(Layout(2, 1, 1), (2, 3))  # the actor's home is on workers 0 and 1
    cfg = mock_config(tmp_path, "t", mfc_placements={"gen": gen}, async_rl=AsyncRL(1), device="cuda")
    assert VersionRule(cfg).pushes_weights()
    tracker = CopyTracker(cfg, TagCounter())
    assert tracker.push_placements("actor") == [gen]
    mfc = {m.name: m for m in cfg.mfcs}
    assert tracker.plan(mfc["gen"], 0).realloc  # the first fill: a reallocation
    tracker.plan(mfc["actor_train"], 0)
    assert len(tracker.weight_pushes(mfc["actor_train"], total_steps=4)) == 1
    assert not VersionRule(mock_config(tmp_path, "s", device="cuda")).pushes_weights()  # synchronous


def test_a_steps_record_shows_what_pushes_cost_each_side(tmp_path):
    log = StepLog(str(tmp_path))
    log.open(0, 0)
    train = CallResult([], {}, 1.0, 0, push=PushResult(1000, 0.25, 0.0))
    gen = CallResult([], {}, 1.0, 0, push=PushResult(0, 0.0, 0.5))
    log.realloc(0, "actor", train)
    log.realloc(0, "actor", gen)
    log.realloc(0, "critic", CallResult([], {}, 1.0, 0))  # no push: no keys
    record = log.records[0]
    assert {k: v for k, v in record.items() if k.startswith("push/")} == {
        "push/actor/bytes": 1000.0,
        "push/actor/send_blocked_s": 0.25,
        "push/actor/recv_blocked_s": 0.5,
    }
