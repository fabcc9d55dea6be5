"""One pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x)); the MLP is dense, or a
Mixture of Experts in the blocks the config makes sparse (``nn/moe.py``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from realrl.api.core.model_api import ReaLModelConfig
from realrl.impl.model.kernels import DecodeWeights
from realrl.impl.model.modules.mlp import MLP
from realrl.impl.model.modules.norm import RMSNorm, make_norm
from realrl.impl.model.modules.rotary import apply_rotary
from realrl.impl.model.nn.compiled_blocks import mark_token_dim
from realrl.impl.model.nn.lora import is_adapter_layer
from realrl.impl.model.nn.moe import MoE
from realrl.impl.model.parallel.dtensor import is_dtensor


class Attention(nn.Module):
    """Projections, optional per-head q/k RMSNorm (qwen3), rotary; the context does the attending."""

    def __init__(self, cfg: ReaLModelConfig, layer_idx: int, dtype=None, device=None):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_q, self.n_kv, self.head_dim = cfg.n_q_heads, cfg.n_kv_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.window = cfg.sliding_window
        kw = dict(dtype=dtype, device=device)
        self.q = nn.Linear(cfg.hidden_dim, self.n_q * self.head_dim, bias=cfg.use_attention_bias, **kw)
        self.k = nn.Linear(cfg.hidden_dim, self.n_kv * self.head_dim, bias=cfg.use_attention_bias, **kw)
        self.v = nn.Linear(cfg.hidden_dim, self.n_kv * self.head_dim, bias=cfg.use_attention_bias, **kw)
        self.o = nn.Linear(self.n_q * self.head_dim, cfg.hidden_dim, bias=cfg.use_attn_proj_bias, **kw)
        if cfg.qk_layernorm:
            self.q_ln = RMSNorm(self.head_dim, cfg.layer_norm_epsilon, **kw)
            self.k_ln = RMSNorm(self.head_dim, cfg.layer_norm_epsilon, **kw)
        self.qk_layernorm = cfg.qk_layernorm

    def qkv(self, x: torch.Tensor, cache: DecodeWeights | None) -> torch.Tensor:
        """[T, (hq + 2 hkv) d]: fused into one matmul, or three linears running their own forward
        (sharded under tensor parallelism: the heads of this rank only; or LoRA layers)."""
        if any(map(own_forward, (self.q, self.k, self.v))):
            return torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1)
        return project(x, cache, self, self.fused_qkv)

    def fused_qkv(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One [q; k; v] projection: a single matmul instead of three (differentiable)."""
        w = torch.cat([self.q.weight, self.k.weight, self.v.weight])
        b = None if self.q.bias is None else torch.cat([self.q.bias, self.k.bias, self.v.bias])
        return w, b

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        ctx,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[T, hidden] -> [T, hidden]; with ``keep`` (token indices), only those rows come out:
        every token still serves as a key and value, the output projection runs on ``keep``."""
        T, hq, hkv, d = x.shape[0], self.n_q, self.n_kv, self.head_dim
        qkv = self.qkv(x, ctx.weight_cache).view(T, hq + 2 * hkv, d)
        # split, not slicing: a slice's backward zero-fills the whole input and copies into it
        qk, v = qkv.split([hq + hkv, hkv], dim=1)
        if self.qk_layernorm:
            q, k = qk.split([hq, hkv], dim=1)
            qk = torch.cat([self.q_ln(q), self.k_ln(k)], dim=1)
        if rope is not None:  # q and k rotate together: one set of ops for both
            qk = apply_rotary(qk, *rope)
        q, k = qk.split([hq, hkv], dim=1)
        if torch.compiler.is_compiling():  # the kernels run eagerly, behind a graph break
            out = eager_attend(ctx, self, q, k, v, keep)
        elif keep is None:
            out = ctx.attend(self.layer_idx, q, k, v, self.scale, self.window)
        else:
            out = ctx.attend(self.layer_idx, q, k, v, self.scale, self.window, keep)
        return linear(out.reshape(out.shape[0], hq * d), ctx.weight_cache, self.o)


@torch.compiler.disable
def eager_attend(ctx, attn: Attention, q, k, v, keep) -> torch.Tensor:
    """``ctx.attend`` outside any compiled region (``nn/compiled_blocks.py``): the C and CUDA
    attention kernels are opaque to Dynamo, and eager they give the eager model's exact result.
    The layer's index is read here, not in the traced code, where Dynamo would make it a constant
    and compile every block once more."""
    if keep is None:
        out = ctx.attend(attn.layer_idx, q, k, v, attn.scale, attn.window)
    else:
        out = ctx.attend(attn.layer_idx, q, k, v, attn.scale, attn.window, keep)
    mark_token_dim(out)  # the compiled rest of the block takes any token count
    return out


def run_moe(moe: MoE, h: torch.Tensor, ctx, attn: Attention) -> torch.Tensor:
    """The sparse MLP; the context carries where routing is recorded, or replayed from."""
    routing, log = getattr(ctx, "routing", None), getattr(ctx, "router_log", None)
    return moe(h, log, routing, attn.layer_idx)


# A compiled block runs its Mixture of Experts eagerly: the expert slices' sizes are read on the
# host (data-dependent shapes: a graph break and a recompile per new set of sizes), and routing
# is recorded into Python objects
@torch.compiler.disable
def eager_moe(moe: MoE, h: torch.Tensor, ctx, attn: Attention) -> torch.Tensor:
    out = run_moe(moe, h, ctx, attn)
    mark_token_dim(out)
    return out


def own_forward(module: nn.Module) -> bool:
    """Whether this linear must run through its own forward rather than its weight alone: a
    tensor-parallel plan made its weight a DTensor (the forward's hooks lay inputs and outputs
    out over the mesh), or it is a LoRA layer (``W`` alone misses the adapters, nn/lora.py)."""
    return is_dtensor(module.weight) or is_adapter_layer(module)


def linear(x: torch.Tensor, cache: DecodeWeights | None, module: nn.Module) -> torch.Tensor:
    """``module(x)``; through the decoding weights (``project``) unless it runs its own forward."""
    if own_forward(module):
        return module(x)
    return project(x, cache, module, _plain(module))


def project(x: torch.Tensor, cache: DecodeWeights | None, module: nn.Module, build) -> torch.Tensor:
    """``x @ W.T + b`` for ``(W, b) = build()``: rebuilt each call (training, prefill: gradients
    reach the parameters), or with a ``cache`` (a decoding context's ``weight_cache``) prepared
    once per generate call (``kernels.DecodeWeights``)."""
    if cache is None:
        w, b = build()
        return F.linear(x, w, b)
    return cache.linear(x, module, build)


def gate_up(h: torch.Tensor, cache: DecodeWeights | None, mlp: MLP) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated MLP's two projections.

    Training and prefill (no cache, many rows): two matmuls with contiguous outputs. Chunking one
    fused [T, 2I] output leaves strided views, and the activation, the product and their backward
    on those ran ~30% slower on CPU than the second matmul dispatch costs (toy RM step, T=2.5k,
    I=256). Decoding (a cache, a few rows): one fused matmul, where dispatch is what counts.
    """
    if own_forward(mlp.gate) or own_forward(mlp.up):
        return mlp.gate(h), mlp.up(h)
    if cache is None:
        return F.linear(h, mlp.gate.weight, mlp.gate.bias), F.linear(h, mlp.up.weight, mlp.up.bias)
    return project(h, cache, mlp, mlp.fused_gate_up).chunk(2, dim=-1)


def _plain(linear: nn.Linear):
    return lambda: (linear.weight, linear.bias)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ReaLModelConfig, layer_idx: int, dtype=None, device=None):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.attn_ln = make_norm(cfg.layer_norm_type, cfg.hidden_dim, cfg.layer_norm_epsilon, **kw)
        self.attn = Attention(cfg, layer_idx, **kw)
        self.mlp_ln = make_norm(cfg.layer_norm_type, cfg.hidden_dim, cfg.layer_norm_epsilon, **kw)
        self.mlp: MLP | MoE
        if cfg.is_moe_layer(layer_idx):
            self.mlp = MoE(cfg, **kw)
        else:
            self.mlp = MLP(
                cfg.hidden_dim,
                cfg.intermediate_dim,
                cfg.mlp_type == "gated",
                cfg.activation_function,
                cfg.use_mlp_bias,
                **kw,
            )
        self.resid_drop = nn.Dropout(cfg.resid_pdrop)

    def forward(self, x: torch.Tensor, rope, ctx, keep: torch.Tensor | None = None) -> torch.Tensor:
        """With ``keep`` (token indices) the block returns only those rows: what the last layer
        needs when a loss reads a few positions (the attention still sees every token)."""
        attn = self.attn(self.attn_ln(x), rope, ctx, keep)
        x = (x if keep is None else ctx.rows(x, keep)) + self.resid_drop(attn)
        h, mlp = self.mlp_ln(x), self.mlp
        if isinstance(mlp, MoE):
            moe = eager_moe if torch.compiler.is_compiling() else run_moe
            return x + self.resid_drop(moe(mlp, h, ctx, self.attn))
        if mlp.gated:
            gate, up = gate_up(h, ctx.weight_cache, mlp)
            h = mlp.act(gate) * up
        else:
            h = mlp.act(linear(h, ctx.weight_cache, mlp.up))
        return x + self.resid_drop(linear(h, ctx.weight_cache, mlp.down))
