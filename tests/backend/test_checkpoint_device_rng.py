"""A recover point saves the RNG of the worker's own CUDA device only, and restores it on that
device whatever number of devices the resuming worker sees (a local run sees every GPU of the
node, a Ray actor its own). Exercised through a stand-in for ``torch.cuda``'s RNG calls over 1 or
4 visible devices, each device's state a distinct byte pattern."""

from __future__ import annotations

import pytest
import torch

from realrl.impl.model.backend.checkpoint import (
    device_rng_state,
    rng_state,
    set_device_rng_state,
    set_rng_state,
)


class VisibleDevices:
    """``torch.cuda``'s RNG calls over ``n`` visible devices; ``current`` is the current one."""

    def __init__(self, n: int, current: int = 0) -> None:
        self.states = [torch.full((4,), 10 + i, dtype=torch.uint8) for i in range(n)]
        self.current = current

    def device_count(self) -> int:
        return len(self.states)

    def current_device(self) -> int:
        return self.current

    def _index(self, device: torch.device | str) -> int:
        index = torch.device(device).index
        return self.current if index is None else index

    def get_rng_state(self, device: torch.device | str = "cuda") -> torch.Tensor:
        return self.states[self._index(device)].clone()

    def set_rng_state(self, state: torch.Tensor, device: torch.device | str = "cuda") -> None:
        self.states[self._index(device)] = state.clone()


def pattern(value: int) -> torch.Tensor:
    return torch.full((4,), value, dtype=torch.uint8)


@pytest.mark.parametrize("saved_on, seen", [("cuda:2", 4), ("cuda:0", 1)])
@pytest.mark.parametrize("resumed_on, n_resumed", [("cuda:0", 1), ("cuda:3", 4), ("cuda", 4)])
def test_own_device_state_saves_and_restores_across_visible_counts(saved_on, seen, resumed_on, n_resumed):
    saving = VisibleDevices(seen)
    saved = device_rng_state(saved_on, saving)
    assert isinstance(saved, torch.Tensor)  # one state, not one per visible device
    assert torch.equal(saved, saving.states[torch.device(saved_on).index])
    resuming = VisibleDevices(n_resumed, current=n_resumed - 1)
    before = [s.clone() for s in resuming.states]
    set_device_rng_state(saved, resumed_on, resuming)
    own = resuming._index(resumed_on)
    for i, state in enumerate(resuming.states):  # this device restored, the others untouched
        assert torch.equal(state, saved if i == own else before[i]), i


def test_a_host_device_has_no_device_state():
    devices = VisibleDevices(2)
    assert device_rng_state("cpu", devices) is None
    set_device_rng_state(pattern(99), "cpu", devices)
    assert torch.equal(devices.states[0], pattern(10)) and torch.equal(devices.states[1], pattern(11))


def test_a_list_of_every_device_from_an_older_recover_point():
    """Its entry for this device is restored when as many devices are visible, none otherwise."""
    old = [pattern(50 + i) for i in range(4)]
    same = VisibleDevices(4)
    set_device_rng_state(old, "cuda:2", same)
    assert torch.equal(same.states[2], pattern(52)) and torch.equal(same.states[0], pattern(10))
    fewer = VisibleDevices(1)
    set_device_rng_state(old, "cuda:0", fewer)
    assert torch.equal(fewer.states[0], pattern(10))


def test_rng_state_holds_torch_cuda_own_device_only(monkeypatch):
    """Through ``rng_state`` / ``set_rng_state`` with ``torch.cuda``'s calls standing in for 4
    visible devices: one device's state goes in, and comes back on that device."""
    devices = VisibleDevices(4)
    for name in ("device_count", "current_device", "get_rng_state", "set_rng_state"):
        monkeypatch.setattr(torch.cuda, name, getattr(devices, name))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    state = rng_state("cuda:1")
    assert torch.equal(state["cuda"], pattern(11))
    devices.states[1] = pattern(0)
    set_rng_state(state, "cuda:1")
    assert torch.equal(devices.states[1], pattern(11)) and torch.equal(devices.states[2], pattern(12))
    assert "cuda" not in rng_state("cpu")
