"""Argument checks shared by the verifiable rewards."""

from __future__ import annotations

from typing import Any


def references(name: str, completions: list[str], metadata: dict[str, Any], key: str) -> list[str]:
    """The per-completion reference answers from the samples' metadata, as strings.

    A missing key is an error that says how to pass it: the reward reads dataset row fields only
    when the dataset forwards them (``dataset.metadata_keys``).
    """
    if key not in metadata or metadata[key] is None:
        given = sorted(k for k in metadata if metadata[k] is not None)
        raise ValueError(
            f"reward {name!r} needs the reference answers in metadata key {key!r}, but the samples carry "
            f"{given or 'no metadata'}; give every dataset row an {key!r} field and set "
            f"dataset.metadata_keys=[{key}]"
        )
    refs = metadata[key]
    if isinstance(refs, (str, bytes)) or not hasattr(refs, "__len__"):
        raise ValueError(
            f"reward {name!r}: metadata {key!r} must be a list with one reference per completion, "
            f"got {type(refs).__name__}"
        )
    refs = list(refs)
    if len(refs) != len(completions):
        raise ValueError(
            f"reward {name!r}: {len(refs)} references in metadata {key!r} for {len(completions)} completions"
        )
    out = []
    for i, ref in enumerate(refs):
        if ref is None or isinstance(ref, bool) or not isinstance(ref, (str, int, float)):
            raise ValueError(
                f"reward {name!r}: reference {i} in metadata {key!r} must be a string or a number, got {ref!r}"
            )
        out.append(str(ref))
    return out


def check_lengths(name: str, prompts: list[str], completions: list[str]) -> None:
    if len(prompts) != len(completions):
        raise ValueError(f"reward {name!r}: {len(prompts)} prompts for {len(completions)} completions")
