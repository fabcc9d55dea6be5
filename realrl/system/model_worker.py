"""A model worker: holds model shards, the data shard and the tensors of live samples.

It answers the master's requests in order (``setup``, ``initialize``, ``fetch``, ``mfc``,
``clear``); replies carry metadata and stats only, tensors stay here or move directly to another
worker (``data_transfer``).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import os
import time
import zlib

import torch
import torch.distributed as dist

from realrl.api.core import data_api, model_api
from realrl.api.core.config import ModelBackendAbstraction
from realrl.api.core.data_api import SequenceSample
from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.model_api import DROPPED_KEY, SAMPLES_KEY
from realrl.api.core.system_api import ModelWorkerConfig
from realrl.base import host_memory, logging, network, plugins, seeding
from realrl.base.failpoints import Failpoints
from realrl.base.name_resolve import NameRecordRepository
from realrl.impl.model.backend import dp, integrity
from realrl.impl.model.nn.lora import adapters_disabled
from realrl.impl.model.parallel.mesh import ParallelContext, build_contexts
from realrl.system import names, recover_state
from realrl.system.data_transfer import PendingSends, TensorStore, push_outputs, run_transfers
from realrl.system.model_copies import ModelCopies
from realrl.system.protocol import (
    EvaluateRequest,
    FetchEvalRequest,
    FetchReply,
    FetchRequest,
    InitializeReply,
    InitializeRequest,
    LoadRecoverRequest,
    MFCCall,
    MFCReply,
    MFCRequest,
    ReallocOrder,
    SamplesRequest,
    SaveRequest,
    SetupReply,
    SetupRequest,
)
from realrl.system.request_reply_stream import Codec
from realrl.system.worker_base import WorkerBase

logger = logging.getLogger("model_worker")


def import_plugins(modules: list[str]) -> tuple[str, ...]:
    """Register realrl's implementations (``realrl.impl.builtin``), then the plugins
    (``plugins.import_plugins``); the names of the plugin modules (whose classes a config may hold)."""
    importlib.import_module("realrl.impl.builtin")
    return plugins.import_plugins(modules)


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


class ModelWorker(WorkerBase):
    def __init__(self, config: ModelWorkerConfig, codec: Codec, name_record: NameRecordRepository, **kwargs):
        super().__init__(
            config.worker_name,
            codec,
            name_record,
            config.experiment_name,
            config.trial_name,
            config.timeouts,
            **kwargs,
        )
        self.config = config
        self.failpoints = Failpoints(config.failpoints, config.worker_index)
        self.mfcs: dict[str, MFCDef] = {m.name: m for m in config.mfcs}
        self.store = TensorStore()
        self.sends = PendingSends(config.timeouts.peer)  # posted sends not waited for
        self.models: dict[str, model_api.Model] = {}
        self.interfaces: dict[str, model_api.ModelInterface] = {}
        self.parallel: dict[str, ParallelContext] = {}
        self.copies: ModelCopies | None = None  # built at setup, with the meshes
        self.loader: ShardLoader | None = None
        self.eval_batches: dict[str, list[SequenceSample]] = {}
        self.eval_prompts: SequenceSample | None = None  # the RL evaluation's, on the first data worker
        self.tokenizer = None
        # generate calls decoded in pieces (partial rollouts), paused between pieces: (mfc, step) ->
        self.rollouts: dict[tuple[str, int], tuple[model_api.Rollout, list]] = {}
        self.handlers = {
            "setup": self.setup,
            "initialize": self.initialize,
            "fetch": self.fetch,
            "mfc": self.run_mfc,
            "clear": self.clear,
            "save": self.save,
            "load_recover": self.load_recover,
            "evaluate": self.evaluate,
            "fetch_eval": self.fetch_eval,
            "samples": self.samples,
        }

    def before_exit(self) -> None:
        self.sends.wait_all()  # no receiver is left waiting for a send this worker posted

    def describe_state(self) -> str:
        return f"{len(self.store)} live samples"

    # -- setup ---------------------------------------------------------------------------------

    def _init_process_group(self) -> None:
        """The run's process groups meet at a TCPStore served by worker 0 on a socket bound here,
        to ``bind_host`` (the loopback in local mode), before its address is published: no other
        process can take the port in between, and nothing listens beyond ``bind_host``."""
        cfg = self.config
        key = names.dist_store(cfg.experiment_name, cfg.trial_name)
        timeout = datetime.timedelta(seconds=self.timeouts.peer)
        if cfg.bind_host == network.LOOPBACK:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if cfg.worker_index == 0:
            host = cfg.bind_host or _node_ip()
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
            self.name_record.add(key, f"{host}:{port}", replace=True)
        else:
            host, port = self.name_record.wait(key, timeout=self.timeouts.setup).rsplit(":", 1)
            store = dist.TCPStore(host, int(port), cfg.n_model_workers, is_master=False, timeout=timeout)
        dist.init_process_group(
            cfg.dist_backend,
            store=store,
            rank=cfg.worker_index,
            world_size=cfg.n_model_workers,
            timeout=timeout,
            device_id=nccl_device(cfg.device, cfg.dist_backend),
        )

    def setup(self, req: SetupRequest) -> SetupReply:
        cfg = self.config
        self.failpoints.hit("setup")
        import_plugins(cfg.import_modules)
        seeding.set_random_seed(cfg.seed, cfg.worker_index)
        torch.set_num_threads(cfg.torch_threads or max(1, (os.cpu_count() or 1) // cfg.n_model_workers))
        if cfg.retain_freed_memory and not host_memory.retain_freed_memory():
            logger.info("%s: retain_freed_memory needs glibc; the allocator keeps its defaults", self.name)
        device = torch.device(cfg.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL and the engines use this worker's own GPU
        self._init_process_group()
        timeout = datetime.timedelta(seconds=self.timeouts.peer)
        self.parallel = build_contexts(req.placements, cfg.worker_index, device.type, timeout)
        # like meshes, groups are created by every worker in one order, kept by their members
        groups = {ws: dist.new_group(list(ws), timeout=timeout) for ws in req.realloc_groups}
        mine = {ws: g for ws, g in groups.items() if cfg.worker_index in ws}
        self.copies = ModelCopies(
            cfg.worker_index, cfg.device, cfg.shards + cfg.copies, self.parallel, mine, timeout
        )
        if cfg.tokenizer_path:
            self.tokenizer = data_api.load_hf_tokenizer(cfg.tokenizer_path)
        self._load_eval_data()
        if cfg.dataset_dp_rank is None:
            return SetupReply(None)
        datasets = [
            data_api.make_dataset(d, cfg.seed, cfg.dataset_dp_rank, cfg.dataset_dp_size, self.tokenizer)
            for d in cfg.datasets
        ]
        dataset = datasets[0] if len(datasets) == 1 else torch.utils.data.ConcatDataset(datasets)
        self.loader = ShardLoader(dataset, cfg.seed, cfg.dataset_dp_rank)
        logger.info(
            "%s loaded dataset shard %d/%d: %d samples",
            self.name,
            cfg.dataset_dp_rank,
            cfg.dataset_dp_size,
            len(dataset),
        )
        return SetupReply(len(dataset))

    def _load_eval_data(self) -> None:
        """Each dp rank of a trained model keeps its shard of the evaluation sets, in batches.

        Every dp rank holds the same number of batches (the most any rank needs, agreed over the
        dp group; shards differ by one sample at most): a sharded (FSDP) model gathers weights
        collectively in each forward, so its ranks must run evaluation in lockstep."""
        cfg = self.config
        trained = {m.role for m in cfg.mfcs if m.interface_type is ModelInterfaceType.TRAIN_STEP}
        for shard in sorted(cfg.shards, key=lambda s: s.role):
            if shard.role not in trained or not cfg.eval_datasets:
                continue
            samples = []
            for d in cfg.eval_datasets:
                dataset = data_api.make_dataset(d, cfg.seed, shard.dp_rank, shard.dp_size, self.tokenizer)
                samples += [dataset[i] for i in range(len(dataset))]
            n_batches = -(-len(samples) // cfg.eval_batch_size)
            n_batches = dp.all_reduce_max(n_batches, self.parallel[shard.role].dp_group)
            if len(samples) < n_batches:
                raise ValueError(
                    f"model {shard.role!r}: dp rank {shard.dp_rank} holds {len(samples)} evaluation samples, "
                    f"fewer than the {n_batches} batches every dp rank runs; raise eval_batch_size"
                )
            bounds = [i * len(samples) // n_batches for i in range(n_batches + 1)]
            self.eval_batches[shard.role] = [
                SequenceSample.gather(samples[a:b]) for a, b in zip(bounds, bounds[1:])
            ]

    def initialize(self, req: InitializeRequest) -> InitializeReply:
        cfg = self.config
        self.failpoints.hit("initialize")
        for shard in sorted(cfg.shards, key=lambda s: s.role):
            path = shard.spec.model.args.get("path")
            if shard.spec.model.type_ == "real_model" and path:  # a damaged HF folder: a named error
                integrity.verify_hf_checkpoint(path, f"model {shard.role!r}")
            # every rank starts from the same whole weights; a parallel backend keeps its part.
            # Every model is built (and a random one initialised) in host memory, whatever its
            # layout: the CPU's random stream, not a GPU's, so one worker and a mesh of them
            # start from the same weights. A checkpoint under tensor parallelism is loaded split
            # (the factory takes ``parallel``); splitting moves a model to the device a parameter
            # (DTensor) or a block (FSDP2) at a time, so a device never holds the whole model;
            # the engine then moves what stayed whole.
            seeding.set_random_seed(cfg.seed)
            parallel = self.parallel[shard.role]
            model = model_api.make_model(
                shard.spec.model, shard.model_name, "cpu", parallel if parallel.mesh else None
            )
            model.device = cfg.device
            if model.tokenizer is None:
                model.tokenizer = self.tokenizer
            backend_args = {**shard.spec.backend.args, "parallel": parallel if parallel.mesh else None}
            backend = model_api.make_backend(ModelBackendAbstraction(shard.spec.backend.type_, backend_args))
            self.models[shard.role] = backend.initialize(model, req.ft_spec)
        for mfc_name, impl in cfg.interfaces.items():
            self.interfaces[mfc_name] = model_api.make_interface(impl)
        logger.info(
            "%s built models %s and interfaces %s", self.name, sorted(self.models), sorted(self.interfaces)
        )
        return InitializeReply(sorted(n for n, i in self.interfaces.items() if recover_state.stateful(i)))

    # -- data ------------------------------------------------------------------------------------

    def fetch(self, req: FetchRequest) -> FetchReply:
        if self.loader is None:
            raise RuntimeError(f"{self.name} holds no dataset shard but was asked to fetch")
        self.failpoints.hit("fetch", req.step)
        sample = self.loader.batch(req.epoch, req.pos, req.n)
        self.store.put(sample)
        return FetchReply(sample.meta(), req.epoch)

    def fetch_eval(self, req: FetchEvalRequest) -> FetchReply:
        """The RL evaluation's prompts, stored under ``eval/<id>`` (apart from the training data)."""
        cfg = self.config
        if cfg.eval_prompts is None:
            raise RuntimeError(f"{self.name} holds no evaluation prompts but was asked for them")
        if self.eval_prompts is None:  # loaded once, at the first evaluation
            dataset = data_api.make_dataset(cfg.eval_prompts, cfg.seed, 0, 1, self.tokenizer)
            self.eval_prompts = SequenceSample.gather(
                [dataset[i] for i in range(min(len(dataset), cfg.eval_batch_size))]
            )
            self.eval_prompts.ids = [f"eval/{i}" for i in self.eval_prompts.ids]
        self.store.put(self.eval_prompts)
        return FetchReply(self.eval_prompts.meta(), req.step)

    def clear(self, ids: list) -> int:
        self.sends.reap()
        return self.store.drop(ids)

    # -- checkpoints ------------------------------------------------------------------------------

    def _role_interfaces(self, role: str) -> dict[str, model_api.ModelInterface]:
        return {n: i for n, i in self.interfaces.items() if self.mfcs[n].role == role}

    def save(self, req: SaveRequest) -> None:
        self.failpoints.hit("save")
        if req.kind == "state":  # a frozen role's call may run away from the model's home
            recover_state.save_interface_state(self.interfaces[req.interface], req.path, req.role, req.step)
            logger.info("%s saved the state of %s to %s", self.name, req.interface, req.path)
            return
        model = self.models[req.role]
        if req.kind == "hf":
            engine_parallel = getattr(model.module, "parallel", None)
            collective = engine_parallel is not None and engine_parallel.sharded
            if not collective and self.parallel[req.role].model_rank != 0:
                return  # a whole replica: its first rank writes it
            self.interfaces[req.interface].save(model, req.path)
        elif req.kind == "recover":
            recover_state.save_recover(model, req.role, self._role_interfaces(req.role), req.path, req.step)
        else:
            raise ValueError(f"unknown checkpoint kind {req.kind!r}")
        logger.info("%s saved %s (%s) to %s", self.name, req.role, req.kind, req.path)

    def samples(self, req: SamplesRequest) -> SequenceSample | None:
        """Save samples of the store to a recover point, or load them back (``SamplesRequest``)."""
        if req.meta is not None:
            recover_state.save_samples(self.store.assemble(req.meta), req.path, req.step)
            return None
        sample = recover_state.load_samples(req.path, req.step)
        self.store.put(sample)
        return sample.meta()

    def evaluate(self, req: EvaluateRequest) -> dict[str, float]:
        batches = self.eval_batches.get(req.role, [])
        stats = self.interfaces[req.interface].evaluate(self.models[req.role], batches)
        return _float_stats(stats, req.interface)

    def load_recover(self, req: LoadRecoverRequest) -> None:
        for role, path in sorted(req.paths.items()):
            if role in self.models:
                interfaces = self._role_interfaces(role)
                recover_state.load_recover(self.models[role], role, interfaces, path, req.step)
                logger.info("%s restored %s from %s", self.name, role, path)
        for mfc, path in sorted(req.states.items()):
            role = self.mfcs[mfc].role
            recover_state.load_interface_state(self.interfaces[mfc], path, role, req.step)
            logger.info("%s restored the state of %s from %s", self.name, mfc, path)

    # -- model function calls --------------------------------------------------------------------

    def run_mfc(self, req: MFCRequest) -> MFCReply:
        tik = time.monotonic()
        reply = self._run_mfc(req)
        reply.seconds = time.monotonic() - tik
        return reply

    def _run_mfc(self, req: MFCRequest) -> MFCReply:
        moves = [self._receive_weights(order) for order in req.weight_receives]
        if req.realloc is not None:
            moves.append(self._reallocate(req))
        realloc = _sum_moves(moves)
        if req.pieces:
            self.failpoints.hit("transfer", None if req.call is None else req.call.step)
        self.sends.reap()
        run_transfers(self.store, req.pieces, self.config.worker_index, self.timeouts.peer, self.sends)
        call = req.call
        if call is None:
            return MFCReply(realloc=realloc)
        try:
            reply = self._call(call)
        finally:
            if call.drop_copy:
                self.copies.drop(call.copy)
        reply.realloc = realloc
        return reply

    def _receive_weights(self, order: ReallocOrder) -> dict[str, float]:
        logger.info("%s receiving pushed weights of %s (version %d)", self.name, order.role, order.version)
        self.failpoints.hit("realloc")
        return self.copies.receive_weights(order, self.tokenizer)

    def _reallocate(self, req: MFCRequest) -> dict[str, float]:
        order = req.realloc
        home = self.models.get(order.role) if self.config.worker_index in order.src.workers else None
        tokenizer = home.tokenizer if home is not None else self.tokenizer
        logger.info("%s reallocating %s: %s -> %s", self.name, order.role, order.src, order.dst)
        self.failpoints.hit("realloc")
        return self.copies.reallocate(order, home, tokenizer)

    def _call(self, call: MFCCall) -> MFCReply:
        mfc = self.mfcs[call.mfc]
        model = self.models[mfc.role] if call.copy is None else self.copies[call.copy]
        # the store holds host tensors; the call sees its inputs on its model's device
        later_piece = call.segment is not None and call.segment.index > 0  # the rollout holds the inputs
        data = None if later_piece else self.store.assemble(call.input_meta).to(model.device)
        if mfc.input_key_remap and data is not None:
            data.remap_keys_(mfc.input_key_remap)
        interface = self.interfaces[mfc.name]
        # Every call draws from its own stream, so results do not depend on how calls of
        # different models interleave on this worker (same seed, same numbers, any launcher).
        # A generate call's stream is the same on every dp rank: each sequence samples with
        # noise keyed by its sample id, so the tokens do not depend on how the batch is split.
        self.failpoints.hit(_FAILPOINT.get(mfc.interface_type, ""), call.step)
        generates = mfc.interface_type is ModelInterfaceType.GENERATE
        seeding.set_random_seed(
            (self.config.seed * 1_000_003 + zlib.crc32(mfc.name.encode()) + call.step) % 2**31,
            0 if generates else call.dp_rank,
        )
        if mfc.interface_type is ModelInterfaceType.TRAIN_STEP:
            # the interface advances model.version (PPO may step the optimizer several times)
            stats = interface.train_step(model, data, mfc.mb_spec)
            for order in call.push_weights:  # the new weights leave for the generation copies now
                for work, buf, peer in self.copies.send_weights(order, model):
                    self.sends.add(work, buf, f"{mfc.role} version {order.version}", peer)
            return MFCReply(stats=_float_stats(stats, mfc.name))
        if mfc.interface_type is ModelInterfaceType.GENERATE and call.segment is not None:
            return self._generate_piece(mfc, call, model, data)
        if mfc.interface_type is ModelInterfaceType.GENERATE:
            out = interface.generate(model, data, mfc.mb_spec)
        elif mfc.interface_type is ModelInterfaceType.INFERENCE:
            with adapters_disabled(model.module.module) if mfc.base_weights else contextlib.nullcontext():
                out = interface.inference(model, data, mfc.mb_spec)
        else:
            raise ValueError(
                f"MFC {mfc.name!r}: the runtime does not schedule {mfc.interface_type.value} calls"
            )
        return self._reply(mfc, data, out, call.pushes)

    def _generate_piece(
        self, mfc: MFCDef, call: MFCCall, model: model_api.Model, data: SequenceSample | None
    ) -> MFCReply:
        """One piece of a generate call decoded in pieces (partial rollouts): piece 0 starts the
        rollout, every piece advances it with the weights the model holds now (their version the
        model's), and the piece that finishes this dp rank's answers replies with the outputs;
        a rank done earlier answers the later pieces with nothing."""
        key = (mfc.name, call.step)
        if call.segment.index == 0:
            rollout = self.interfaces[mfc.name].start_rollout(model, data, mfc.mb_spec)
            self.rollouts[key] = (rollout, call.pushes)  # the pushes go once the answers are done
        if key not in self.rollouts:
            return MFCReply()
        rollout, pushes = self.rollouts[key]
        left = rollout.advance(call.segment.tokens, model.version.global_step)
        if left:
            return MFCReply(unfinished=left)
        del self.rollouts[key]
        return self._reply(mfc, rollout.data, rollout.finish(), pushes)

    def _reply(self, mfc: MFCDef, data: SequenceSample, out, pushes: list) -> MFCReply:
        """A generate or inference call's reply: its outputs kept in the store (and pushed to the
        workers that read them), its statistics."""
        stats, samples, dropped = None, None, None
        if isinstance(out, tuple):  # (outputs, statistics of the call): both are reported
            out, stats = out
            stats = dict(stats)
            samples = stats.pop(SAMPLES_KEY, None)
            dropped = stats.pop(DROPPED_KEY, None)
            stats = _float_stats(stats, mfc.name)
        meta = self._keep_outputs(mfc, data, out)
        push_outputs(self.store, pushes, self.sends)
        return MFCReply(meta=meta, stats=stats, samples=samples, dropped=dropped)

    def _keep_outputs(
        self, mfc: MFCDef, data: SequenceSample, out: SequenceSample | None
    ) -> SequenceSample | None:
        if not mfc.output_keys:
            return None
        if not isinstance(out, SequenceSample):
            raise TypeError(
                f"MFC {mfc.name!r}: the interface returned {type(out).__name__}, not a SequenceSample"
            )
        if mfc.output_key_remap:
            out.remap_keys_({k: v for k, v in mfc.output_key_remap.items() if k in out.keys})
        missing = set(mfc.output_keys) - out.keys
        if missing:
            raise ValueError(
                f"MFC {mfc.name!r}: the interface did not produce keys {sorted(missing)} (it produced {sorted(out.keys)})"
            )
        if out.ids != data.ids:
            raise ValueError(
                f"MFC {mfc.name!r}: the output ids {out.ids[:4]}... differ from the input ids {data.ids[:4]}..."
            )
        out = out.select(mfc.output_keys)
        self.store.put(out)
        return out.meta()


_FAILPOINT = {
    ModelInterfaceType.GENERATE: "generate",
    ModelInterfaceType.INFERENCE: "inference",
    ModelInterfaceType.TRAIN_STEP: "train",
}


def nccl_device(device: str, backend: str) -> torch.device | None:
    """The GPU to bind NCCL to at start-up, when the default group has NCCL: its communicator is
    then made eagerly, by every worker at once, instead of lazily at the first CUDA collective
    or message of some subset of the workers. None: no NCCL (CPU, or GPUs shared over gloo)."""
    dev = torch.device(device)
    if dev.type != "cuda" or "nccl" not in backend:
        return None
    return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())


def _sum_moves(moves: list[dict[str, float]]) -> dict[str, float] | None:
    """One report of a call's weight moves (pushed versions received, a reallocation)."""
    if not moves:
        return None
    return {k: sum(m.get(k, 0.0) for m in moves) for k in moves[0]}


def _float_stats(stats, mfc_name: str) -> dict[str, float]:
    if stats is None:
        return {}
    if not isinstance(stats, dict):
        raise TypeError(
            f"MFC {mfc_name!r}: the interface returned stats of type {type(stats).__name__}, expected a dict"
        )
    out = {}
    for k, v in stats.items():
        if isinstance(v, torch.Tensor):
            v = v.item()
        out[str(k)] = float(v)
    return out


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def run_model_worker(config: ModelWorkerConfig, secret: bytes, exit_on_master_lost: bool = True) -> None:
    """Run one model worker in this process until the master ends the run."""
    record = names.make_name_record(config.name_resolve)
    ModelWorker(config, Codec(secret), record, exit_on_master_lost=exit_on_master_lost).run()
