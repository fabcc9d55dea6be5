"""The master's record of model copies: when a call placed outside its model's home needs a
reallocation first, and when its copy is freed."""

from __future__ import annotations

import dataclasses

from system_graphs import mock_config

from realrl.api.core.layout import Layout, Placement

GEN = Placement(Layout(2, 1, 1), (2, 3))


def calls(tmp_path, keep: bool):
    from realrl.system.copies import CopyTracker
    from realrl.system.transfer_plan import TagCounter

    cfg = mock_config(tmp_path, "t", mfc_placements={"gen": GEN})
    cfg.models["actor"] = dataclasses.replace(cfg.models["actor"], keep_gen_copy=keep)
    tracker = CopyTracker(cfg, TagCounter())
    by_name = {m.name: m for m in cfg.mfcs}
    return lambda name: tracker.plan(by_name[name])


def test_a_dropped_copy_is_refilled_before_every_call(tmp_path):
    plan = calls(tmp_path, keep=False)
    first = plan("gen")
    assert first.realloc and first.drop and first.name == "actor d2m1p1@2,3"
    assert first.home == Placement(Layout(2), (0, 1)) and first.placement == GEN
    assert plan("gen").realloc  # freed after the first call: filled again
    assert plan("actor_train") is None and plan("values") is None  # at home: nothing to move


def test_a_kept_copy_is_refilled_only_after_its_model_trained(tmp_path):
    plan = calls(tmp_path, keep=True)
    assert plan("gen").realloc and not plan("gen").drop
    assert not plan("gen").realloc  # nothing trained since: the copy is current
    assert plan("critic_train") is None and not plan("gen").realloc  # another model trained
    assert plan("actor_train") is None
    assert plan("gen").realloc  # the actor's weights changed: move them again


def test_asynchronous_generation_reuses_its_copy_within_the_staleness_bound(tmp_path):
    """Under ``async_rl`` (max staleness 1) the generate call's copy is kept between calls and
    refilled once its model has trained since (the master posts the call of step k when k - 1
    training calls are posted); the tracker records the version every generate call sampled from
    (its samples' staleness is the training step minus it)."""
    from realrl.api.core.system_api import AsyncRL
    from realrl.system.copies import CopyTracker
    from realrl.system.transfer_plan import TagCounter

    cfg = dataclasses.replace(mock_config(tmp_path, "t", mfc_placements={"gen": GEN}), async_rl=AsyncRL(1))
    tracker = CopyTracker(cfg, TagCounter())
    by_name = {m.name: m for m in cfg.mfcs}

    def plan(name, step):
        return tracker.plan(by_name[name], step)

    first = plan("gen", 0)
    assert first.realloc and not first.drop and first.version == 0  # kept, though keep_gen_copy is off
    assert not plan("gen", 1).realloc  # version 0 is one step behind step 1: allowed
    assert plan("actor_train", 0) is None
    second = plan("gen", 2)  # one training call posted: refilled with version 1
    assert second.realloc and second.version == 1
    assert tracker.versions_used == {("gen", 0): 0, ("gen", 1): 0, ("gen", 2): 1}


def test_with_staleness_zero_the_copy_follows_every_training_step(tmp_path):
    from realrl.api.core.system_api import AsyncRL
    from realrl.system.copies import CopyTracker
    from realrl.system.transfer_plan import TagCounter

    cfg = dataclasses.replace(mock_config(tmp_path, "t", mfc_placements={"gen": GEN}), async_rl=AsyncRL(0))
    tracker = CopyTracker(cfg, TagCounter())
    by_name = {m.name: m for m in cfg.mfcs}
    for step in range(3):
        copy = tracker.plan(by_name["gen"], step)
        assert copy.realloc and copy.version == step  # as the synchronous run: the newest weights
        tracker.plan(by_name["actor_train"], step)
