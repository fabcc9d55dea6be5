"""The command line: errors before any worker starts, presets, resolved configs."""

import os
import re
import subprocess
import sys

import pytest

from realrl.api.core.dfg import build_graph
from realrl.api.core.layout import Layout
from realrl.apps.configs import build_config, chosen_task, preset_overrides
from realrl.apps.errors import UserError
from realrl.apps.quickstart import standby_count


def cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "realrl.apps.quickstart", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_lists_experiments_and_groups():
    out = cli("--help")
    assert out.returncode == 0
    for name in ("sft", "rw", "dpo", "ppo", "grpo", "gen"):
        assert f"  {name}" in out.stdout
    assert "groups: " in out.stdout and "actor" in out.stdout


def assert_user_error(out, message):
    """Exit status 2 and one ``error:`` line with ``message``: no traceback, no hydra wrapper."""
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr
    for noise in ("Traceback", "Error executing job", "HYDRA_FULL_ERROR"):
        assert noise not in out.stdout + out.stderr
    assert [line for line in out.stderr.splitlines() if line.startswith("error: ")] != []


def test_unknown_experiment():
    assert_user_error(cli("ppx"), "unknown experiment 'ppx'")


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "actor.optimzer.lr=1",
            "Key 'optimzer' not in 'ModelTrainEvalConfig'; did you mean 'actor.optimizer'?",
        ),
        ("seed=abc", "seed=abc: Value 'abc' of type 'str' could not be converted to Integer"),
        ("mode=cluster", "mode='cluster' is not allowed; choose one of ['local', 'ray']"),
    ],
)
def test_cli_fails_before_any_worker_naming_the_key(override, message, tmp_path):
    assert_user_error(cli("ppo", f"fileroot={tmp_path}", override), message)
    assert not any(tmp_path.rglob("*.log"))  # no worker ever started


def test_debug_true_adds_the_traceback(tmp_path):
    out = cli("ppo", f"fileroot={tmp_path}", "seed=abc", "debug=true")
    assert out.returncode == 2 and "Traceback" in out.stderr
    assert out.stderr.rstrip().splitlines()[-1].startswith("error: seed=abc: ")


@pytest.mark.parametrize(
    "override, error, message",
    [
        ("actor.optimzer.lr=1", Exception, "optimzer"),
        ("ppo.kl_estimator=k9", ValueError, "kl_estimator must be 'k1', 'k2' or 'k3'"),
        ("actor.optimizer.lr_scheduler_type=step", ValueError, "lr_scheduler_type must be one of"),
        ("recover_mode=sometimes", ValueError, "recover_mode='sometimes' is not allowed"),
        ("exp_ctrl.total_train_epochs=0", ValueError, "exp_ctrl.total_train_epochs must be >= 1"),
        ("ppo_preset=nope", UserError, "ppo_preset='nope' is not a preset"),
        ("ppo.gen.n=0", UserError, "ppo.gen.n must be >= 1, got 0"),
        ("actor.n_mbs=0", UserError, "actor.n_mbs must be >= 1, got 0"),
        ("actor.optimizer.lr=nan", UserError, "actor.optimizer.lr=nan: not a number"),
        ("seed=-1", UserError, "seed must be in [0, 2**63), got -1"),
        ("dataset.train_bs_n_seqs=0", UserError, "dataset.train_bs_n_seqs must be >= 1, got 0"),
    ],
)
def test_config_errors_name_the_key(override, error, message):
    with pytest.raises(error, match=re.escape(message)):
        build_config("ppo", [override])


def test_cfg_job_prints_resolved_config_with_toy_preset_and_user_precedence(tmp_path):
    out = cli("ppo", f"fileroot={tmp_path}", "actor.optimizer.lr=0.5", "--cfg", "job")
    assert out.returncode == 0, out.stderr
    assert "lr: 0.5" in out.stdout  # the user's value beats the toy preset's 1e-4
    assert "trial_name: toy-seed1" in out.stdout
    assert "max_new_tokens: 13" in out.stdout


def test_presets_expand_before_user_overrides():
    expanded, rest = preset_overrides(["ppo_preset=lm_human_preferences", "ppo.kl_ctl=0.3"])
    assert rest == ["ppo.kl_ctl=0.3"]
    assert "ppo.adaptive_kl_ctl=true" in expanded and "ppo.gen.fixed_length=true" in expanded
    cfg = build_config("ppo", ["ppo_preset=lm_human_preferences", "ppo.kl_ctl=0.3", "dataset.path=x.jsonl"])
    assert cfg.ppo.kl_ctl == 0.3 and cfg.ppo.adaptive_kl_ctl and cfg.ppo.gen.max_new_tokens == 24


def test_toy_preset_only_without_a_dataset_path():
    assert (
        chosen_task("ppo", []).name == "sentiment"
        and chosen_task("ppo", ["dataset.path=/data/p.jsonl"]) is None
    )
    cfg = build_config("ppo", ["dataset.path=/data/p.jsonl", "actor.path=/m"])
    assert cfg.trial_name == "default" and cfg.actor.optimizer.lr == 1e-5


@pytest.mark.parametrize("name", ["sft", "rw", "dpo", "ppo", "grpo", "rloo", "reinforce_pp", "remax", "gen"])
def test_every_experiment_builds_a_valid_graph_on_the_toy_task(name, tmp_path):
    cfg = build_config(name, [f"fileroot={tmp_path}"])
    exp = cfg.initial_setup()
    graph = build_graph(exp.mfcs, exp.dataset_keys())
    assert graph.number_of_nodes() == len(exp.mfcs)
    assert exp.run_dir.startswith(str(tmp_path)) and exp.trial_name == "toy-seed1"
    if name in ("ppo",):
        assert set(graph.nodes) == {
            "actor_gen",
            "rew_inf",
            "ref_inf",
            "critic_inf",
            "compute_adv",
            "actor_train",
            "critic_train",
        }
    if name in ("grpo", "rloo", "reinforce_pp", "remax"):
        assert "critic_inf" not in graph and exp.models["reward"].model.type_ == "null"
    if name == "remax":  # the greedy baseline: a second generate call and a second reward call
        assert {"actor_gen_greedy", "rew_inf_greedy"} <= set(graph.nodes)
        assert graph.has_edge("rew_inf_greedy", "compute_adv")


@pytest.mark.parametrize(
    "overrides, reference",
    [
        ([], True),  # GRPO's KL loss (0.04) reads the reference
        (["ppo_preset=dr_grpo"], False),  # no KL term at all: no reference model, no ref_inf
        (["ppo_preset=dapo", "dynamic_sampling.enabled=false"], False),
        (["ppo_preset=dr_grpo", "ppo.monitor_ref_kl=true"], True),  # kept for the statistic
        (["ppo_preset=dr_grpo", "ppo.kl_loss_coef=0.01"], True),
    ],
)
def test_the_reference_runs_only_where_a_kl_term_reads_it(tmp_path, overrides, reference):
    cfg = build_config("grpo", [f"fileroot={tmp_path}", "dataset.valid_path=/data/v.jsonl", *overrides])
    exp = cfg.initial_setup()
    calls = {m.name for m in exp.mfcs}
    assert ("ref_inf" in calls) == ("ref" in exp.models) == reference
    reads = [m.name for m in [*exp.mfcs, *exp.eval_mfcs] if "packed_ref_logprobs" in m.input_keys]
    assert bool(reads) == reference and ("ref_inf" in exp.eval_calls) == reference
    assert ("ref" in cfg.unused_groups()) != reference  # the --help and ignored-option notes say so
    build_graph(exp.mfcs, exp.dataset_keys())  # every input has a producer


def test_a_kl_penalty_in_the_reward_reads_the_reference_even_from_a_coefficient_of_zero():
    from realrl.impl.interface.ppo_config import PPOHyperparameters

    assert PPOHyperparameters().uses_reference  # PPO's fixed penalty, 0.1
    assert not PPOHyperparameters(kl_ctl=0.0).uses_reference
    assert PPOHyperparameters(kl_ctl=0.0, adaptive_kl_ctl=True).uses_reference  # it may grow


def test_ppo_top_p_and_top_k_set_the_sampling(tmp_path):
    cfg = build_config("ppo", [f"fileroot={tmp_path}", "ppo.top_p=0.9", "ppo.top_k=1000"])
    assert (cfg.ppo.gen.top_p, cfg.ppo.gen.top_k) == (0.9, 1000)


def test_lm_human_preferences_preset_sets_schedule_epsilon_and_value_head(tmp_path):
    cfg = build_config("ppo", [f"fileroot={tmp_path}", "ppo_preset=lm_human_preferences"])
    for group in (cfg.actor, cfg.critic):
        opt = group.optimizer
        assert (opt.lr_scheduler_type, opt.min_lr_ratio, opt.tf_style_eps) == ("linear", 0.0, True)
    assert cfg.critic_head_init == "zeros" and cfg.ppo.adaptive_kl_ctl and cfg.ppo.gen.fixed_length


def test_dapo_preset_turns_on_dynamic_sampling_with_a_filter_after_the_reward(tmp_path):
    cfg = build_config("grpo", [f"fileroot={tmp_path}", "ppo_preset=dapo"])
    assert cfg.dynamic_sampling.enabled and cfg.ppo.eps_clip_high == 0.28
    exp = cfg.initial_setup()
    graph = build_graph(exp.mfcs, exp.dataset_keys())
    assert graph.has_edge("rew_inf", "filter_groups") and exp.dynamic_sampling.max_rounds == 10
    assert [m.name for m in exp.sampling_mfcs()] == ["actor_gen", "rew_inf", "filter_groups"]
    off = build_config("grpo", [f"fileroot={tmp_path}", "ppo_preset=dapo", "dynamic_sampling.enabled=false"])
    assert off.initial_setup().dynamic_sampling is None
    assert build_config("grpo", [f"fileroot={tmp_path}"]).initial_setup().sampling_mfcs() == []
    with pytest.raises(ValueError, match=r"needs several answers per prompt; ppo.gen.n is 1"):
        build_config("ppo", [f"fileroot={tmp_path}", "dynamic_sampling.enabled=true"])
    with pytest.raises(ValueError, match=r"metric='score' is written by no call"):
        build_config(
            "grpo", [f"fileroot={tmp_path}", "ppo_preset=dapo", "dynamic_sampling.metric=score"]
        ).initial_setup()


def test_arith_task_sets_its_files_checker_and_metadata(tmp_path):
    cfg = build_config("grpo", [f"fileroot={tmp_path}", "task=arith"])
    assert cfg.task == "arith" and cfg.trial_name == "arith-seed1" and cfg.reward_fn == "math_answer"
    assert cfg.dataset.metadata_keys == ["answer"] and cfg.dataset.path.endswith("rl_train.jsonl")
    assert cfg.actor.path.endswith(os.path.join("sft", "arith-seed1", "checkpoints", "default", "final"))
    with pytest.raises(UserError, match="task=arith runs on the task's own data"):
        build_config("grpo", [f"fileroot={tmp_path}", "task=arith", "dataset.path=x.jsonl"])
    with pytest.raises(UserError, match="not an embedded task"):
        build_config("grpo", [f"fileroot={tmp_path}", "task=nope"])
    with pytest.raises(UserError, match="no recipe for the 'dpo' experiment"):
        build_config("dpo", [f"fileroot={tmp_path}", "task=arith"])


def test_allocation_mode_reaches_the_experiment(tmp_path):
    cfg = build_config("ppo", [f"fileroot={tmp_path}", "allocation_mode=actor:d2,*:d1@1"])
    exp = cfg.initial_setup()
    assert exp.allocations["actor"] == [0, 1] and exp.allocations["critic"] == [1]
    cfg = build_config("ppo", [f"fileroot={tmp_path}", 'allocation_mode="actor:d1m2p1,*:d2m1p1@1"'])
    exp = cfg.initial_setup()
    assert exp.n_model_workers == 3 and exp.data_workers() == [0]
    assert str(exp.layouts["actor"]) == "d1m2p1" and exp.allocations["critic"] == [1, 2]


def test_manual_layouts_from_the_command_line(tmp_path):
    cfg = build_config(
        "ppo",
        [
            f"fileroot={tmp_path}",
            "allocation_mode=manual",
            "+manual.actor=[0,1]",  # as on the command line: hydra adds dict keys with '+'
            "+manual.critic=[1]",
            "+manual.ref=[0]",
            "+manual.reward=[1]",
            "+manual_layouts.actor=d1m2p1",
        ],
    )
    exp = cfg.initial_setup()
    assert str(exp.layouts["actor"]) == "d1m2p1" and exp.allocations["actor"] == [0, 1]
    assert str(exp.layouts["critic"]) == "d1m1p1" and exp.allocations["reward"] == [1]


def test_pipeline_layouts_place_stages_and_refuse_what_they_cannot_do(tmp_path):
    """Whole-run and per-call layouts with stages set up; pipelined partial rollouts are refused."""
    cfg = build_config("ppo", [f"fileroot={tmp_path}", "allocation_mode=d1m1p2"])
    exp = cfg.initial_setup()
    assert str(exp.layouts["actor"]) == "d1m1p2" and exp.allocations["actor"] == [0, 1]
    per_call = 'allocation_mode="actor_train:d1m1p2,actor_gen:d2m1p1,*:d1m1p1"'
    exp = build_config("ppo", [f"fileroot={tmp_path}", per_call]).initial_setup()
    assert str(exp.layouts["actor"]) == "d1m1p2" and str(exp.mfc_placements["actor_gen"]) == "d2m1p1@0,1"
    pieces = ["async_rl.enabled=true", "async_rl.partial_rollout=true"]
    cfg = build_config("ppo", [f"fileroot={tmp_path}", "allocation_mode=d1m1p2", *pieces])
    with pytest.raises(ValueError, match=r"MFC 'actor_gen' generates in d1m1p2 and async_rl.partial_rollout"):
        cfg.initial_setup()


@pytest.mark.parametrize("layout", ["d1m1p2", "d1m2p1"])
def test_a_layout_for_the_whole_experiment_is_meant_for_the_models(layout, tmp_path):
    """grpo's reward is a function (no weights): it runs replicated on the layout's workers."""
    exp = build_config("grpo", [f"fileroot={tmp_path}", f"allocation_mode={layout}"]).initial_setup()
    assert str(exp.layouts["actor"]) == layout and exp.allocations["actor"] == [0, 1]
    assert str(exp.layouts["reward"]) == "d2m1p1" and exp.allocations["reward"] == [0, 1]


def test_a_layout_for_the_whole_experiment_passes_the_pre_run_check_on_the_command_line(tmp_path):
    from realrl.apps.quickstart import prepare

    command = prepare(["grpo", f"fileroot={tmp_path}", "allocation_mode=d1m1p2"])
    assert str(command.phases[-1].experiment.layouts["reward"]) == "d2m1p1"
    assert_user_error(
        cli(
            "grpo",
            f"fileroot={tmp_path}",
            'allocation_mode="reward:d1m2p1,*:d1m1p1"',
        ),
        "model 'reward' has no weights to split, but its layout is d1m2p1",
    )


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["ppo"], 1),
        (["ppo", "allocation_mode=d2"], 2),
        (["ppo", "allocation_mode=actor:d2,critic:d1@1"], 2),
        (["ppo", 'allocation_mode="actor:d1m2p1,critic:d2m2p1@2,*:d1"'], 6),
        (["ppo", "allocation_mode=d2m2p1"], 4),
        (["ppo", "allocation_mode=manual"], 1),
        (["ppo", "allocation_mode=d2", "standby_workers=0"], 0),
        (["ppo", "standby_workers=3"], 3),
        (["ppo", "standby_workers=null"], 1),
        (["ppo", "mode=ray"], 0),
        (["ppo", "--cfg", "job"], 0),
        (["--help"], 0),
        ([], 0),
    ],
)
def test_standby_workers_started_before_the_config_is_built(argv, expected):
    assert standby_count(argv) == expected


def test_the_cli_starts_its_standby_workers_first_and_stops_the_unused_ones(monkeypatch):
    import realrl.apps.quickstart as qs

    seen = []
    monkeypatch.setattr(qs, "_main", lambda argv, standby: seen.append((standby, list(standby.procs))))
    qs.main(["ppo", "allocation_mode=d2"])
    standby, procs = seen[0]
    assert len(procs) == 2
    assert all(p.returncode is not None for p in procs)  # not used: stopped when the CLI ends
    seen.clear()
    monkeypatch.setattr(qs, "_main", lambda argv, standby: seen.append(standby))
    qs.main(["ppo", "standby_workers=0"])
    assert seen == [None]  # no pool at all: no phase starts standby processes for the next one


def test_the_search_profiles_only_layouts_the_pre_run_check_accepts(tmp_path):
    """A whole-experiment layout of the search replicates grpo's reward function as the command
    line does; a layout the check refuses (3 heads' worth of tensor parallelism) is not profiled."""
    from realrl.apps.plan_search.choose import _runnable
    from realrl.apps.plan_search.cost_table import task_fallback
    from realrl.apps.plan_search.space import with_allocation

    cfg = build_config("grpo", [f"fileroot={tmp_path}", "allocation_mode=d1"])
    exp, fallback = cfg.initial_setup(), task_fallback(cfg)  # the toy model: its SFT phase has not run
    placed = with_allocation(exp, "d1m2p1")
    assert str(placed.layouts["actor"]) == "d1m2p1" and str(placed.layouts["reward"]) == "d2m1p1"
    assert _runnable(exp, Layout(1, 2, 1), fallback)
    assert not _runnable(exp, Layout(1, 3, 1), fallback)


def test_a_plugin_of_realrls_own_is_looked_up_without_importing_torch(tmp_path):
    """``module:function`` naming a realrl module is found (or named missing) without running it:
    the command line's process stays free of torch; a user's own file is imported."""
    from test_lean_master import check, run_lean

    out = check(
        run_lean(
            f"""
            from realrl.apps.errors import UserError
            from realrl.apps.quickstart import parse_command
            base = ["grpo", "task=arith", "fileroot={tmp_path}/out"]
            parse_command(base + ["reward_fn=realrl.impl.interface.reward_plugin:resolve_reward_fn"])
            try:
                parse_command(base + ["reward_fn=realrl.impl.interface.no_such:f"])
            except UserError as e:
                print(e)
            """,
            tmp_path,
        )
    )
    assert "reward_fn='realrl.impl.interface.no_such:f': no module 'realrl.impl.interface.no_such'" in out
