"""Loading a local Hugging Face tokenizer with realrl's pad-token rules: ``load_hf_tokenizer``.

Re-exported by ``realrl.api.core.data_api`` (the stable import path).
"""

from __future__ import annotations

from realrl.base import logging

logger = logging.getLogger("tokenizer")


def load_hf_tokenizer(
    path: str,
    fast: bool = True,
    padding_side: str | None = None,
    distinct_pad_token: bool = False,
    pad_token: str = "<|pad|>",
):
    """Load a local Hugging Face tokenizer (never from a hub at run time).

    Pad-token handling follows "The N Implementation Details of RLHF with PPO" (general detail 2,
    "Pad with a special padding token"): realrl's batches are packed, so the
    pad token is only used by padded collators. With ``distinct_pad_token=True`` a tokenizer whose
    pad is missing or equal to EOS gets a new special token ``pad_token`` (the caller must resize
    the embeddings to ``len(tokenizer)``), so padding can never be mistaken for a real EOS when a
    reward is read at the last non-pad token. Otherwise a missing pad becomes EOS, and pad == EOS
    (set here or saved with the tokenizer) is never silent: it is logged as a warning.
    """
    import transformers

    if padding_side not in (None, "left", "right"):
        raise ValueError(f"padding_side must be 'left', 'right' or None, got {padding_side!r}")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(
            path, use_fast=fast, trust_remote_code=False, local_files_only=True
        )
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load a tokenizer from {path!r}: {e}") from e
    if padding_side is not None:
        tok.padding_side = padding_side
    pad_is_eos = tok.pad_token_id is not None and tok.pad_token_id == tok.eos_token_id
    if distinct_pad_token and (tok.pad_token_id is None or pad_is_eos):
        n_before = len(tok)
        tok.add_special_tokens({"pad_token": pad_token})
        if tok.pad_token_id == tok.eos_token_id:
            raise ValueError(f"tokenizer at {path!r}: pad token {pad_token!r} is the EOS token; pick another")
        if len(tok) > n_before:
            logger.info(
                "tokenizer at %s: added pad token %r (id %d); resize the model's embeddings to %d",
                path,
                pad_token,
                tok.pad_token_id,
                len(tok),
            )
    elif tok.pad_token_id is None:
        if tok.eos_token is None:
            raise ValueError(f"tokenizer at {path!r} has neither a pad nor an EOS token")
        logger.warning(
            "tokenizer at %s has no pad token; using EOS (%r) for padded batches. Pass "
            "distinct_pad_token=True if you read rewards from padded batches.",
            path,
            tok.eos_token,
        )
        tok.pad_token = tok.eos_token
    elif pad_is_eos:
        logger.warning(
            "tokenizer at %s uses EOS (%r) as its pad token; in padded batches a real EOS looks like "
            "padding. Pass distinct_pad_token=True if you read rewards from padded batches.",
            path,
            tok.eos_token,
        )
    return tok
