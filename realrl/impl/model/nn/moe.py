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

Experts are an ``nn.ModuleList`` of gated MLPs (``mlp.experts.{e}.{gate,up,down}``), not
stacked [E, ...] tensors, because:
- conversion to and from Hugging Face is a rename: checkpoints store one tensor per expert and
  projection (what transformers 5 writes back from its fused in-memory layout, what older
  versions and vLLM read), so a rank reads just its slices of the files (``hf_io._sources``);
- tensor parallelism splits each expert as it splits the dense MLP, with the same torch styles
  (gate/up column-wise, down row-wise); expert parallelism places whole experts on ranks, and
  every parameter's name says which expert it is, so the reallocation plan, which works on names
  and shapes, needs nothing new;
- LoRA adapters (injected by module name) reach the experts' projections unchanged.
A stacked layout would suit one grouped-GEMM kernel on GPUs; that can come with expert
parallelism, where each rank's experts are few.
"""

from __future__ import annotations

import torch
from torch import nn

from realrl.api.core.model_api import ReaLModelConfig
from realrl.impl.model.modules.mlp import MLP
from realrl.impl.model.nn.moe_stats import RouterLog


class MoE(nn.Module):
    def __init__(self, cfg: ReaLModelConfig, dtype=None, device=None):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        hidden, act = cfg.hidden_dim, cfg.activation_function
        self.n_experts = cfg.n_experts
        self.top_k = cfg.n_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.router = nn.Linear(hidden, cfg.n_experts, bias=False, **kw)
        self.experts = nn.ModuleList(
            MLP(hidden, cfg.moe_intermediate_dim, True, act, False, **kw) for _ in range(cfg.n_experts)
        )
        self.shared: MLP | None = None
        if cfg.shared_expert_intermediate_dim:
            self.shared = MLP(hidden, cfg.shared_expert_intermediate_dim, True, act, False, **kw)
            self.shared_gate = nn.Linear(hidden, 1, bias=False, **kw)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(probabilities fp32 [T, E], the top-k weights fp32 [T, k], the top-k experts [T, k])."""
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return probs, weights, chosen

    def forward(self, x: torch.Tensor, router_log: RouterLog | None = None) -> torch.Tensor:
        """[T, hidden] -> [T, hidden]; ``router_log``: where a training forward records routing."""
        probs, weights, chosen = self.route(x)
        if router_log is not None:
            router_log.record(probs, chosen)
        out = self.dispatch(x, weights, chosen)
        if self.shared is not None:
            out = out + torch.sigmoid(self.shared_gate(x)) * self.shared(x)
        return out

    def dispatch(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """sum_j weights[t, j] * expert_{chosen[t, j]}(x[t]) for every token t, grouped by expert."""
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)  # the (token, slot) pairs, expert by expert
        token = torch.div(order, self.top_k, rounding_mode="floor")
        sizes = torch.bincount(flat, minlength=self.n_experts).tolist()  # one host read: slice sizes
        every = torch.is_grad_enabled()
        parts = [
            expert(rows)
            for expert, rows in zip(self.experts, x[token].split(sizes))
            if every or rows.shape[0]
        ]
        if not parts:  # no token at all
            return torch.zeros_like(x)
        # the product in fp32 (Mixtral's weights stay fp32), added in the activations' dtype
        y = (torch.cat(parts) * weights.reshape(-1)[order, None]).to(x.dtype)
        return torch.zeros_like(x).index_add(0, token, y)
