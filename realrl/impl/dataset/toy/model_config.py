"""The embedded tasks' tiny llama-family decoders: one ``ReaLModelConfig`` field dict (what the
"real_model" factory takes as ``config=``) over a task's word-level vocabulary, sized per task."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from realrl.impl.dataset.toy.word_tokenizer import BOS, EOS, PAD


@dataclasses.dataclass(frozen=True)
class DecoderShape:
    """What sets a task's decoder apart (all have 4 heads, RMSNorm, a gated SiLU MLP, no tying)."""

    n_layers: int
    hidden_dim: int
    intermediate_dim: int


def tiny_decoder_config(
    shape: DecoderShape, tokens: Sequence[str], n_positions: int, **extra: Any
) -> dict[str, Any]:
    """The decoder of ``shape`` over the vocabulary ``tokens`` (its special tokens' ids read from
    it); ``extra`` fields (a Mixture of Experts) come last."""
    return {
        "n_layers": shape.n_layers,
        "n_q_heads": 4,
        "n_kv_heads": 4,
        "hidden_dim": shape.hidden_dim,
        "intermediate_dim": shape.intermediate_dim,
        "vocab_size": len(tokens),
        "n_positions": n_positions,
        "layer_norm_type": "rms",
        "mlp_type": "gated",
        "activation_function": "silu",
        "tied_embedding": False,
        "bos_token_id": tokens.index(BOS),
        "eos_token_id": tokens.index(EOS),
        "pad_token_id": tokens.index(PAD),
        **extra,
    }
