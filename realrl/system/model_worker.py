"""A model worker: holds model shards, the data shard and the tensors of live samples.

It answers the master's requests in order (``setup``, ``initialize``, ``fetch``, ``mfc``,
``clear``); replies carry metadata and stats only, tensors stay here or move directly to another
worker (``data_transfer``). This file is the worker and its setup and data requests; the model
function calls are ``model_worker_calls``, the recover points ``model_worker_checkpoints``.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from realrl.api.core import data_api, model_api
from realrl.api.core.config import ModelBackendAbstraction
from realrl.api.core.data_api import SequenceSample
from realrl.api.core.system_api import ModelWorkerConfig
from realrl.base import host_memory, logging, seeding
from realrl.base.failpoints import Failpoints
from realrl.base.name_resolve import NameRecordRepository
from realrl.impl.model.backend import integrity
from realrl.impl.model.parallel.mesh import build_contexts
from realrl.system import names, recover_state
from realrl.system.data_transfer import PendingSends, TensorStore
from realrl.system.model_copies import ModelCopies
from realrl.system.model_worker_calls import MFCRunner, float_stats
from realrl.system.model_worker_checkpoints import CheckpointHandlers
from realrl.system.model_worker_setup import (
    HeldModels,
    ShardLoader,
    import_plugins,
    init_process_group,
    load_eval_batches,
)
from realrl.system.protocol import (
    EvaluateRequest,
    FetchEvalRequest,
    FetchReply,
    FetchRequest,
    InitializeReply,
    InitializeRequest,
    SetupReply,
    SetupRequest,
)
from realrl.system.signed_messages import Codec
from realrl.system.worker_base import WorkerBase

logger = logging.getLogger("model_worker")


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
        self.held = HeldModels({m.name: m for m in config.mfcs})
        self.store = TensorStore()
        self.sends = PendingSends(config.timeouts.peer)  # posted sends not waited for
        self.loader: ShardLoader | None = None
        self.eval_batches: dict[str, list[SequenceSample]] = {}
        self.eval_prompts: SequenceSample | None = None  # the RL evaluation's, on the first data worker
        self.calls = MFCRunner(self.name, config, self.failpoints, self.held, self.store, self.sends)
        self.checkpoints = CheckpointHandlers(self.name, self.failpoints, self.held, self.store)
        self.handlers = {
            "setup": self.setup,
            "initialize": self.initialize,
            "fetch": self.fetch,
            "mfc": self.calls.run,
            "clear": self.clear,
            "save": self.checkpoints.save,
            "load_recover": self.checkpoints.load_recover,
            "evaluate": self.evaluate,
            "fetch_eval": self.fetch_eval,
            "samples": self.checkpoints.samples,
        }

    def before_exit(self) -> None:
        self.sends.wait_all()  # no receiver is left waiting for a send this worker posted

    def describe_state(self) -> str:
        return f"{len(self.store)} live samples"

    # -- setup ---------------------------------------------------------------------------------

    def setup(self, req: SetupRequest) -> SetupReply:
        cfg, held = self.config, self.held
        self.failpoints.hit("setup")
        import_plugins(cfg.import_modules)
        seeding.set_random_seed(cfg.seed, cfg.worker_index)
        torch.set_num_threads(cfg.torch_threads or max(1, (os.cpu_count() or 1) // cfg.n_model_workers))
        if cfg.retain_freed_memory and not host_memory.retain_freed_memory():
            logger.info("%s: retain_freed_memory needs glibc; the allocator keeps its defaults", self.name)
        device = torch.device(cfg.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL and the engines use this worker's own GPU
        init_process_group(cfg, self.name_record, self.timeouts)
        timeout = datetime.timedelta(seconds=self.timeouts.peer)
        held.parallel = build_contexts(req.placements, cfg.worker_index, device.type, timeout)
        # like meshes, groups are created by every worker in one order, kept by their members
        groups = {ws: dist.new_group(list(ws), timeout=timeout) for ws in req.realloc_groups}
        mine = {ws: g for ws, g in groups.items() if cfg.worker_index in ws}
        held.copies = ModelCopies(
            cfg.worker_index, cfg.device, cfg.shards + cfg.copies, held.parallel, mine, timeout
        )
        if cfg.tokenizer_path:
            held.tokenizer = data_api.load_hf_tokenizer(cfg.tokenizer_path)
        self.eval_batches.update(load_eval_batches(cfg, held.parallel, held.tokenizer))
        if cfg.dataset_dp_rank is None:
            return SetupReply(None)
        datasets = [
            data_api.make_dataset(d, cfg.seed, cfg.dataset_dp_rank, cfg.dataset_dp_size, held.tokenizer)
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

    def initialize(self, req: InitializeRequest) -> InitializeReply:
        cfg, held = self.config, self.held
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
            parallel = held.parallel[shard.role]
            model = model_api.make_model(
                shard.spec.model, shard.model_name, "cpu", parallel if parallel.mesh else None
            )
            model.device = cfg.device
            if model.tokenizer is None:
                model.tokenizer = held.tokenizer
            backend_args = {**shard.spec.backend.args, "parallel": parallel if parallel.mesh else None}
            backend = model_api.make_backend(ModelBackendAbstraction(shard.spec.backend.type_, backend_args))
            held.models[shard.role] = backend.initialize(model, req.ft_spec)
        for mfc_name, impl in cfg.interfaces.items():
            held.interfaces[mfc_name] = model_api.make_interface(impl)
        logger.info(
            "%s built models %s and interfaces %s", self.name, sorted(held.models), sorted(held.interfaces)
        )
        return InitializeReply(sorted(n for n, i in held.interfaces.items() if recover_state.stateful(i)))

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
            dataset = data_api.make_dataset(cfg.eval_prompts, cfg.seed, 0, 1, self.held.tokenizer)
            self.eval_prompts = SequenceSample.gather(
                [dataset[i] for i in range(min(len(dataset), cfg.eval_batch_size))]
            )
            self.eval_prompts.ids = [f"eval/{i}" for i in self.eval_prompts.ids]
        self.store.put(self.eval_prompts)
        return FetchReply(self.eval_prompts.meta(), req.step)

    def clear(self, ids: list) -> int:
        self.sends.reap()
        return self.store.drop(ids)

    def evaluate(self, req: EvaluateRequest) -> dict[str, float]:
        batches = self.eval_batches.get(req.role, [])
        stats = self.held.interfaces[req.interface].evaluate(self.held.models[req.role], batches)
        return float_stats(stats, req.interface)


def run_model_worker(config: ModelWorkerConfig, secret: bytes, exit_on_master_lost: bool = True) -> None:
    """Run one model worker in this process until the master ends the run."""
    record = names.make_name_record(config.name_resolve)
    ModelWorker(config, Codec(secret), record, exit_on_master_lost=exit_on_master_lost).run()
