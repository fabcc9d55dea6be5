"""Options every quickstart experiment shares (hydra structured config, ``key=value`` on the CLI).

Only plain types, ``X | None`` and nested dataclasses appear here, so hydra can check every
override; choices are ``str`` fields checked in ``__post_init__`` with the allowed values named.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, ClassVar

from realrl.api.core.devices import visible_gpu_count


def check_choice(where: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{where}={value!r} is not allowed; choose one of {list(allowed)}")


def _option(default: Any, help: str) -> Any:
    """A field whose ``help`` sentence the command line's ``--help`` prints (``default``: a value,
    or a factory such as ``list``)."""
    if callable(default):
        return dataclasses.field(default_factory=default, metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class PlanSearchOptions:
    """``allocation_mode=search`` and ``python -m realrl.apps.search``: the devices a plan is for
    and how the plans are searched (docs/plan_search.md)."""

    n_nodes: int = _option(1, "Nodes the plan is for.")
    n_gpus_per_node: int | None = _option(
        None, "Devices per node; null counts this machine's GPUs, or on a CPU machine its cores."
    )
    device_memory_gb: float | None = _option(
        None, "Memory per device in GiB; null is 80 on GPUs and unchecked on CPU workers."
    )
    seed: int = _option(1, "Seed of the Metropolis search.")
    iterations: int = _option(3000, "Metropolis proposals when the space is too large to try every plan.")
    time_limit_s: float | None = _option(
        270.0,
        "Seconds the search may take after the prerequisite phases (profiles, search, plans run briefly): "
        "runs that do not fit are skipped and said so; null for no limit. 270: the command within 5 minutes.",
    )
    top: int = _option(10, "Plans printed, best first.")
    costs: str = _option(
        "profile",
        "Where call costs come from: profile (short runs here, cached) or paper (FLOPs on hardware).",
    )
    hardware: str = _option(
        "h100", "The device kind costs=paper prices, as named in realrl/apps/plan_search/paper_costs.py."
    )
    interpolate: bool = _option(
        True, "A new batch shape is interpolated from two measured ones within reach."
    )
    contention: bool = _option(True, "Measure once how workers computing side by side slow each other.")
    compare: list[str] = _option(list, "Allocation modes scored beside the plans searched.")
    verify: int = _option(
        3, "With costs=profile, the best N plans also run briefly and the fastest measured wins (0: none)."
    )
    reprofile: bool = _option(
        False, "With costs=profile, measure every cost again instead of reading the cached profile."
    )

    def __post_init__(self) -> None:
        if self.costs not in ("profile", "paper"):
            raise ValueError(f"search.costs must be 'profile' or 'paper', got {self.costs!r}")
        if self.n_nodes < 1 or (self.n_gpus_per_node is not None and self.n_gpus_per_node < 1):
            raise ValueError(
                f"search.n_nodes and search.n_gpus_per_node must be >= 1, got {self.n_nodes} and "
                f"{self.n_gpus_per_node}"
            )
        if self.verify < 0:
            raise ValueError(f"search.verify must be >= 0, got {self.verify}")
        if self.iterations < 1 or self.top < 1:
            raise ValueError(
                f"search.iterations and search.top must be >= 1, got {self.iterations}, {self.top}"
            )


@dataclasses.dataclass
class ExperimentSaveEvalControl:
    """How long to train and how often to save and evaluate (``exp_ctrl.*``)."""

    total_train_epochs: int = 1
    total_train_steps: int | None = None  # stop after this many steps even mid-epoch
    save_freq_steps: int | None = None  # HF checkpoints every N steps; always at the end
    ckpt_freq_steps: int | None = None  # recover points (weights + optimizer + counters) every N steps
    eval_freq_steps: int | None = None  # evaluate on the valid set every N steps; always at the end

    def __post_init__(self) -> None:
        if self.total_train_epochs < 1:
            raise ValueError(f"exp_ctrl.total_train_epochs must be >= 1, got {self.total_train_epochs}")
        for name in ("total_train_steps", "save_freq_steps", "ckpt_freq_steps", "eval_freq_steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"exp_ctrl.{name} must be >= 1 or null, got {value}")


RUN_MODES = ("local", "ray")
RECOVER_MODES = ("disabled", "auto", "resume")
DEVICES = ("auto", "cpu", "cuda")
# "cuda:<k>": every worker on GPU k; "cpu:<k>" is the CPU under torch's indexed spelling, which
# torch moves to with a copy: the device-discipline tests run on it to tell a move to the compute
# device from a move to host memory (docs/runtime.md)
INDEXED_DEVICE = re.compile(r"(cpu|cuda):\d+")


@dataclasses.dataclass
class CommonExperimentConfig:
    """Where a run writes, how it is launched, and how it recovers.

    An experiment declares what a user watches: ``CURVES`` (plots/<group>.png: the statistics
    keys, or ``*`` patterns, each plot draws) and ``PROGRESS`` (the progress bar's fields: label ->
    keys, the first present in a step's record is shown)."""

    SUMMARY: ClassVar[str] = ""  # one sentence for --help (default: the first sentence of its docstring)
    CURVES: ClassVar[dict[str, list[str]]] = {}
    PROGRESS: ClassVar[dict[str, tuple[str, ...]]] = {}

    experiment_name: str = ""  # default: the experiment's quickstart name
    trial_name: str = "default"
    fileroot: str = "outputs"  # everything goes under fileroot/experiment_name/trial_name/
    mode: str = "local"
    ray_address: str | None = None  # mode=ray: an existing cluster ("auto" or host:port); None starts one
    # d<dp>m<tp>p<pp>, per role ('actor:d1m2p1,*:d1'), manual, or search (the best plan found first)
    allocation_mode: str = "d1"
    search: PlanSearchOptions = dataclasses.field(default_factory=PlanSearchOptions)
    manual: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # allocation_mode=manual
    manual_layouts: dict[str, str] = dataclasses.field(default_factory=dict)  # its layouts (default d<n>)
    colocate: bool = False  # device=cuda: let workers share GPUs when there are fewer GPUs than workers
    seed: int = 1
    device: str = "auto"
    torch_threads: int | None = None  # CPU threads per model worker; default: cores // workers
    retain_freed_memory: bool = True  # model workers keep freed host memory (no per-step page faults)
    exp_ctrl: ExperimentSaveEvalControl = dataclasses.field(default_factory=ExperimentSaveEvalControl)
    recover_mode: str = "disabled"
    recover_retries: int = 1
    wandb_project: str | None = None
    # local mode: worker processes the CLI starts at once, warming up while it builds the config
    # (realrl.system.standby); default: one per worker of a d<N> allocation, 0 disables
    standby_workers: int | None = None
    import_modules: list[str] = dataclasses.field(default_factory=list)  # plugins: modules or .py files
    # key=value overrides for the phases a toy run builds on (e.g. ["exp_ctrl.total_train_steps=3"])
    prerequisite_overrides: list[str] = dataclasses.field(default_factory=list)
    debug: bool = False  # the command line shows the traceback of a configuration or input error
    # the embedded task a run with no dataset path uses (sentiment, the default, arith, or a
    # variant: sentiment_long, sentiment_moe); the command line sets it and points the dataset
    # and model paths at the task's files
    task: str | None = None

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, RUN_MODES)
        check_choice("recover_mode", self.recover_mode, RECOVER_MODES)
        if not INDEXED_DEVICE.fullmatch(self.device):
            check_choice("device", self.device, (*DEVICES, "cuda:<k>"))
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1 or null, got {self.torch_threads}")
        if self.standby_workers is not None and self.standby_workers < 0:
            raise ValueError(f"standby_workers must be >= 0 or null, got {self.standby_workers}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if self.recover_retries < 0:
            raise ValueError(f"recover_retries must be >= 0, got {self.recover_retries}")
        for name in ("experiment_name", "trial_name"):
            value = getattr(self, name)
            if "/" in value or value in (".", ".."):
                raise ValueError(f"{name} must be a folder name (no '/', not '.' or '..'), got {value!r}")
        if not self.trial_name:
            raise ValueError("trial_name must not be empty")

    def unused_groups(self) -> set[str]:
        """Model option groups this configuration does not read (no phase runs to make them)."""
        return set()

    @property
    def run_dir(self) -> str:
        return os.path.join(os.path.abspath(self.fileroot), self.experiment_name, self.trial_name)

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        return "cuda" if visible_gpu_count() > 0 else "cpu"
