"""``combined`` (also ``weighted_sum``): a weighted sum of other reward functions, e.g.
correctness plus a small format bonus."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from realrl.api.core.model_api import get_reward_fn, register_reward_fn, registered_reward_fns
from realrl.impl.rewards.common import check_lengths

_PART_KEYS = {"name", "weight", "kwargs"}


def _weight(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"combined: the weight of {name!r} must be a finite number, got {value!r}")
    return float(value)


def _resolve(name: Any) -> Callable[..., list[float]]:
    if not isinstance(name, str) or not name:
        raise ValueError(f"combined: a reward name must be a non-empty string, got {name!r}")
    if ":" in name:  # module:function or file.py:function, as the reward_fn option takes
        from realrl.impl.interface.reward_plugin import resolve_reward_fn

        return resolve_reward_fn(name)
    if name not in registered_reward_fns():
        raise ValueError(
            f"combined: unknown reward function {name!r}; registered: {', '.join(registered_reward_fns())} "
            "(or name one as package.module:function)"
        )
    return get_reward_fn(name)


def parse_parts(rewards: Any) -> list[tuple[str, float, dict[str, Any], Callable[..., list[float]]]]:
    """``rewards`` as ``[(name, weight, kwargs, fn)]``: from a mapping ``{name: weight}`` or a list
    of ``{name, weight=1.0, kwargs={}}`` mappings. Every name is resolved before any is called."""
    parts: list[tuple[str, float, dict[str, Any]]] = []
    if isinstance(rewards, Mapping):
        parts = [(name, _weight(name, w), {}) for name, w in rewards.items()]
    elif isinstance(rewards, Sequence) and not isinstance(rewards, (str, bytes)):
        for i, part in enumerate(rewards):
            if not isinstance(part, Mapping) or "name" not in part:
                raise ValueError(f"combined: rewards[{i}] must be a mapping with a 'name', got {part!r}")
            unknown = sorted(set(part) - _PART_KEYS)
            if unknown:
                raise ValueError(
                    f"combined: rewards[{i}] has unknown keys {unknown}; allowed: {sorted(_PART_KEYS)}"
                )
            kwargs = part.get("kwargs") or {}
            if not isinstance(kwargs, Mapping):
                raise ValueError(f"combined: rewards[{i}].kwargs must be a mapping, got {kwargs!r}")
            parts.append((part["name"], _weight(part["name"], part.get("weight", 1.0)), dict(kwargs)))
    else:
        raise ValueError(
            "combined needs reward_fn_kwargs.rewards: a mapping {name: weight} or a list of "
            f"{{name, weight, kwargs}} mappings, got {rewards!r}"
        )
    if not parts:
        raise ValueError("combined: reward_fn_kwargs.rewards is empty; name at least one reward function")
    return [(name, weight, kwargs, _resolve(name)) for name, weight, kwargs in parts]


def combined_reward(
    prompts: list[str], completions: list[str], *, rewards: Any = None, **shared: Any
) -> list[float]:
    """sum_i weight_i * reward_i(prompts, completions, **shared, **kwargs_i).

    ``rewards``: ``{name: weight}`` or ``[{name, weight, kwargs}]``; a name is a registered
    reward function or ``module:function``. ``shared`` (the samples' metadata, such as ``answer``,
    and the other ``reward_fn_kwargs``) goes to every part; a part's own ``kwargs`` override it.
    """
    check_lengths("combined", prompts, completions)
    total = [0.0] * len(completions)
    for name, weight, kwargs, fn in parse_parts(rewards):
        scores = list(fn(prompts, completions, **{**shared, **kwargs}))
        if len(scores) != len(completions):
            raise ValueError(
                f"combined: reward {name!r} returned {len(scores)} scores for {len(completions)} completions"
            )
        total = [t + weight * float(s) for t, s in zip(total, scores)]
    return total


register_reward_fn("combined", combined_reward)
register_reward_fn("weighted_sum", combined_reward)
