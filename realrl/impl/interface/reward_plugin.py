"""``reward_fn``: any Python function as the reward node (ReaL's custom reward, made simple).

``fn(prompts: list[str], completions: list[str], **metadata) -> list[float]`` is named by a
``register_reward_fn`` name, ``package.module:function`` or ``path/to/file.py:function``, and is
called in batches on the worker that holds the data. Metadata keys of the dataset's samples are
passed per sequence; ``fn_kwargs`` are passed to every call. An exception, a wrong length, or a
value that is not a finite number stops the run with a ``RewardFunctionError`` that carries the
plugin's traceback and the offending sample ids.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import traceback
from collections.abc import Callable
from typing import Any

import torch

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import Model, ModelInterface, get_reward_fn, register_interface
from realrl.base.plugins import load_attribute
from realrl.impl.interface.common import INPUT_KEY, per_sequence_sample, require_keys
from realrl.impl.interface.texts import prompts_and_completions


class RewardFunctionError(RuntimeError):
    """A reward plugin raised or returned something that is not one finite number per sample."""


def resolve_reward_fn(spec: str) -> Callable[..., list[float]]:
    """A registered name, ``package.module:function`` or ``file.py:function``."""
    if ":" not in spec:
        return get_reward_fn(spec)
    try:
        fn = load_attribute(spec)
    except Exception as e:  # noqa: BLE001 - re-raised with the spec that failed
        raise RewardFunctionError(f"cannot load reward function {spec!r}: {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise RewardFunctionError(f"reward function {spec!r} resolves to {fn!r}, which is not callable")
    return fn


def check_scores(spec: str, scores: Any, ids: list, where: str) -> list[float]:
    """One finite real number per sequence, or a ``RewardFunctionError`` naming the samples."""
    if isinstance(scores, torch.Tensor):
        scores = scores.tolist()
    try:
        scores = list(scores)
    except TypeError:
        raise RewardFunctionError(
            f"reward function {spec!r} returned {type(scores).__name__}, not a list of floats ({where}; ids {ids})"
        ) from None
    if len(scores) != len(ids):
        raise RewardFunctionError(
            f"reward function {spec!r} returned {len(scores)} scores for {len(ids)} completions ({where}; ids {ids})"
        )
    bad = [
        (i, s)
        for i, s in zip(ids, scores)
        if isinstance(s, bool) or not isinstance(s, numbers.Real) or not math.isfinite(float(s))
    ]
    if bad:
        shown = ", ".join(f"{i!r}: {s!r}" for i, s in bad[:10])
        raise RewardFunctionError(
            f"reward function {spec!r} returned values that are not finite numbers for sample ids [{shown}]"
            f"{' ...' if len(bad) > 10 else ''} ({where})"
        )
    return [float(s) for s in scores]


def call_reward_fn(
    fn: Callable,
    spec: str,
    prompts: list[str],
    completions: list[str],
    ids: list,
    kwargs: dict[str, Any],
    where: str,
) -> list[float]:
    try:
        scores = fn(prompts, completions, **kwargs)
    except Exception as e:  # noqa: BLE001 - the plugin's own error, re-raised with context
        tb = traceback.format_exc()
        raise RewardFunctionError(
            f"reward function {spec!r} raised {type(e).__name__}: {e} ({where}; sample ids {ids})\n"
            f"--- plugin traceback ---\n{tb}"
        ) from e
    return check_scores(spec, scores, ids, where)


@dataclasses.dataclass
class RewardFunctionInterface(ModelInterface):
    fn: str = "word_sentiment"
    fn_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    batch_size: int = 256
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"reward_fn.batch_size must be >= 1, got {self.batch_size}")
        self._fn = resolve_reward_fn(self.fn)

    def score_texts(
        self, prompts: list[str], completions: list[str], ids: list, metadata: dict[str, list]
    ) -> list[float]:
        """Call the plugin in batches of ``batch_size``; metadata lists are per sequence."""
        clash = sorted(set(metadata) & set(self.fn_kwargs))
        if clash:
            raise ValueError(f"reward_fn: fn_kwargs {clash} clash with metadata keys of the samples")
        out: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            sl = slice(start, start + self.batch_size)
            kwargs = {**self.fn_kwargs, **{k: v[sl] for k, v in metadata.items()}}
            where = f"batch of sequences {start}..{min(start + self.batch_size, len(prompts)) - 1}"
            out.extend(
                call_reward_fn(self._fn, self.fn, prompts[sl], completions[sl], ids[sl], kwargs, where)
            )
        return out

    def inference(self, model: Model, data: SequenceSample, mb_spec: MicroBatchSpec | None = None):
        """``rewards``: one score per sequence of ``packed_input_ids``."""
        require_keys(data, (INPUT_KEY,), "reward_fn.inference")
        ids, prompts, completions = prompts_and_completions(data, model.tokenizer, self.skip_special_tokens)
        n_per_sample = [len(r) for r in data.seqlens[INPUT_KEY]]
        metadata = {
            k: [v for v, n in zip(vals, n_per_sample) for _ in range(n)] for k, vals in data.metadata.items()
        }
        scores = self.score_texts(prompts, completions, ids, metadata)
        return per_sequence_sample(data, "rewards", torch.tensor(scores, dtype=torch.float32))


register_interface("reward_fn", RewardFunctionInterface)
