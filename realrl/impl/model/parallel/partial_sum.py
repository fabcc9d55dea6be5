"""The two reductions a block needs when each tp rank computes one part of a sum (Megatron-LM's
``f`` and ``g``): ``reduce_parts`` adds the parts in forward, ``summed_gradient`` adds the parts
of a gradient in backward.

A Mixture-of-Experts block split over the tp ranks (its experts split by tensor parallelism, or
placed whole by expert parallelism) computes on every rank its part of the block's output from
whole, replicated inputs. ``reduce_parts`` is the all-reduce that makes the output whole; its
backward hands the output's (replicated) gradient to every part unchanged, as a row-parallel
layer's does. Each replicated input that fed only this rank's part then has a partial gradient;
``summed_gradient`` on that input, an identity in forward, sums it over the ranks in backward so
every rank holds the whole gradient, as one worker would.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from realrl.impl.model.parallel.mesh import comm_device


def all_reduced(t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """A new tensor: ``t`` summed over ``group`` (``t`` itself stays as autograd saved it)."""
    total = t.to(comm_device(group), copy=True).contiguous()
    dist.all_reduce(total, group=group)
    return total.to(t.device)


class _ReduceParts(torch.autograd.Function):
    @staticmethod
    def forward(ctx, part: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        return all_reduced(part, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _SummedGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_reduced(grad, ctx.group), None


def reduce_parts(part: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The sum of every rank's ``part`` (forward); the gradient passes to each part unchanged."""
    return _ReduceParts.apply(part, group)


def summed_gradient(t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``t`` unchanged (forward); its gradient summed over ``group`` (backward). Without
    gradients it is ``t`` itself and communicates nothing."""
    if not (torch.is_grad_enabled() and t.requires_grad):
        return t
    return _SummedGradient.apply(t, group)
