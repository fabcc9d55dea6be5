"""Length rules of SequenceSample keys: per token, per token minus one, or per sequence.

Declared here once (the key contract: docs/datasets.md) instead of hard-coded tables; plugins add
their own keys with ``register_key_spec``. Re-exported by ``realrl.api.core.data_api`` (the stable
import path).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from realrl.api.core.dtype_names import dtype_name
from realrl.base.registry import Registry


class KeyKind(str, enum.Enum):
    TOKEN = "token"  # one entry per token: length L
    TOKEN_MINUS_ONE = "token_minus_one"  # one entry per next-token prediction: length L - 1
    SEQUENCE = "sequence"  # one entry per sequence: length 1


@dataclasses.dataclass(frozen=True)
class KeySpec:
    """How a key's per-sequence length follows from the sequence's token count L."""

    name: str
    kind: KeyKind
    dtype: str  # a dtype name (realrl.api.core.dtype_names): metadata needs no torch
    trailing_shape: tuple[int, ...] = ()

    def length(self, n_tokens: int) -> int:
        if self.kind is KeyKind.TOKEN:
            return n_tokens
        if self.kind is KeyKind.TOKEN_MINUS_ONE:
            return max(n_tokens - 1, 0)
        return 1


_KEY_SPECS: Registry[KeySpec] = Registry("key spec")


def register_key_spec(
    name: str,
    kind: KeyKind | str,
    dtype: Any,
    trailing_shape: tuple[int, ...] = (),
) -> KeySpec:
    """Declare a key's length rule so ``from_default`` and every consumer agree on it. ``dtype``:
    a ``torch.dtype`` or its name (stored as the name)."""
    spec = KeySpec(name, KeyKind(kind), dtype_name(dtype), tuple(trailing_shape))
    return _KEY_SPECS.register(name, spec)


def get_key_spec(name: str) -> KeySpec:
    return _KEY_SPECS.get(name)


def registered_keys() -> list[str]:
    return _KEY_SPECS.names()


for _name, _kind, _dtype in [
    ("packed_prompts", KeyKind.TOKEN, "int64"),
    ("packed_input_ids", KeyKind.TOKEN, "int64"),
    ("prompt_mask", KeyKind.TOKEN, "bool"),
    ("greedy_input_ids", KeyKind.TOKEN, "int64"),  # ReMax's baseline answers
    ("greedy_prompt_mask", KeyKind.TOKEN, "bool"),
    ("values", KeyKind.TOKEN, "float32"),
    ("old_values", KeyKind.TOKEN, "float32"),
    ("packed_logprobs", KeyKind.TOKEN_MINUS_ONE, "float32"),
    ("packed_ref_logprobs", KeyKind.TOKEN_MINUS_ONE, "float32"),
    ("advantages", KeyKind.TOKEN_MINUS_ONE, "float32"),
    ("returns", KeyKind.TOKEN_MINUS_ONE, "float32"),
    ("ppo_loss_mask", KeyKind.TOKEN_MINUS_ONE, "bool"),
    ("kl_rewards", KeyKind.TOKEN_MINUS_ONE, "float32"),
    ("rewards", KeyKind.SEQUENCE, "float32"),
    ("baseline_rewards", KeyKind.SEQUENCE, "float32"),
    ("env_rewards", KeyKind.SEQUENCE, "float32"),  # a multi-turn trajectory's summed step rewards
    ("seq_no_eos_mask", KeyKind.SEQUENCE, "bool"),
]:
    register_key_spec(_name, _kind, _dtype)
