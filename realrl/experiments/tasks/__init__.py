"""The embedded tasks (``task=<name>`` with no dataset path): importing this package registers
them. ``sentiment`` is the default; ``arith`` is arithmetic with reference answers; ``calc`` is
multi-step arithmetic with a calculator tool (multi-turn)."""

from realrl.experiments.tasks.arith import ARITH
from realrl.experiments.tasks.base import (
    DEFAULT_TASK,
    EmbeddedTask,
    Recipe,
    final_checkpoint,
    get_task,
    has_checkpoint,
    register_task,
    task_names,
)
from realrl.experiments.tasks.calc import CALC
from realrl.experiments.tasks.sentiment import SENTIMENT

__all__ = [
    "ARITH",
    "CALC",
    "DEFAULT_TASK",
    "SENTIMENT",
    "EmbeddedTask",
    "Recipe",
    "final_checkpoint",
    "get_task",
    "has_checkpoint",
    "register_task",
    "task_names",
]
