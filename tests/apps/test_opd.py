"""The ``opd`` experiment: its graph, its refusals, the teacher phases it plans (and reuses) on the
toy task, and 2 steps from the command line with a given tiny teacher of another family and size."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from device_discipline import OVERRIDES

from realrl.api.core.dfg import build_graph
from realrl.apps.configs import build_config
from realrl.apps.errors import UserError
from realrl.apps.run import plan_phases, run_quickstart
from realrl.experiments.tasks import get_task


def cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "realrl.apps.quickstart", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The toy task's files, a tiny student (llama family, the toy model) and a teacher of twice
    its width in the mistral family, both with random weights and the toy tokenizer."""
    import torch

    from realrl.api.core.data_api import load_hf_tokenizer
    from realrl.api.core.model_api import ReaLModelConfig
    from realrl.impl.dataset.toy.corpus import toy_model_config
    from realrl.impl.model.nn.real_model import ReaLModel

    root = str(tmp_path_factory.mktemp("opd"))
    files = get_task("sentiment").files(root, 1)
    tokenizer = load_hf_tokenizer(files["tokenizer"])
    paths = {}
    for name, extra in (("student", {}), ("teacher", {"hidden_dim": 128, "hf_model_type": "mistral"})):
        torch.manual_seed(0)
        ReaLModel(ReaLModelConfig(**{**toy_model_config(), **extra})).save_pretrained(
            os.path.join(root, name), tokenizer
        )
        paths[name] = os.path.join(root, name)
    return root, paths


def test_the_graph_scores_the_students_samples_with_the_teacher_and_the_student():
    cfg = build_config(
        "opd", ["actor.path=/s", "teacher.path=/t", "dataset.path=/p.jsonl", "tokenizer_path=/s"]
    )
    exp = cfg.initial_setup()
    calls = {m.name: m for m in exp.mfcs}
    assert list(calls) == ["actor_gen", "teacher_inf", "actor_inf", "compute_adv", "actor_train"]
    assert {m.role for m in exp.mfcs} == {"actor", "teacher", "adv"} and set(exp.models) == {
        "actor",
        "teacher",
        "adv",
    }
    graph = build_graph(exp.mfcs)
    assert set(graph.predecessors("compute_adv")) == {"actor_gen", "teacher_inf", "actor_inf"}
    assert calls["teacher_inf"].output_keys == ("packed_teacher_logprobs",)
    assert calls["actor_inf"].output_keys == ("packed_student_logprobs",)
    assert calls["compute_adv"].interface_impl.type_ == "opd_reward"
    assert calls["actor_train"].input_key_remap == {"packed_teacher_logprobs": "packed_ref_logprobs"}
    assert exp.models["teacher"].model.args["path"] == "/t"
    assert exp.models["teacher"].backend.type_ == "inference"
    # a watched task reward adds its call; the advantages still ignore it
    watched = build_config(
        "opd", ["actor.path=/s", "teacher.path=/t", "dataset.path=/p.jsonl", "reward_fn=toy_sentiment"]
    )
    names = [m.name for m in watched.initial_setup().mfcs]
    assert "rew_inf" in names


@pytest.mark.parametrize(
    "override, message",
    [
        ("async_rl.enabled=true", "async_rl.enabled=false"),
        ("teacher_kl_coef=0", "teacher_kl_coef must be > 0"),
        ("ppo.adv_estimator=gae", "trains no critic"),
        ("dynamic_sampling.enabled=true", "dynamic_sampling"),
    ],
)
def test_options_opd_cannot_honour_are_refused(override, message):
    with pytest.raises(UserError, match=message):
        build_config(
            "opd", ["actor.path=/s", "teacher.path=/t", "dataset.path=/p.jsonl", "ppo.gen.n=2", override]
        )


def test_a_teacher_with_another_vocabulary_and_a_missing_teacher_are_one_line_errors(tmp_path):
    for name, size in (("s", 10), ("t", 12)):
        os.makedirs(tmp_path / name)
        (tmp_path / name / "config.json").write_text(json.dumps({"vocab_size": size}))
    cfg = build_config(
        "opd", [f"actor.path={tmp_path / 's'}", f"teacher.path={tmp_path / 't'}", "dataset.path=/p"]
    )
    with pytest.raises(ValueError, match="vocabulary of 12 tokens.*of 10"):
        cfg.initial_setup()
    (tmp_path / "p.jsonl").write_text('{"prompt": "a b"}\n')
    common = (
        "opd",
        f"actor.path={tmp_path / 's'}",
        f"dataset.path={tmp_path / 'p.jsonl'}",
        f"fileroot={tmp_path}",
    )
    for extra, message in (
        ((), "teacher.path is required"),
        ((f"teacher.path={tmp_path / 't'}",), "vocabulary"),
    ):
        out = cli(*common, *extra)
        assert out.returncode == 2 and message in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_the_toy_task_builds_the_teacher_first_and_reuses_it(checkpoints):
    root = checkpoints[0]  # the task's files are written there already
    cfg = build_config("opd", [f"fileroot={root}"])
    teacher = cfg.teacher.path
    assert teacher == os.path.join(root, "opd_teacher", "toy-seed1", "checkpoints", "actor", "final")
    phases = plan_phases("opd", cfg)
    assert [p.name for p in phases] == ["sft", "opd_teacher_sft", "opd_teacher", "opd"]
    shapes = {p.name: p.experiment.models.get("default") for p in phases[:2]}
    student, big = (shapes[n].model.args["config"] for n in ("sft", "opd_teacher_sft"))
    assert (student["hidden_dim"], big["hidden_dim"]) == (64, 128)
    assert phases[2].config.actor.path.endswith(
        os.path.join("opd_teacher_sft", "toy-seed1", "checkpoints", "default", "final")
    )
    os.makedirs(teacher)  # a teacher checkpoint is there: its phases are not run again
    with open(os.path.join(teacher, "config.json"), "w") as f:
        json.dump({}, f)
    assert [p.name for p in plan_phases("opd", build_config("opd", [f"fileroot={root}"]))] == [
        "sft",
        "opd",
    ]


def test_opd_runs_two_steps_from_the_command_line_with_a_given_teacher(checkpoints):
    root, paths = checkpoints
    out = cli(
        "opd",
        f"fileroot={root}",
        f"actor.path={paths['student']}",
        f"teacher.path={paths['teacher']}",
        "exp_ctrl.total_train_steps=2",
        "dataset.train_bs_n_seqs=8",
        "toy_eval_prompts=16",
        *OVERRIDES,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = os.path.join(root, "opd", "toy-seed1")
    with open(os.path.join(run_dir, "stats.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["compute_adv/reverse_kl"] > 0  # a random teacher disagrees with the student
        assert "compute_adv/task_reward" in r and "actor_train/loss" in r
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["experiment"] == "opd" and summary["steps"] == 2
    assert summary["kl_to_teacher"] > 0 and "teacher_true_reward_mean" in summary
    assert set(summary["phase_seconds"]) == {"opd", "plots", "evaluation"}  # no teacher phase ran


@pytest.mark.slow
def test_opd_builds_its_teacher_by_rl_then_distils(tmp_path):
    short = 'prerequisite_overrides=["exp_ctrl.total_train_steps=2","dataset.train_bs_n_seqs=8"]'
    cfg = build_config(
        "opd",
        [f"fileroot={tmp_path}", "exp_ctrl.total_train_steps=2", "toy_eval_prompts=16", short, *OVERRIDES],
    )
    summary = run_quickstart("opd", cfg)
    assert set(summary["phase_seconds"]) >= {"sft", "opd_teacher_sft", "opd_teacher", "opd"}
    assert os.path.isfile(os.path.join(cfg.teacher.path, "config.json"))
    with open(os.path.join(cfg.teacher.path, "config.json")) as f:
        assert json.load(f)["hidden_size"] == 128
    assert summary["kl_to_teacher"] >= 0 and "true_reward_mean" in summary
