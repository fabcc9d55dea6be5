"""Where tensors live: the device-discipline check itself, and the rule it enforces on a worker
(the sample store holds host tensors; a call sees its inputs on its model's device).

The end-to-end runs of ``tests/apps/test_experiments_e2e.py`` run every experiment and layout
under the check; the tests here make sure the check can fail, and where."""

from __future__ import annotations

import pytest
import torch
from device_discipline import STAND_IN, DeviceDiscipline, DeviceMixError

from realrl.api.core.data_api import SequenceSample
from realrl.impl.model.utils.functional import predicting_tokens
from realrl.system.data_transfer import TensorStore


@pytest.fixture
def discipline():
    mode = DeviceDiscipline()
    with mode:
        yield mode


def test_a_device_tensor_meeting_a_host_tensor_raises_like_cuda(discipline):
    device, host = torch.ones(4).to(STAND_IN), torch.ones(4)
    for combine in (
        lambda: device + host,
        lambda: torch.cat([device, host]),
        lambda: torch.where(device > 0, device, host),
        lambda: torch.nn.functional.linear(host.view(1, 4), torch.ones(2, 4).to(STAND_IN)),
        lambda: device.numpy(),
    ):
        with pytest.raises(DeviceMixError):
            combine()


def test_what_cuda_allows_passes(discipline):
    device = torch.arange(6.0).to(STAND_IN)
    assert float((device * torch.tensor(2.0)).sum()) == 30.0  # a 0-d host tensor is a scalar
    index = torch.tensor([1, 3])
    assert device[index].tolist() == [1.0, 3.0]  # a host index into a device tensor
    device[index] = 0.0
    torch.zeros(6).copy_(device)  # copies cross devices
    assert device.cpu().numpy().sum() == 11.0
    with pytest.raises(DeviceMixError):  # but not a host value written into a device tensor
        device[index] = torch.ones(2)


def test_code_that_follows_a_tensor_s_device_stays_on_the_device(discipline):
    """``torch.zeros(n, device=t.device)`` is the usual idiom: a device tensor says it lives on
    the stand-in device, so what is made beside it is a device tensor too."""
    device = torch.ones(3).to(STAND_IN)
    assert device.device == STAND_IN and torch.ones(3).device == torch.device("cpu")
    made_beside = torch.zeros(3, device=device.device)
    assert discipline.tag_of(made_beside) == "device"
    assert discipline.tag_of(device.cpu()) == "host" and discipline.tag_of(device.to("cpu")) == "host"
    with pytest.raises(DeviceMixError):
        made_beside + torch.ones(3)


def test_the_store_holds_host_tensors_whatever_a_call_produced(discipline):
    """The rule's one place: ``put`` brings a call's outputs to host memory, so a batch joins
    pieces of one device only, and the worker moves a call's inputs to its model's device."""
    store = TensorStore()
    produced = SequenceSample.from_default(
        ids=["a", "b"], seqlens=[3, 2], data={"packed_input_ids": torch.arange(5).to(STAND_IN)}
    )
    store.put(produced)
    received = SequenceSample.from_default(
        ids=["c"], seqlens=[2], data={"packed_input_ids": torch.arange(2)}
    )  # what a transfer lands: host memory
    store.put(received)
    joined = store.get(["a", "b", "c"], "packed_input_ids")
    assert discipline.tag_of(joined) == "host"
    meta = SequenceSample.gather([produced.meta(), received.meta()])
    on_device = store.assemble(meta).to(STAND_IN)
    assert discipline.tag_of(on_device.data["packed_input_ids"]) == "device"
    # a call's own arithmetic on it, with boundaries made from Python lists, moved beside it
    cu = on_device.cu_seqlens("packed_input_ids").to(on_device.data["packed_input_ids"].device)
    assert predicting_tokens(cu).tolist() == [0, 1, 3, 5]
