"""Layer 3: one file per algorithm, turning its config into a list of MFCDef.

Importing this package registers the quickstart experiments sft, rw, dpo, ppo, grpo, rloo,
reinforce_pp, remax, gen and opd (with its teacher's phases opd_teacher_sft and opd_teacher),
and the embedded tasks.
"""

import realrl.experiments.critic_free  # noqa: F401
import realrl.experiments.dpo  # noqa: F401
import realrl.experiments.gen  # noqa: F401
import realrl.experiments.grpo  # noqa: F401
import realrl.experiments.opd  # noqa: F401
import realrl.experiments.opd_teacher  # noqa: F401
import realrl.experiments.ppo  # noqa: F401
import realrl.experiments.rw  # noqa: F401
import realrl.experiments.sft  # noqa: F401
import realrl.experiments.tasks  # noqa: F401
