"""What the engines do on a pipelined model: the schedules of ``parallel/pipeline.py`` behind the
engine's own calls, so an interface runs the same code on one worker and on pipeline stages.

Every stage of a replica holds the whole batch (the data reaches every rank of a replica), cuts it
into the same micro-batches and runs its part of the schedule. The last stage computes what the
call returns (the post-hooks' results, the sampled answers, the losses' statistics) and hands it
to the other stages, so every rank of the replica returns the same thing, as tensor-parallel
ranks do: any of them can keep the outputs or answer the master.

A tied embedding (the head reusing the token embedding) has a copy on the first stage and one on
the last; their gradients are summed over the two after every backward pass, so the two copies
take the same update and stay equal (Megatron-LM's rule), and the gradient norm counts the
first stage's copy only.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_api import GenerationHyperparameters, GenerationOutput
from realrl.impl.model.parallel.dtensor import is_dtensor, local
from realrl.impl.model.parallel.mesh import ParallelContext, comm_device
from realrl.impl.model.parallel.pipeline import (
    LossFn,
    PipelineStage,
    StageLinks,
    forward_only,
    train_1f1b,
)
from realrl.impl.model.parallel.pipeline_generation import Prompts, generate_pipelined

PROMPT_KEY = "packed_prompts"


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` with ``fn`` applied to every tensor in it (in lists, tuples, dicts and dataclasses),
    in one fixed order."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, list | tuple):
        return type(obj)(_map_tensors(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: _map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **fields)
    return obj


def _lockstep(mbs: list[SequenceSample], n_runs: int) -> list[SequenceSample]:
    """``mbs`` and repeats of the first up to ``n_runs`` (FSDP: every dp rank of a stage runs as
    many micro-batches as the rank with the most, each gathering weights collectively)."""
    return mbs + [mbs[0]] * (n_runs - len(mbs))


def _on_host(t: torch.Tensor) -> bool:
    return t.device == torch.device("cpu")


@dataclasses.dataclass
class PipelineRun:
    """One rank's stage of a pipelined model and the groups its schedules use."""

    stage: PipelineStage
    links: StageLinks
    parallel: ParallelContext
    device: torch.device

    @classmethod
    def of(
        cls, module: torch.nn.Module, parallel: ParallelContext | None, device: torch.device
    ) -> PipelineRun | None:
        """The run of ``module`` when ``parallel`` has pipeline stages (None otherwise). The
        activations between stages travel in the stage's own dtype (its residual stream's)."""
        if parallel is None or parallel.layout.pp == 1:
            return None
        if not isinstance(module, PipelineStage):
            raise TypeError(
                f"layout {parallel.layout} has pipeline stages, but the model is a {type(module).__name__}, "
                "not a PipelineStage (the model factory cuts a ReaLModel into its stage)"
            )
        links = StageLinks(
            parallel.pp_group,
            module.spec,
            module.config.hidden_dim,
            module.dtype,
            device,
            parallel.stage_ranks,
        )
        return cls(module, links, parallel, device)

    @property
    def last(self) -> bool:
        return self.stage.spec.last

    # -- what the last stage computed, on every stage --------------------------------------------

    def share(self, obj: Any) -> Any:
        """``obj`` as the last stage has it, on every stage of this rank's pipeline: each tensor in
        host memory where the last stage's is, else on this engine's device. Serialised with
        ``torch.save``: any picklable result travels."""
        group = self.parallel.pp_group
        src = self.links.peer(self.stage.spec.n_stages - 1)
        wire = comm_device(group)
        if self.last:
            hosted: list[bool] = []  # which tensors the last stage holds in host memory
            _map_tensors(obj, lambda t: hosted.append(_on_host(t)) or t)
            buf = io.BytesIO()
            torch.save((obj, hosted), buf)
            payload = torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8).to(wire)
            size = torch.tensor([payload.numel()], dtype=torch.long, device=wire)
        else:
            size = torch.zeros(1, dtype=torch.long, device=wire)
        dist.broadcast(size, src, group=group)
        if not self.last:
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=wire)
        dist.broadcast(payload, src, group=group)
        if self.last:
            return obj
        data = io.BytesIO(payload.cpu().numpy().tobytes())
        obj, hosted = torch.load(data, map_location="cpu", weights_only=False)
        flags = iter(hosted)  # each tensor where the last stage has it: host memory, or this device
        return _map_tensors(obj, lambda t: t if next(flags) else t.to(self.device))

    # -- the engine's calls ------------------------------------------------------------------------

    def forward(
        self,
        mbs: list[SequenceSample],
        n_runs: int,
        output_index_fn: Callable | None,
        post_hook: Callable | None,
        aggregate_fn: Callable,
    ) -> Any:
        """Inference over ``mbs``; ``n_runs`` >= len(mbs) micro-batches go through the stages
        (FSDP's lockstep: the extra ones repeat the first and are dropped)."""
        outs = forward_only(self.stage, self.links, _lockstep(mbs, n_runs), output_index_fn)
        result = None
        if self.last:
            pairs = zip(outs[: len(mbs)], mbs)
            result = aggregate_fn([post_hook(o, mb) if post_hook is not None else o for o, mb in pairs])
        return self.share(result)

    def generate(
        self,
        mbs: list[SequenceSample],
        keys: list[torch.Tensor | None],
        gconfig: GenerationHyperparameters,
        eos_token_id: Any,
    ) -> list[GenerationOutput]:
        """Every micro-batch's answers, pipelined; ``keys[i]``: micro-batch i's prompt keys (None:
        greedy, no noise is drawn)."""
        prompts = []
        for mb, key in zip(mbs, keys):
            ids = mb.data[PROMPT_KEY]
            cu = mb.cu_seqlens(PROMPT_KEY).to(self.device)
            if key is None:
                key = torch.zeros(cu.numel() - 1, dtype=torch.long, device=self.device)
            prompts.append(Prompts(ids, cu, key))
        outs = generate_pipelined(self.stage, self.links, prompts, gconfig, eos_token_id)
        return self.share(outs if self.last else None)

    def train(
        self,
        mbs: list[SequenceSample],
        n_runs: int,
        loss_fn: LossFn,
        scales: list[float],
        output_index_fn: Callable | None,
    ) -> list[tuple[float, dict] | None]:
        """Gradients of ``sum_i scales[i] * loss_i`` accumulated into the stage's parameters (1F1B);
        every micro-batch's (loss, stats), None where its scale is 0. ``n_runs`` as in
        ``forward``: the lockstep repeats learn nothing."""
        scales = scales + [0.0] * (n_runs - len(mbs))
        results = train_1f1b(self.stage, self.links, _lockstep(mbs, n_runs), loss_fn, scales, output_index_fn)
        self.sum_tied_gradients()
        return self.share(results[: len(mbs)] if self.last else None)

    def sum_tied_gradients(self) -> None:
        """The first and the last stage's copies of a tied embedding get the sum of both gradients."""
        weight = self.stage.tied_weight()
        if weight is None:
            return
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        if is_dtensor(weight.grad) and weight.grad.placements != weight.placements:
            # a tensor-parallel embedding's gradient may come back replicated: split it as the
            # weight is, so both stages' copies sum the same slice (no communication)
            weight.grad = weight.grad.redistribute(weight.device_mesh, weight.placements)
        grad = local(weight.grad)
        group = self.parallel.ends_group
        moved = grad.to(comm_device(group))
        dist.all_reduce(moved, group=group)
        if moved is not grad:
            grad.copy_(moved)

    def uncounted(self) -> set[int]:
        """Parameters (by id) the gradient norm leaves out: the last stage's copy of a tied embedding."""
        weight = self.stage.tied_weight()
        return {id(weight)} if weight is not None and self.last else set()

    # -- checkpoints -------------------------------------------------------------------------------

    def gather_stages(self, state: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
        """The whole model's weights on the model's first rank, from each stage's first rank's
        ``state`` (its whole tensors: tensor-parallel and FSDP shards already gathered); None on
        the other ranks. Collective over the pipeline of the (dp 0, tp 0) ranks."""
        if not self.keeps_gathered:
            return None
        group = self.parallel.pp_group
        dst = self.links.peer(0)
        parts = [None] * self.stage.spec.n_stages if self.stage.spec.first else None
        dist.gather_object(state, parts, dst=dst, group=group)
        if not self.stage.spec.first:
            return None
        whole: dict[str, torch.Tensor] = {}
        for part in parts:
            whole.update(part)
        return whole

    @property
    def keeps_gathered(self) -> bool:
        """Whether this rank keeps its stage's gathered weights (each stage's dp 0, tp 0 rank)."""
        _, d, t = self.parallel.coords
        return (d, t) == (0, 0)
