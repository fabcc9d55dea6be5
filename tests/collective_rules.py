"""NCCL's rules for torch.distributed calls, held on gloo: the check every end-to-end run carries.

gloo forgives what NCCL does not. A CPU run passes with a non-contiguous tensor, with one
collective mixing host and device tensors, with ranks that create their groups in different
orders, with point-to-point messages that gloo matches by tag but NCCL matches in order, and with
ranks whose collectives on a group differ in dtype or shape; on GPUs each of these fails or hangs.
This check holds every call to NCCL's rules:

- in each worker process a ``TorchDispatchMode`` sees every ``c10d`` and functional-collective op
  (``dist.all_reduce``, FSDP2's gathers, DTensor's collectives, ``isend``/``irecv``); it raises
  ``CollectiveRuleError`` at once, naming the op and its group, when a tensor is not contiguous,
  when the op's tensors are of more than one dtype, or when they mix host and device tensors
  (the tags of ``device_discipline``: on a GPU they would live on two devices); a call on a group
  the rank does not belong to (torch skips it with a warning) raises too;
- it writes each call (op, group and its ranks, shapes, dtypes, peer) to
  ``collectives-<pid>.jsonl`` beside the worker's log, with the groups the rank had created, in
  order, when each group was first used;
- after the run, ``check_run(run_dir)`` compares the ranks' records: every member of a group
  issued the same sequence of collectives (op, dtypes, and shapes where NCCL needs equal
  shapes), every rank created its groups in the same order, and between a pair of ranks the
  k-th receive is of the k-th message sent (shape and dtype), whatever the tags; messages of host
  tensors on the default group (the sample transfers, which go over gloo on GPUs too) are left to
  gloo's tag matching. Weight moves and pushes travel through host buffers on the CPU but on
  groups of their own, and through device buffers over NCCL on GPUs: they are held to the rules.

As the run goes, every point-to-point message NCCL would carry is also held to NCCL's blocking
window (``tests/send_window.py``, shared with the pipeline schedules' unit check
``tests/parallel/p2p_window.py``): between a pair of ranks on a group, a send waits while more
than two messages toward its peer have no receive posted there, as on NCCL, where gloo would
buffer it; after ``REALRL_P2P_WINDOW_TIMEOUT_S`` seconds (120 by default) it raises
``CollectiveRuleError`` naming the pair, the group and the messages outstanding, and the worker
fails. The ranks count their posted receives in the world's store. The operations of one
``batch_isend_irecv`` are posted together, as NCCL's group calls are: its receives count as posted
before any of its sends waits. The sample transfers stay exempt (gloo's, on GPUs too).

Model workers import this file as a plugin (``import_modules``); it switches on in
``python -m realrl.apps.remote`` processes only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import warnings
from collections import defaultdict

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from realrl.base.plugins import load_attribute

# loaded by path: model workers import this file as a plugin, with the tests' folder not importable
SendWindow = load_attribute(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "send_window.py:SendWindow")
)

MARKER = "collective-rules check: on"
RECORDS_GLOB = "collectives-"
_DEVICE_TAG = "_device_discipline_tag"  # what tests/device_discipline.py stores on tensors
P2P_OPS = {"send", "recv_"}
IGNORED_OPS = {"wait_tensor", "recv_any_source_"}  # the latter refused below, not recorded
WINDOW = 2  # messages toward a peer that may wait for its receive (NCCL buffers about this much)
WINDOW_TIMEOUT_ENV = "REALRL_P2P_WINDOW_TIMEOUT_S"
WINDOW_TIMEOUT_S = 120.0  # generous: a peer may be busy computing before it posts its receive
# collectives whose tensors NCCL requires of equal shapes on every rank of the group
SAME_SHAPES = {
    "allreduce_",
    "allreduce_coalesced_",
    "broadcast_",
    "allgather_",
    "_allgather_base_",
    "allgather_into_tensor_coalesced_",
    "reduce_scatter_",
    "_reduce_scatter_base_",
    "reduce_scatter_tensor_coalesced_",
    "all_reduce",
    "all_reduce_",
    "all_reduce_coalesced",
    "all_gather_into_tensor",
    "all_gather_into_tensor_out",
    "reduce_scatter_tensor",
    "broadcast",
}


class CollectiveRuleError(RuntimeError):
    """A torch.distributed call that NCCL would refuse, or that would hang on it."""


@dataclasses.dataclass
class Call:
    world: str
    rank: int  # global
    op: str
    group: str  # the group's name
    ranks: list[int]  # the group's global ranks
    shapes: list[list[int]]
    dtypes: list[str]
    peer: int | None = None  # point-to-point: the other side's global rank
    # where the tensors live under device_discipline: "device" (NCCL's on a GPU), "host" (gloo's:
    # the sample transfers, which match messages by tag), or None when nothing tags them
    where: str | None = None


def _flat_tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat_tensors(v)]
    return []


def _group_of(func, args, kwargs):
    """The op's process group: a boxed ProcessGroup (c10d ops) or a group name (functional ops)."""
    for arg, value in zip(
        func._schema.arguments, list(args) + [kwargs.get(a.name) for a in func._schema.arguments[len(args) :]]
    ):
        if isinstance(value, torch.ScriptObject) and "ProcessGroup" in str(value._type()):
            return dist.ProcessGroup.unbox(value)
        if arg.name == "group_name" and isinstance(value, str):
            return dist.distributed_c10d._resolve_process_group(value)
    return None


def _op_name(func) -> str:
    """``c10d::send`` of ``send.default``: the op without its namespace and overload."""
    return func._schema.name.split("::")[-1]


def _peer(op: str, args, group) -> int | None:
    if op not in P2P_OPS:
        return None
    group_rank = int(args[2])  # send(tensors, group, dstRank, tag) / recv_(tensors, group, srcRank, tag)
    return dist.get_global_rank(group, group_rank)


def _world_key() -> str:
    """One name for every process of a world: its rendezvous store's port."""
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return str(getattr(store, "port", id(store)))


def check_local(op: str, group_desc: str, tensors: list[torch.Tensor]) -> None:
    """The rules one rank can check alone: contiguous tensors of one dtype, on one device."""
    for t in tensors:
        if not t.is_contiguous():
            raise CollectiveRuleError(
                f"{op} on {group_desc}: a non-contiguous tensor {tuple(t.shape)} (NCCL refuses it)"
            )
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise CollectiveRuleError(
            f"{op} on {group_desc}: tensors of dtypes {sorted(map(str, dtypes))} in one call"
        )
    tags = {getattr(t, _DEVICE_TAG, None) for t in tensors} - {None}
    if len(tags) > 1:
        raise CollectiveRuleError(
            f"{op} on {group_desc}: host and device tensors in one call (two devices on a GPU)"
        )


_C10D = dist.distributed_c10d.__name__


def _batch_of() -> list | None:
    """The ``p2p_op_list`` of the ``torch.distributed.batch_isend_irecv`` call the op being
    dispatched comes from, or None. gloo has no group calls: the batch reaches dispatch one op at
    a time, and nothing the op carries says it belongs to one, so only the caller's frame tells
    (reading it is fine for a check that only tests load, never for the product)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "batch_isend_irecv" and frame.f_globals.get("__name__") == _C10D:
            return frame.f_locals.get("p2p_op_list")
        frame = frame.f_back
    return None


def _gloo_on_gpus(call: Call, group=None, tensor=None) -> bool:
    """Whether a message goes over gloo on GPUs too: a host tensor on the default group (the
    sample transfers, which gloo buffers and matches by tag). Weight moves use host buffers on the
    CPU but groups of their own, and device buffers (NCCL) on GPUs: they keep NCCL's rules here."""
    if tensor is not None:
        where = getattr(tensor, _DEVICE_TAG, None)
        name = (group if group is not None else dist.group.WORLD).group_name
    else:
        where, name = call.where, call.group
    return where == "host" and name == _default_group_name()


def _default_group_name() -> str:
    """The default group's name (torch names it "0"; the records are read after the run)."""
    return dist.group.WORLD.group_name if dist.is_initialized() else "0"


class CollectiveRecorder(TorchDispatchMode):
    """Checks each distributed op as it is issued and records it for the cross-rank comparison."""

    def __init__(self, records_path: str, window: int = WINDOW, window_timeout_s: float | None = None):
        super().__init__()
        self.records_path = records_path
        self.seen_groups: set[str] = set()
        self.window = window
        if window_timeout_s is None:
            window_timeout_s = float(os.environ.get(WINDOW_TIMEOUT_ENV, WINDOW_TIMEOUT_S))
        self.window_timeout_s = window_timeout_s
        # by (world, group, receiver): a description of every device message sent there, in order
        self.sent: dict[tuple[str, str, int], list[str]] = defaultdict(list)
        self.batch: list | None = None  # the batch_isend_irecv whose ops are arriving
        self.batch_left = 0  # its ops yet to arrive

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace in ("c10d", "_c10d_functional"):
            op = _op_name(func)
            if op == "recv_any_source_":
                raise CollectiveRuleError("recv from any source: NCCL has no such receive")
            if op not in IGNORED_OPS:
                self.observe(func, op, args, kwargs)
        return func(*args, **kwargs)

    def hold_window(self, call: Call, tag: int) -> None:
        """NCCL's blocking window: count a receive as posted, or wait until a send is within it."""
        window = SendWindow(
            dist.distributed_c10d._get_default_store(),
            self.window,
            self.window_timeout_s,
            error=CollectiveRuleError,
            prefix="p2p-window/",
        )
        batch = _batch_of()
        if batch is not None and (batch is not self.batch or self.batch_left == 0):
            # the batch's first op: all its receives are posted (NCCL's group call posts them at once)
            self.batch, self.batch_left = batch, len(batch)
            for p in batch:
                if p.op is dist.irecv and not _gloo_on_gpus(call, p.group, p.tensor):
                    window.post(p.peer, call.rank, f"group {p.group.group_name}")
        if batch is not None:
            self.batch_left -= 1
            if self.batch_left == 0:
                self.batch = None  # keeps no tensor alive
        if _gloo_on_gpus(call):  # a sample transfer: gloo's on GPUs too, which buffers it
            return
        channel = f"group {call.group}"
        if call.op == "recv_":
            if batch is None:
                window.post(call.peer, call.rank, channel)
            return
        sent = self.sent[(call.world, call.group, call.peer)]
        sent.append(f"#{len(sent)} (tag {tag}, shape {call.shapes[0]}, {call.dtypes[0]})")
        window.admit(call.rank, call.peer, sent, channel)

    def observe(self, func, op: str, args, kwargs) -> None:
        group = _group_of(func, args, kwargs)
        if group is None:
            return
        ranks = dist.get_process_group_ranks(group)
        desc = f"group {group.group_name} (ranks {ranks})"
        tensors = _flat_tensors(list(args)) + _flat_tensors(list(kwargs.values()))
        check_local(op, desc, tensors)
        call = Call(
            world=_world_key(),
            rank=dist.get_rank(),
            op=op,
            group=group.group_name,
            ranks=ranks,
            shapes=[list(t.shape) for t in tensors],
            dtypes=[str(t.dtype) for t in tensors],
            peer=_peer(op, args, group),
            where=next(iter({getattr(t, _DEVICE_TAG, None) for t in tensors} - {None}), None),
        )
        if op in P2P_OPS:
            self.hold_window(call, int(args[3]))
        lines = []
        if group.group_name not in self.seen_groups:
            self.seen_groups.add(group.group_name)
            created = [dist.get_process_group_ranks(g) for g in dist.distributed_c10d._world.pg_group_ranks]
            lines.append({"world": call.world, "rank": call.rank, "groups_created": created})
        lines.append(dataclasses.asdict(call))
        with open(self.records_path, "a") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))


def read_records(folder: str) -> tuple[list[Call], dict[tuple[str, int], list[list[int]]]]:
    calls: list[Call] = []
    created: dict[tuple[str, int], list[list[int]]] = {}
    for name in sorted(os.listdir(folder)):
        if not name.startswith(RECORDS_GLOB):
            continue
        with open(os.path.join(folder, name)) as f:
            for line in f:
                row = json.loads(line)
                if "groups_created" in row:
                    created[(row["world"], row["rank"])] = row["groups_created"]  # the latest is the longest
                else:
                    calls.append(Call(**row))
    return calls, created


def problems(calls: list[Call], created: dict[tuple[str, int], list[list[int]]]) -> list[str]:
    """Where the ranks' records break NCCL's rules, each named; empty when they keep them."""
    found: list[str] = []
    # two ranks create the groups they both belong to in the same order (a group a rank is not in
    # may be created on its members only, as DeviceMesh's split groups are)
    by_world: dict[str, dict[int, list[list[int]]]] = defaultdict(dict)
    for (world, rank), groups in created.items():
        by_world[world][rank] = groups
    for per_rank in by_world.values():
        ranks = sorted(per_rank)
        for i, r1 in enumerate(ranks):
            for r2 in ranks[i + 1 :]:
                a = [g for g in per_rank[r1] if r1 in g and r2 in g]
                b = [g for g in per_rank[r2] if r1 in g and r2 in g]
                for k, (ga, gb) in enumerate(zip(a, b)):
                    if ga != gb:
                        found.append(
                            f"new_group order: the {k}-th group ranks {r1} and {r2} share is {ga} on "
                            f"rank {r1} but {gb} on rank {r2}"
                        )
                        break
    # every member of a group issues the same collectives
    sequences: dict[tuple[str, str], dict[int, list[Call]]] = defaultdict(lambda: defaultdict(list))
    # NCCL orders the messages of one communicator: a pair's messages per group
    p2p: dict[tuple[str, str, int, int], dict[str, list[Call]]] = defaultdict(lambda: defaultdict(list))
    for c in calls:
        if c.op in P2P_OPS:
            if _gloo_on_gpus(c):  # a sample transfer: gloo's, on GPUs too, where tags match
                continue
            src, dst = (c.rank, c.peer) if c.op == "send" else (c.peer, c.rank)
            p2p[(c.world, c.group, src, dst)][c.op].append(c)
        else:
            sequences[(c.world, c.group)][c.rank].append(c)
    for (_, group), per_rank in sequences.items():
        ranks = sorted(per_rank)
        first = per_rank[ranks[0]]
        for r in ranks[1:]:
            for i, (a, b) in enumerate(zip(first, per_rank[r])):
                # one dtype per call (checked where issued); a rooted op's lists (gather_'s outputs,
                # scatter_'s inputs) exist on its root alone, so the count of tensors may differ
                if (a.op, set(a.dtypes)) != (b.op, set(b.dtypes)) or (
                    a.op in SAME_SHAPES and a.shapes != b.shapes
                ):
                    found.append(
                        f"group {group} (ranks {a.ranks}), collective {i}: rank {ranks[0]} issued {a.op} "
                        f"{a.shapes} {a.dtypes}, rank {r} issued {b.op} {b.shapes} {b.dtypes}"
                    )
                    break
            if len(first) != len(per_rank[r]):
                found.append(
                    f"group {group}: rank {ranks[0]} issued {len(first)} collectives, rank {r} {len(per_rank[r])}"
                )
    # point-to-point: matched in order between each pair
    for (_, group, src, dst), ops in p2p.items():
        for i, (s, r) in enumerate(zip(ops["send"], ops["recv_"])):
            if (s.shapes, s.dtypes) != (r.shapes, r.dtypes):
                found.append(
                    f"point-to-point {src} -> {dst} on group {group}, message {i}: sent {s.shapes} {s.dtypes}, "
                    f"received as {r.shapes} {r.dtypes} (NCCL matches in order, not by tag)"
                )
                break
    return found


def check_folder(folder: str) -> int:
    """Raise ``CollectiveRuleError`` listing every broken rule; the number of calls checked."""
    calls, created = read_records(folder)
    found = problems(calls, created)
    if found:
        raise CollectiveRuleError(
            "; ".join(found[:5]) + (f" (and {len(found) - 5} more)" if len(found) > 5 else "")
        )
    return len(calls)


def check_run(run_dir: str) -> int:
    """The cross-rank comparison of a finished run's records (its ``logs/`` folder)."""
    return check_folder(os.path.join(run_dir, "logs"))


def in_model_worker() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec is not None and spec.name == "realrl.apps.remote"


def start(records_dir: str) -> CollectiveRecorder:
    """Switch the check on in this process for the rest of its life."""
    # torch skips a collective on a group the rank is not in, with this warning: NCCL would hang
    warnings.filterwarnings("error", message=r".*does not belong to the given group.*")
    recorder = CollectiveRecorder(os.path.join(records_dir, f"{RECORDS_GLOB}{os.getpid()}.jsonl"))
    recorder.__enter__()
    return recorder


if in_model_worker():
    # the worker's output is its log file in the run's logs/ folder: the records go beside it
    start(os.path.dirname(os.path.realpath(f"/proc/{os.getpid()}/fd/2")))
    print(MARKER, file=sys.stderr, flush=True)
