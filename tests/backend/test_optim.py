"""AdamW update rules ("The N Implementation Details of RLHF with PPO", "PyTorch Adam optimizer
numerical issues"), weight decay, LR schedules (same post, general detail 5) and config validation."""

from __future__ import annotations

import math

import pytest
import torch

from realrl.impl.model.backend.config import OptimizerConfig
from realrl.impl.model.backend.lr_schedule import LRScheduler, lr_factor
from realrl.impl.model.backend.optim import AdamW, build_optimizer

BETAS = (0.9, 0.999)


def grad_sequence(n: int, shape=(4, 3)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=g) * 1e-3 for _ in range(n)]


def run(opt_cls, grads, **kw) -> list[torch.Tensor]:
    """Parameter values after each step."""
    p = torch.nn.Parameter(torch.ones(grads[0].shape))
    opt = opt_cls([p], **kw)
    out = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        out.append(p.detach().clone())
    return out


def test_pytorch_rule_matches_torch_adamw():
    grads = grad_sequence(6)
    kw = dict(lr=1e-2, betas=BETAS, eps=1e-6, weight_decay=0.1)
    for a, b in zip(run(AdamW, grads, **kw), run(torch.optim.AdamW, grads, **kw)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_tf_and_pytorch_eps_follow_the_seed_formulas():
    """Both rules equal theta -= lr m_t/(1-b1^t) * sqrt(1-b2^t) / (sqrt(v_t) + E) with
    E = eps * sqrt(1 - b2^t) for PyTorch and E = eps for TensorFlow."""
    grads = grad_sequence(5)
    lr, eps = 1e-2, 1e-3  # eps comparable to sqrt(v_t) so the two rules visibly differ
    b1, b2 = BETAS
    pt = run(AdamW, grads, lr=lr, betas=BETAS, eps=eps, tf_style_eps=False)
    tf = run(AdamW, grads, lr=lr, betas=BETAS, eps=eps, tf_style_eps=True)
    m = torch.zeros_like(grads[0])
    v = torch.zeros_like(grads[0])
    theta_pt = theta_tf = torch.ones_like(grads[0])
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        common = lr * m / (1 - b1**t) * math.sqrt(1 - b2**t)
        theta_pt = theta_pt - common / (v.sqrt() + eps * math.sqrt(1 - b2**t))
        theta_tf = theta_tf - common / (v.sqrt() + eps)
        torch.testing.assert_close(pt[t - 1], theta_pt, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(tf[t - 1], theta_tf, rtol=1e-5, atol=1e-7)
    # the effective epsilon is smaller for PyTorch, so its (early) steps are larger
    step_pt, step_tf = (1 - pt[0]).abs(), (1 - tf[0]).abs()
    assert bool((step_pt > step_tf * 1.5).all())


def test_one_step_tf_eps_equals_pytorch_with_rescaled_eps():
    """At step 1, TF(eps) is PyTorch(eps / sqrt(1 - b2)): exactly the rescaling the post describes."""
    grads = grad_sequence(1)
    eps = 1e-3
    tf = run(AdamW, grads, lr=1e-2, betas=BETAS, eps=eps, tf_style_eps=True)
    pt = run(
        torch.optim.AdamW, grads, lr=1e-2, betas=BETAS, eps=eps / math.sqrt(1 - BETAS[1]), weight_decay=0
    )
    torch.testing.assert_close(tf[0], pt[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("tf_style", [False, True])
def test_weight_decay_spares_biases_and_norms(tf_style):
    module = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    opt = build_optimizer(module, OptimizerConfig(lr=0.1, weight_decay=0.5, tf_style_eps=tf_style))
    assert isinstance(opt, AdamW) == tf_style
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    for p in module.parameters():
        p.grad = torch.zeros_like(p)  # zero gradient: only decay can move a parameter
    opt.step()
    for n, p in module.named_parameters():
        if p.ndim >= 2:
            torch.testing.assert_close(p.detach(), before[n] * (1 - 0.1 * 0.5))
        else:
            assert torch.equal(p.detach(), before[n]), n


def test_linear_to_zero_reproduces_lm_human_preferences():
    """lm-human-preferences: lr = lr0 * (1 - (update - 1) / num_updates), update = 1..N."""
    n, lr0 = 7, 3e-4
    cfg = OptimizerConfig(lr=lr0, lr_scheduler_type="linear", min_lr_ratio=0.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr0)
    sched = LRScheduler(opt, cfg, total_steps=n)
    for update in range(1, n + 1):
        assert sched.step(update - 1) == pytest.approx(lr0 * (1 - (update - 1) / n), rel=1e-12)
        assert opt.param_groups[0]["lr"] == pytest.approx(lr0 * (1 - (update - 1) / n), rel=1e-12)
    assert sched.step(n) == 0.0


def test_schedules_warmup_and_floor():
    total = 20
    warm = OptimizerConfig(lr_scheduler_type="cosine", warmup_steps_proportion=0.25, min_lr_ratio=0.1)
    assert [lr_factor(s, total, warm) for s in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert lr_factor(5, total, warm) == pytest.approx(1.0)
    assert lr_factor(total, total, warm) == pytest.approx(0.1)
    mid = 5 + 15 / 2
    assert lr_factor(int(mid), total, warm) == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 7 / 15))
    )
    const = OptimizerConfig(lr_scheduler_type="constant", min_lr_ratio=0.5)
    assert {lr_factor(s, total, const) for s in range(total + 3)} == {1.0}
    lin = OptimizerConfig(lr_scheduler_type="linear", min_lr_ratio=0.5)
    factors = [lr_factor(s, total, lin) for s in range(total + 1)]
    assert factors[0] == 1.0 and factors[-1] == pytest.approx(0.5)
    assert all(a > b for a, b in zip(factors, factors[1:]))


def test_scheduler_state_round_trip():
    cfg = OptimizerConfig(lr=1.0, lr_scheduler_type="linear")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = LRScheduler(opt, cfg, 10)
    sched.step(3)
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched2 = LRScheduler(opt2, cfg, 10)
    sched2.load_state_dict(sched.state_dict())
    assert sched2.get_last_lr() == sched.get_last_lr() == [pytest.approx(0.7)]
    assert sched2.n_updates == 1


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(lr=-1.0), "lr"),
        (dict(betas=(0.9, 1.0)), "betas"),
        (dict(eps=0.0), "eps"),
        (dict(lr_scheduler_type="step"), "lr_scheduler_type"),
        (dict(warmup_steps_proportion=1.5), "warmup_steps_proportion"),
        (dict(min_lr_ratio=-0.1), "min_lr_ratio"),
        (dict(weight_decay=-1), "weight_decay"),
    ],
)
def test_bad_optimizer_config_names_the_field(kw, field):
    with pytest.raises(ValueError, match=f"OptimizerConfig.{field}"):
        OptimizerConfig(**kw)


def test_build_optimizer_is_fused_on_cpu_and_matches_the_plain_update():
    """The factory's fused AdamW takes the same steps as the per-parameter loop (fp32 rounding)."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    twin = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    twin.load_state_dict(module.state_dict())
    cfg = OptimizerConfig(lr=1e-2, weight_decay=0.1)
    opt = build_optimizer(module, cfg)
    assert opt.defaults["fused"] is True
    plain = torch.optim.AdamW(
        [
            {"params": [p for p in twin.parameters() if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for p in twin.parameters() if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=1e-2,
        betas=cfg.betas,
        eps=cfg.eps,
        foreach=False,
    )
    x = torch.randn(5, 8)
    for _ in range(4):
        for m, o in ((module, opt), (twin, plain)):
            o.zero_grad()
            m(x).square().sum().backward()
            o.step()
    for a, b in zip(module.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
