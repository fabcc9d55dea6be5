"""fp16 dynamic loss scaling (``LossScaler``): the scale comes off the gradients exactly, backs
off on an overflow, grows after clean steps, and resumes from torch's GradScaler state."""

from __future__ import annotations

import torch

from realrl.impl.model.backend.loss_scaler import LossScaler


def test_unscaling_gives_the_gradient_of_the_unscaled_loss():
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    scaler = LossScaler(scale=2.0**10)
    scaler.scale_loss((w**2).sum()).backward()
    assert torch.equal(w.grad, 2.0**10 * 2 * w.detach())
    scaler.unscale_([w])
    assert torch.equal(w.grad, 2 * w.detach())


def test_the_scale_backs_off_on_an_overflow_and_grows_after_clean_steps():
    scaler = LossScaler(scale=8.0, growth_interval=3)
    scaler.update(finite=False)
    assert scaler.get_scale() == 4.0 and scaler.clean_steps == 0
    for _ in range(2):
        scaler.update(finite=True)
    assert scaler.get_scale() == 4.0
    scaler.update(finite=True)
    assert scaler.get_scale() == 8.0 and scaler.clean_steps == 0


def test_a_recover_point_of_torch_s_grad_scaler_is_read():
    torch_scaler = torch.amp.GradScaler("cpu", init_scale=512.0, growth_interval=7)
    torch_scaler.scale(torch.ones(()))  # the scale exists from the first scaled loss on
    scaler = LossScaler()
    scaler.load_state_dict(torch_scaler.state_dict())
    assert (scaler.scale, scaler.growth_interval, scaler.clean_steps) == (512.0, 7, 0)
    again = LossScaler()
    again.load_state_dict(scaler.state_dict())
    assert again == scaler
