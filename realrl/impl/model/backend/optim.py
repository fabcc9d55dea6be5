"""AdamW (PyTorch- or TensorFlow-style epsilon) and the optimizer factory.

"The N Implementation Details of RLHF with PPO" (section "PyTorch Adam optimizer numerical issues
w.r.t RLHF") gives both update rules:

    pytorch:     theta -= lr / (1 - b1^t) * m_t / (sqrt(v_t) / sqrt(1 - b2^t) + eps)
    tensorflow:  theta -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m_t / (sqrt(v_t) + eps)

Rewritten over the raw moments, PyTorch's effective epsilon is ``eps * sqrt(1 - b2^t)``, which is
much smaller than TensorFlow's ``eps`` in early steps, so early PyTorch updates are larger.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from realrl.impl.model.backend.config import OptimizerConfig
from realrl.impl.model.parallel.dtensor import is_dtensor


class AdamW(torch.optim.Optimizer):
    """Adam with decoupled weight decay, written out so the epsilon rule is visible."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        tf_style_eps: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, tf_style_eps=tf_style_eps
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = int(state["step"].item())
                m, v = state["exp_avg"], state["exp_avg_sq"]

                p.mul_(1 - lr * group["weight_decay"])  # decoupled weight decay (AdamW)
                m.lerp_(p.grad, 1 - beta1)  # m_t = b1 m_{t-1} + (1 - b1) g
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)  # v_t = b2 v_{t-1} + (1 - b2) g^2
                bias_correction1 = 1 - beta1**t
                bias_correction2 = 1 - beta2**t
                if group["tf_style_eps"]:
                    lr_t = lr * math.sqrt(bias_correction2) / bias_correction1
                    denom = v.sqrt().add_(eps)
                    p.addcdiv_(m, denom, value=-lr_t)
                else:
                    step_size = lr / bias_correction1
                    denom = (v.sqrt() / math.sqrt(bias_correction2)).add_(eps)
                    p.addcdiv_(m, denom, value=-step_size)
        return loss


def param_groups(module: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only: biases and norm gains (1-D parameters) are not decayed. Under tensor
    parallelism sharded (DTensor) and whole parameters go in separate groups: ``foreach`` kernels
    take one kind at a time."""
    groups: dict[tuple[bool, bool], list] = {}
    for p in module.parameters():
        if p.requires_grad:
            groups.setdefault((p.ndim >= 2, is_dtensor(p)), []).append(p)
    return [
        {"params": params, "weight_decay": weight_decay if decay else 0.0}
        for (decay, _), params in sorted(groups.items(), key=lambda kv: (not kv[0][0], kv[0][1]))
    ]


def build_optimizer(module: torch.nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """PyTorch-style epsilon uses ``torch.optim.AdamW``: fused (one kernel over all parameters;
    torch picks it by itself nowhere) when every parameter is a plain float tensor on CPU or CUDA,
    else ``foreach`` (sharded DTensor parameters). The same update up to fp32 rounding; on the toy model's CPU step 0.6 ms instead
    of 1.6 ms (foreach) or ~2.4 ms (per-parameter loop). The TensorFlow-style epsilon uses
    ``AdamW`` above."""
    groups = param_groups(module, cfg.weight_decay)
    if not groups:
        raise ValueError(f"{type(module).__name__} has no trainable parameters to optimize")
    if cfg.tf_style_eps:
        return AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, tf_style_eps=True)
    params = [p for g in groups for p in g["params"]]
    fused = all(
        p.is_floating_point() and p.device.type in ("cpu", "cuda") and not is_dtensor(p) for p in params
    )
    kind = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kind)
