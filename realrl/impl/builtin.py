"""Importing this module registers every implementation realrl ships, by name.

Model workers import it (``realrl.apps.remote``) before building anything. The master and the
command line do not: they hold configs and metadata only and never import torch (the packages
of ``realrl.impl`` therefore register nothing on import; this module does it, in one place).
"""

import realrl.api.from_hf  # noqa: F401  (the HF families: gpt2, llama, mistral, mixtral, qwen2(_moe), qwen3(_moe))
import realrl.impl.dataset.dschat.dataset  # noqa: F401  ("dschat")
import realrl.impl.dataset.prompt  # noqa: F401  ("prompt")
import realrl.impl.dataset.prompt_answer  # noqa: F401  ("prompt_answer")
import realrl.impl.dataset.rw_paired  # noqa: F401  ("rw_paired")
import realrl.impl.dataset.toy  # noqa: F401  (the embedded toy task: "toy_sentiment" reward)
import realrl.impl.envs.calculator  # noqa: F401  ("calc" environment)
import realrl.impl.interface.dpo_interface  # noqa: F401  ("dpo")
import realrl.impl.interface.generation_interface  # noqa: F401  ("generation")
import realrl.impl.interface.group_filter  # noqa: F401  ("group_filter")
import realrl.impl.interface.opd_reward  # noqa: F401  ("opd_reward")
import realrl.impl.interface.ppo_actor  # noqa: F401  ("ppo_actor", "grpo_actor")
import realrl.impl.interface.ppo_advantages  # noqa: F401  ("ppo_advantages")
import realrl.impl.interface.ppo_critic  # noqa: F401  ("ppo_critic")
import realrl.impl.interface.reward_plugin  # noqa: F401  ("reward_fn")
import realrl.impl.interface.rule_reward  # noqa: F401  ("word_sentiment")
import realrl.impl.interface.rw_interface  # noqa: F401  ("paired_rw")
import realrl.impl.interface.sft_interface  # noqa: F401  ("sft")
import realrl.impl.model.backend.backends  # noqa: F401  (train / inference / null backends)
import realrl.impl.model.nn.factory  # noqa: F401  ("real_model" and "null" models)
import realrl.impl.rewards  # noqa: F401  (math_answer / gsm8k / exact_match / regex_match / format / combined)
