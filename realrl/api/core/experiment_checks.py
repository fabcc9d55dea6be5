"""How the parts of an ``ExperimentConfig`` must fit together, checked when it is built: pure
checks of the graph, the placements and the options, no model read and no device seen (those
are the launcher's feasibility check, ``realrl.apps.feasibility``). Each raises a ``ValueError``
that names the option at fault."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.experiment_parts import AsyncRL, DynamicSampling, ModelSpec
from realrl.api.core.layout import Layout, Placement

# options of an ExperimentConfig that are counts: >= 1 where given
POSITIVE_OPTIONS = (
    "torch_threads",
    "total_train_steps",
    "save_freq_steps",
    "ckpt_freq_steps",
    "eval_freq_steps",
    "eval_batch_size",
)


def check_positive(values: Mapping[str, int | None]) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {value}")


def check_one_batch(mfcs: Sequence[MFCDef]) -> None:
    n_seqs = {m.name: m.n_seqs for m in mfcs}
    if len(set(n_seqs.values())) != 1:
        raise ValueError(f"every MFC must use the same n_seqs (one batch per step), got {n_seqs}")


def check_calls(mfcs: Sequence[MFCDef], models: Mapping[str, ModelSpec], allocated: Sequence[str]) -> None:
    """Every call on a model that is built and allocated."""
    for mfc in mfcs:
        if mfc.role not in models:
            raise ValueError(
                f"MFC {mfc.name!r} runs on model {mfc.role!r}, absent from models {sorted(models)}"
            )
        if mfc.role not in allocated:
            raise ValueError(
                f"MFC {mfc.name!r}: model {mfc.role!r} has no allocation (allocations: {sorted(allocated)})"
            )


def check_placement(
    what: str, placement: Placement, n_model_workers: int, batch_size: int, key: str | None = None
) -> None:
    """``what`` runs in ``placement``: workers that exist, data for every dp rank."""
    layout = placement.layout
    bad = [w for w in placement.workers if not 0 <= w < n_model_workers]
    if bad:
        raise ValueError(f"{key or what} names workers {bad}, outside 0..{n_model_workers - 1}")
    if layout.dp > batch_size:
        raise ValueError(
            f"{what} has dp size {layout.dp} > n_seqs {batch_size}: some ranks would get no data"
        )


def check_pipelines(
    async_rl: AsyncRL | None, call_layouts: Mapping[str, Layout], mfcs: Sequence[MFCDef]
) -> None:
    """What pipeline stages (p > 1) do not run yet: generation decoded in pieces.
    ``call_layouts``: the layout each call runs in."""
    pieces = async_rl is not None and async_rl.interrupt_every is not None
    for mfc in mfcs if pieces else ():
        layout = call_layouts[mfc.name]
        if mfc.interface_type is ModelInterfaceType.GENERATE and layout.pp > 1:
            raise ValueError(
                f"MFC {mfc.name!r} generates in {layout} and async_rl.partial_rollout decodes in "
                "pieces, which pipeline stages (p > 1) do not do; generate with p1 or turn partial "
                "rollouts off"
            )


def check_weightless_layouts(
    models: Mapping[str, ModelSpec], role_layouts: Mapping[str, Sequence[Layout]], mfcs: Sequence[MFCDef]
) -> None:
    """A role without weights (the ``null`` backend: a tokenizer and a reward function) has
    nothing to split: a tensor-parallel layout named for it is a mistake of ``allocation_mode``
    (a layout for every role leaves it replicated). Nor do tensor and pipeline parallelism split
    LoRA adapters. ``role_layouts``: every layout a role runs in."""
    for role in sorted(role_layouts):
        split = [lay for lay in role_layouts[role] if lay.tp > 1 or lay.pp > 1]
        if not models[role].has_weights and split:
            raise ValueError(
                f"model {role!r} has no weights to split, but its layout is {split[0]}; give the "
                f"roles with weights their tensor-parallel layout and the others d<n>m1p1, e.g. "
                f"'allocation_mode=\"actor:{split[0]},*:d1m1p1\"'"
            )
        rank = models[role].lora_rank
        if split and rank:
            raise ValueError(
                f"model {role!r} trains LoRA adapters ({role}.lora.rank={rank}), which tensor and "
                f"pipeline parallelism do not split, but a layout of it is {split[0]}; use data parallelism "
                f"or FSDP for it (d<n>m1p1, {role}.engine.fsdp=true)"
            )
    for mfc in mfcs:
        if mfc.base_weights and not models[mfc.role].lora_rank:
            raise ValueError(
                f"MFC {mfc.name!r} runs on the base weights of {mfc.role!r}, which has no LoRA adapters"
            )


def check_dynamic_sampling(
    sampling: DynamicSampling | None, mfcs: Sequence[MFCDef], sampling_mfcs: Callable[[], Sequence[MFCDef]]
) -> None:
    """The filter is a call of the graph and its rounds train nothing. ``sampling_mfcs()``: the
    filter and the calls it depends on (asked once the filter is known to be a call)."""
    if sampling is None:
        return
    if all(m.name != sampling.filter_mfc for m in mfcs):
        raise ValueError(
            f"dynamic_sampling.filter_mfc names {sampling.filter_mfc!r}, not an MFC of the graph"
        )
    if sampling.max_rounds < 1:
        raise ValueError(f"dynamic_sampling.max_rounds must be >= 1, got {sampling.max_rounds}")
    trains = [m.name for m in sampling_mfcs() if m.interface_type is ModelInterfaceType.TRAIN_STEP]
    if trains:
        raise ValueError(
            f"dynamic sampling: the filter {sampling.filter_mfc!r} depends on the training calls "
            f"{trains}; only generate and inference calls can run in sampling rounds"
        )
