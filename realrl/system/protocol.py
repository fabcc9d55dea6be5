"""Payloads of the master's requests to model workers and of their replies."""

from __future__ import annotations

import dataclasses

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.layout import Placement
from realrl.api.core.model_api import FinetuneSpec
from realrl.system.transfer_plan import PushOrder, TransferPiece


@dataclasses.dataclass
class SetupRequest:
    # every layout of every model (homes by role, copies by ``copy_name``): all workers build every mesh
    placements: dict[str, Placement]
    realloc_groups: list[tuple[int, ...]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SetupReply:
    dataset_size: int | None  # this worker's shard size, None if it loads no data


@dataclasses.dataclass
class InitializeRequest:
    ft_spec: FinetuneSpec


@dataclasses.dataclass
class InitializeReply:
    # MFCs whose interface on this worker has state_dict / load_state_dict: a frozen role's
    # (e.g. the reward normalisation) is saved in recover points beside the trained models
    stateful: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class FetchEvalRequest:
    """The RL evaluation's prompts: the first ``eval_batch_size`` rows of ``eval_prompts``, stored
    under their own ids (``eval/<id>``) for the calls of the evaluation at ``step``."""

    step: int


@dataclasses.dataclass
class FetchRequest:
    """Samples ``pos .. pos + n`` of this worker's shard in the order of ``epoch``."""

    n: int
    step: int
    epoch: int
    pos: int


@dataclasses.dataclass
class SaveRequest:
    """``kind="hf"``: ``interface`` saves the model (a collective when the model is sharded, else
    only its first rank writes); ``kind="recover"``: every rank of the model writes the engine's
    resumable state (a collective); ``kind="state"``: the MFC ``interface`` writes its state to
    the file ``path`` (a frozen role's part of a recover point). ``step``: the steps the
    checkpoint holds, for error messages."""

    role: str
    kind: str
    path: str
    interface: str
    step: int | None = None


@dataclasses.dataclass
class SamplesRequest:
    """Write to ``path`` the samples ``meta`` names (ids, keys, lengths) from this worker's store, or
    (``meta`` None) read them back into it: a generate call's answers in flight at a recover point
    (asynchronous RL). ``step``: the recover point's, for error messages."""

    path: str
    meta: SequenceSample | None = None
    step: int | None = None


@dataclasses.dataclass
class EvaluateRequest:
    role: str
    interface: str  # the MFC whose interface evaluates the model


@dataclasses.dataclass
class LoadRecoverRequest:
    paths: dict[str, str]  # role -> recover folder, for the trained roles
    states: dict[str, str] = dataclasses.field(default_factory=dict)  # MFC -> this worker's state file
    step: int | None = None


@dataclasses.dataclass
class FetchReply:
    meta: SequenceSample
    epoch: int


@dataclasses.dataclass
class MFCCall:
    """Run ``mfc`` on ``input_meta`` (graph key names; this worker's dp share) at ``step``.

    ``copy``: the name of the model's copy the call runs on (None: its home); ``drop_copy``: free
    that copy after the call (unless the role keeps it)."""

    mfc: str
    step: int
    dp_rank: int
    input_meta: SequenceSample
    copy: str | None = None
    drop_copy: bool = False
    segment: Segment | None = None  # a generate call decoded in pieces (partial rollouts)
    pushes: list[PushOrder] = dataclasses.field(default_factory=list)  # outputs sent on once produced
    # a training call: once it is done, post the sends of these moves of the trained weights to
    # generation copies on other workers (weight pushes, asynchronous RL) and wait for none
    push_weights: list[ReallocOrder] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Segment:
    """One piece of an interruptible generate call (asynchronous RL's partial rollouts): decode up
    to ``tokens`` more tokens of every unfinished answer. Piece 0 starts the call (prefills its
    prompts); the worker keeps the paused decoding between pieces, and a piece that finds the
    model's weights changed recomputes the answers' caches first."""

    index: int
    tokens: int


@dataclasses.dataclass
class ReallocOrder:
    """Bring ``role``'s weights from its home (``src``) to its copy in ``dst`` before the call;
    every worker of either placement takes part. Point-to-point tags start at ``first_tag``."""

    role: str
    src: Placement
    dst: Placement
    first_tag: int
    # the copy holds the base already: move the LoRA adapters (and a critic's head) only
    adapters_only: bool = False
    version: int = 0  # the model version the copy holds once filled (training steps done at home)

    @property
    def workers(self) -> list[int]:
        return sorted({*self.src.workers, *self.dst.workers})

    @property
    def n_tags(self) -> int:
        return len(self.src.workers) * len(self.dst.workers)


@dataclasses.dataclass
class MFCRequest:
    """One worker's part of one call: a reallocation to take part in, tensors to send and
    receive, then maybe a computation (in that order)."""

    pieces: list[TransferPiece]
    call: MFCCall | None = None
    realloc: ReallocOrder | None = None
    # weight pushes to receive first (their sources posted them after training), oldest first
    weight_receives: list[ReallocOrder] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class MFCReply:
    meta: SequenceSample | None = None  # produced keys (graph names), metadata only
    stats: dict[str, float] | None = None
    samples: list[dict] | None = None  # a few decoded prompts, completions and rewards
    dropped: list | None = None  # ids a filtering call drops from the batch (dynamic sampling)
    seconds: float | None = None  # the worker's own time on the call (transfers + compute)
    realloc: dict[str, float] | None = None  # bytes_sent, bytes_received, seconds of its reallocation
    # its weight pushes: bytes_sent and send_blocked_s (a training call's sends), recv_blocked_s
    # (receiving the pushed versions it took first)
    pushed: dict[str, float] | None = None
    unfinished: int = 0  # a generate call in pieces: answers this worker is still decoding
    # the worker's peak memory since it started (``base.peak_memory.process_peaks``)
    peak_memory: dict[str, float] | None = None
