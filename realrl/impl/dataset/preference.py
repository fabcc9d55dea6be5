"""Preference rows -> (chosen ids, rejected ids) pairs, following TRL's ``RewardTrainer._prepare_dataset``.

A row is one of:
- pre-tokenized: ``chosen_ids``/``rejected_ids`` (or the older ``chosen_input_ids``/
  ``rejected_input_ids``) -- used as they are, never re-tokenized;
- text: ``chosen``/``rejected`` strings, EOS appended unless already there, an explicit
  ``prompt`` prepended, then ``tokenizer(text)``;
- conversational: lists of ``{role, content}`` messages (prompt + chosen) through the chat template.
Several pairs per prompt: the same fields holding equal-length lists of the above.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from realrl.impl.dataset.errors import DataError, check_token_ids, get_field
from realrl.impl.dataset.tokenize import BatchTokenizer, check_messages, is_conversational, tokenize


@dataclasses.dataclass(frozen=True)
class PreferenceFields:
    prompt: str = "prompt"
    chosen: str = "chosen"
    rejected: str = "rejected"
    margin: str = "margin"

    def ids_names(self) -> list[tuple[str, str]]:
        """Pre-tokenized column names, newest spelling first (TRL renames the legacy ones)."""
        return [
            (f"{self.chosen}_ids", f"{self.rejected}_ids"),
            (f"{self.chosen}_input_ids", f"{self.rejected}_input_ids"),
        ]


def _is_ids(x: Any) -> bool:
    """One sequence of ids (checked element by element later), not a list of sequences."""
    return isinstance(x, list) and not (x and isinstance(x[0], list))


def _as_list_of_pairs(chosen: Any, rejected: Any, single: Any, fields: tuple[str, str], where: str):
    """One pair, or several when both fields hold lists of items; ``single(x)`` tells an item."""
    if single(chosen) and single(rejected):
        return [(chosen, rejected)]
    if (
        isinstance(chosen, list)
        and isinstance(rejected, list)
        and chosen
        and all(map(single, chosen + rejected))
    ):
        if len(chosen) != len(rejected):
            raise DataError(
                f"{where}: fields {fields[0]!r} and {fields[1]!r} hold {len(chosen)} and {len(rejected)} "
                "answers; several pairs per prompt must be one-to-one"
            )
        return list(zip(chosen, rejected))
    raise DataError(
        f"{where}: fields {fields[0]!r}/{fields[1]!r} must both be one answer or equal-length lists of "
        f"answers of one kind, got {type(chosen).__name__} and {type(rejected).__name__}"
    )


def _ids_names(row: dict, fields: PreferenceFields) -> tuple[str, str] | None:
    """The pre-tokenized columns this row has, if any."""
    for c_name, r_name in fields.ids_names():
        if c_name in row and r_name in row:
            return c_name, r_name
    return None


def _pretokenized_pairs(
    row: dict, where: str, fields: PreferenceFields
) -> list[tuple[list[int], list[int]]] | None:
    names = _ids_names(row, fields)
    if names is None:
        return None
    c_name, r_name = names
    c, r = get_field(row, c_name, list, where), get_field(row, r_name, list, where)
    pairs = _as_list_of_pairs(c, r, _is_ids, (c_name, r_name), where)
    return [(check_token_ids(a, c_name, where), check_token_ids(b, r_name, where)) for a, b in pairs]


def _answers(row: dict, where: str, fields: PreferenceFields) -> tuple[Any, Any, Any]:
    chosen = get_field(row, fields.chosen, (str, list), where)
    rejected = get_field(row, fields.rejected, (str, list), where)
    return chosen, rejected, row.get(fields.prompt)


def _is_chat(chosen: Any) -> bool:
    return is_conversational(chosen) or (
        isinstance(chosen, list) and bool(chosen) and is_conversational(chosen[0])
    )


def _pair_texts(
    chosen: Any, rejected: Any, prompt: Any, eos: str | None, where: str, fields: PreferenceFields
) -> list[tuple[str, str]]:
    """Text answers: (prompt + chosen + EOS, prompt + rejected + EOS) per pair, EOS not doubled."""
    pairs = _as_list_of_pairs(
        chosen, rejected, lambda x: isinstance(x, str), (fields.chosen, fields.rejected), where
    )
    if prompt is not None and not isinstance(prompt, str):
        raise DataError(
            f"{where}: field {fields.prompt!r} must be text like {fields.chosen!r}, got {type(prompt).__name__}"
        )
    if eos is None:
        raise ValueError("the tokenizer has no EOS token; preference text needs one appended")
    return [(_text(prompt, c, eos), _text(prompt, r, eos)) for c, r in pairs]


def _text(prompt: str | None, answer: str, eos: str) -> str:
    """TRL's text: the explicit prompt, then the answer with EOS appended unless already there."""
    return (prompt or "") + (answer if answer.endswith(eos) else answer + eos)


def _text_pairs(tok: BatchTokenizer, row: dict, where: str, fields: PreferenceFields):
    chosen, rejected, prompt = _answers(row, where, fields)
    if _is_chat(chosen):
        pairs = _as_list_of_pairs(
            chosen, rejected, is_conversational, (fields.chosen, fields.rejected), where
        )
        if prompt is not None and not is_conversational(prompt):
            raise DataError(f"{where}: field {fields.prompt!r} must be chat messages like {fields.chosen!r}")
        prefix = check_messages(prompt, fields.prompt, where) if prompt is not None else []
        out = []
        for c, r in pairs:
            check_messages(c, fields.chosen, where)
            check_messages(r, fields.rejected, where)
            try:
                out.append((tokenize(tok, prefix + c), tokenize(tok, prefix + r)))
            except DataError as e:
                raise DataError(f"{where}: fields {fields.chosen!r}/{fields.rejected!r}: {e}") from e
        return out
    texts = _pair_texts(chosen, rejected, prompt, tok.eos_token, where, fields)
    return [(tok(c), tok(r)) for c, r in texts]


def preference_texts(row: dict, fields: PreferenceFields, eos: str | None) -> list[str]:
    """The texts ``preference_pairs`` will likely tokenize for a text row, read without checks
    (the builder checks): what ``BatchTokenizer.prefetch`` reads ahead; none for other rows."""
    prompt = row.get(fields.prompt)
    if eos is None or (prompt is not None and not isinstance(prompt, str)) or _ids_names(row, fields):
        return []
    texts = []
    for side in (row.get(fields.chosen), row.get(fields.rejected)):
        answers = [side] if isinstance(side, str) else side if isinstance(side, list) else []
        texts.extend(_text(prompt, a, eos) for a in answers if isinstance(a, str))
    return texts


def preference_pairs(
    tok: BatchTokenizer, row: dict, where: str, fields: PreferenceFields = PreferenceFields()
) -> list[tuple[list[int], list[int]]]:
    """All (chosen, rejected) token-id pairs of one row, before any length filter."""
    pairs = _pretokenized_pairs(row, where, fields)
    return pairs if pairs is not None else _text_pairs(tok, row, where, fields)


def _is_finite_number(x: Any) -> bool:
    """A JSON number a float holds: not NaN or infinite, and no integer beyond float's range."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def preference_margins(row: dict, where: str, fields: PreferenceFields, n_pairs: int) -> list[float]:
    """One margin per pair: a number (one pair) or a list of numbers (several pairs)."""
    m = get_field(row, fields.margin, (float, list), where)
    margins = m if isinstance(m, list) else [m]
    if len(margins) != n_pairs or not all(_is_finite_number(x) for x in margins):
        raise DataError(
            f"{where}: field {fields.margin!r} must hold {n_pairs} finite number(s), one per pair, got {m!r:.60}"
        )
    return [float(x) for x in margins]
