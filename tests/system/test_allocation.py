"""allocation_mode parsing and ExperimentConfig validation."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from system_graphs import mock_config, mock_rlhf_mfcs

from realrl.api.core.layout import Layout, Placement
from realrl.api.core.system_api import NameResolveConfig, Timeouts
from realrl.api.quickstart.allocation import parse_allocation

MFCS = mock_rlhf_mfcs()  # roles actor, critic, reward


def workers(allocation) -> dict[str, list[int]]:
    return {role: list(p.workers) for role, p in allocation.homes.items()}


def test_data_parallel_string_puts_every_role_everywhere():
    assert workers(parse_allocation("d2", MFCS)) == {"actor": [0, 1], "critic": [0, 1], "reward": [0, 1]}
    assert workers(parse_allocation("d1m1p1", MFCS)) == {"actor": [0], "critic": [0], "reward": [0]}


def test_layouts_in_reals_grammar_use_dp_times_tp_workers():
    got = parse_allocation("actor:d1m2p1,critic:d2m1p1@2,*:d2m2p1", MFCS).homes
    assert got["actor"] == Placement(Layout(1, 2, 1), (0, 1))
    assert got["critic"] == Placement(Layout(2, 1, 1), (2, 3))
    assert got["reward"].layout == Layout(2, 2, 1) and got["reward"].replicas() == [[0, 1], [2, 3]]
    assert got["reward"].heads() == [0, 2] and got["reward"].coords_of(3) == (0, 1, 1)


def test_per_role_strings_with_offsets_and_default():
    got = parse_allocation("actor:d2,critic:d1@1,*:d1@0", MFCS)
    assert workers(got) == {"actor": [0, 1], "critic": [1], "reward": [0]}


@pytest.mark.parametrize("mode", ["d1m1p2", "d1m2p1", "*:d1m2p1"])
def test_a_layout_for_every_role_leaves_a_role_without_weights_replicated(mode):
    """The layout is meant for the models: a weightless role runs d<n>m1p1 on the same workers."""
    allocation = parse_allocation(mode, MFCS, weightless={"reward"})
    assert str(allocation.homes["actor"].layout) == mode.removeprefix("*:")
    assert allocation.homes["reward"] == Placement(Layout(dp=2), (0, 1))


def test_a_layout_that_names_a_role_without_weights_is_its_own():
    allocation = parse_allocation("reward:d1m2p1,*:d1m1p1", MFCS, weightless={"reward"})
    assert str(allocation.homes["reward"].layout) == "d1m2p1"


def test_manual_lists_by_mfc_or_role():
    got = parse_allocation(
        "manual", MFCS, {"gen": [0, 1], "actor_train": [0, 1], "critic": [1], "reward": [0]}
    )
    assert workers(got) == {"actor": [0, 1], "critic": [1], "reward": [0]}
    got = parse_allocation(
        "manual", MFCS, {"actor": [2, 3], "critic": [1], "reward": [0]}, {"actor": "d1m2p1"}
    ).homes
    assert got["actor"] == Placement(Layout(1, 2, 1), (2, 3)) and got["critic"].layout == Layout(1, 1, 1)


@pytest.mark.parametrize(
    "mode, manual, match",
    [
        ("x2", None, "not of the form"),
        ("d0m1p1", None, "must be >= 1"),
        ("gen:d1m2p1,actor_train:d1,critic:d1", None, r"no layout for roles \['reward'\]"),
        ("manual", {"actor": [0], "critic": [1], "reward": [0]}, None),
        ("actor:d2", None, r"no layout for roles \['critic', 'reward'\]"),
        ("actor:d2,policy:d1,*:d1", None, "names 'policy', neither a model role"),
        ("actor:d2,actor:d1,*:d1", None, "gives 'actor' twice"),
        (
            "manual",
            {"gen": [0]},
            r"no workers for MFCs \['values', 'reward', 'actor_train', 'critic_train'\]",
        ),
        ("manual", {"nope": [0]}, "neither an MFC"),
        ("d1", {"gen": [0]}, "not 'manual'"),
    ],
)
def test_bad_allocations_say_what_is_wrong(mode, manual, match):
    if match is None:  # the well-formed neighbour of the cases around it
        assert parse_allocation(mode, MFCS, manual)
        return
    with pytest.raises(ValueError, match=match):
        parse_allocation(mode, MFCS, manual)


def test_manual_layout_must_match_its_worker_count():
    with pytest.raises(
        ValueError, match=r"manual allocation 'actor': layout d1m2p1 has 2 ranks but 3 workers"
    ):
        parse_allocation(
            "manual", MFCS, {"actor": [0, 1, 2], "critic": [0], "reward": [0]}, {"actor": "d1m2p1"}
        )


def test_calls_of_one_model_take_their_own_layouts_and_the_trainer_is_home():
    got = parse_allocation("gen:d2m1p1,actor_train:d1m2p1,critic:d1@2,*:d1m1p1", MFCS)
    assert got.calls["gen"] == Placement(Layout(2, 1, 1), (0, 1))
    assert got.calls["actor_train"] == Placement(Layout(1, 2, 1), (0, 1))
    assert got.homes["actor"] == got.calls["actor_train"]  # weights and optimizer live where it trains
    assert got.calls["values"] == got.homes["critic"] == Placement(Layout(), (2,))
    assert got.calls["reward"] == got.homes["reward"] == Placement(Layout(), (0,))
    # an MFC's own entry beats its role's, which beats the default
    got = parse_allocation("actor:d1m2p1,gen:d2m1p1@2,*:d1", MFCS)
    assert got.calls["actor_train"].layout == Layout(1, 2, 1) and got.calls["gen"].workers == (2, 3)
    # a model nobody trains lives where its first call runs
    assert parse_allocation("values:d2,*:d1", MFCS).homes["critic"].layout == Layout(1, 1, 1)


def test_manual_allocation_per_call():
    got = parse_allocation(
        "manual",
        MFCS,
        {"gen": [2, 3], "actor_train": [0, 1], "critic": [1], "reward": [0]},
        {"actor_train": "d1m2p1"},
    )
    assert got.calls["gen"] == Placement(Layout(2, 1, 1), (2, 3))
    assert got.homes["actor"] == Placement(Layout(1, 2, 1), (0, 1))


def test_a_model_trains_in_one_placement():
    mfcs = [*MFCS, dataclasses.replace(MFCS[3], name="actor_train2")]
    with pytest.raises(ValueError, match="both train model 'actor' but in different placements"):
        parse_allocation("actor_train2:d2,*:d1", mfcs)


def test_experiment_config_with_per_call_placements(tmp_path):
    gen = Placement(Layout(2, 1, 1), (2, 3))
    cfg = mock_config(tmp_path, "t", mfc_placements={"gen": gen})
    assert cfg.n_model_workers == 4 and cfg.call_placement("gen") == gen
    assert cfg.call_placement("actor_train") == cfg.placement("actor") == Placement(Layout(2), (0, 1))
    assert cfg.copy_placements("actor") == [gen] and cfg.copy_placements("critic") == []
    assert cfg.mesh_placements()["actor d2m1p1@2,3"] == gen
    assert cfg.realloc_groups() == [(0, 1, 2, 3)]  # the actor's home and its copy
    configs = cfg.model_worker_configs(NameResolveConfig("nfs", str(tmp_path)))
    assert [(c.role, str(c.placement)) for c in configs[2].copies] == [("actor", "d2m1p1@2,3")]
    assert configs[2].shards == [] and sorted(configs[2].interfaces) == ["gen"]
    assert configs[0].copies == []
    with pytest.raises(ValueError, match="trains model 'actor' in d1m1p1@0, not in its home"):
        mock_config(tmp_path, "t", mfc_placements={"actor_train": Placement(Layout(), (0,))})
    with pytest.raises(ValueError, match="MFC 'gen' has dp size 8 > n_seqs 4"):
        mock_config(tmp_path, "t", mfc_placements={"gen": Placement(Layout(8), tuple(range(8)))})


def test_experiment_config_cuts_into_picklable_worker_configs(tmp_path):
    cfg = mock_config(tmp_path, "t")
    assert (
        cfg.n_model_workers == 2 and cfg.owner_role() == "actor" and cfg.dataset_keys() == ["packed_prompts"]
    )
    w0, w1 = pickle.loads(pickle.dumps(cfg.model_worker_configs(NameResolveConfig("nfs", str(tmp_path)))))
    assert [(s.role, s.dp_rank, s.dp_size) for s in w0.shards] == [("actor", 0, 2), ("reward", 0, 1)]
    assert [(s.role, s.dp_rank, s.dp_size) for s in w1.shards] == [("actor", 1, 2), ("critic", 0, 1)]
    assert sorted(w1.interfaces) == ["actor_train", "critic_train", "gen", "values"]
    assert (w0.dataset_dp_rank, w1.dataset_dp_rank, w0.dataset_dp_size) == (0, 1, 2)
    assert w0.worker_name == "model_worker/0" and w0.bind_host == "127.0.0.1"


def test_timeouts_must_leave_room_for_heartbeats():
    with pytest.raises(ValueError, match="must exceed twice heartbeat_interval"):
        Timeouts(heartbeat=1.0, heartbeat_interval=1.0)
    with pytest.raises(ValueError, match="request must be > 0"):
        Timeouts(request=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"allocations": {"actor": [0, 1], "critic": [1]}}, "model 'reward' has no allocation"),
        (
            {"allocations": {"actor": [0, 0], "critic": [1], "reward": [0]}},
            "two ranks of layout d2m1p1 on one worker",
        ),
        ({"n_model_workers": 3}, r"model workers \[2\] hold no model"),
        (
            {"allocations": {"actor": [0, 1], "critic": [1], "reward": [2]}, "n_model_workers": 2},
            "outside 0..1",
        ),
        ({"total_train_epochs": 0}, "total_train_epochs"),
    ],
)
def test_bad_experiment_configs_are_refused_before_any_worker_starts(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        mock_config(tmp_path, "t", **kwargs)
