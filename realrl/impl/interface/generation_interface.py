"""``generation``: sample answers to ``packed_prompts`` and optionally write them as JSON lines."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import GenerationHyperparameters, Model, ModelInterface, register_interface
from realrl.impl.interface.common import coerce_config, require_keys
from realrl.impl.interface.ppo_rollout import rollout_sample
from realrl.impl.interface.texts import prompts_and_completions


@dataclasses.dataclass
class GenerationInterface(ModelInterface):
    gconfig: GenerationHyperparameters | dict[str, Any] | None = None
    output_file: str | None = None  # JSON lines {"id", "prompt", "completion", "no_eos"} appended

    def __post_init__(self) -> None:
        self.gconfig = coerce_config(GenerationHyperparameters, self.gconfig, "generation.gconfig")

    def generate(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        """The rollout keys (``packed_input_ids``, ``packed_logprobs``, ``prompt_mask``,
        ``seq_no_eos_mask``), ``gconfig.n`` answers per prompt."""
        require_keys(data, ("packed_prompts",), "generation.generate")
        gen = model.module.generate(data, mb_spec or MicroBatchSpec(), model.tokenizer, self.gconfig)
        out = rollout_sample(data, gen)
        if self.output_file:
            self._write(model, out)
        return out

    def _write(self, model: Model, out: SequenceSample) -> None:
        seq_ids, prompts, completions = prompts_and_completions(out, model.tokenizer)
        no_eos = out.data["seq_no_eos_mask"].tolist()
        os.makedirs(os.path.dirname(os.path.abspath(self.output_file)), exist_ok=True)
        with open(self.output_file, "a") as f:
            for sid, p, c, ne in zip(seq_ids, prompts, completions, no_eos):
                f.write(json.dumps({"id": str(sid), "prompt": p, "completion": c, "no_eos": bool(ne)}) + "\n")


register_interface("generation", GenerationInterface)
