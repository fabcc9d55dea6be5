"""``group_filter``: DAPO's dynamic-sampling filter ("DAPO: An Open-Source LLM Reinforcement
Learning System at Scale", Yu et al. 2025, section 3.2).

A group (one prompt's answers, one sample) whose answers all score the same has zero advantage
under every group baseline (GRPO, RLOO, DAPO): it adds no gradient, only shrinks the batch the
update averages over. This call reports such groups under ``DROPPED_KEY``; the master drops them
and refills the batch with further prompts (``ExperimentConfig.dynamic_sampling``). A group of one
answer is kept, as verl's filter keeps it: it has no spread to measure.
"""

from __future__ import annotations

import dataclasses

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import DROPPED_KEY, Model, ModelInterface, register_interface
from realrl.impl.interface.common import require_keys


@dataclasses.dataclass
class GroupFilterInterface(ModelInterface):
    metric: str = "rewards"  # a per-answer key: the task reward the reward call wrote
    tolerance: float = 0.0  # spreads (max - min) at or below it count as "all the same"

    def __post_init__(self) -> None:
        if self.tolerance < 0:
            raise ValueError(f"group_filter: tolerance must be >= 0, got {self.tolerance}")

    def inference(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        require_keys(data, (self.metric,), "group_filter.inference")
        dropped = []
        for group in data.unpack():
            scores = group.data[self.metric].float().flatten()
            if scores.numel() > 1 and float(scores.max() - scores.min()) <= self.tolerance:
                dropped.append(group.ids[0])
        n = data.bs
        stats = {
            "kept_groups": float(n - len(dropped)),
            "dropped_groups": float(len(dropped)),
            DROPPED_KEY: dropped,
        }
        return None, stats


register_interface("group_filter", GroupFilterInterface)
