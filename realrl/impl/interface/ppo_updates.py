"""The update loop the actor's and the critic's train steps share.

Batches and minibatches ("The N Implementation Details of RLHF with PPO", PPO detail 7):
``ppo_n_epochs`` passes, each over a fresh shuffle cut into ``ppo_n_minibatches`` minibatches, one
optimizer step per minibatch. The shuffle seed follows the model version, so the actor and the
critic cut the same minibatches. The advantages were computed once for the batch
(``ppo_advantages``); ``prepare`` may adjust a minibatch first (the actor whitens its advantages
per minibatch with ``whiten_scope="minibatch"``, PPO detail 9).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import Model
from realrl.impl.interface.ppo_config import PPOHyperparameters
from realrl.impl.interface.ppo_rollout import shuffled_minibatches


def run_epochs(
    hp: PPOHyperparameters,
    model: Model,
    data: SequenceSample,
    loss_fn: Callable,
    loss_weight_fn: Callable[[SequenceSample], float],
    mb_spec: MicroBatchSpec | None,
    token_normalize_scope: str,
    output_index_fn: Callable[[SequenceSample], torch.Tensor] | None = None,
    prepare: Callable[[SequenceSample], SequenceSample] | None = None,
) -> list[dict[str, float]]:
    """One statistics dict per optimizer step. ``output_index_fn``: the tokens the loss reads
    (see the train engine); ``loss_weight_fn``: a micro-batch's weight when losses are averaged."""
    generator = torch.Generator().manual_seed(hp.shuffle_seed * 1_000_003 + model.version.global_step)
    step_stats = []
    engine = model.module
    # one mode switch for all the updates instead of two per update (a module walk each)
    hold_train_mode = engine.mode(training=True) if hasattr(engine, "mode") else contextlib.nullcontext()
    samples = data.unpack()
    with hold_train_mode:
        for _ in range(hp.ppo_n_epochs):
            for mb in shuffled_minibatches(samples, hp.ppo_n_minibatches, generator):
                step_stats.append(
                    engine.train_batch(
                        input_=prepare(mb) if prepare else mb,
                        mb_spec=mb_spec or MicroBatchSpec(),
                        loss_fn=loss_fn,
                        loss_weight_fn=loss_weight_fn,
                        token_normalize_scope=token_normalize_scope,
                        version_steps=model.version.global_step,
                        output_index_fn=output_index_fn,
                    )
                )
    return step_stats
