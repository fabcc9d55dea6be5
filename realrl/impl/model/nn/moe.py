"""The Mixture-of-Experts feed-forward block of Mixtral, Qwen2-MoE and Qwen3-MoE, over packed rows.

Routing, as transformers' ``MixtralSparseMoeBlock`` / ``Qwen2MoeSparseMoeBlock`` compute it:
router logits ``x W_r^T`` (no bias), probabilities by a softmax in fp32, each token's top-k
experts, their weights renormalised to sum to 1 when ``norm_topk_prob`` (Mixtral's router always
renormalises; its family sets the flag). A token's output is the weighted sum of its k experts'
outputs; Qwen2-MoE adds an always-on shared expert scaled by ``sigmoid(x w_g)``.

Grouped dispatch: the T*k (token, slot) pairs are sorted by expert, so each expert runs once on a
contiguous slice of gathered rows (a loop over experts, never over tokens) and the weighted
results go back to their tokens with ``index_add``. Under gradients every expert runs, an empty
slice too, so each has a gradient (zeros when no token came), as with transformers' stacked
expert tensors: an unused expert's optimizer state advances the same way on one replica as on
several (data-parallel sums give it zeros there). Without gradients (inference, decoding) only
the experts that received tokens run.

Experts are an ``nn.ModuleDict`` of gated MLPs keyed by their index (``mlp.experts.{e}.{gate,up,
down}``, the names an ``nn.ModuleList`` would give), not stacked [E, ...] tensors, because:
- conversion to and from Hugging Face is a rename: checkpoints store one tensor per expert and
  projection (what transformers 5 writes back from its fused in-memory layout, what older
  versions and vLLM read), so a rank reads just its slices of the files (``hf_io._sources``);
- tensor parallelism splits each expert as it splits the dense MLP, with the same torch styles
  (gate/up column-wise, down row-wise); expert parallelism keeps only a rank's own experts, under
  their global names, so the reallocation plan, which works on names and shapes, and checkpoint
  loading find each expert by name;
- LoRA adapters (injected by module name) reach the experts' projections unchanged.
A stacked layout would suit one grouped-GEMM kernel on GPUs.

Split over the tp ranks (``ExpertSplit``, set by ``parallel/tensor_parallel.py``). Activations
are whole on every tp rank (no sequence parallelism), so every rank holds every token: each rank
routes all of them with its whole copy of the router and computes its part of the output, and
one all-reduce over the tp group (``reduce_parts``, the communication of a row-parallel layer)
sums the parts. The part is:
- tensor parallelism: every expert, on this rank's slice of its inner dimension (its down
  projection's output left as a partial sum, not reduced expert by expert), plus the shared
  expert's slice;
- expert parallelism: this rank's whole experts ``[r E/m, (r+1) E/m)``, on the rows routed to
  them, plus the shared expert's slice (the shared expert is split as by tensor parallelism).
Weighting by the router and ``index_add`` are linear, so they apply to the parts before the one
reduction. No all-to-all is needed: a token's rows are already on the rank that holds its
expert. An all-to-all dispatch is what expert parallelism over data-parallel ranks needs, where
each rank holds different tokens; realrl does not build that.

Gradients: the output's gradient reaches every rank's part whole. The routing weights and the
shared gate feed only this rank's part, so their gradient is summed over the tp ranks
(``summed_gradient``) before it reaches the router: the router (replicated) then gets the
one-worker gradient on every rank, including the load-balancing loss's, which every rank computes
whole and which must not be counted once per rank. Whole experts' inputs get the same sum (a
column-parallel expert's inputs get it from its DTensor style). An expert's own gradient comes
from the rows routed to it only; without tokens it is zeros.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from torch import nn

from realrl.api.core.model_api import ReaLModelConfig
from realrl.impl.model.modules.mlp import MLP
from realrl.impl.model.nn.moe_stats import RouterLog
from realrl.impl.model.nn.router_replay import ExpertRouting, replay_choice
from realrl.impl.model.parallel.dtensor import summand
from realrl.impl.model.parallel.partial_sum import reduce_parts, summed_gradient

if TYPE_CHECKING:
    import torch.distributed as dist


@dataclasses.dataclass(frozen=True)
class ExpertSplit:
    """How a sparse block is divided over the tp ranks ``group``: what this rank computes is its
    part of the output. ``whole_experts``: expert parallelism (this rank's experts are plain, whole
    modules, their inputs' gradient summed here); else every expert is split by tensor parallelism."""

    group: dist.ProcessGroup
    whole_experts: bool


def routed_expert(cfg: ReaLModelConfig, dtype=None, device=None) -> MLP:
    """One routed expert: a gated MLP of ``moe_intermediate_dim`` without biases."""
    return MLP(cfg.hidden_dim, cfg.moe_intermediate_dim, True, cfg.activation_function, False, dtype, device)


class MoE(nn.Module):
    def __init__(self, cfg: ReaLModelConfig, dtype=None, device=None):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        hidden, act = cfg.hidden_dim, cfg.activation_function
        self.n_experts = cfg.n_experts
        self.top_k = cfg.n_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.router = nn.Linear(hidden, cfg.n_experts, bias=False, **kw)
        self.experts = nn.ModuleDict({str(e): routed_expert(cfg, **kw) for e in range(cfg.n_experts)})
        self.held = range(cfg.n_experts)  # the experts this module holds (expert parallelism: a range)
        self.split: ExpertSplit | None = None  # on one worker: the whole output here
        self.shared: MLP | None = None
        if cfg.shared_expert_intermediate_dim:
            self.shared = MLP(hidden, cfg.shared_expert_intermediate_dim, True, act, False, **kw)
            self.shared_gate = nn.Linear(hidden, 1, bias=False, **kw)

    def keep_experts(self, held: range) -> None:
        """Drop every expert outside ``held`` (expert parallelism: the others live on other ranks)."""
        for e in range(self.n_experts):
            if e not in held and str(e) in self.experts:
                del self.experts[str(e)]
        self.held = held

    def route(
        self, x: torch.Tensor, replayed: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(probabilities fp32 [T, E], the top-k weights fp32 [T, k], the top-k experts [T, k]).
        ``replayed`` (long [T, k], ``nn/router_replay.py``): these experts instead of the top-k
        (FREE rows keep theirs), weighted by the probabilities gathered there: differentiable."""
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if replayed is not None:
            chosen = replay_choice(chosen, replayed)
            weights = probs.gather(-1, chosen)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return probs, weights, chosen

    def forward(
        self,
        x: torch.Tensor,
        router_log: RouterLog | None = None,
        routing: ExpertRouting | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        """[T, hidden] -> [T, hidden]; ``router_log``: where a training forward records routing;
        ``routing``: the experts to replay and/or record for this block, sparse block ``layer``."""
        replayed = None if routing is None else routing.replayed(layer)
        probs, weights, chosen = self.route(x, replayed)
        if routing is not None:
            routing.record(layer, chosen)
        if router_log is not None:
            router_log.record(probs, chosen)
        group = None if self.split is None else self.split.group
        if group is not None:  # the weights (and the shared gate) feed this rank's part only
            weights = summed_gradient(weights, group)
        out = self.dispatch(x, weights, chosen)
        if self.shared is not None:
            gate = torch.sigmoid(self.shared_gate(x))
            if group is not None:
                gate = summed_gradient(gate, group)
            out = out + gate * summand(self.shared(x))
        return out if group is None else reduce_parts(out, group)

    def dispatch(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """sum_j weights[t, j] * expert_{chosen[t, j]}(x[t]) over the experts held here, for every
        token t, grouped by expert (split: this rank's part of the sum)."""
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)  # the (token, slot) pairs, expert by expert
        sizes = torch.bincount(flat, minlength=self.n_experts).tolist()  # one host read: slice sizes
        first, last = self.held.start, self.held.stop
        order = order[sum(sizes[:first]) : sum(sizes[:last])]  # the pairs of the experts held here
        token = torch.div(order, self.top_k, rounding_mode="floor")
        every = torch.is_grad_enabled()
        rows = x
        if self.split is not None and self.split.whole_experts:  # plain experts: sum their inputs' grad
            rows = summed_gradient(x, self.split.group)
        parts = [
            summand(self.experts[str(e)](r))
            for e, r in zip(self.held, rows[token].split(sizes[first:last]))
            if every or r.shape[0]
        ]
        out = torch.zeros_like(x)
        if not parts:  # no token for the experts here
            return out
        # the product in fp32 (Mixtral's weights stay fp32), added in the activations' dtype
        y = (torch.cat(parts) * weights.reshape(-1)[order, None]).to(x.dtype)
        return out.index_add(0, token, y)
