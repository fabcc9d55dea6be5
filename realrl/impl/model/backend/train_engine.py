"""The train engine: token-normalised gradient accumulation, data parallelism, one update per call.

Loss contract (interfaces write their losses against it):

    loss_fn(output: Tensor, mb: SequenceSample) -> (loss: Tensor, stats: dict[str, float])
        ``output`` is the module's forward output on ``mb["packed_input_ids"]`` (all sequences of
        all samples packed, cu_seqlens from their lengths); ``loss`` is the MEAN over the
        micro-batch's own weight units (e.g. its loss tokens).
    loss_weight_fn(mb: SequenceSample) -> float
        how many weight units the micro-batch holds (e.g. its number of loss tokens).
    output_index_fn(mb: SequenceSample) -> LongTensor[N]   (optional)
        the tokens the loss reads; ``output`` is then the module's output at those tokens only
        (see ``engine.py``), which spares the last layer and the head the rest.

With ``W`` the total weight (summed over data-parallel ranks when
``token_normalize_scope="global"``), the engine back-propagates

    sum over micro-batches i of  loss_i * w_i / W            ("global")
    sum over micro-batches i of  loss_i * w_i / W_rank / dp  ("dp": each rank's mean, averaged)

and sums gradients over ranks, so the update is the gradient of the batch mean however the batch
is cut into micro-batches or ranks. Then it clips, sets the LR and steps the optimizer once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.distributed as dist

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.base import logging
from realrl.impl.model.backend import dp
from realrl.impl.model.backend.activation_checkpointing import enable_gradient_checkpointing
from realrl.impl.model.backend.checkpoint import load_checkpoint, save_checkpoint
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.engine import INPUT_KEY, InferenceEngine, OutputIndexFn
from realrl.impl.model.backend.loss_scaler import LossScaler
from realrl.impl.model.backend.lr_schedule import LRScheduler
from realrl.impl.model.backend.optim import build_optimizer
from realrl.impl.model.nn.lora import keep_frozen_in
from realrl.impl.model.parallel.grad_norm import clip_grad_norm
from realrl.impl.model.parallel.mesh import ParallelContext

logger = logging.getLogger("train_engine")

LossFn = Callable[[torch.Tensor, SequenceSample], tuple[torch.Tensor, dict[str, float]]]
LossWeightFn = Callable[[SequenceSample], float]
SCOPES = ("global", "dp")
# the loss function's statistics are averaged over micro-batches by their weight, except those
# named "<...>_max": the largest value over the micro-batches, and "<...>_min": the smallest
MAX_STAT_SUFFIX = "_max"
MIN_STAT_SUFFIX = "_min"


class TrainEngine(InferenceEngine):
    """Holds the module, its optimizer and LR schedule; also serves forward/generate (the actor
    generates and trains with one module). Parameters stay fp32 (master weights); a low-precision
    ``EngineConfig.dtype`` runs forward/backward under autocast, fp16 with a dynamic loss scaler.
    Under FSDP the backend also has each unit gathered in that dtype (``apply_fsdp``'s
    ``param_dtype``): the fp32 shards and their fp32 gradients are what the scaler and the
    optimizer see.
    """

    casts_module = False

    def __init__(
        self,
        module: torch.nn.Module,
        optimizer_config: OptimizerConfig | None = None,
        engine_config: EngineConfig | None = None,
        total_train_steps: int = 1,
        device: torch.device | str = "cpu",
        parallel: ParallelContext | None = None,
    ) -> None:
        super().__init__(module, engine_config, device, parallel, total_train_steps=total_train_steps)
        if getattr(module, "lora", None) is not None and self.dtype != torch.float32 and not self.fsdp:
            keep_frozen_in(module, self.dtype)  # the frozen base in bf16/fp16, the adapters in fp32
        self.optimizer_config = optimizer_config or OptimizerConfig()
        dp.world_size(self.dp_group)  # fail early if the group is unusable
        if self.fsdp:
            from realrl.impl.model.parallel.fsdp import sum_gradients

            sum_gradients(module)  # the loss scaling below already divides by the global weight
        if self.config.gradient_checkpointing:
            enable_gradient_checkpointing(module)
        self.optimizer = build_optimizer(module, self.optimizer_config)
        self.lr_scheduler = LRScheduler(self.optimizer, self.optimizer_config, total_train_steps)
        use_scaler = self.dtype == torch.float16
        self.loss_scaler = LossScaler() if use_scaler else None

    @property
    def grad_sync_group(self) -> dist.ProcessGroup | None:
        """The ranks whose gradients the engine sums itself (FSDP reduces its own shards)."""
        return None if self.fsdp else self.dp_group

    # -- gradients --------------------------------------------------------------------------

    def accumulate_gradients(
        self,
        input_: SequenceSample,
        mb_spec: MicroBatchSpec | None,
        loss_fn: LossFn,
        loss_weight_fn: LossWeightFn,
        token_normalize_scope: Literal["global", "dp"] = "global",
        output_index_fn: OutputIndexFn | None = None,
    ) -> dict[str, float]:
        """Add the batch loss's gradient to ``.grad`` (summed over DP ranks); no optimizer step."""
        if token_normalize_scope not in SCOPES:
            raise ValueError(f"token_normalize_scope must be one of {SCOPES}, got {token_normalize_scope!r}")
        self._require(input_, INPUT_KEY, "train_batch")
        mbs = self.split(input_, mb_spec)
        weights = [float(loss_weight_fn(mb)) for mb in mbs]
        if any(w < 0 for w in weights):
            raise ValueError(f"loss_weight_fn returned a negative weight: {weights}")
        local_total = sum(weights)
        n_ranks = dp.world_size(self.dp_group)
        n_runs = self.lockstep_count(len(mbs))
        if token_normalize_scope == "global":
            total, divide = dp.all_reduce_sum(local_total, self.dp_group), 1.0
        else:
            total, divide = local_total, float(n_ranks)
        if total == 0:
            logger.warning("train_batch: total loss weight is 0 (no loss tokens); the gradient is zero")

        loss_sum, stat_sums, n_tokens = 0.0, {}, 0
        results: list[tuple[float, dict] | None] = []
        if self.pipeline is not None:
            scales = [w / total / divide if total > 0 else 0.0 for w in weights]
            if self.loss_scaler is not None:
                scales = [x * self.loss_scaler.get_scale() for x in scales]
            with self.mode(training=True), self._autocast():
                results = self.pipeline.train(mbs, n_runs, loss_fn, scales, output_index_fn)
            n_runs = 0  # the loop below has nothing left to run
        with self.mode(training=True):
            for i in range(n_runs):
                mb, w = (mbs[i], weights[i]) if i < len(mbs) else (mbs[0], 0.0)
                if w == 0:  # nothing to learn here; its mean loss may be 0/0 = NaN, which * 0 stays NaN
                    if self.fsdp:  # the other ranks gather and reduce this step's weights: join them
                        self.packed_forward(mb, output_index_fn).float().sum().mul(0.0).backward()
                    continue
                output = self.packed_forward(mb, output_index_fn)
                loss, stats = loss_fn(output, mb)
                scale = w / total / divide if total > 0 else 0.0
                scaled = loss.float() * scale
                if self.loss_scaler is not None:
                    scaled = self.loss_scaler.scale_loss(scaled)
                scaled.backward()
                results += [None] * (i - len(results)) + [(float(loss.detach()), stats)]
        for mb, w, result in zip(mbs, weights, results):
            if result is None or w == 0:
                continue
            share = w / local_total
            loss_sum += result[0] * share
            for k, v in result[1].items():
                if k.endswith(MAX_STAT_SUFFIX):  # a largest value: the largest over micro-batches
                    stat_sums[k] = max(stat_sums.get(k, float("-inf")), float(v))
                elif k.endswith(MIN_STAT_SUFFIX):
                    stat_sums[k] = min(stat_sums.get(k, float("inf")), float(v))
                else:
                    stat_sums[k] = stat_sums.get(k, 0.0) + float(v) * share
            n_tokens += sum(mb.flat_seqlens(INPUT_KEY))
        dp.all_reduce_gradients(self.module.parameters(), self.grad_sync_group)
        return {
            "loss": loss_sum,
            **stat_sums,
            "n_mbs": float(len(mbs)),
            "n_tokens": float(n_tokens),
            "loss_weight": local_total,
        }

    def optimizer_step(self, version_steps: int | None = None) -> dict[str, float]:
        """Clip the global gradient norm, set the LR for ``version_steps`` (default: the number of
        updates so far), step once, zero the gradients."""
        cfg = self.optimizer_config
        if version_steps is None:
            version_steps = self.lr_scheduler.n_updates
        params = [p for p in self.module.parameters() if p.grad is not None]
        if self.loss_scaler is not None:
            self.loss_scaler.unscale_(params)
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        if self.pipeline is not None:  # each stage's squares, then summed over the stages
            grad_norm = clip_grad_norm(
                params,
                max_norm,
                self.module,
                across=self.parallel.pp_group,
                uncounted=self.pipeline.uncounted(),
            )
        elif self.sharded:  # shards' squares summed over the mesh: the norm of the whole gradient
            grad_norm = clip_grad_norm(params, max_norm, self.module)
        else:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        lr = self.lr_scheduler.step(version_steps)
        # the norm is the whole gradient's (sharded: reduced over the mesh): every rank of the
        # model takes the same decision, also a rank whose own shard is finite
        finite = math.isfinite(grad_norm)
        if self.loss_scaler is not None:
            self.loss_scaler.update(finite)
        skipped = 0.0
        if finite:
            self.optimizer.step()
        else:
            logger.warning(
                "non-finite gradient norm %s at version %d: update skipped", grad_norm, version_steps
            )
            skipped = 1.0
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, "lr": lr, "update_skipped": skipped}

    def train_batch(
        self,
        input_: SequenceSample,
        mb_spec: MicroBatchSpec | None,
        loss_fn: LossFn,
        loss_weight_fn: LossWeightFn,
        token_normalize_scope: Literal["global", "dp"] = "global",
        version_steps: int | None = None,
        output_index_fn: OutputIndexFn | None = None,
    ) -> dict[str, float]:
        """One optimizer update on ``input_`` (see the module docstring for the loss contract).

        ``version_steps`` is the model version being trained (``model.version.global_step``): the
        LR schedule reads it, so several updates of one version share one LR. None counts updates.
        """
        self.optimizer.zero_grad(set_to_none=True)
        stats = self.accumulate_gradients(
            input_, mb_spec, loss_fn, loss_weight_fn, token_normalize_scope, output_index_fn
        )
        stats.update(self.optimizer_step(version_steps))
        stats.update(self.compile_stats())  # nothing when the blocks run eagerly
        return stats

    # -- checkpoints ------------------------------------------------------------------------

    @property
    def sharded(self) -> bool:
        return self.parallel is not None and self.parallel.sharded

    def engine_state(self) -> dict[str, Any]:
        """What every rank holds alike; a sharded optimizer's state goes with the weights' shards."""
        return {
            "optimizer": None if self.sharded else self.optimizer.state_dict(),
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "grad_scaler": None if self.loss_scaler is None else self.loss_scaler.state_dict(),
        }

    def save(self, path: str, extra_state: Any = None) -> None:
        """Atomic checkpoint of weights (HF format, or every rank's shards), optimizer, schedule, RNG
        and ``extra_state``. Collective over the model's ranks."""
        group = None if self.parallel is None else self.parallel.model_group
        shards = None
        if self.sharded:
            from realrl.impl.model.parallel.state import sharded_state

            shards = sharded_state(self.module, self.optimizer)
        save_checkpoint(path, self.module, self.engine_state(), extra_state, group, shards, self.device)

    def load(self, path: str) -> Any:
        """Restore everything ``save`` wrote; return the ``extra_state`` saved by this rank."""
        group = None if self.parallel is None else self.parallel.model_group
        load_shards = None
        if self.sharded:
            from realrl.impl.model.parallel.state import load_sharded

            def load_shards(folder: str) -> None:
                load_sharded(folder, self.module, self.optimizer, group)

        state, extra = load_checkpoint(path, self.module, group, load_shards, self.device)
        if state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        if self.loss_scaler is not None and state.get("grad_scaler") is not None:
            self.loss_scaler.load_state_dict(state["grad_scaler"])
        return extra
