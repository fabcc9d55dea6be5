"""The keys of the ``opd`` graph, defined once for the experiment (in the master, which imports
no torch) and the ``opd_reward`` interface (in the workers)."""

from __future__ import annotations

from realrl.api.core.key_spec import KeyKind, register_key_spec

STUDENT_LOGPROBS = "packed_student_logprobs"  # the student's forward on its own samples
TEACHER_LOGPROBS = "packed_teacher_logprobs"  # the teacher's forward on the same tokens
# what ``compute_adv`` reads (plus ``rewards`` when a task reward is watched) and writes
OPD_INPUTS = ("packed_input_ids", "prompt_mask", STUDENT_LOGPROBS, TEACHER_LOGPROBS)
OPD_OUTPUTS = ("advantages", "ppo_loss_mask", "opd_rewards")
# what the student's update reads: the PPO actor's keys, the teacher's log-probs standing in for
# the reference's (read only by a KL loss term, ppo.kl_loss_coef > 0)
OPD_TRAIN_KEYS = ("packed_input_ids", "packed_logprobs", TEACHER_LOGPROBS, "advantages", "ppo_loss_mask")

for _name in (STUDENT_LOGPROBS, TEACHER_LOGPROBS, "opd_rewards"):
    register_key_spec(_name, KeyKind.TOKEN_MINUS_ONE, "float32")
