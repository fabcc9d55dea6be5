"""Pieces every experiment file uses: per-model options and the step that makes an ExperimentConfig."""

from __future__ import annotations

import dataclasses
from typing import Any

from realrl.api.core.config import (
    DatasetAbstraction,
    ModelAbstraction,
    ModelBackendAbstraction,
    ModelInterfaceAbstraction,
)
from realrl.api.core.data_api import MicroBatchSpec
from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.lora import LoRAConfig
from realrl.api.core.system_api import ExperimentConfig, ModelSpec
from realrl.api.quickstart.allocation import parse_allocation
from realrl.api.quickstart.base import CommonExperimentConfig, check_choice
from realrl.experiments.tasks import get_task
from realrl.impl.model.backend.config import ATTN_IMPLS, EngineConfig, OptimizerConfig


@dataclasses.dataclass
class ModelTrainEvalConfig:
    """One model role (``actor.*``, ``critic.*``, ``ref.*``, ``rew.*``, ``model.*``)."""

    path: str | None = None  # a local HF checkpoint folder; None: the experiment's default
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    n_mbs: int = 1  # at least this many micro-batches per call
    max_tokens_per_mb: int | None = None  # token budget of one micro-batch
    attn_impl: str = "auto"  # auto | flash_attn | torch_varlen | sdpa
    offload: bool = False  # a frozen model (ref, reward): host memory between its calls
    keep_gen_copy: bool = False  # a call in another layout keeps its copy of the weights between calls
    lora: LoRAConfig = dataclasses.field(default_factory=LoRAConfig)  # rank > 0: train adapters only

    def __post_init__(self) -> None:
        try:
            MicroBatchSpec(self.n_mbs, self.max_tokens_per_mb)  # validates
        except ValueError as e:  # named by the field the user sets, n_mbs or max_tokens_per_mb
            raise ValueError(str(e).removeprefix("MicroBatchSpec.")) from None
        check_choice("attn_impl", self.attn_impl, ATTN_IMPLS)
        if self.lora.enabled and self.lora.dropout > 0 and self.engine.disable_dropout:
            raise ValueError(
                f"lora.dropout={self.lora.dropout:g} would be zeroed by engine.disable_dropout=true (the "
                "default: RL policies train without dropout); set engine.disable_dropout=false beside it"
            )

    def mb_spec(self) -> MicroBatchSpec:
        return MicroBatchSpec(self.n_mbs, self.max_tokens_per_mb)

    def model(
        self,
        is_critic: bool,
        default_config: dict[str, Any] | None = None,
        tokenizer_path: str | None = None,
        critic_head_init: str = "reward",
        key: str = "model",
        hint: str = "",
    ) -> ModelAbstraction:
        """A "real_model" from ``path``, or random weights of ``default_config`` when no path.
        ``key``: the role's config group and ``hint`` another way out, for the message."""
        args: dict[str, Any] = {"is_critic": is_critic, "attn_impl": self.attn_impl}
        if tokenizer_path:
            args["tokenizer_path"] = tokenizer_path
        if is_critic:
            args["critic_head_init"] = critic_head_init
        if self.lora.enabled:
            args["lora"] = dataclasses.asdict(self.lora)
        if self.path:
            args["path"] = self.path
        elif default_config is not None:
            args["config"] = dict(default_config)
        else:
            raise ValueError(
                f"{key}.path is required: a local Hugging Face checkpoint folder (only the toy task, "
                f"with no dataset path, has default models){hint}"
            )
        return ModelAbstraction("real_model", args)

    def backend(self, trainable: bool, key: str = "model") -> ModelBackendAbstraction:
        """``key``: the role's config group, for messages."""
        engine = dataclasses.asdict(self.engine)
        if trainable:
            if self.offload:
                raise ValueError(
                    f"{key}.offload=true: only frozen models (ref, reward) are offloaded; a trained model's "
                    f"weights and optimizer stay on its device (shard them with {key}.engine.fsdp=true)"
                )
            return ModelBackendAbstraction(
                "train", {"optimizer": dataclasses.asdict(self.optimizer), "engine": engine}
            )
        return ModelBackendAbstraction("inference", {"engine": engine, "offload": self.offload})


def ref_is_actor_base(enabled: bool, actor: ModelTrainEvalConfig, ref: ModelTrainEvalConfig) -> bool:
    """Whether the reference policy is the LoRA actor with its adapters off (no second copy of
    the weights, and exactly the reference: the base never trains): asked for
    (``ref_from_actor_base``), the actor trains adapters, and ``ref.path`` is unset or the
    actor's own base."""
    return enabled and actor.lora.enabled and ref.path in (None, actor.path)


def reference_on_actor(nodes: list[MFCDef], ref_call: str = "ref_inf") -> list[MFCDef]:
    """``nodes`` with ``ref_call`` moved onto the actor's model, its adapters off."""
    return [
        dataclasses.replace(m, model_name="actor", base_weights=True) if m.name == ref_call else m
        for m in nodes
    ]


def mfc(
    name: str,
    role: str,
    type_: ModelInterfaceType,
    interface: ModelInterfaceAbstraction,
    n_seqs: int,
    inputs: tuple[str, ...],
    outputs: tuple[str, ...] = (),
    mb_spec: MicroBatchSpec | None = None,
    log: bool = False,
) -> MFCDef:
    return MFCDef(
        name=name,
        model_name=role,
        interface_type=type_,
        interface_impl=interface,
        n_seqs=n_seqs,
        input_keys=inputs,
        output_keys=outputs,
        mb_spec=mb_spec or MicroBatchSpec(),
        log_return_value=log,
    )


def experiment_config(
    common: CommonExperimentConfig,
    mfcs: list[MFCDef],
    models: dict[str, ModelSpec],
    datasets: list[DatasetAbstraction],
    tokenizer_path: str | None,
    eval_datasets: list[DatasetAbstraction] | None = None,
    **extra: Any,
) -> ExperimentConfig:
    """The runtime's ExperimentConfig from the common options, the graph and the models."""
    ctrl = common.exp_ctrl
    allocation = parse_allocation(
        common.allocation_mode, mfcs, common.manual, common.manual_layouts, ModelSpec.weightless(models)
    )
    homes = allocation.homes
    try:
        return ExperimentConfig(
            experiment_name=common.experiment_name,
            trial_name=common.trial_name,
            mfcs=mfcs,
            models=models,
            allocations={role: list(p.workers) for role, p in homes.items()},
            layouts={role: p.layout for role, p in homes.items()},
            mfc_placements={m.name: p for m in mfcs if (p := allocation.calls[m.name]) != homes[m.role]},
            datasets=datasets,
            tokenizer_path=tokenizer_path,
            fileroot=common.fileroot,
            seed=common.seed,
            total_train_epochs=ctrl.total_train_epochs,
            total_train_steps=ctrl.total_train_steps,
            save_freq_steps=ctrl.save_freq_steps,
            ckpt_freq_steps=ctrl.ckpt_freq_steps,
            eval_freq_steps=ctrl.eval_freq_steps,
            eval_datasets=list(eval_datasets or []),
            resume=common.recover_mode == "resume",
            import_modules=list(common.import_modules),
            device=common.resolved_device(),
            colocate=common.colocate,
            torch_threads=common.torch_threads,
            retain_freed_memory=common.retain_freed_memory,
            **extra,
        )
    except ValueError as e:  # the runtime checks where models run: the allocation's doing
        if "allocation" in str(e):
            raise
        raise ValueError(f"allocation_mode={common.allocation_mode!r}: {e}") from e


def task_model_config(cfg: CommonExperimentConfig) -> dict[str, Any] | None:
    """The model config of the embedded task ``cfg`` runs on (None on a user's data): what a model
    with no checkpoint path starts from, with random weights."""
    return get_task(cfg.task).model_config() if cfg.task else None
