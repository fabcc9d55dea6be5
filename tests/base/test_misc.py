import logging
import random
import socket

import numpy as np
import pytest
import torch

from realrl.base import logging as rlog
from realrl.base import network, seeding
from realrl.base.registry import Registry, UnknownNameError


def test_logger_does_not_touch_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    log = rlog.getLogger("some.component")
    log.info("hello")
    assert log.name == "realrl.some.component"
    assert root.handlers == handlers and root.level == level
    n = len(logging.getLogger("realrl").handlers)
    rlog.getLogger("other")
    assert len(logging.getLogger("realrl").handlers) == n  # idempotent


def test_seeding_per_rank():
    assert seeding.process_seed(1, 0) == 1
    assert seeding.process_seed(1, 2) == 1 + 2 * 100003
    draws = []
    for _ in range(2):
        seeding.set_random_seed(7, rank=1)
        draws.append((random.random(), np.random.rand(), torch.rand(1).item()))
    assert draws[0] == draws[1]
    seeding.set_random_seed(7, rank=0)
    assert torch.rand(1).item() != draws[0][2]
    with pytest.raises(ValueError):
        seeding.process_seed(-1)


def test_free_ports_are_distinct_and_bindable():
    ports = network.find_free_ports(4)
    assert len(set(ports)) == 4
    with socket.socket() as s:
        s.bind((network.LOOPBACK, ports[0]))


def test_registry_errors():
    reg = Registry("widget")
    reg.register("a", 1)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", 2)
    with pytest.raises(UnknownNameError, match="registered: a"):
        reg.get("b")
    assert "a" in reg and reg.names() == ["a"]
