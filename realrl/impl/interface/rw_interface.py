"""``paired_rw``: a Bradley–Terry reward model over [c1, r1, c2, r2, ...] pairs (TRL's
``RewardTrainer`` loss).

"The N Implementation Details of RLHF with PPO", RM detail 1: the reward of a sequence is the
scalar head's output at its last token (``reward_position="last"``), or, as in
summarize-from-feedback, at the token before a final EOS (``"before_eos"``). RM detail 3: ``reward
= raw * gain + bias`` with gain and bias fitted so the rewards of (x ~ D, y ~ policy) have mean 0
and std 1 (``fit_normalization``, or on the first inference call with
``normalize_on_first_inference``), used in the loss and in inference, and saved with the
checkpoint as ``reward_normalization.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import torch

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import Model, ModelInterface, register_interface
from realrl.base import logging
from realrl.impl.interface.common import (
    INPUT_KEY,
    cu_seqlens_on,
    per_sequence_sample,
    require_keys,
    save_model,
    scalar_output,
)
from realrl.impl.model.backend import dp
from realrl.impl.model.nn.moe_stats import add_router_aux_loss
from realrl.impl.model.utils.losses import bradley_terry_loss

logger = logging.getLogger("paired_rw")
NORMALIZATION_FILE = "reward_normalization.json"


@dataclasses.dataclass
class PairedRewardInterface(ModelInterface):
    center_rewards_coefficient: float | None = None
    use_margins: bool = True  # subtract the dataset's ``margins`` when present
    reward_position: str = "last"  # last | before_eos (str: hydra has no Literal)
    gain: float = 1.0
    bias: float = 0.0
    normalization_file: str | None = None  # a reward_normalization.json to load gain / bias from
    normalize_on_first_inference: bool = False
    target_mean: float = 0.0
    target_std: float = 1.0
    token_normalize_scope: str = "global"

    def __post_init__(self) -> None:
        if self.reward_position not in ("last", "before_eos"):
            raise ValueError(
                f"paired_rw.reward_position must be 'last' or 'before_eos', got {self.reward_position!r}"
            )
        if self.normalization_file:
            path = self.normalization_file
            if os.path.isdir(path):
                path = os.path.join(path, NORMALIZATION_FILE)
            with open(path) as f:
                saved = json.load(f)
            self.gain, self.bias = float(saved["gain"]), float(saved["bias"])
        self._normalized_once = False

    # -- reading rewards ----------------------------------------------------------------------

    def _reward_indices(self, mb: SequenceSample, eos_id: int | None, device) -> torch.Tensor:
        cu = cu_seqlens_on(mb, device)
        last = (cu[1:] - 1).long()
        if self.reward_position == "before_eos" and eos_id is not None:
            ids = mb.data[INPUT_KEY].to(device)
            ends_eos = (ids[last] == eos_id) & (cu[1:] - cu[:-1] > 1)
            last = last - ends_eos.long()
        return last

    def _rewards(self, output: torch.Tensor) -> torch.Tensor:
        """One normalised reward per sequence from the head's output at the reward tokens (the
        engine computes only those: ``output_index_fn=self._reward_index_fn``)."""
        return scalar_output(output) * self.gain + self.bias

    def _reward_index_fn(self, eos_id: int | None):
        return lambda mb: self._reward_indices(mb, eos_id, mb.data[INPUT_KEY].device)

    @staticmethod
    def _eos(model: Model) -> int | None:
        return getattr(model.tokenizer, "eos_token_id", None) if model.tokenizer is not None else None

    def _scores(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None):
        eos = self._eos(model)
        return model.module.forward(
            data,
            mb_spec or MicroBatchSpec(),
            post_hook=lambda out, mb: self._rewards(out),
            output_index_fn=self._reward_index_fn(eos),
        )

    # -- training -----------------------------------------------------------------------------

    @staticmethod
    def _check_pairs(mb: SequenceSample, where: str) -> None:
        for sid, lens in zip(mb.ids, mb.seqlens[INPUT_KEY]):
            if len(lens) % 2:
                raise ValueError(
                    f"{where}: sample {sid!r} holds {len(lens)} sequences; expected [c1, r1, c2, r2, ...]"
                )

    def _pair_loss(self, output: torch.Tensor, mb: SequenceSample):
        rewards = self._rewards(output)
        chosen, rejected = rewards[0::2], rewards[1::2]
        c, r = chosen.detach(), rejected.detach()
        margin = None
        if self.use_margins and "margins" in mb.keys and mb.data["margins"] is not None:
            margin = mb.data["margins"].to(rewards.device).float()[0::2]
        loss = bradley_terry_loss(chosen, rejected, margin, self.center_rewards_coefficient)
        stats = {
            "accuracy": float((c > r).float().mean()),
            "chosen_reward": float(c.mean()),
            "rejected_reward": float(r.mean()),
            "n_pairs": float(c.numel()),
        }
        return add_router_aux_loss(loss, stats, output)  # a Mixture-of-Experts model's router term

    def train_step(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        require_keys(data, (INPUT_KEY,), "paired_rw.train_step")
        self._check_pairs(data, "paired_rw.train_step")
        eos = self._eos(model)
        stats = model.module.train_batch(
            input_=data,
            mb_spec=mb_spec or MicroBatchSpec(),
            loss_fn=self._pair_loss,
            loss_weight_fn=lambda mb: len(mb.flat_seqlens(INPUT_KEY)) / 2,
            token_normalize_scope=self.token_normalize_scope,
            version_steps=model.version.global_step,
            output_index_fn=self._reward_index_fn(eos),
        )
        model.inc_version()
        return dict(stats)

    def evaluate(self, model: Model, eval_dataloader) -> dict[str, float]:
        """Pairwise accuracy and loss over every batch of ``eval_dataloader``."""
        chosen, rejected = [], []
        for batch in eval_dataloader:
            self._check_pairs(batch, "paired_rw.evaluate")
            r = self._scores(model, batch, MicroBatchSpec())
            chosen.append(r[0::2])
            rejected.append(r[1::2])
        if not chosen:
            raise ValueError("paired_rw.evaluate: the evaluation dataloader is empty")
        c, r = torch.cat(chosen), torch.cat(rejected)
        return {
            "eval_accuracy": float((c > r).float().mean()),
            "eval_loss": float(bradley_terry_loss(c, r)),
            "eval_chosen_reward": float(c.mean()),
            "eval_rejected_reward": float(r.mean()),
            "eval_n_pairs": float(c.numel()),
        }

    # -- inference and normalisation ----------------------------------------------------------

    def fit_normalization(
        self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None
    ) -> tuple[float, float]:
        """RM detail 3: from rewards of policy samples, g = sigma_T / sigma_D and
        b = mu_T - g * mu_D (computed with gain 1, bias 0); sets and returns (gain, bias).

        With data parallelism the moments are those of the whole batch (summed over the dp
        ranks), so every rank fits the same gain and bias, whatever the layout."""
        require_keys(data, (INPUT_KEY,), "paired_rw.fit_normalization")
        self.gain, self.bias = 1.0, 0.0
        raw = self._scores(model, data, mb_spec).double()  # gain 1, bias 0: raw head outputs
        group = getattr(model.module, "dp_group", None)
        n = dp.all_reduce_sum(raw.numel(), group)
        if n < 2:
            raise ValueError("paired_rw.fit_normalization needs at least 2 sequences")
        if dp.world_size(group) == 1:
            mu, sigma = float(raw.mean()), float(raw.std(unbiased=False))
        else:
            mu = dp.all_reduce_sum(float(raw.sum()), group) / n
            sigma = math.sqrt(dp.all_reduce_sum(float(((raw - mu) ** 2).sum()), group) / n)
        self.gain = self.target_std / max(sigma, 1e-8)
        self.bias = self.target_mean - self.gain * mu
        logger.info(
            "reward normalisation: mean %.4f std %.4f -> gain %.4f bias %.4f", mu, sigma, self.gain, self.bias
        )
        return self.gain, self.bias

    def inference(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        """``rewards``: one score per sequence of ``packed_input_ids`` (query + response, general
        detail 1 of the same post)."""
        require_keys(data, (INPUT_KEY,), "paired_rw.inference")
        if self.normalize_on_first_inference and not self._normalized_once:
            self.fit_normalization(model, data, mb_spec)
            self._normalized_once = True
        rewards = self._scores(model, data, mb_spec).float()
        return per_sequence_sample(data, "rewards", rewards)

    def state_dict(self) -> dict:
        """Gain, bias and whether they were fitted: a resumed PPO run must not refit them on the
        already-trained policy's samples (recover points save a frozen role's state too)."""
        return {"gain": self.gain, "bias": self.bias, "normalized_once": self._normalized_once}

    def load_state_dict(self, state: dict) -> None:
        self.gain, self.bias = float(state["gain"]), float(state["bias"])
        self._normalized_once = bool(state["normalized_once"])

    def save(self, model: Model, save_dir: str) -> None:
        save_model(model, save_dir, {"reward_normalization": {"gain": self.gain, "bias": self.bias}})


register_interface("paired_rw", PairedRewardInterface)
