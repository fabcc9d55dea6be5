"""``sft``: next-token training on prompt + answer (DeepSpeed-Chat's phase 1).

The loss covers answer tokens (``prompt_mask`` from the ``prompt_answer`` dataset masks the
prompt) or every token when the dataset was built with ``loss_on_prompt`` (its mask is all 0).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import Model, ModelInterface, register_interface
from realrl.impl.interface.common import (
    INPUT_KEY,
    answer_loss_mask,
    logprob_index,
    packed_logprobs,
    require_keys,
    save_model,
)
from realrl.impl.model.nn.moe_stats import add_router_aux_loss
from realrl.impl.model.utils.losses import sft_loss

_ANSWER_INDEX = logprob_index(answer_loss_mask)


@dataclasses.dataclass
class SFTInterface(ModelInterface):
    token_normalize_scope: str = "global"

    def _loss_fn(self, logits: torch.Tensor, mb: SequenceSample):
        """``logits`` of the answer-predicting tokens only (``output_index_fn=_ANSWER_INDEX``); a
        Mixture-of-Experts model's training forward adds its router's load-balancing loss."""
        mask = answer_loss_mask(mb, logits.device)
        loss, n = sft_loss(packed_logprobs(logits, mb, mask=mask), mask)
        return add_router_aux_loss(loss, {"n_answer_tokens": float(n)}, logits)

    @staticmethod
    def _weight(mb: SequenceSample) -> float:
        return float(answer_loss_mask(mb).sum())

    def train_step(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        require_keys(data, (INPUT_KEY,), "sft.train_step")
        stats = model.module.train_batch(
            input_=data,
            mb_spec=mb_spec or MicroBatchSpec(),
            loss_fn=self._loss_fn,
            loss_weight_fn=self._weight,
            token_normalize_scope=self.token_normalize_scope,
            version_steps=model.version.global_step,
            output_index_fn=_ANSWER_INDEX,
        )
        model.inc_version()
        stats = dict(stats)
        nll = stats.get("moe_task_loss", stats["loss"])  # without the router's term (MoE)
        stats["ppl"] = math.exp(min(nll, 50.0))
        return stats

    def evaluate(self, model: Model, eval_dataloader) -> dict[str, float]:
        """Token-weighted NLL and perplexity over every batch of ``eval_dataloader``."""

        def nll_and_count(logits: torch.Tensor, mb: SequenceSample) -> torch.Tensor:
            loss, n = self._loss_fn(logits, mb)
            return torch.tensor(
                [float(loss) * n["n_answer_tokens"], n["n_answer_tokens"]], dtype=torch.float64
            )

        total = torch.zeros(2, dtype=torch.float64)
        for batch in eval_dataloader:
            total += model.module.forward(
                batch,
                MicroBatchSpec(),
                post_hook=nll_and_count,
                aggregate_fn=lambda xs: torch.stack(xs).sum(0),
                output_index_fn=_ANSWER_INDEX,
            )
        if total[1] == 0:
            raise ValueError("sft.evaluate: the evaluation data holds no answer tokens")
        loss = float(total[0] / total[1])
        return {"eval_loss": loss, "eval_ppl": math.exp(min(loss, 50.0)), "eval_n_tokens": float(total[1])}

    def save(self, model: Model, save_dir: str) -> None:
        save_model(model, save_dir)


register_interface("sft", SFTInterface)
