"""Layer 2: implementations. Importing this package registers them by name."""

import realrl.impl.dataset  # noqa: E402, F401  (prompt_answer / rw_paired / prompt / dschat datasets)
import realrl.impl.dataset.toy  # noqa: E402, F401  (the embedded toy task: "toy_sentiment" reward)
import realrl.impl.interface  # noqa: E402, F401  (sft / paired_rw / dpo / ppo_actor / grpo_actor / ppo_critic / generation / reward_fn)
import realrl.impl.model  # noqa: E402, F401  (ReaLModel, "real_model" / "null" models)
import realrl.impl.model.backend  # noqa: E402, F401  (train / inference / null backends)
import realrl.impl.rewards  # noqa: E402, F401  (math_answer / gsm8k / exact_match / regex_match / format / combined)
