"""The master's one rule for evaluations, HF checkpoints and recover points."""

from realrl.system.schedule import Schedule


def test_eval_save_and_recover_points_fall_on_their_steps_and_the_last():
    s = Schedule(total_steps=10, eval_freq=4, save_freq=3, ckpt_freq=5, evaluates=True, trains=True)
    assert [d for d in range(1, 11) if s.eval_due(d)] == [4, 8, 10]
    assert [d for d in range(1, 11) if s.save_due(d)] == [3, 6, 9, 10]
    assert [d for d in range(1, 11) if s.recover_due(d)] == [5, 10]
    assert [d for d in range(1, 11) if s.any_due(d)] == [3, 4, 5, 6, 8, 9, 10]


def test_nothing_to_evaluate_or_resume_means_no_such_points():
    s = Schedule(total_steps=6, eval_freq=2, ckpt_freq=2, evaluates=False, trains=False)
    assert not any(s.eval_due(d) or s.recover_due(d) for d in range(1, 7))
    assert [d for d in range(1, 7) if s.any_due(d)] == [6]  # the final checkpoint only
    assert not any(Schedule(6, trains=True).recover_due(d) for d in range(1, 7))  # no ckpt_freq
