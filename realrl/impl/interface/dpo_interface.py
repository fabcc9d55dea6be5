"""``dpo``: direct preference optimisation on [c1, r1, c2, r2, ...] pairs.

The same interface serves two MFCs: ``ref_inf`` (``inference`` on the frozen reference ->
``packed_ref_logprobs``) and ``actor_train`` (``train_step``). The answer of each sequence is
where ``prompt_mask`` is 0 when the data has one; ``rw_paired`` data has none, so the answer
starts after the longest common prefix of the pair's chosen and rejected sequences (for the
sigmoid loss this choice does not matter at all: prompt log-probs cancel in h).
"""

from __future__ import annotations

import dataclasses

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
    token_minus_one_sample,
)
from realrl.impl.model.nn.moe_stats import add_router_aux_loss
from realrl.impl.model.utils.losses import dpo_loss


def pair_answer_mask(mb: SequenceSample) -> torch.Tensor:
    """bool [T - B]: entry j is set where token j + 1 is past the pair's common prefix."""
    if "prompt_mask" in mb.keys and mb.data["prompt_mask"] is not None:
        return answer_loss_mask(mb)
    ids = mb.data[INPUT_KEY].tolist()
    lens = mb.flat_seqlens(INPUT_KEY)
    seqs, off = [], 0
    for n in lens:
        seqs.append(ids[off : off + n])
        off += n
    parts = []
    for c, r in zip(seqs[0::2], seqs[1::2]):
        p = 0
        while p < min(len(c), len(r)) and c[p] == r[p]:
            p += 1
        p = max(p, 1)
        for s in (c, r):
            parts.append(torch.arange(1, len(s)) >= p)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool)


def sequence_sums(x: torch.Tensor, lens_minus_one: list[int]) -> torch.Tensor:
    """Sum of a token-minus-one tensor over each sequence."""
    seg = torch.repeat_interleave(
        torch.arange(len(lens_minus_one), device=x.device), torch.tensor(lens_minus_one, device=x.device)
    )
    return torch.zeros(len(lens_minus_one), dtype=x.dtype, device=x.device).index_add_(0, seg, x)


@dataclasses.dataclass
class DPOInterface(ModelInterface):
    beta: float = 0.1
    loss_type: str = "sigmoid"  # sigmoid | ipo (str: hydra has no Literal)
    label_smoothing: float = 0.0
    token_normalize_scope: str = "global"

    def __post_init__(self) -> None:
        if self.loss_type not in ("sigmoid", "ipo"):
            raise ValueError(f"dpo.loss_type must be 'sigmoid' or 'ipo', got {self.loss_type!r}")
        if self.beta <= 0:
            raise ValueError(f"dpo.beta must be > 0, got {self.beta}")

    def inference(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        """``packed_ref_logprobs`` of every sequence (the reference model's ``ref_inf``)."""
        require_keys(data, (INPUT_KEY,), "dpo.inference")
        logp = model.module.forward(
            data, mb_spec or MicroBatchSpec(), post_hook=lambda out, mb: packed_logprobs(out, mb)
        )
        return token_minus_one_sample(data, "packed_ref_logprobs", logp.float())

    def _loss_fn(self, logits: torch.Tensor, mb: SequenceSample):
        for sid, lens in zip(mb.ids, mb.seqlens[INPUT_KEY]):
            if len(lens) % 2:
                raise ValueError(f"dpo: sample {sid!r} holds {len(lens)} sequences; expected [c1, r1, ...]")
        mask = pair_answer_mask(mb).to(logits.device)
        logp = packed_logprobs(logits, mb, mask=mask)  # answer-predicting logits only; 0 elsewhere
        ref = mb.data["packed_ref_logprobs"].to(logp.device).float()
        lens = [n - 1 for n in mb.flat_seqlens(INPUT_KEY)]
        pi = sequence_sums(logp * mask, lens)
        pi_ref = sequence_sums(ref * mask, lens)
        n_tok = sequence_sums(mask.float(), lens)
        loss, stats = dpo_loss(
            pi[0::2],
            pi[1::2],
            pi_ref[0::2],
            pi_ref[1::2],
            self.beta,
            self.loss_type,
            self.label_smoothing,
            chosen_lengths=n_tok[0::2],
            rejected_lengths=n_tok[1::2],
        )
        # a Mixture-of-Experts policy's router load-balancing term
        return add_router_aux_loss(loss, {k: float(v) for k, v in stats.items()}, logits)

    def train_step(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        require_keys(data, (INPUT_KEY, "packed_ref_logprobs"), "dpo.train_step")
        stats = model.module.train_batch(
            input_=data,
            mb_spec=mb_spec or MicroBatchSpec(),
            loss_fn=self._loss_fn,
            loss_weight_fn=lambda mb: len(mb.flat_seqlens(INPUT_KEY)) / 2,
            token_normalize_scope=self.token_normalize_scope,
            version_steps=model.version.global_step,
            output_index_fn=logprob_index(pair_answer_mask),
        )
        model.inc_version()
        return dict(stats)

    def save(self, model: Model, save_dir: str) -> None:
        save_model(model, save_dir)


register_interface("dpo", DPOInterface)
