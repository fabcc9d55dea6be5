"""The plan space and the search over it: a small space whose best plan is known, the Metropolis
search (deterministic for a seed, finding that plan too), plans rejected for memory, and a space
with no feasible plan."""

from __future__ import annotations

import time

import pytest
from system_graphs import mock_config

from realrl.api.core.layout import Layout, Placement
from realrl.apps.plan_search.search import NoFeasiblePlan, search
from realrl.apps.plan_search.simulator import Costs
from realrl.apps.plan_search.space import Plan, call_options, layouts_up_to, with_allocation

# gen -> values -> reward -> {actor_train, critic_train}; two data-parallel ranks gain nothing,
# tensor parallelism doubles every call: the best is the critic's calls on a worker of their own
SECONDS = {"gen": 4.0, "values": 1.0, "reward": 1.0, "actor_train": 3.0, "critic_train": 3.0}
SCALE = {"d1m1p1": 1.0, "d2m1p1": 1.0, "d1m2p1": 2.0}
COSTS = Costs(
    {(m, layout): s * f for m, s in SECONDS.items() for layout, f in SCALE.items()},
    {"actor": 1e9, "critic": 1e9, "reward": 1e9},
    bandwidth=1e12,
)
BEST = {
    "values:d1m1p1@1,critic_train:d1m1p1@1,*:d1m1p1",
    "gen:d1m1p1@1,reward:d1m1p1@1,actor_train:d1m1p1@1,*:d1m1p1",
}


def _config(tmp_path):
    return mock_config(tmp_path, "t", allocations={"actor": [0], "critic": [0], "reward": [0]})


def test_the_space_of_a_call_on_two_workers():
    assert [str(layout) for layout in layouts_up_to(2)] == ["d1m1p1", "d2m1p1", "d1m2p1"]
    from realrl.api.core.dfg import MFCDef

    call = MFCDef("c", "actor", "inference", "x", n_seqs=2, input_keys=("a",), output_keys=("b",))
    assert [str(p) for p in call_options(call, 2)] == ["d1m1p1@0", "d1m1p1@1", "d2m1p1@0,1", "d1m2p1@0,1"]
    whole = MFCDef(
        "w", "adv", "inference", "x", n_seqs=2, input_keys=("a",), output_keys=("b",), whole_batch=True
    )
    assert [str(p) for p in call_options(whole, 2)] == ["d1m1p1@0", "d1m1p1@1"]


def test_a_plan_is_written_as_an_allocation_mode_that_places_every_call_so(tmp_path):
    cfg = _config(tmp_path)
    one, other = Placement(Layout(), (0,)), Placement(Layout(), (1,))
    plan = Plan.of(cfg.mfcs, [other, one, one, one, other])  # gen and critic_train on worker 1
    mode = plan.allocation_mode()
    assert mode == "gen:d1m1p1@1,critic_train:d1m1p1@1,*:d1m1p1"
    placed = with_allocation(cfg, mode)
    assert [placed.call_placement(m.name) for m in cfg.mfcs] == [p for _, p in plan.calls]
    assert Plan.of(cfg.mfcs, [one] * 5).allocation_mode() == "d1m1p1"


def test_a_small_search_finds_the_known_best_plan(tmp_path):
    result = search(_config(tmp_path), COSTS, n_workers=2)
    assert result.exhaustive and result.evaluated > 100
    best = result.ranked[0]
    # gen 4, values 1, reward 1, then both trainings side by side: 9 s; every call on one: 12 s
    assert best.simulation.step_seconds == pytest.approx(9.0)
    assert best.allocation_mode in BEST
    times = [c.simulation.step_seconds for c in result.ranked]
    assert times == sorted(times) and times[-1] > 12.0


def test_the_time_limit_stops_an_exhaustive_search_too(tmp_path):
    def slow_memory(planned) -> int:  # every plan scored costs 20 ms
        time.sleep(0.02)
        return 0

    result = search(_config(tmp_path), COSTS, n_workers=2, memory=slow_memory, time_limit=0.3)
    assert not result.exhaustive and result.stopped and 0 < result.evaluated < 100
    assert result.seconds < 2.0


def test_the_metropolis_search_is_deterministic_for_a_seed_and_finds_it_too(tmp_path):
    runs = [
        search(_config(tmp_path), COSTS, n_workers=2, exhaustive_limit=10, iterations=400, seed=7)
        for _ in range(2)
    ]
    assert not runs[0].exhaustive and not runs[0].stopped  # it ran its iterations
    assert [c.allocation_mode for c in runs[0].ranked] == [c.allocation_mode for c in runs[1].ranked]
    assert runs[0].ranked[0].simulation.step_seconds == pytest.approx(9.0)


def test_plans_over_the_device_memory_are_rejected_and_none_left_is_an_error(tmp_path):
    cfg = _config(tmp_path)

    def memory(planned):  # tensor parallelism "needs" 3 GiB, everything else 1
        layouts = {planned.call_placement(m.name).layout for m in planned.mfcs}
        return 3 * 2**30 if Layout(1, 2) in layouts else 2**30

    result = search(cfg, COSTS, n_workers=2, memory=memory, limit_bytes=2 * 2**30)
    assert all("d1m2p1" not in c.allocation_mode for c in result.ranked)
    assert any("needs 3.00 GiB on a device of 2.00 GiB" in why for _, why in result.rejected)
    with pytest.raises(NoFeasiblePlan, match="no plan of 'systest' on 2 workers is feasible"):
        search(cfg, COSTS, n_workers=2, memory=memory, limit_bytes=2**29)


def test_tensor_parallelism_stays_within_a_node():
    assert [str(layout) for layout in layouts_up_to(4, per_node=2)] == [
        "d1m1p1",
        "d2m1p1",
        "d1m2p1",
        "d3m1p1",
        "d4m1p1",
        "d2m2p1",
    ]


def test_plans_asked_for_by_name_are_scored_beside_the_search(tmp_path):
    """A hand-made plan gets the simulator's step with the same costs; one in a layout nobody
    costed, or one the runtime refuses, is reported with the reason instead of stopping the search."""
    split, uncosted = "values:d1m1p1@1,critic_train:d1m1p1@1,*:d1m1p1", "gen:d4m1p1,*:d1m1p1"
    result = search(_config(tmp_path), COSTS, n_workers=2, compare=[split, "d1m1p1", uncosted, "nonsense"])
    assert result.compared[split].simulation.step_seconds == pytest.approx(9.0)
    assert result.compared["d1m1p1"].simulation.step_seconds == pytest.approx(12.0)
    assert "no cost" in result.compared[uncosted] and "d4m1p1" in result.compared[uncosted]
    assert result.compared["nonsense"].startswith("refused")
    assert all(m not in dict(result.rejected) for m in (uncosted, "nonsense"))  # the search's own list


def test_the_walk_descends_to_plans_that_fit_when_no_one_layout_plan_does(tmp_path):
    """Every plan that places all calls alike is over the memory (as for a 70B model on its
    one-layout plans): the Metropolis walk starts from the least excessive and still finds the
    best split."""

    def memory(planned):
        placements = {planned.call_placement(m.name) for m in planned.mfcs}
        return 3 * 2**30 if len(placements) == 1 else 2**30

    result = search(
        _config(tmp_path),
        COSTS,
        n_workers=2,
        memory=memory,
        limit_bytes=2 * 2**30,
        exhaustive_limit=10,
        iterations=400,
    )
    assert not result.exhaustive
    assert result.ranked[0].simulation.step_seconds == pytest.approx(9.0)
    assert all(m in dict(result.rejected) for m in ("d1m1p1", "d2m1p1", "d1m2p1"))
