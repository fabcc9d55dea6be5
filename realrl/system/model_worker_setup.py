"""What a model worker builds before its first call: plugins, the run's process groups, its
dataset shard (``ShardLoader``), the evaluation batches, and ``HeldModels``, the one record of the
models it holds that its request handlers share."""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import os
from typing import Any

import torch
import torch.distributed as dist

from realrl.api.core import data_api, model_api
from realrl.api.core.data_api import SequenceSample
from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.experiment_parts import Timeouts
from realrl.api.core.system_api import ModelWorkerConfig
from realrl.base import network, plugins, seeding
from realrl.base.name_resolve import NameRecordRepository
from realrl.impl.model.backend import dp
from realrl.impl.model.parallel.mesh import ParallelContext
from realrl.system import names
from realrl.system.model_copies import ModelCopies


def import_plugins(modules: list[str]) -> tuple[str, ...]:
    """Register realrl's implementations (``realrl.impl.builtin``), then the plugins
    (``plugins.import_plugins``); the names of the plugin modules (whose classes a config may hold)."""
    importlib.import_module("realrl.impl.builtin")
    return plugins.import_plugins(modules)


@dataclasses.dataclass
class HeldModels:
    """The models a worker holds and how its calls reach them: the MFCs of its config, the meshes,
    copies and tokenizer built at ``setup``, the models and interfaces built at ``initialize``."""

    mfcs: dict[str, MFCDef]
    models: dict[str, model_api.Model] = dataclasses.field(default_factory=dict)
    interfaces: dict[str, model_api.ModelInterface] = dataclasses.field(default_factory=dict)
    parallel: dict[str, ParallelContext] = dataclasses.field(default_factory=dict)
    copies: ModelCopies | None = None  # built at setup, with the meshes
    tokenizer: Any = None

    def role_interfaces(self, role: str) -> dict[str, model_api.ModelInterface]:
        """The interfaces of the MFCs that call model ``role``."""
        return {n: i for n, i in self.interfaces.items() if self.mfcs[n].role == role}


class ShardLoader:
    """This worker's dataset shard; epoch ``e`` visits it in an order drawn from (seed, e, dp rank),
    so any position of any epoch can be served again after a restart."""

    def __init__(self, dataset, seed: int, dp_rank: int):
        if len(dataset) == 0:
            raise ValueError(f"dataset shard {dp_rank} is empty")
        self.dataset, self.seed, self.dp_rank = dataset, seed, dp_rank
        self.epoch, self.order = -1, []

    def batch(self, epoch: int, pos: int, n: int) -> SequenceSample:
        if epoch != self.epoch:
            g = torch.Generator().manual_seed(seeding.process_seed(self.seed + epoch, self.dp_rank))
            self.epoch, self.order = epoch, torch.randperm(len(self.dataset), generator=g).tolist()
        if pos + n > len(self.dataset):
            raise ValueError(
                f"dataset shard {self.dp_rank} has {len(self.dataset)} samples; asked for {pos}..{pos + n} in epoch {epoch}"
            )
        items = []
        for i in self.order[pos : pos + n]:
            item = self.dataset[i]
            item.ids = [f"{sid}@e{epoch}" for sid in item.ids]  # unique across epochs
            items.append(item)
        return SequenceSample.gather(items)


def init_process_group(cfg: ModelWorkerConfig, name_record: NameRecordRepository, timeouts: Timeouts) -> None:
    """The run's process groups meet at a TCPStore served by worker 0 on a socket bound here,
    to ``bind_host`` (the loopback in local mode), before its address is published: no other
    process can take the port in between, and nothing listens beyond ``bind_host``."""
    key = names.dist_store(cfg.experiment_name, cfg.trial_name)
    timeout = datetime.timedelta(seconds=timeouts.peer)
    host = cfg.bind_host or _node_ip()
    interface = network.interface_of(host)  # "lo" in local mode
    if interface is not None:  # the one the peers reach; a user's own choice stands
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        if host != network.LOOPBACK:  # one node: NCCL's own choice (shared memory, NVLink) stands
            os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    if cfg.worker_index == 0:
        sock = network.bound_socket(host)
        port = sock.getsockname()[1]
        store = dist.TCPStore(
            host,
            port,
            cfg.n_model_workers,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,  # they connect once the address below is published
            master_listen_fd=sock.detach(),  # the store owns (and closes) the socket now
        )
        name_record.add(key, f"{host}:{port}", replace=True)
    else:
        host, port = name_record.wait(key, timeout=timeouts.setup).rsplit(":", 1)
        store = dist.TCPStore(host, int(port), cfg.n_model_workers, is_master=False, timeout=timeout)
    dist.init_process_group(
        cfg.dist_backend,
        store=store,
        rank=cfg.worker_index,
        world_size=cfg.n_model_workers,
        timeout=timeout,
        device_id=nccl_device(cfg.device, cfg.dist_backend),
    )


def nccl_device(device: str, backend: str) -> torch.device | None:
    """The GPU to bind NCCL to at start-up, when the default group has NCCL: its communicator is
    then made eagerly, by every worker at once, instead of lazily at the first CUDA collective
    or message of some subset of the workers. None: no NCCL (CPU, or GPUs shared over gloo)."""
    dev = torch.device(device)
    if dev.type != "cuda" or "nccl" not in backend:
        return None
    return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def load_eval_batches(
    cfg: ModelWorkerConfig, parallel: dict[str, ParallelContext], tokenizer
) -> dict[str, list[SequenceSample]]:
    """Each dp rank of a trained model keeps its shard of the evaluation sets, in batches.

    Every dp rank holds the same number of batches (the most any rank needs, agreed over the
    dp group; shards differ by one sample at most): a sharded (FSDP) model gathers weights
    collectively in each forward, so its ranks must run evaluation in lockstep."""
    eval_batches = {}
    trained = {m.role for m in cfg.mfcs if m.interface_type is ModelInterfaceType.TRAIN_STEP}
    for shard in sorted(cfg.shards, key=lambda s: s.role):
        if shard.role not in trained or not cfg.eval_datasets:
            continue
        samples = []
        for d in cfg.eval_datasets:
            dataset = data_api.make_dataset(d, cfg.seed, shard.dp_rank, shard.dp_size, tokenizer)
            samples += [dataset[i] for i in range(len(dataset))]
        n_batches = -(-len(samples) // cfg.eval_batch_size)
        n_batches = dp.all_reduce_max(n_batches, parallel[shard.role].dp_group)
        if len(samples) < n_batches:
            raise ValueError(
                f"model {shard.role!r}: dp rank {shard.dp_rank} holds {len(samples)} evaluation samples, "
                f"fewer than the {n_batches} batches every dp rank runs; raise eval_batch_size"
            )
        bounds = [i * len(samples) // n_batches for i in range(n_batches + 1)]
        eval_batches[shard.role] = [SequenceSample.gather(samples[a:b]) for a, b in zip(bounds, bounds[1:])]
    return eval_batches
