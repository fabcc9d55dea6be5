"""How a batch is cut into micro-batches: ``MicroBatchSpec``.

Re-exported by ``realrl.api.core.data_api`` (the stable import path).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class MicroBatchSpec:
    """At least ``n_mbs`` token-balanced pieces, none over ``max_tokens_per_mb`` tokens
    unless a single sample alone is larger."""

    n_mbs: int = 1
    max_tokens_per_mb: int | None = None

    def __post_init__(self) -> None:
        if self.n_mbs < 1:
            raise ValueError(f"MicroBatchSpec.n_mbs must be >= 1, got {self.n_mbs}")
        if self.max_tokens_per_mb is not None and self.max_tokens_per_mb < 1:
            raise ValueError(
                f"MicroBatchSpec.max_tokens_per_mb must be >= 1 or None, got {self.max_tokens_per_mb}"
            )
