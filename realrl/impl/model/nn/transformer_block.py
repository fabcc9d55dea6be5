"""One pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x))."""

from __future__ import annotations

import torch
from torch import nn

from realrl.api.core.model_api import ReaLModelConfig
from realrl.impl.model.modules.mlp import MLP
from realrl.impl.model.modules.norm import RMSNorm, make_norm
from realrl.impl.model.modules.rotary import apply_rotary


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

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None, ctx) -> torch.Tensor:
        T = x.shape[0]
        q = self.q(x).view(T, self.n_q, self.head_dim)
        k = self.k(x).view(T, self.n_kv, self.head_dim)
        v = self.v(x).view(T, self.n_kv, self.head_dim)
        if self.qk_layernorm:
            q, k = self.q_ln(q), self.k_ln(k)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        out = ctx.attend(self.layer_idx, q, k, v, self.scale, self.window)
        return self.o(out.reshape(T, self.n_q * self.head_dim))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ReaLModelConfig, layer_idx: int, dtype=None, device=None):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.attn_ln = make_norm(cfg.layer_norm_type, cfg.hidden_dim, cfg.layer_norm_epsilon, **kw)
        self.attn = Attention(cfg, layer_idx, **kw)
        self.mlp_ln = make_norm(cfg.layer_norm_type, cfg.hidden_dim, cfg.layer_norm_epsilon, **kw)
        self.mlp = MLP(
            cfg.hidden_dim,
            cfg.intermediate_dim,
            cfg.mlp_type == "gated",
            cfg.activation_function,
            cfg.use_mlp_bias,
            **kw,
        )
        self.resid_drop = nn.Dropout(cfg.resid_pdrop)

    def forward(self, x: torch.Tensor, rope, ctx) -> torch.Tensor:
        x = x + self.resid_drop(self.attn(self.attn_ln(x), rope, ctx))
        return x + self.resid_drop(self.mlp(self.mlp_ln(x)))
