"""What a run is made of, and what the launcher hands to each worker (docs/runtime.md).

``ExperimentConfig`` is the whole run: the MFC graph, how to build each model role, which model
workers hold each role (one worker per data-parallel rank), the datasets, how long to train and
where to write. ``ExperimentConfig.model_worker_configs()`` cuts it into one picklable
``ModelWorkerConfig`` per worker; the master keeps the ``ExperimentConfig`` itself. Its parts
that stand alone are in ``experiment_parts``, how they must fit together in ``experiment_checks``.
"""

from __future__ import annotations

import dataclasses
import os

import networkx as nx

from realrl.api.core import experiment_checks as checks
from realrl.api.core.config import DatasetAbstraction, ModelInterfaceAbstraction, ModelName
from realrl.api.core.devices import GLOO
from realrl.api.core.dfg import MFCDef, ModelInterfaceType, build_graph
from realrl.api.core.experiment_parts import AsyncRL, DynamicSampling, ModelSpec, Timeouts
from realrl.api.core.layout import Layout, Placement
from realrl.base.failpoints import Failpoint


@dataclasses.dataclass
class ModelShardSpec:
    """One rank of a model role's layout, living on one worker."""

    role: str
    placement: Placement  # the whole layout and the worker of every rank
    spec: ModelSpec
    worker: int

    @property
    def model_name(self) -> ModelName:
        return ModelName(self.role)

    @property
    def layout(self) -> Layout:
        return self.placement.layout

    @property
    def dp_rank(self) -> int:
        return self.placement.coords_of(self.worker)[1]

    @property
    def dp_size(self) -> int:
        return self.layout.dp


@dataclasses.dataclass
class NameResolveConfig:
    """Which name_resolve backend the workers of a run use: ``nfs`` (needs ``root``) or ``ray``."""

    kind: str = "nfs"
    root: str | None = None
    namespace: str = "realrl"


@dataclasses.dataclass
class ModelWorkerConfig:
    """Everything model worker ``worker_index`` needs; picklable, built by ``ExperimentConfig``."""

    worker_index: int
    n_model_workers: int
    experiment_name: str
    trial_name: str
    run_dir: str
    seed: int
    shards: list[ModelShardSpec]  # the home ranks this worker holds (weights, optimizer)
    copies: list[ModelShardSpec]  # ranks of calls in another layout than their model's home
    mfcs: list[MFCDef]  # the calls this worker may run (for remaps, types, micro-batch specs)
    interfaces: dict[str, ModelInterfaceAbstraction]  # mfc name -> interface, for mfcs on this worker
    datasets: list[DatasetAbstraction]
    dataset_dp_rank: int | None  # None: this worker loads no data
    dataset_dp_size: int
    tokenizer_path: str | None
    import_modules: list[str]
    timeouts: Timeouts
    name_resolve: NameResolveConfig
    eval_datasets: list[DatasetAbstraction]
    eval_batch_size: int
    eval_prompts: DatasetAbstraction | None  # the RL evaluation's prompts (the first data worker only)
    bind_host: str | None  # None: the node's address (ray mode on a cluster)
    device: str = "cpu"  # this worker's own device ("cuda:<local rank>", or what Ray assigned)
    dist_backend: str = "gloo"  # "cpu:gloo,cuda:nccl" when every worker owns its GPU (api/core/devices.py)
    torch_threads: int | None = None  # None: this machine's cores shared evenly by the workers on it
    retain_freed_memory: bool = True  # base/host_memory.py: no page-fault churn on activations
    failpoints: list[str] = dataclasses.field(default_factory=list)  # base/failpoints.py (fault tests)

    @property
    def worker_name(self) -> str:
        return model_worker_name(self.worker_index)


def model_worker_name(index: int) -> str:
    return f"model_worker/{index}"


def copy_name(role: str, placement: Placement) -> str:
    """The name of ``role``'s copy in ``placement`` (its mesh and its weights on a worker)."""
    return f"{role} {placement}"


@dataclasses.dataclass
class ExperimentConfig:
    """A run: the graph, the models and where they live, the data, the schedule, the run folder.

    ``allocations[role]`` lists the worker of each rank of ``role``'s home layout (``layouts[role]``,
    default: data parallelism over the listed workers): ``[0, 1]`` with ``d2m1p1`` is a model
    with dp size 2 on workers 0 and 1, with ``d1m2p1`` one replica split over both. Several roles
    may share a worker. The home holds the weights (and the optimizer state of a trained model);
    ``mfc_placements[name]`` runs one call elsewhere, on a copy of the weights moved there before
    the call (parameter reallocation).
    ``import_modules`` are imported by every worker before building anything (module names or
    ``.py`` paths), so plugins registered there (interfaces, datasets, models) are found.
    """

    experiment_name: str
    trial_name: str
    mfcs: list[MFCDef]
    models: dict[str, ModelSpec]
    allocations: dict[str, list[int]]
    datasets: list[DatasetAbstraction]
    layouts: dict[str, Layout] = dataclasses.field(default_factory=dict)  # default: d<len(workers)>
    mfc_placements: dict[str, Placement] = dataclasses.field(default_factory=dict)  # default: home
    n_model_workers: int | None = None  # default: 1 + the largest allocated worker index
    tokenizer_path: str | None = None
    fileroot: str = "outputs"  # relative to the working folder, like the command line's; never a shared /tmp
    seed: int = 1
    total_train_epochs: int = 1
    total_train_steps: int | None = None  # stop after this many steps even mid-epoch
    data_owner: str | None = None  # role whose workers load the data; default: first consumer's
    save_freq_steps: int | None = None  # HF checkpoints of trained models every N steps (always at the end)
    ckpt_freq_steps: int | None = None  # recover points (weights + optimizer + counters) every N steps
    resume: bool = False  # continue from the latest recover point under run_dir, if there is one
    eval_datasets: list[DatasetAbstraction] = dataclasses.field(default_factory=list)
    eval_freq_steps: int | None = None  # evaluate trained models every N steps (always at the end)
    eval_batch_size: int | None = None  # samples per evaluation batch; default n_seqs
    # an RL run's evaluation: ``eval_calls`` (graph calls, in order) and then ``eval_mfcs`` (calls
    # that run only then, on their role's home) on the first eval_batch_size rows of eval_prompts
    eval_prompts: DatasetAbstraction | None = None
    eval_calls: list[str] = dataclasses.field(default_factory=list)
    eval_mfcs: list[MFCDef] = dataclasses.field(default_factory=list)
    dynamic_sampling: DynamicSampling | None = None
    async_rl: AsyncRL | None = None  # None: synchronous (the parameter-version rule exactly)
    import_modules: list[str] = dataclasses.field(default_factory=list)
    timeouts: Timeouts = dataclasses.field(default_factory=Timeouts)
    device: str = "cpu"  # "cuda": one GPU per worker (api/core/devices.py); "cuda:<k>": all on GPU k
    colocate: bool = False  # device=cuda with fewer GPUs than workers: workers share GPUs
    torch_threads: int | None = None  # CPU threads per worker; None: cores // workers on the machine
    retain_freed_memory: bool = True  # workers keep freed host memory (base/host_memory.py)
    # fault injection for tests: "<worker>:<point>[@<step>][:stop]" (realrl/base/failpoints.py)
    failpoints: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.mfcs:
            raise ValueError("ExperimentConfig.mfcs is empty: an experiment needs at least one MFC")
        for name in ("experiment_name", "trial_name"):
            value = getattr(self, name)
            if not value or "/" in value:
                raise ValueError(f"ExperimentConfig.{name} must be non-empty without '/', got {value!r}")
        self.allocations = {role: list(ws) for role, ws in self.allocations.items()}
        self.layouts = {
            role: self.layouts.get(role) or Layout(dp=len(ws)) for role, ws in self.allocations.items()
        }
        if self.n_model_workers is None:
            self.n_model_workers = 1 + max((w for ws in self._used_workers() for w in ws), default=0)
        self.validate()

    # -- derived -----------------------------------------------------------------------------

    @property
    def run_dir(self) -> str:
        return os.path.join(os.path.abspath(self.fileroot), self.experiment_name, self.trial_name)

    @property
    def log_dir(self) -> str:
        return os.path.join(self.run_dir, "logs")

    @property
    def batch_size(self) -> int:
        return self.mfcs[0].n_seqs

    def dataset_keys(self) -> list[str]:
        return build_graph(self.mfcs).graph["dataset_keys"]

    def source_mfcs(self) -> list[MFCDef]:
        keys = set(self.dataset_keys())
        return [m for m in self.mfcs if keys & set(m.input_keys)]

    def owner_role(self) -> str:
        return self.data_owner or self.source_mfcs()[0].role

    def placement(self, role: str) -> Placement:
        """``role``'s home: where its weights (and optimizer state) live."""
        return Placement(self.layouts[role], tuple(self.allocations[role]))

    def call_placement(self, mfc_name: str) -> Placement:
        """Where the MFC ``mfc_name`` runs: its own placement, else its model's home."""
        if mfc_name in self.mfc_placements:
            return self.mfc_placements[mfc_name]
        return self.placement(next(m.role for m in [*self.mfcs, *self.eval_mfcs] if m.name == mfc_name))

    def copy_placements(self, role: str) -> list[Placement]:
        """The placements other than home where calls of ``role`` run, in graph order."""
        home, out = self.placement(role), []
        for m in self.mfcs:
            p = self.call_placement(m.name)
            if m.role == role and p != home and p not in out:
                out.append(p)
        return out

    def role_layouts(self) -> dict[str, list[Layout]]:
        """Every layout a role runs in: its home's, then its calls' copies'."""
        return {
            role: [self.placement(role).layout, *(p.layout for p in self.copy_placements(role))]
            for role in self.allocations
        }

    def mesh_placements(self) -> dict[str, Placement]:
        """Every placement a model is laid out in, by name (``copy_name`` for copies): the meshes
        every worker builds at setup, in one order."""
        out = {role: self.placement(role) for role in self.allocations}
        for role in self.allocations:
            out.update({copy_name(role, p): p for p in self.copy_placements(role)})
        return out

    def realloc_groups(self) -> list[tuple[int, ...]]:
        """The workers of each reallocation (a model's home and one of its copies), each once:
        they meet in a barrier before the weights move, so the time measured is the move's."""
        groups = {
            tuple(sorted({*self.allocations[role], *p.workers}))
            for role in self.allocations
            for p in self.copy_placements(role)
        }
        return sorted(groups)

    def _used_workers(self) -> list[list[int]]:
        return [*self.allocations.values(), *(list(p.workers) for p in self.mfc_placements.values())]

    def data_workers(self) -> list[int]:
        """The workers that load the dataset: one per data-parallel rank of the owner role. Under
        asynchronous RL with no ``data_owner`` given, those of the first call reading the dataset
        (the generate call): generation workers then never wait for a busy training worker to
        send them their prompts."""
        if self.async_rl is not None and self.data_owner is None:
            return self.call_placement(self.source_mfcs()[0].name).heads()
        return self.placement(self.owner_role()).heads()

    def sampling_mfcs(self) -> list[MFCDef]:
        """With dynamic sampling: the filter and every call it depends on, in graph order (they
        run in rounds until the filter keeps a full batch); else none."""
        if self.dynamic_sampling is None:
            return []
        name = self.dynamic_sampling.filter_mfc
        upstream = nx.ancestors(build_graph(self.mfcs), name) | {name}
        return [m for m in self.mfcs if m.name in upstream]

    def trained_roles(self) -> dict[str, str]:
        """Role -> its first training MFC (the one whose interface saves the model)."""
        out: dict[str, str] = {}
        for m in self.mfcs:
            if m.interface_type is ModelInterfaceType.TRAIN_STEP:
                out.setdefault(m.role, m.name)
        return out

    # -- checks (api/core/experiment_checks.py) -------------------------------------------------

    def validate(self) -> None:
        build_graph(self.mfcs)  # names, producers, cycles
        checks.check_one_batch(self.mfcs)
        if self.total_train_epochs < 1:
            raise ValueError(f"total_train_epochs must be >= 1, got {self.total_train_epochs}")
        checks.check_positive({name: getattr(self, name) for name in checks.POSITIVE_OPTIONS})
        checks.check_calls(self.mfcs, self.models, list(self.allocations))
        if not self.source_mfcs():
            raise ValueError("no MFC reads a dataset key: nothing would ever feed the graph")
        for role, workers in self.allocations.items():
            if role not in self.models:
                raise ValueError(f"allocations name model {role!r}, absent from models {sorted(self.models)}")
            if not workers:
                raise ValueError(f"allocations[{role!r}] is empty: a model needs at least one worker")
            try:
                placement = self.placement(role)
            except ValueError as e:
                raise ValueError(f"model {role!r}: {e}") from None
            self._check_placement(f"model {role!r}", placement, f"allocations[{role!r}]")
        for name, placement in self.mfc_placements.items():
            mfc = next((m for m in self.mfcs if m.name == name), None)
            if mfc is None:
                raise ValueError(f"mfc_placements names {name!r}, not an MFC of the graph")
            self._check_placement(f"MFC {name!r}", placement)
            if mfc.interface_type is ModelInterfaceType.TRAIN_STEP and placement != self.placement(mfc.role):
                raise ValueError(
                    f"MFC {name!r} trains model {mfc.role!r} in {placement}, not in its home "
                    f"{self.placement(mfc.role)}: a model trains where its weights live"
                )
        checks.check_dynamic_sampling(self.dynamic_sampling, self.mfcs, self.sampling_mfcs)
        checks.check_weightless_layouts(self.models, self.role_layouts(), self.mfcs)
        call_layouts = {m.name: self.call_placement(m.name).layout for m in self.mfcs}
        checks.check_pipelines(self.async_rl, call_layouts, self.mfcs)
        for spec in self.failpoints:
            Failpoint.parse(spec)
        if self.owner_role() not in self.allocations:
            raise ValueError(f"data_owner {self.owner_role()!r} is not an allocated model")
        idle = sorted(set(range(self.n_model_workers)) - {w for ws in self._used_workers() for w in ws})
        if idle:
            raise ValueError(f"model workers {idle} hold no model; lower n_model_workers or allocate them")

    def _check_placement(self, what: str, placement: Placement, key: str | None = None) -> None:
        checks.check_placement(what, placement, self.n_model_workers, self.batch_size, key)

    # -- worker configs ------------------------------------------------------------------------

    def model_worker_configs(
        self,
        name_resolve: NameResolveConfig,
        bind_host: str | None = "127.0.0.1",
        devices: list[str] | None = None,
        dist_backend: str = GLOO,
    ) -> list[ModelWorkerConfig]:
        """``devices[w]``: worker w's device (default: ``self.device`` for all, e.g. "cpu")."""
        data_workers = self.data_workers()
        devices = devices or [self.device] * self.n_model_workers
        configs = []
        for w in range(self.n_model_workers):
            shards = [
                ModelShardSpec(role, self.placement(role), self.models[role], w)
                for role, ws in sorted(self.allocations.items())
                if w in ws
            ]
            copies = [
                ModelShardSpec(role, p, self.models[role], w)
                for role in sorted(self.allocations)
                for p in self.copy_placements(role)
                if w in p.workers
            ]
            roles = {s.role for s in shards}
            mfcs = [m for m in self.mfcs if m.role in roles or w in self.call_placement(m.name).workers]
            mfcs += [m for m in self.eval_mfcs if m.role in roles]
            configs.append(
                ModelWorkerConfig(
                    worker_index=w,
                    n_model_workers=self.n_model_workers,
                    experiment_name=self.experiment_name,
                    trial_name=self.trial_name,
                    run_dir=self.run_dir,
                    seed=self.seed,
                    shards=shards,
                    copies=copies,
                    mfcs=mfcs,
                    interfaces={m.name: m.interface_impl for m in mfcs},
                    datasets=list(self.datasets),
                    dataset_dp_rank=data_workers.index(w) if w in data_workers else None,
                    dataset_dp_size=len(data_workers),
                    tokenizer_path=self.tokenizer_path,
                    import_modules=list(self.import_modules),
                    timeouts=self.timeouts,
                    name_resolve=name_resolve,
                    eval_datasets=list(self.eval_datasets),
                    eval_prompts=self.eval_prompts if w == data_workers[0] else None,
                    eval_batch_size=self.eval_batch_size or self.batch_size,
                    bind_host=bind_host,
                    device=devices[w],
                    dist_backend=dist_backend,
                    torch_threads=self.torch_threads,
                    retain_freed_memory=self.retain_freed_memory,
                    failpoints=list(self.failpoints),
                )
            )
        return configs
