"""DAPO's group filter: a prompt whose answers all score the same is dropped, any spread keeps it,
and a single answer is always kept."""

import pytest
import torch

from realrl.api.core.config import ModelInterfaceAbstraction
from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_api import DROPPED_KEY, make_interface


def rewards(groups: dict[str, list[float]]) -> SequenceSample:
    """One sample per prompt holding its answers' rewards."""
    flat = [r for g in groups.values() for r in g]
    return SequenceSample.from_default(
        list(groups), [[1] * len(g) for g in groups.values()], {"rewards": torch.tensor(flat)}
    )


def test_uniform_groups_are_dropped_and_the_rest_kept():
    data = rewards(
        {"all-right": [1.0, 1.0, 1.0], "mixed": [1.0, 0.0, 1.0], "all-wrong": [0.0, 0.0], "alone": [0.0]}
    )
    out, stats = make_interface(ModelInterfaceAbstraction("group_filter")).inference(None, data)
    assert out is None
    assert stats[DROPPED_KEY] == ["all-right", "all-wrong"]
    assert (stats["kept_groups"], stats["dropped_groups"]) == (2.0, 2.0)


def test_tolerance_treats_a_small_spread_as_uniform():
    data = rewards({"close": [0.50, 0.52], "apart": [0.5, 0.9]})
    strict = make_interface(ModelInterfaceAbstraction("group_filter"))
    loose = make_interface(ModelInterfaceAbstraction("group_filter", {"tolerance": 0.05}))
    assert strict.inference(None, data)[1][DROPPED_KEY] == []
    assert loose.inference(None, data)[1][DROPPED_KEY] == ["close"]
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        make_interface(ModelInterfaceAbstraction("group_filter", {"tolerance": -1.0}))
