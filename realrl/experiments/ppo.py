"""The PPO dataflow graph (names as in ReaL, DESIGN §3)."""

from __future__ import annotations

from realrl.api.core.config import ModelInterfaceAbstraction
from realrl.api.core.data_api import MicroBatchSpec
from realrl.api.core.dfg import MFCDef, ModelInterfaceType

PPO_DATASET_KEYS = ("packed_prompts",)
ROLLOUT_KEYS = ("packed_input_ids", "packed_logprobs", "prompt_mask", "seq_no_eos_mask")


def ppo_mfcs(
    n_seqs: int,
    actor_interface: ModelInterfaceAbstraction | None = None,
    critic_interface: ModelInterfaceAbstraction | None = None,
    reward_interface: ModelInterfaceAbstraction | None = None,
    ref_interface: ModelInterfaceAbstraction | None = None,
    mb_specs: dict[str, MicroBatchSpec] | None = None,
) -> list[MFCDef]:
    """actor_gen -> {rew_inf, ref_inf, critic_inf} -> {actor_train, critic_train}."""
    actor = actor_interface or ModelInterfaceAbstraction("ppo_actor")
    critic = critic_interface or ModelInterfaceAbstraction("ppo_critic")
    reward = reward_interface or ModelInterfaceAbstraction("paired_rw")
    ref = ref_interface or actor
    mb = mb_specs or {}

    def mfc(name, model, type_, impl, inputs, outputs, log=False):
        return MFCDef(
            name=name,
            model_name=model,
            interface_type=type_,
            interface_impl=impl,
            n_seqs=n_seqs,
            input_keys=inputs,
            output_keys=outputs,
            mb_spec=mb.get(name, MicroBatchSpec()),
            log_return_value=log,
        )

    train_inputs = ROLLOUT_KEYS + ("packed_ref_logprobs", "rewards", "values")
    return [
        mfc("actor_gen", "actor", ModelInterfaceType.GENERATE, actor, ("packed_prompts",), ROLLOUT_KEYS),
        mfc("rew_inf", "reward", ModelInterfaceType.INFERENCE, reward, ("packed_input_ids",), ("rewards",)),
        mfc(
            "ref_inf",
            "ref",
            ModelInterfaceType.INFERENCE,
            ref,
            ("packed_input_ids",),
            ("packed_ref_logprobs",),
        ),
        mfc(
            "critic_inf",
            "critic",
            ModelInterfaceType.INFERENCE,
            critic,
            ("packed_input_ids", "seq_no_eos_mask"),
            ("values",),
        ),
        mfc("actor_train", "actor", ModelInterfaceType.TRAIN_STEP, actor, train_inputs, (), log=True),
        mfc("critic_train", "critic", ModelInterfaceType.TRAIN_STEP, critic, train_inputs, (), log=True),
    ]
