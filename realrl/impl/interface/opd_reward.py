"""``opd_reward``: on-policy distillation's per-token reward and advantages ("On-Policy
Distillation", Thinking Machines Lab 2025; verl's distillation trainer).

The ``compute_adv`` call of the ``opd`` graph. On the student's own samples, each answer token's
reward is minus the reverse KL to the teacher, estimated on the sampled token:

    r_t = -kl_coef * (log pi_student(y_t | y_<t) - log pi_teacher(y_t | y_<t))

and the advantage is its discounted sum (``discount``, 0 by default: A_t = r_t, no critic), so the
PPO update the actor already has (``ppo_actor.train_step``) raises the tokens the teacher likes
more than the student does and lowers the others. With teacher == student every reward is 0.
"""

from __future__ import annotations

import dataclasses

import torch

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import Model, ModelInterface, register_interface
from realrl.impl.interface.common import INPUT_KEY, require_keys, token_minus_one_sample
from realrl.impl.interface.opd_keys import OPD_INPUTS, STUDENT_LOGPROBS, TEACHER_LOGPROBS
from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.advantages import packed_discounted_returns


def opd_token_rewards(
    student: torch.Tensor, teacher: torch.Tensor, loss_mask: torch.Tensor, kl_coef: float = 1.0
) -> torch.Tensor:
    """[T - N]: -kl_coef * (student - teacher) on answer entries, 0 elsewhere (the k1 estimate
    of the reverse KL on the sampled token, negated)."""
    return -kl_coef * (student.float() - teacher.float()) * loss_mask.float()


def opd_advantages(rewards: torch.Tensor, cu_seqlens: torch.Tensor, discount: float = 0.0) -> torch.Tensor:
    """[T - N]: the per-token rewards summed forward with ``discount`` within each answer."""
    if discount == 0.0:
        return rewards.clone()
    return packed_discounted_returns(rewards, F.short_cu_seqlens(cu_seqlens), discount)


@dataclasses.dataclass
class OPDRewardInterface(ModelInterface):
    kl_coef: float = 1.0  # the reverse KL's weight in the reward
    discount: float = 0.0  # 0: each token's advantage is its own reward
    adv_norm: bool = False  # whiten the advantages over the batch (the blog does not)

    def __post_init__(self) -> None:
        if self.kl_coef <= 0:
            raise ValueError(f"teacher_kl_coef must be > 0, got {self.kl_coef}")
        if not 0 <= self.discount <= 1:
            raise ValueError(f"ppo.discount must be in [0, 1], got {self.discount}")

    def inference(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        require_keys(data, OPD_INPUTS, "opd_reward.inference")
        ids = data.data[INPUT_KEY]
        cu = data.cu_seqlens(INPUT_KEY).to(ids.device)
        mask = F.response_loss_mask(data.data["prompt_mask"], cu)
        student, teacher = data.data[STUDENT_LOGPROBS], data.data[TEACHER_LOGPROBS]
        rewards = opd_token_rewards(student, teacher, mask, self.kl_coef)
        advantages = opd_advantages(rewards, cu, self.discount)
        if self.adv_norm:
            advantages = F.whiten(advantages, shift_mean=True, mask=mask)
        n, n_tok = cu.shape[0] - 1, mask.float().sum().clamp(min=1)
        reverse_kl = -rewards / self.kl_coef
        stats = {
            "reverse_kl": float(reverse_kl.sum() / n_tok),  # per answer token, nats
            "reverse_kl_per_answer": float(reverse_kl.sum() / n),
            "advantage_mean": float((advantages * mask).sum() / n_tok),
            "response_length": float(mask.float().sum() / n),
        }
        if "rewards" in data.keys:  # a task reward, watched only: it does not enter the advantages
            stats["task_reward"] = float(data.data["rewards"].float().mean())
        out = token_minus_one_sample(data, "advantages", advantages.float())
        out.update_(token_minus_one_sample(data, "ppo_loss_mask", mask))
        out.update_(token_minus_one_sample(data, "opd_rewards", rewards))
        return out, stats


register_interface("opd_reward", OPDRewardInterface)
