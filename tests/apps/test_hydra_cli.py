"""The command line on hydra: YAML config files with defaults lists, --cfg job, --multirun sweeps,
and their errors as one line."""

import json
import os
import re
import subprocess
import sys

import pytest

from realrl.apps.configs import ConfigFile, build_config
from realrl.apps.errors import UserError
from realrl.apps.quickstart import parse_command
from realrl.apps.sweep import expand

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "configs")


def cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "realrl.apps.quickstart", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_error_line(out, message):
    assert out.returncode == 2, out.stdout + out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], out.stderr
    for noise in ("Traceback", "Error executing job", "HYDRA_FULL_ERROR"):
        assert noise not in out.stdout + out.stderr


@pytest.fixture
def configs(tmp_path):
    """A folder with a base file and a run file that extends it through its defaults list."""
    folder = tmp_path / "conf"
    folder.mkdir()
    (folder / "base.yaml").write_text("seed: 4\nexp_ctrl:\n  total_train_steps: 7\nactor:\n  n_mbs: 3\n")
    (folder / "run.yaml").write_text(
        "defaults:\n  - base\n  - _self_\n"
        f"fileroot: {tmp_path}/out\n"
        "actor:\n  n_mbs: 2\n  optimizer:\n    lr: 0.25\n"
        "ppo:\n  kl_ctl: 0.07\n"
    )
    return folder


def test_a_yaml_file_with_a_defaults_list_and_overrides_that_beat_it(configs, tmp_path):
    cfg = build_config("ppo", ["ppo.kl_ctl=0.3"], ConfigFile(str(configs), "run"))
    assert cfg.seed == 4 and cfg.exp_ctrl.total_train_steps == 7  # from base, through the defaults list
    assert cfg.actor.n_mbs == 2  # the file beats its defaults
    assert cfg.actor.optimizer.lr == 0.25  # the file beats the toy task's preset (1e-4)
    assert cfg.ppo.kl_ctl == 0.3  # the command line beats the file
    # the task read the file's seed
    assert cfg.trial_name == "toy-seed4" and cfg.fileroot == f"{tmp_path}/out"


def test_a_yaml_file_that_does_not_parse_is_named_with_its_line(configs):
    (configs / "broken.yaml").write_text("seed: 4\nactor:\n  n_mbs: [1\nppo: {}\n")
    with pytest.raises(
        UserError, match=rf"^{re.escape(str(configs / 'broken.yaml'))}: line \d+: not valid YAML"
    ):
        build_config("ppo", [], ConfigFile(str(configs), "broken"))


def test_an_unknown_key_in_a_yaml_file_names_the_file(configs):
    (configs / "typo.yaml").write_text("exp_ctrl:\n  total_train_stepz: 3\n")
    with pytest.raises(UserError) as info:
        build_config("ppo", [], ConfigFile(str(configs), "typo"))
    message = str(info.value)
    assert message.startswith(f"{configs / 'typo.yaml'}: ") and "\n" not in message
    assert "did you mean 'exp_ctrl.total_train_steps'?" in message
    with pytest.raises(UserError, match=r"--config-name nope: no nope.yaml in "):
        build_config("ppo", [], ConfigFile(str(configs), "nope"))


def test_cfg_job_with_a_yaml_file_and_its_errors_on_the_command_line(configs, tmp_path):
    out = cli("ppo", "--config-path", str(configs), "--config-name", "run", "seed=9", "--cfg", "job")
    assert out.returncode == 0, out.stderr
    assert "lr: 0.25" in out.stdout and "kl_ctl: 0.07" in out.stdout and "trial_name: toy-seed9" in out.stdout
    assert not (tmp_path / "out").exists()  # --cfg job runs nothing
    (configs / "typo.yaml").write_text("exp_ctrl:\n  total_train_stepz: 3\n")
    assert_one_error_line(
        cli("ppo", f"--config-path={configs}", "--config-name=typo.yaml"), f"error: {configs / 'typo.yaml'}: "
    )


@pytest.mark.parametrize(
    "name, file, extra, expected",
    [
        ("ppo", "toy_ppo", [], ["trial_name: toy-seed1", "kl_ctl: 0.1"]),
        ("grpo", "smollm2_grpo", [], ["reward_fn: math_answer", "- answer", "max_new_tokens: 24"]),
        ("ppo", "ppo_7b_8gpu", [], ["allocation_mode: actor_train:d8m1p1,actor_gen:d4m2p1,*:d2m4p1"]),
        ("ppo", "ppo_7b_8gpu", ["layouts=fsdp_8gpu"], ["allocation_mode: d8", "offload: true"]),
    ],
)
def test_the_example_config_files_compose(name, file, extra, expected, tmp_path):
    flags = ["--config-path", EXAMPLES, "--config-name", file, "--cfg", "job"]
    command = parse_command([name, *flags, f"fileroot={tmp_path}", *extra])
    for text in expected:
        assert text in command.text, (text, command.text)


def test_hydra_grammar_deletion_and_commas_outside_a_sweep(tmp_path):
    cfg = build_config("ppo", [f"fileroot={tmp_path}", "+manual.actor=[0,1]", "~manual.actor"])
    assert cfg.manual == {}
    with pytest.raises(UserError, match=r"^~seed: seed is an option and cannot be removed"):
        build_config("ppo", [f"fileroot={tmp_path}", "~seed"])
    with pytest.raises(UserError, match=r"^seed=choice\(1,2\): a sweep runs with --multirun"):
        build_config("ppo", [f"fileroot={tmp_path}", "seed=choice(1,2)"])
    with pytest.raises(UserError, match=r"^seed=1,2: Value '1,2' of type 'str' could not be converted"):
        build_config("ppo", [f"fileroot={tmp_path}", "seed=1,2"])  # no --multirun: the text itself


def test_a_sweep_expands_every_combination_named_after_its_values(tmp_path):
    runs = expand(["seed=1,2", "ppo.kl_ctl=0.05,0.1", f"fileroot={tmp_path}"])
    assert [r.label for r in runs] == [
        "seed=1,ppo.kl_ctl=0.05",
        "seed=1,ppo.kl_ctl=0.1",
        "seed=2,ppo.kl_ctl=0.05",
        "seed=2,ppo.kl_ctl=0.1",
    ]
    command = parse_command(["ppo", "--multirun", "seed=1,2", f"fileroot={tmp_path}", "--cfg", "job"])
    assert "trial_name: seed=1\n" in command.text and "trial_name: seed=2\n" in command.text
    named = parse_command(
        ["ppo", "-m", "seed=1,2", f"fileroot={tmp_path}", "trial_name=s${seed}", "--cfg", "job"]
    )
    assert "# s1: " in named.text and "# s2: " in named.text  # the user's trial_name wins
    with pytest.raises(UserError, match=r"both write to .*give each run its own trial_name"):
        parse_command(["ppo", "-m", "seed=1,2", f"fileroot={tmp_path}", "trial_name=same"])


def test_a_sweep_of_two_tiny_runs_writes_two_trials_and_a_table(tmp_path):
    out = cli(
        "sft",
        "--multirun",
        "seed=1,2",
        "exp_ctrl.total_train_steps=1",
        "dataset.train_bs_n_seqs=8",
        f"fileroot={tmp_path}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for trial in ("seed=1", "seed=2"):
        with open(tmp_path / "sft" / trial / "summary.json") as f:
            assert json.load(f)["steps"] == 1
    table = [line for line in out.stdout.splitlines() if line.startswith("| seed=")]
    assert [line.split("|")[1].strip() for line in table] == ["seed=1", "seed=2"]
    assert out.stdout.count("| trial | experiment | steps |") == 1
    # output to a file: one short line a step (the whole record is in stats.jsonl), no bar frames
    steps = [line for line in out.stderr.splitlines() if " done in " in line]
    assert len(steps) == 2 and all(len(line) < 200 and "loss=" in line for line in steps), steps
    assert "\r" not in out.stderr and "step/s" not in out.stderr
