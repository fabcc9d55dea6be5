import json
import os

from realrl.apps.run import RunMonitor, curves_of
from realrl.base import stats
from realrl.experiments.ppo import PPOConfig
from realrl.experiments.sft import SFTConfig


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


def test_curve_keys_take_patterns_and_numbers_only():
    rows = [
        {"step": 1, "a/loss": 1.0, "timing": {"a": 1.0}, "realloc/x/moves": "d1 -> d2"},
        {"step": 2, "a/loss": 0.5, "a/eval_loss": 0.7, "b/eval_loss": 0.9, "b/eval_flag": True},
    ]
    assert stats.curve_keys(rows, ["a/loss", "*/eval_loss", "a/loss", "missing"]) == [
        "a/loss",
        "a/eval_loss",
        "b/eval_loss",
    ]
    assert stats.curve_keys(rows, ["*/moves", "timing", "*/eval_flag"]) == []


def test_curves_table_draws_kl_and_evaluations(tmp_path):
    """A PPO run's records give reward, KL and loss plots; an SFT run's its evaluation loss too."""
    ppo = [
        {"step": i, "compute_adv/task_reward": 0.1 * i, "compute_adv/ref_kl": 0.2 * i}
        | {"actor_train/loss": -0.02, "critic_train/critic_loss": 5.0 / i, "timing": {}}
        for i in range(1, 4)
    ]
    sft = [{"step": i, "trainDefault/loss": 3.0 / i} for i in range(1, 4)]
    sft[-1] |= {"trainDefault/eval_loss": 1.2, "trainDefault/eval_ppl": 3.3, "trainDefault/eval_n_tokens": 9}
    for name, rows in (("ppo", ppo), ("sft", sft)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ppo_curves, sft_curves = curves_of(PPOConfig), curves_of(SFTConfig)
    written = stats.plot_curves(str(tmp_path / "ppo.jsonl"), str(tmp_path / "ppo"), ppo_curves)
    assert [os.path.basename(p) for p in written] == ["reward.png", "kl.png", "loss.png"]
    assert stats.curve_keys(ppo, ppo_curves["kl"]) == ["compute_adv/ref_kl"]
    assert stats.curve_keys(sft, sft_curves["loss"]) == ["trainDefault/loss", "trainDefault/eval_loss"]
    assert stats.curve_keys(sft, sft_curves["perplexity"]) == ["trainDefault/eval_ppl"]
    written = stats.plot_curves(str(tmp_path / "sft.jsonl"), str(tmp_path / "sft"), sft_curves)
    assert [os.path.basename(p) for p in written] == ["loss.png", "perplexity.png"]


def test_run_monitor_mirrors_records_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monitor = RunMonitor(str(tmp_path), dict(PPOConfig.PROGRESS))
    for step in (1, 2, 3):
        monitor({"step": step, "epoch": 1, "compute_adv/task_reward": float(step), "timing": {}}, 3)
    assert monitor.bar.n == 3
    monitor.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.value for e in events.Scalars("compute_adv/task_reward")] == [1.0, 2.0, 3.0]


def test_finite_numbers_only():
    assert stats._finite_numbers({"a": 1, "b": float("nan"), "c": "x", "d": True}) == {"a": 1.0, "d": 1.0}
