"""Small helpers every interface shares: masks, per-sequence views, output samples, saving."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_api import Model
from realrl.impl.model.backend.integrity import CheckpointError, remove_path, replace_dir
from realrl.impl.model.utils.functional import (
    gather_packed_shifted_log_probs,
    masked_shifted_log_probs,
    predicting_tokens,
    shifted_token_mask,
)
from realrl.impl.model.utils.ppo_functional import response_loss_mask

INPUT_KEY = "packed_input_ids"
T = TypeVar("T")


def coerce_config(cls: type[T], value: T | dict[str, Any] | None, what: str) -> T:
    """A dataclass from itself, a dict of its fields (hydra / JSON args) or None (defaults)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"{what}: unknown option(s) {unknown}; known: {sorted(known)}")
        return cls(**value)
    raise TypeError(f"{what}: expected {cls.__name__} or dict, got {type(value).__name__}")


def require_keys(data: SequenceSample, keys: tuple[str, ...], where: str) -> None:
    if data.data is None:
        raise ValueError(f"{where}: the input is metadata only (ids {data.ids[:4]}...)")
    missing = [k for k in keys if k not in data.keys or data.data[k] is None]
    if missing:
        raise ValueError(f"{where}: input lacks key(s) {missing} (has {sorted(data.keys)})")


def cu_seqlens_on(data: SequenceSample, device: torch.device | str, key: str = INPUT_KEY) -> torch.Tensor:
    return data.cu_seqlens(key).to(device)


def answer_loss_mask(data: SequenceSample, device: torch.device | str | None = None) -> torch.Tensor:
    """bool [T - B]: predict token j + 1 where it is not a prompt token; every token without a
    ``prompt_mask`` key."""
    ids = data.data[INPUT_KEY]
    device = device or ids.device
    cu = cu_seqlens_on(data, device)
    if "prompt_mask" in data.keys and data.data["prompt_mask"] is not None:
        return response_loss_mask(data.data["prompt_mask"].to(device), cu)
    return torch.ones(ids.shape[0] - (cu.shape[0] - 1), dtype=torch.bool, device=device)


def packed_logprobs(
    logits: torch.Tensor, mb: SequenceSample, temperature: float = 1.0, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``packed_logprobs`` alignment [T - B] from a micro-batch's logits, divided by
    ``temperature`` ("The N Implementation Details of RLHF with PPO", policy detail 1, "Scale the
    logits by sampling temperature").

    With ``mask`` [T - B], ``logits`` are those of the forward at ``logprob_index(mask)`` only,
    and the entries outside the mask are 0: a loss that reads only masked entries loses nothing.
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    ids = mb.data[INPUT_KEY].to(logits.device)
    cu = cu_seqlens_on(mb, logits.device)
    if mask is None:
        return gather_packed_shifted_log_probs(logits, cu, ids)
    return masked_shifted_log_probs(logits, cu, ids, mask.to(logits.device).bool())


def logprob_index(
    mask_fn: Callable[[SequenceSample], torch.Tensor],
) -> Callable[[SequenceSample], torch.Tensor]:
    """An engine ``output_index_fn``: the tokens whose logits predict the entries where
    ``mask_fn(mb)`` [T - B] is set. The last layer and the LM head then skip every other token
    (the prompt of a policy-gradient or SFT loss, each sequence's last token)."""

    def index(mb: SequenceSample) -> torch.Tensor:
        mask = mask_fn(mb).bool()
        return predicting_tokens(cu_seqlens_on(mb, mask.device))[mask]

    return index


def scalar_output(output: torch.Tensor) -> torch.Tensor:
    """A critic / reward head's output as float [T] (accepts [T] or [T, 1])."""
    if output.dim() == 2 and output.shape[-1] == 1:
        output = output.squeeze(-1)
    if output.dim() != 1:
        raise ValueError(f"expected a scalar head output [T] or [T, 1], got shape {tuple(output.shape)}")
    return output.float()


def drop_last_token(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Per-token [T] -> token-minus-one [T - B] by dropping each sequence's last entry."""
    return x[shifted_token_mask(cu_seqlens)]


def sequence_ids(data: SequenceSample, key: str = INPUT_KEY) -> list[Hashable]:
    """One entry per sequence: the id of the sample it belongs to (``id`` or ``id#k``)."""
    out: list[Hashable] = []
    for sid, lens in zip(data.ids, data.seqlens[key]):
        out.extend([sid] if len(lens) == 1 else [f"{sid}#{k}" for k in range(len(lens))])
    return out


def per_sequence_sample(
    data: SequenceSample, key: str, values: torch.Tensor, ref_key: str = INPUT_KEY
) -> SequenceSample:
    """A ``SequenceSample`` holding one value of ``key`` per sequence of ``ref_key``."""
    return _sample_like(data, key, values, [[1] * len(row) for row in data.seqlens[ref_key]])


def token_minus_one_sample(data: SequenceSample, key: str, values: torch.Tensor) -> SequenceSample:
    """A ``SequenceSample`` holding ``key`` with L - 1 entries per sequence of ``packed_input_ids``."""
    return _sample_like(data, key, values, [[max(n - 1, 0) for n in row] for row in data.seqlens[INPUT_KEY]])


def token_sample(data: SequenceSample, key: str, values: torch.Tensor) -> SequenceSample:
    """A ``SequenceSample`` holding ``key`` with L entries per sequence of ``packed_input_ids``."""
    return _sample_like(data, key, values, [list(row) for row in data.seqlens[INPUT_KEY]])


def _sample_like(
    data: SequenceSample, key: str, values: torch.Tensor, seqlens: list[list[int]]
) -> SequenceSample:
    """``values`` as key ``key`` of a sample with ``data``'s ids and the given lengths."""
    return SequenceSample(
        keys={key},
        trailing_shapes={key: tuple(values.shape[1:])},
        dtypes={key: values.dtype},
        ids=list(data.ids),
        seqlens={key: seqlens},
        data={key: values},
    )


def save_model(model: Model, save_dir: str, extra: dict[str, Any] | None = None) -> None:
    """HF-format weights through the engine (or module), the tokenizer, and ``extra`` as JSON
    files (``{name}.json``) beside them, e.g. the reward normalisation.

    Everything goes into ``<save_dir>.tmp`` first, which then replaces ``save_dir`` by renames:
    a crash or a failed write (full or read-only disk) leaves the previous folder whole, and a
    folder under the final name always holds weights, tokenizer and extras together.

    Every rank of a sharded model calls it (the weights are gathered collectively); only the
    engine's writing rank (``is_writer``) touches the folder."""
    target = model.module
    if not hasattr(target, "save_pretrained"):
        raise TypeError(f"model {model.name}: {type(target).__name__} offers no save_pretrained(dir)")
    writer = getattr(target, "is_writer", True)
    save_dir = os.path.abspath(save_dir.rstrip("/"))
    tmp = save_dir + ".tmp"
    if writer:
        remove_path(tmp)  # left by a crash
    try:
        target.save_pretrained(tmp)  # a collective when sharded: every rank comes here first
        if not writer:
            return
        if model.tokenizer is not None and hasattr(model.tokenizer, "save_pretrained"):
            model.tokenizer.save_pretrained(tmp)
        for name, value in (extra or {}).items():
            with open(os.path.join(tmp, f"{name}.json"), "w") as f:
                json.dump(value, f, indent=2)
        replace_dir(tmp, save_dir)
    except Exception as e:
        if writer:
            remove_path(tmp)
        raise CheckpointError(
            f"model {model.name}: cannot write its checkpoint {save_dir} ({type(e).__name__}: {e}); "
            "the previous one there, if any, is unchanged"
        ) from e


def mean_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    """Average a list of stat dicts key by key (keys missing from some dicts average the rest)."""
    out: dict[str, list[float]] = {}
    for s in stats:
        for k, v in s.items():
            out.setdefault(k, []).append(float(v))
    return {k: sum(v) / len(v) for k, v in out.items()}
