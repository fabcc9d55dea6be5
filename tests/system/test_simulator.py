"""The plan simulator replays the graph with the master's rules: calls on one worker take turns,
calls on disjoint workers overlap, the parameter-version rule orders the steps, a call on a copy
of its model pays the reallocation on both sides, and asynchronous RL hides generation behind
training with only the pushed version's receive left to pay."""

from __future__ import annotations

import dataclasses

import pytest
from system_graphs import mock_config

from realrl.api.core.layout import Layout, Placement
from realrl.api.core.system_api import AsyncRL
from realrl.apps.plan_search.simulator import Costs, MissingCost, simulate

# gen -> values -> reward -> {actor_train, critic_train}, seconds per call on one worker
SECONDS = {"gen": 4.0, "values": 1.0, "reward": 1.0, "actor_train": 3.0, "critic_train": 2.0}
ONE_WORKER = {"actor": [0], "critic": [0], "reward": [0]}
GEN_ALONE = {"gen": Placement(Layout(), (1,))}


def costs(**calls) -> Costs:
    table = {(name, "d1m1p1"): s for name, s in {**SECONDS, **calls}.items()}
    return Costs(table, model_bytes={"actor": 2e9}, bandwidth=2e9)  # a refill: 1 s


def test_calls_on_one_worker_take_turns(tmp_path):
    sim = simulate(mock_config(tmp_path, "one", allocations=ONE_WORKER), costs())
    assert sim.step_seconds == pytest.approx(sum(SECONDS.values()))
    assert sim.call_seconds == SECONDS and sim.realloc_seconds == 0.0 and sim.busy == {0: 1.0}


def test_calls_on_disjoint_workers_overlap_within_the_version_rule(tmp_path):
    """The critic on worker 1: its training overlaps the actor's; the next generation still
    waits for the actor's training (the version rule), so a step is the chain gen, values,
    reward, actor_train."""
    cfg = mock_config(tmp_path, "two", allocations={"actor": [0], "critic": [1], "reward": [0]})
    assert simulate(cfg, costs()).step_seconds == pytest.approx(4 + 1 + 1 + 3)


def test_workers_computing_side_by_side_slow_each_other_down(tmp_path):
    """Contention 1.5: while the critic trains (2 s of work) beside the actor (3 s), both run 1.5x
    longer: the critic's ends at 3 s, when the actor has done 2 s of its 3; its last second runs
    alone. A step is 4 + 1 + 1 + 4 s, and the trainings overlap 3 s of it."""
    cfg = mock_config(tmp_path, "two", allocations={"actor": [0], "critic": [1], "reward": [0]})
    table = costs()
    slowed = dataclasses.replace(table, contention=1.5)
    sim = simulate(cfg, slowed)
    assert sim.step_seconds == pytest.approx(4 + 1 + 1 + 4)
    assert sim.call_seconds["critic_train"] == pytest.approx(3.0)
    assert sim.call_seconds["actor_train"] == pytest.approx(4.0)
    assert sim.overlap == pytest.approx(3 / 10)
    alone = simulate(mock_config(tmp_path, "one", allocations=ONE_WORKER), slowed)
    assert alone.step_seconds == pytest.approx(sum(SECONDS.values())) and alone.overlap == 0.0


def test_a_call_on_a_copy_pays_its_reallocation_on_both_sides(tmp_path):
    cfg = mock_config(tmp_path, "copy", allocations=ONE_WORKER, mfc_placements=GEN_ALONE)
    sim = simulate(cfg, costs())
    assert sim.realloc_seconds == pytest.approx(1.0)  # the actor trains every step: refilled every step
    assert sim.step_seconds == pytest.approx(1 + sum(SECONDS.values()))  # nothing overlaps


def test_asynchronous_generation_hides_behind_training(tmp_path):
    """Staleness 1, generation alone on worker 1: worker 0's 7 s of calls set the pace; the
    generation worker spends 4 s generating and 1 s receiving the pushed version each step (less
    over the whole window: at the end it has no step left to run ahead to)."""
    cfg = mock_config(
        tmp_path, "async", allocations=ONE_WORKER, mfc_placements=GEN_ALONE, async_rl=AsyncRL(1)
    )
    sim = simulate(cfg, costs(), steps=24, warmup=8)
    assert sim.step_seconds == pytest.approx(7.0)
    assert sim.busy[0] == pytest.approx(1.0) and 0.5 < sim.busy[1] < 5 / 7 + 0.01  # 5 of every 7 s
    slow = simulate(cfg, costs(gen=10.0), steps=24, warmup=8)  # now generation sets the pace
    assert slow.step_seconds == pytest.approx(10 + 1)


def test_a_layout_without_a_cost_is_named(tmp_path):
    cfg = mock_config(tmp_path, "dp", allocations={"actor": [0, 1], "critic": [0], "reward": [0]})
    with pytest.raises(MissingCost, match="'gen' in layout d2m1p1"):
        simulate(cfg, costs())


def test_a_reallocation_costs_what_the_neediest_copy_rank_lacks():
    """Each copy rank receives the part of its tensor-parallel slice its worker's home slice does
    not hold, all at once: the slowest sets the time."""
    table = Costs({}, model_bytes={"actor": 8e9}, bandwidth=1e9)
    eight = tuple(range(8))
    home = Placement(Layout(2, 4), eight)
    # d1m8: worker 1 holds a quarter [1/4, 1/2) and needs the eighth [1/8, 1/4): 1 GB
    assert table.realloc("actor", home, Placement(Layout(1, 8), eight)) == pytest.approx(1.0)
    # d8m1 on the same workers: each lacks three quarters of the whole model
    assert table.realloc("actor", home, Placement(Layout(8, 1), eight)) == pytest.approx(6.0)
    assert table.realloc("actor", home, home) == 0.0
    # a worker outside home receives its whole slice
    one = Placement(Layout(), (0,))
    assert table.realloc("actor", one, Placement(Layout(1, 2), (1, 2))) == pytest.approx(4.0)
    assert table.realloc("actor", one, Placement(Layout(2, 1), (0, 1))) == pytest.approx(8.0)
    # pipeline stages: each of p2's workers holds half; d2 on them lacks the other half (4 GB)
    stages = Placement(Layout(pp=2), (0, 1))
    assert table.realloc("actor", stages, Placement(Layout(2, 1), (0, 1))) == pytest.approx(4.0)
    # d1m2p2 -> d1m4 on the same workers: worker 1 holds [1/4, 1/2) and needs it: nothing moves
    four = tuple(range(4))
    assert table.realloc("actor", Placement(Layout(1, 2, 2), four), Placement(Layout(1, 4), four)) == 0.0
