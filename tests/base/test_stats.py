import json
import os

from realrl.apps.run import RunMonitor
from realrl.base import stats


def test_plot_curves_and_summary(tmp_path, capsys):
    path = tmp_path / "stats.jsonl"
    path.write_text(
        "".join(json.dumps({"step": i, "a/loss": 1.0 / i, "a/reward": i}) + "\n" for i in range(1, 6))
    )
    written = stats.plot_curves(str(path), str(tmp_path / "plots"), {"loss": ["a/loss"], "kl": ["a/missing"]})
    assert [os.path.basename(p) for p in written] == ["loss.png"]  # groups with no data are skipped
    assert (tmp_path / "plots" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    out = stats.write_summary(str(tmp_path), {"true_reward_mean": 3.25, "rm_accuracy": None, "steps": 5})
    assert json.loads(open(out).read()) == {"true_reward_mean": 3.25, "rm_accuracy": None, "steps": 5}
    printed = capsys.readouterr().out
    assert "true_reward_mean  3.25" in printed and "rm_accuracy       None" in printed


def test_run_monitor_mirrors_records_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monitor = RunMonitor(str(tmp_path))
    for step in (1, 2, 3):
        monitor({"step": step, "epoch": 1, "actor_train/task_reward": float(step), "timing": {}}, 3)
    assert monitor.bar.n == 3
    monitor.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.value for e in events.Scalars("actor_train/task_reward")] == [1.0, 2.0, 3.0]


def test_finite_numbers_only():
    assert stats._finite_numbers({"a": 1, "b": float("nan"), "c": "x", "d": True}) == {"a": 1.0, "d": 1.0}
