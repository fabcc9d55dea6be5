"""The router's load-balancing loss and the experts' load, from a Mixture-of-Experts forward.

The auxiliary loss of "Switch Transformers: Scaling to Trillion Parameter Models with Simple and
Efficient Sparsity" (Fedus et al., equations 4-6), as transformers' ``load_balancing_loss_func``
computes it for top-k routing. Over the T tokens of one call and its L sparse blocks, with E
experts:

    f_e = (top-k assignments of tokens to expert e, summed over the blocks) / (L T)   (no gradient)
    P_e = (router probabilities of expert e, summed over tokens and blocks) / (L T)
    aux = E * sum_e f_e P_e

Uniform routing gives aux = k (top-k); the more a few experts take, the larger it is. Packed
batches hold no padding, so every token counts (transformers masks its padding instead).

How it travels: a packed forward that records gradients hands its sparse blocks a ``RouterLog``
(on the attention context every block already receives); each block records its router
probabilities and choices; ``ReaLModel.forward`` attaches the resulting ``RouterStats`` to the
tensor it returns. Pipeline stages send their blocks' records on with the activations (``pack``,
``extend``), so the last stage's output carries the statistics of every block. Its value is the logits as before (a dense model's output is untouched), and a
loss function adds ``coef * aux`` with ``add_router_aux_loss``: the interface decides where the
term enters (before PPO's early stop zeroes a micro-batch, for one).
"""

from __future__ import annotations

import dataclasses

import torch

_ATTR = "router_stats"  # the attribute of a forward's output that holds its RouterStats


@dataclasses.dataclass
class RouterStats:
    """What one forward's routing adds to a loss and to the statistics."""

    aux_loss: torch.Tensor  # scalar, differentiable through the router probabilities
    load: torch.Tensor  # [sparse blocks, E]: fraction of the tokens each expert received
    coef: float  # the model's router_aux_loss_coef

    def as_stats(self) -> dict[str, float]:
        """``moe_load_*``: the least and most loaded expert over every sparse block; uniform
        routing gives top_k / n_experts for both."""
        return {
            "moe_aux_loss": float(self.aux_loss.detach()),
            "moe_load_min": float(self.load.min()),
            "moe_load_max": float(self.load.max()),
        }


class RouterLog:
    """Per-call record of the sparse blocks' routing. ``row_weights``: how many of the call's
    tokens each computed row stands for (shared-prefix packing computes a shared prompt once);
    None: one each.

    Not a dataclass, on purpose: FSDP2 rebuilds every dataclass among a unit's arguments that
    holds a tensor requiring gradients (``dataclasses.replace``, to hook those tensors), so the
    blocks after the first would record into copies of a dataclass log (their probabilities
    lost to the aux loss). This object passes through as it is."""

    def __init__(self, n_experts: int, row_weights: torch.Tensor | None = None) -> None:
        self.n_experts = n_experts
        self.row_weights = row_weights
        self.counts: list[torch.Tensor] = []  # per block [E]
        self.prob_sums: list[torch.Tensor] = []  # per block [E]
        self.n_tokens: list[torch.Tensor] = []  # per block, scalar

    def record(self, probs: torch.Tensor, chosen: torch.Tensor) -> None:
        """``probs`` fp32 [rows, E] (softmax of the router logits); ``chosen`` long [rows, k]."""
        w = self.row_weights
        k = chosen.shape[-1]
        if w is None:
            counts = torch.bincount(chosen.reshape(-1), minlength=self.n_experts).float()
            prob_sum = probs.sum(0)
            n = torch.tensor(float(probs.shape[0]), device=probs.device)
        else:
            w = w.to(device=probs.device, dtype=probs.dtype)
            counts = torch.bincount(
                chosen.reshape(-1), weights=w.repeat_interleave(k), minlength=self.n_experts
            )
            prob_sum = (probs * w[:, None]).sum(0)
            n = w.sum()
        self.counts.append(counts.detach().float())
        self.prob_sums.append(prob_sum)
        self.n_tokens.append(n)

    def pack(self) -> torch.Tensor:
        """Every block's record as one ``[blocks, 2 E + 1]`` tensor (counts, probability sums,
        tokens), what a pipeline stage sends the next so the last can take the loss over every
        block; differentiable through the probability sums."""
        return torch.cat(
            [torch.stack(self.counts), torch.stack(self.prob_sums), torch.stack(self.n_tokens)[:, None]],
            dim=1,
        )

    def extend(self, packed: torch.Tensor) -> None:
        """Add the records of ``pack()``'s tensor (earlier stages' blocks) to this log."""
        e = self.n_experts
        for row in packed:
            self.counts.append(row[:e].detach())
            self.prob_sums.append(row[e : 2 * e])
            self.n_tokens.append(row[2 * e].detach())

    def stats(self, coef: float) -> RouterStats | None:
        """None when no sparse block recorded anything."""
        if not self.counts:
            return None
        counts = torch.stack(self.counts)  # [L, E]
        n = self.n_tokens[0]  # every block sees the same tokens
        total = n * len(self.counts)
        f = counts.sum(0) / total
        p = torch.stack(self.prob_sums).sum(0) / total
        aux = self.n_experts * (f * p).sum()
        load = counts / n.clamp(min=1)
        return RouterStats(aux, load, coef)


def attach_router_stats(output: torch.Tensor, stats: RouterStats | None) -> torch.Tensor:
    """``output`` itself, carrying ``stats`` (read back with ``router_stats_of``)."""
    if stats is not None:
        setattr(output, _ATTR, stats)
    return output


def router_stats_of(output: torch.Tensor) -> RouterStats | None:
    """The routing statistics of the forward that produced ``output`` (None: a dense model, a
    forward without gradients, or a tensor computed from the output rather than the output)."""
    return getattr(output, _ATTR, None)


def add_router_aux_loss(
    loss: torch.Tensor, stats: dict[str, float], output: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """``loss + coef * aux`` and the statistics with ``moe_aux_loss``, ``moe_load_min``,
    ``moe_load_max`` and ``moe_task_loss`` (the loss without the routing term) added, when
    ``output`` carries routing statistics; else both unchanged (dense models)."""
    routed = router_stats_of(output)
    if routed is None:
        return loss, stats
    total = loss + routed.coef * routed.aux_loss.to(loss.dtype)
    return total, {**stats, "moe_task_loss": float(loss.detach()), **routed.as_stats()}
