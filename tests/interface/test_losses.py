"""SFT, Bradley–Terry and DPO losses against hand-computed numbers and TRL's formulas."""

import collections
import math
import types

import pytest
import torch
import torch.nn.functional as tF

from realrl.impl.model.utils.functional import (
    gather_packed_shifted_log_probs,
    masked_shifted_log_probs,
    predicting_tokens,
)
from realrl.impl.model.utils.losses import bradley_terry_loss, dpo_loss, sft_loss


def test_sft_loss_equals_cross_entropy_on_masked_targets():
    g = torch.Generator().manual_seed(0)
    V = 7  # two sequences of 4 and 3 tokens
    ids = torch.randint(0, V, (7,), generator=g)
    logits = torch.randn(7, V, generator=g)
    cu = torch.tensor([0, 4, 7], dtype=torch.int32)
    mask = torch.tensor([False, True, True, True, True])  # seq 0: first target is a prompt token
    loss, n = sft_loss(gather_packed_shifted_log_probs(logits, cu, ids), mask)
    targets = [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6)]  # (position, next position) per sequence
    ref = torch.stack([tF.cross_entropy(logits[p : p + 1], ids[q : q + 1]) for p, q in targets])
    assert n == 4
    assert float(loss) == pytest.approx(float(ref[mask].mean()), rel=1e-6)
    assert predicting_tokens(cu).tolist() == [p for p, _ in targets]
    # the same log-probs from the logits of only the masked targets' predicting tokens
    at = predicting_tokens(cu)[mask]
    masked = masked_shifted_log_probs(logits[at], cu, ids, mask)
    full = gather_packed_shifted_log_probs(logits, cu, ids)
    torch.testing.assert_close(masked, torch.where(mask, full, torch.zeros_like(full)))


def trl_reward_loss(chosen, rejected, margin=None, center=None):
    """TRL 1.16 RewardTrainer.compute_loss, written out:
    -logsigmoid(r_c - r_r - margin).mean() + center * mean((r_c + r_r)^2)."""
    if margin is not None:
        loss = -tF.logsigmoid(chosen - rejected - margin).mean()
    else:
        loss = -tF.logsigmoid(chosen - rejected).mean()
    if center is not None:
        loss = loss + center * torch.mean((chosen + rejected) ** 2)
    return loss


def test_bradley_terry_by_hand():
    c, r = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    # -log sigmoid(1) and -log sigmoid(-1)
    expected = (math.log1p(math.exp(-1)) + math.log1p(math.exp(1))) / 2
    assert float(bradley_terry_loss(c, r)) == pytest.approx(expected)
    m = torch.tensor([1.0, -1.0])  # diffs become 0 and 0
    assert float(bradley_terry_loss(c, r, m)) == pytest.approx(math.log(2))
    assert float(bradley_terry_loss(c, r, None, 0.5)) == pytest.approx(expected + 0.5 * (9 + 1) / 2)


@pytest.mark.parametrize("use_margin,center", [(False, None), (True, None), (True, 0.01)])
def test_bradley_terry_equals_trl(use_margin, center):
    g = torch.Generator().manual_seed(1)
    c, r, m = torch.randn(8, generator=g), torch.randn(8, generator=g), torch.rand(8, generator=g)
    margin = m if use_margin else None
    ours = bradley_terry_loss(c, r, margin, center)
    torch.testing.assert_close(ours, trl_reward_loss(c, r, margin, center))

    trl = pytest.importorskip("trl")  # TRL's own compute_loss on a stub trainer and model
    stub = types.SimpleNamespace(
        model=types.SimpleNamespace(training=False),
        args=types.SimpleNamespace(center_rewards_coefficient=center),
        accelerator=types.SimpleNamespace(gather_for_metrics=lambda x: x, gather=lambda x: x),
        _total_train_tokens=0,
        _tp_size=1,
        _metrics=collections.defaultdict(lambda: collections.defaultdict(list)),
    )
    inputs = {"input_ids": torch.zeros(16, 1), "attention_mask": torch.ones(16, 1)}
    if margin is not None:
        inputs["margin"] = margin
    model = lambda **kw: types.SimpleNamespace(logits=torch.cat([c, r]).unsqueeze(-1))  # noqa: E731
    trl_loss = trl.RewardTrainer.compute_loss(stub, model, inputs)
    torch.testing.assert_close(ours, trl_loss)


def trl_dpo_sigmoid(pc, pr, rc, rr, beta, ls):
    """TRL 1.16 DPOTrainer, loss_type "sigmoid" with label smoothing."""
    delta = (pc - rc) - (pr - rr)
    return (-tF.logsigmoid(beta * delta) * (1 - ls) - tF.logsigmoid(-beta * delta) * ls).mean()


def trl_dpo_ipo(pc, pr, rc, rr, beta, nc, nr):
    """TRL 1.16 DPOTrainer, loss_type "ipo": log ratios averaged over completion tokens."""
    ipo_delta = (pc - rc) / nc.clamp(min=1.0) - (pr - rr) / nr.clamp(min=1.0)
    return ((ipo_delta - 1 / (2 * beta)) ** 2).mean()


def test_dpo_by_hand():
    # h = (-1 - -2) - (-3 - -2) = 2; beta 0.5 -> -log sigmoid(1)
    loss, stats = dpo_loss(
        torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.0]), 0.5
    )
    assert float(loss) == pytest.approx(math.log1p(math.exp(-1)))
    assert float(stats["chosen_reward"]) == pytest.approx(0.5)
    assert float(stats["rejected_reward"]) == pytest.approx(-0.5)
    assert float(stats["accuracy"]) == 1.0


@pytest.mark.parametrize("beta,ls", [(0.1, 0.0), (0.5, 0.1)])
def test_dpo_sigmoid_equals_trl(beta, ls):
    g = torch.Generator().manual_seed(2)
    pc, pr, rc, rr = (torch.randn(6, generator=g) * 5 for _ in range(4))
    loss, _ = dpo_loss(pc, pr, rc, rr, beta, "sigmoid", ls)
    torch.testing.assert_close(loss, trl_dpo_sigmoid(pc, pr, rc, rr, beta, ls))


def test_dpo_ipo_equals_trl():
    g = torch.Generator().manual_seed(3)
    pc, pr, rc, rr = (torch.randn(6, generator=g) * 5 for _ in range(4))
    nc, nr = torch.tensor([3.0, 4, 5, 1, 2, 9]), torch.tensor([2.0, 2, 7, 3, 1, 4])
    loss, _ = dpo_loss(pc, pr, rc, rr, 0.2, "ipo", chosen_lengths=nc, rejected_lengths=nr)
    torch.testing.assert_close(loss, trl_dpo_ipo(pc, pr, rc, rr, 0.2, nc, nr))
    with pytest.raises(ValueError, match="chosen_lengths"):
        dpo_loss(pc, pr, rc, rr, 0.2, "ipo")
