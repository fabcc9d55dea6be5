"""The parts an ``ExperimentConfig`` is made of that stand alone: how to build one model role,
the bounds on every wait, and the master's asynchronous-RL and dynamic-sampling options. Each
checks its own values; how they fit together is ``experiment_checks``'."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from realrl.api.core.config import ModelAbstraction, ModelBackendAbstraction


@dataclasses.dataclass
class Timeouts:
    """Every wait of the runtime is bounded by one of these (seconds)."""

    connect: float = 120.0  # workers start, import torch and say hello to the master
    setup: float = 600.0  # datasets load, process groups form, models build
    request: float = 3600.0  # one model function call (generation can be long)
    heartbeat_interval: float = 1.0
    heartbeat: float = 15.0  # a worker (or the master) silent this long is declared lost
    transfer: float = 600.0  # one torch.distributed send / receive, once both sides are in it
    shutdown: float = 10.0  # workers exit after being asked to

    @property
    def peer(self) -> float:
        """How long a worker waits for a peer, the one rule for every process group, collective,
        transfer and reallocation: a peer may first finish the call it is running (up to
        ``request``), then the exchange itself may take ``transfer``. A shorter bound would let
        a worker (or NCCL's watchdog) give up on a peer that is merely busy with a long
        generation."""
        return self.request + self.transfer

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"Timeouts.{f.name} must be > 0, got {getattr(self, f.name)}")
        if self.heartbeat <= 2 * self.heartbeat_interval:
            raise ValueError(
                f"Timeouts.heartbeat ({self.heartbeat}) must exceed twice heartbeat_interval "
                f"({self.heartbeat_interval}) or live workers get declared lost"
            )


@dataclasses.dataclass
class ModelSpec:
    """How to build one model role: the model factory and the engine wrapping it."""

    model: ModelAbstraction
    backend: ModelBackendAbstraction = dataclasses.field(
        default_factory=lambda: ModelBackendAbstraction("inference")
    )

    keep_gen_copy: bool = False  # keep a copy in another call's layout between its calls (memory allowing)

    @property
    def has_weights(self) -> bool:
        """False for the ``null`` backend: a tokenizer and a function (a reward function, the
        advantage computation), nothing to split or move."""
        return self.backend.type_ != "null"

    @staticmethod
    def weightless(models: Mapping[str, ModelSpec]) -> set[str]:
        """The roles of ``models`` with no weights: a layout given for the whole experiment
        replicates them (``parse_allocation``)."""
        return {role for role, spec in models.items() if not spec.has_weights}

    @property
    def offload(self) -> bool:
        """A frozen model kept in host memory between its calls (the inference backend's option)."""
        return bool(self.backend.args.get("offload", False))

    @property
    def lora_rank(self) -> int:
        """The rank of the LoRA adapters the model factory adds (``"lora"`` in its args); 0: none."""
        return int((self.model.args.get("lora") or {}).get("rank", 0))


@dataclasses.dataclass
class AsyncRL:
    """Asynchronous RL as the master runs it ("AReaL: A Large-Scale Asynchronous Reinforcement
    Learning System for Language Reasoning", Fu et al. 2025): a generate call of a trained model
    at step k may start once that model has finished training step k - 1 - ``max_staleness``, so
    it samples from a policy at most ``max_staleness`` versions behind the one that trains on its
    samples. 0 is the synchronous run. Copies of the policy in a generate call's own layout are
    kept between calls and refilled only when they would be too old.

    ``interrupt_every`` (partial rollouts): the graph's generate calls decode in pieces of
    that many tokens, and a newer policy finished in the meantime reaches the unfinished answers
    between two pieces (their caches recomputed); None decodes each call in one go."""

    max_staleness: int = 1
    interrupt_every: int | None = None

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"async_rl.max_staleness must be >= 0, got {self.max_staleness}")
        if self.interrupt_every is not None and self.interrupt_every < 1:
            raise ValueError(f"partial rollouts decode pieces of >= 1 token, got {self.interrupt_every}")


@dataclasses.dataclass
class DynamicSampling:
    """DAPO's dynamic sampling ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
    Yu et al. 2025) as the master runs it. Each step, ``filter_mfc`` and the calls it depends on
    (the sampling calls: generate, score) run in rounds, each on a fresh batch of n_seqs prompts
    taken further along the dataset; the filter reports the samples it drops (groups whose answers
    all score the same), and the rest of the graph runs on the first n_seqs samples kept. A step
    that has not kept a full batch after ``max_rounds`` rounds stops the run: the data is too easy
    or too hard for the policy, and looping on would never end."""

    filter_mfc: str
    max_rounds: int = 10
