"""Router replay: a forward's sparse blocks record their top-k experts, or take given ones.

"Stabilizing MoE Reinforcement Learning by Aligning Training and Inference Routers" (R3, 2025):
the experts a Mixture-of-Experts policy routes a token to can differ between the decoder and the
trainer's forward of the same tokens (other kernels, batch shapes, precision: a near-tie of two
router scores flips), and a flipped expert changes the token's log-prob far more than rounding
does. Recording the decoder's choices and replaying them in the trainer's forwards removes that
part of the training-inference mismatch. The gate weights still come from the trainer's router:
its probabilities gathered at the replayed experts (renormalised where the family renormalises),
so the router keeps its gradient.

How it travels: a forward is handed one ``ExpertRouting`` on its attention context (the object
every block already receives; ``PackedContext.routing`` / ``DecodeContext.routing``), never through
global state. Replayed experts are int ``[rows, n_sparse_blocks, top_k]``, one row per token the
context computes, the sparse blocks in layer order (``ReaLModelConfig.moe_layers``). A row of
``FREE`` (-1) routes that token by its own top-k: a token no decoder ran (an answer's last token,
which is sampled but never fed back; a multi-turn observation).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ROUTED_KEY = "routed_experts"  # the batch key that carries a recording to the trainer's forwards
FREE = -1  # a replayed row of this value: the token routes itself
# the dtype of a recorded routing (the ``routed_experts`` key): fits 32767 experts, a quarter of int64
ROUTED_DTYPE = torch.int16


class ExpertRouting:
    """One forward's replayed experts (``replay``, int [rows, n_sparse, k]) and/or the record of
    the experts its sparse blocks chose (``record=True``). ``sparse_layers``: the model's sparse
    blocks in order (a pipeline stage's blocks keep their global indices)."""

    def __init__(
        self, sparse_layers: Sequence[int], replay: torch.Tensor | None = None, record: bool = False
    ) -> None:
        self.column = {layer: j for j, layer in enumerate(sparse_layers)}
        if replay is not None and (replay.dim() != 3 or replay.shape[1] != len(self.column)):
            raise ValueError(
                f"replayed experts must be [tokens, {len(self.column)} sparse blocks, top_k]; got "
                f"{tuple(replay.shape)}"
            )
        self.replay = replay
        self.recorded: dict[int, torch.Tensor] | None = {} if record else None

    def replayed(self, layer: int) -> torch.Tensor | None:
        """long [rows, k]: the experts block ``layer`` takes (FREE rows route themselves); None: route."""
        if self.replay is None:
            return None
        return self.replay[:, self.column[layer]].long()

    def record(self, layer: int, chosen: torch.Tensor) -> None:
        """Keep block ``layer``'s experts [rows, k] (when recording)."""
        if self.recorded is not None:
            self.recorded[layer] = chosen.to(ROUTED_DTYPE)

    def stacked(self) -> torch.Tensor:
        """The record as [rows, n_sparse, k], the blocks in layer order."""
        if self.recorded is None or len(self.recorded) != len(self.column):
            raise RuntimeError("a routing record needs every sparse block's experts")
        return torch.stack([self.recorded[layer] for layer in self.column], dim=1)


def replay_choice(topk_chosen: torch.Tensor, replayed: torch.Tensor | None) -> torch.Tensor:
    """The experts a block uses: ``replayed`` where given, the router's own top-k on FREE rows."""
    if replayed is None:
        return topk_chosen
    if replayed.shape != topk_chosen.shape:
        raise ValueError(
            f"replayed experts {tuple(replayed.shape)} do not match the block's routing "
            f"{tuple(topk_chosen.shape)} (tokens, top_k)"
        )
    replayed = replayed.to(topk_chosen.device)
    free = replayed[:, :1] < 0
    return torch.where(free, topk_chosen, replayed)


def free_rows(n: int, n_sparse: int, top_k: int, device=None) -> torch.Tensor:
    """[n, n_sparse, k] of FREE: tokens without a record."""
    return torch.full((n, n_sparse, top_k), FREE, dtype=ROUTED_DTYPE, device=device)
