"""Every quickstart experiment runs 2 steps on the toy task's tiny model, end to end: workers,
checkpoints, stats, plots, summary. One fileroot is shared so later phases reuse earlier ones."""

import json
import os
import signal
import subprocess
import sys
import time

import collective_rules
import pytest
import torch
from device_discipline import MARKER, OVERRIDES
from safetensors.torch import load_file

from realrl.apps import run as run_mod
from realrl.apps.configs import build_config
from realrl.apps.run import run_quickstart
from realrl.base import stats

SHORT = [
    "exp_ctrl.total_train_steps=2",
    "dataset.train_bs_n_seqs=8",
    'prerequisite_overrides=["exp_ctrl.total_train_steps=2","dataset.train_bs_n_seqs=8"]',
]
# no held-out evaluation at the end (toy_eval_prompts=0): these runs compare their statistics;
# the tests that read the task's figures in the summary ask for them (EVALUATED)
PPO_EXTRA = ("ppo.ppo_n_minibatches=2", "toy_eval_prompts=0")
EVALUATED = "toy_eval_prompts=32"
GRPO_EXTRA = ("ppo.ppo_n_minibatches=2", "toy_eval_prompts=32")
TOY_SUMMARY_KEYS = (
    "sft_true_reward_mean",
    "sft_true_reward_std",
    "true_reward_mean",
    "true_reward_std",
    "rm_accuracy",
    "kl",
    "wall_seconds",
)


@pytest.fixture(scope="session")
def fileroot(toy_fileroot):
    return toy_fileroot


# Every run here is also the device-discipline check (tests/device_discipline.py): its model
# workers treat ``cpu:0`` as the device and fail where a GPU would, on a host tensor meeting a
# device tensor; every experiment and layout of this file is covered (FSDP included). It is also
# the NCCL-rules check (tests/collective_rules.py): each torch.distributed call is checked as it
# is issued, and the ranks' records are compared after the run. Ray actors load neither (they
# switch on in ``realrl.apps.remote`` processes only).


def assert_checked(run_dir):
    """Both checks were on in every model worker of the run, and its torch.distributed calls kept
    NCCL's rules across ranks (tests/collective_rules.py)."""
    logs = os.path.join(run_dir, "logs")
    workers = [f for f in os.listdir(logs) if f.startswith("model_worker")]
    texts = [open(os.path.join(logs, f)).read() for f in workers]
    assert workers and all(MARKER in t and collective_rules.MARKER in t for t in texts), workers
    collective_rules.check_run(run_dir)


def run(name, fileroot, *extra, discipline=True):
    cfg = build_config(name, [f"fileroot={fileroot}", *SHORT, *(OVERRIDES if discipline else ()), *extra])
    summary = run_quickstart(name, cfg)
    if discipline and cfg.mode == "local":
        assert_checked(cfg.run_dir)
    return cfg, summary


def default_run(name, fileroot, *extra):
    """The config of the default-layout run another test compares with; run here when that test
    did not run first (``pytest -m slow`` selects the comparisons alone)."""
    cfg = build_config(name, [f"fileroot={fileroot}", *SHORT, *extra])
    if not os.path.isfile(os.path.join(cfg.run_dir, "stats.jsonl")):
        run(name, fileroot, *extra)
    return cfg


def assert_run_outputs(run_dir, steps=2, trains=True):
    with open(os.path.join(run_dir, "stats.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == list(range(1, steps + 1))
    assert os.path.isfile(os.path.join(run_dir, "dataflow_graph.png"))
    if trains:
        assert os.listdir(os.path.join(run_dir, "plots"))
        # every step went to TensorBoard too (the progress bar's hook)
        assert any(
            f.startswith("events.out.tfevents") for f in os.listdir(os.path.join(run_dir, "tensorboard"))
        )
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def test_sft_then_rw_reuse_and_save(fileroot):
    cfg, summary = run("sft", fileroot)
    assert assert_run_outputs(cfg.run_dir)["steps"] == 2
    final = os.path.join(cfg.run_dir, "checkpoints", "default", "final")
    assert os.path.isfile(os.path.join(final, "config.json"))
    assert summary["trainDefault/loss"] > 0 and "trainDefault/eval_loss" in summary
    cfg, summary = run("rw", fileroot)
    assert_run_outputs(cfg.run_dir)
    assert 0.0 <= summary["rwTrain/eval_accuracy"] <= 1.0
    rows = stats.read_stats(os.path.join(cfg.run_dir, "stats.jsonl"))
    assert "rwTrain/eval_accuracy" in stats.curve_keys(
        rows, run_mod.curves_of(type(cfg))["accuracy"]
    )  # drawn
    assert {"loss.png", "accuracy.png"} <= set(os.listdir(os.path.join(cfg.run_dir, "plots")))
    assert os.path.isfile(
        os.path.join(cfg.run_dir, "checkpoints", "default", "final", "reward_normalization.json")
    )


def test_ppo_default_writes_the_toy_summary(fileroot):
    cfg, summary = run("ppo", fileroot, *PPO_EXTRA, EVALUATED)
    on_disk = assert_run_outputs(cfg.run_dir)
    for key in TOY_SUMMARY_KEYS:
        assert on_disk[key] is not None, key
    assert on_disk["kl"] >= 0 and 0 <= on_disk["rm_accuracy"] <= 1
    assert "compute_adv/task_reward" in on_disk and "critic_train/critic_loss" in on_disk
    # time and memory, phase by phase: the largest worker holds at least its models
    largest, together = (
        on_disk["phase_worker_peak_rss_gb"]["ppo"],
        on_disk["phase_workers_peak_rss_gb"]["ppo"],
    )
    assert 0.2 < largest <= together and on_disk["phase_seconds"]["ppo"] > 0
    assert on_disk["master_peak_rss_gb"] > 0.02
    plots = set(os.listdir(os.path.join(cfg.run_dir, "plots")))
    assert {"reward.png", "kl.png", "loss.png"} <= plots, plots  # the README's reward, KL and loss


@pytest.mark.slow  # FSDP end to end stays in the default suite with grpo (test_other_experiments_run_two_steps)
def test_sft_with_fsdp_over_two_workers_evaluates_and_saves_a_whole_model(fileroot):
    cfg, summary = run("sft", fileroot, "allocation_mode=d2", "model.engine.fsdp=true", "trial_name=fsdp")
    assert assert_run_outputs(cfg.run_dir)["steps"] == 2
    assert summary["trainDefault/eval_loss"] > 0  # both ranks evaluated their shards in lockstep
    final = os.path.join(cfg.run_dir, "checkpoints", "default", "final")
    weights = load_file(os.path.join(final, "model.safetensors"))
    assert weights["model.embed_tokens.weight"].shape[0] > 0  # gathered whole, not a shard
    reference = load_file(
        os.path.join(
            default_run("sft", fileroot).run_dir,
            "checkpoints",
            "default",
            "final",
            "model.safetensors",
        )
    )
    assert {k: v.shape for k, v in weights.items()} == {k: v.shape for k, v in reference.items()}


def assert_same_statistics_as_one_worker(fileroot, run_dir, name="ppo", extra=PPO_EXTRA):
    """Every statistic of the run in ``run_dir`` equals the default run's (everything on one
    worker, ``test_ppo_default_writes_the_toy_summary`` for PPO) within fp32 tolerance."""
    base = default_run(name, fileroot, *extra)
    with open(os.path.join(base.run_dir, "stats.jsonl")) as f:
        want = [json.loads(line) for line in f]
    with open(os.path.join(run_dir, "stats.jsonl")) as f:
        got = [json.loads(line) for line in f]
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        for k, v in w.items():
            if isinstance(v, float) and k not in ("time",):
                tol = 0.01 if k.endswith("clip_frac") else 1e-4  # a borderline token may tip a fraction
                assert g[k] == pytest.approx(v, rel=1e-3, abs=tol), (g["step"], k)
    return got


@pytest.mark.slow  # the default suite covers tensor-parallel PPO in tests/system/test_ppo_runtime.py
def test_ppo_with_tensor_parallel_actor_and_critic_gives_the_same_statistics(fileroot):
    """The toy PPO with actor and critic split over two workers (loaded split from the SFT and
    reward checkpoints) against the run above on one worker."""
    layout = 'allocation_mode="actor:d1m2p1,critic:d1m2p1,*:d1m1p1"'
    cfg, _ = run("ppo", fileroot, *PPO_EXTRA, layout, "trial_name=tp")
    assert_same_statistics_as_one_worker(fileroot, cfg.run_dir)


@pytest.mark.parametrize(
    "trial, gen_at, mode",
    [
        # the default suite runs both placements (gradient checkpointing on the disjoint one) in
        # tests/system/test_ppo_runtime.py, without the command line
        pytest.param("per-call", "", "local", marks=pytest.mark.slow),
        pytest.param("per-call-disjoint", "@2", "local", marks=pytest.mark.slow),
        # Ray against local: tests/system/test_ppo_runtime.py compares them in the default suite
        pytest.param("per-call-ray", "", "ray", marks=pytest.mark.slow),
    ],
)
def test_ppo_training_and_generating_in_different_layouts_gives_the_same_statistics(
    fileroot, ray_cluster, trial, gen_at, mode
):
    """The actor trains split over workers 0 and 1 and generates as two whole replicas, on the
    same workers or on workers 2 and 3 of their own: its weights move before every generation,
    and the run gives one worker's numbers, in local and in ray mode. On disjoint workers the
    actor trains with gradient checkpointing, whose wrapped blocks the move must still find."""
    layout = f'allocation_mode="actor_train:d1m2p1,actor_gen:d2m1p1{gen_at},*:d1m1p1"'
    extra = ("actor.engine.gradient_checkpointing=true",) if gen_at else ()
    cfg, summary = run("ppo", fileroot, *PPO_EXTRA, layout, f"trial_name={trial}", f"mode={mode}", *extra)
    got = assert_same_statistics_as_one_worker(fileroot, cfg.run_dir)
    gen_workers = "2,3" if gen_at else "0,1"
    for record in got:
        assert record["realloc/actor/moves"] == f"d1m2p1@0,1 -> d2m1p1@{gen_workers}"
        assert record["realloc/actor/bytes"] > 0 and record["realloc/actor/count"] == 1.0
        assert record["timing"]["realloc/actor"] > 0
    assert summary["realloc/actor/bytes"] == got[-1]["realloc/actor/bytes"]


@pytest.mark.parametrize(
    "name, layout, extra",
    [
        # the default suite runs every family through two and three stages against one worker in
        # tests/parallel/test_pipeline_engines.py, without the command line
        pytest.param("ppo", "allocation_mode=d1m1p2", PPO_EXTRA, marks=pytest.mark.slow),
        # trains on two stages, generates as two whole replicas: the weights move between them
        pytest.param(
            "ppo",
            'allocation_mode="actor_train:d1m1p2,actor_gen:d2m1p1,*:d1m1p1"',
            PPO_EXTRA,
            marks=pytest.mark.slow,
        ),
        # the reward function's role has no weights to cut: it stays whole
        pytest.param(
            "grpo", 'allocation_mode="actor:d1m1p2,ref:d1m1p2,*:d1m1p1"', GRPO_EXTRA, marks=pytest.mark.slow
        ),
    ],
)
def test_pipeline_stages_give_the_statistics_of_one_worker(fileroot, name, layout, extra):
    """The models cut into two pipeline stages (loaded stage by stage from the SFT and reward
    checkpoints): forward, generate and train_step run through the stages and the run gives one
    worker's numbers."""
    trial = "pp-per-call" if "actor_gen" in layout else "pp2"
    cfg, summary = run(name, fileroot, *extra, layout, f"trial_name={trial}")
    got = assert_same_statistics_as_one_worker(fileroot, cfg.run_dir, name, extra)
    assert summary["allocation_mode"] == layout.split("=", 1)[1].strip('"')
    if "actor_gen" in layout:
        for record in got:
            assert record["realloc/actor/moves"] == "d1m1p2@0,1 -> d2m1p1@0,1"
            assert record["realloc/actor/bytes"] > 0


@pytest.mark.parametrize(
    "name, extra",
    [
        ("grpo", list(GRPO_EXTRA)),
        # the actor sharded by FSDP over two workers: it generates from gathered weights
        ("grpo", ["allocation_mode=d2", "actor.engine.fsdp=true", "trial_name=fsdp", "toy_eval_prompts=0"]),
        ("dpo", []),
        ("gen", []),
    ],
)
def test_other_experiments_run_two_steps(fileroot, name, extra):
    cfg, summary = run(name, fileroot, *extra)
    assert_run_outputs(cfg.run_dir, trains=name != "gen")
    if name == "grpo" and "toy_eval_prompts=0" in extra:  # no held-out evaluation, no task figures
        assert "evaluation" not in summary["phase_seconds"] and "true_reward_mean" not in summary
        assert not os.path.exists(os.path.join(cfg.run_dir, "logs", "summary.log"))  # no evaluator
    elif name == "grpo":
        assert summary["rm_accuracy"] is None and summary["true_reward_mean"] is not None
        assert "kl.png" in os.listdir(os.path.join(cfg.run_dir, "plots"))
    if name == "gen":
        with open(os.path.join(cfg.run_dir, "generations.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        assert len(rows) == 16 and all(r["completion"] for r in rows)


@pytest.mark.slow  # the default suite runs DAPO's dynamic sampling in benchmarks/bench_algorithms.py's smoke test
def test_dapo_samples_dynamically_from_the_command_line(fileroot):
    sampling = ["ppo.gen.max_new_tokens=13", "ppo.gen.top_p=1.0", "ppo.gen.n=4", "toy_eval_prompts=32"]
    cfg, _ = run("grpo", fileroot, "ppo_preset=dapo", "experiment_name=dapo", *sampling)
    assert cfg.dynamic_sampling.enabled
    with open(os.path.join(cfg.run_dir, "stats.jsonl")) as f:
        records = [json.loads(line) for line in f]
    for r in records:
        assert (
            r["dynamic_sampling/rounds"] >= 1
            and r["dynamic_sampling/kept_groups"] >= cfg.dataset.train_bs_n_seqs
        )
        assert {"actor_gen", "rew_inf", "filter_groups", "compute_adv", "actor_train"} <= set(r["timing"])
    assert "sampling.png" in os.listdir(os.path.join(cfg.run_dir, "plots"))


def test_my_ppo_example_swaps_the_reward_interface(fileroot):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    try:
        import my_ppo  # noqa: F401  (registers "my-ppo" and its interface)
    finally:
        sys.path.pop(0)
    cfg, summary = run("my-ppo", fileroot, "ppo.ppo_n_minibatches=2")
    exp = cfg.initial_setup()
    rew = next(m for m in exp.mfcs if m.name == "rew_inf")
    assert rew.interface_impl.type_ == "sentiment_scoring" and exp.models["reward"].model.type_ == "null"
    assert_run_outputs(cfg.run_dir)
    assert "compute_adv/task_reward" in summary


def _final_params(run_dir):
    return load_file(os.path.join(run_dir, "checkpoints", "default", "final", "model.safetensors"))


@pytest.mark.slow  # the default suite kills and resumes sft and ppo in tests/faults/test_resume.py
def test_killed_run_resumes_to_the_same_parameters(fileroot):
    common = [
        sys.executable,
        "-m",
        "realrl.apps.quickstart",
        "sft",
        f"fileroot={fileroot}",
        "dataset.train_bs_n_seqs=8",
        "exp_ctrl.total_train_steps=40",
        "exp_ctrl.ckpt_freq_steps=5",
    ]
    subprocess.run(common + ["trial_name=straight"], check=True, capture_output=True, timeout=600)
    proc = subprocess.Popen(common + ["trial_name=killed"], start_new_session=True)
    latest = os.path.join(fileroot, "sft", "killed", "recover", "latest.json")
    deadline = time.time() + 300
    while not os.path.exists(latest) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the master and its workers, mid-run
    proc.wait(timeout=60)
    with open(latest) as f:
        resumed_from = json.load(f)["step"]
    assert resumed_from < 40
    subprocess.run(
        common + ["trial_name=killed", "recover_mode=resume"], check=True, capture_output=True, timeout=600
    )
    straight = _final_params(os.path.join(fileroot, "sft", "straight"))
    resumed = _final_params(os.path.join(fileroot, "sft", "killed"))
    assert straight.keys() == resumed.keys()
    for k in straight:
        torch.testing.assert_close(resumed[k], straight[k], rtol=0, atol=0)
    with open(os.path.join(fileroot, "sft", "killed", "stats.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == list(range(1, 41))


def test_auto_recover_restarts_from_the_last_recover_point(monkeypatch, tmp_path):
    calls = []

    def flaky(exp, mode, ray_address, on_step=None, **local):
        assert isinstance(on_step, run_mod.RunMonitor)  # the progress bar / TensorBoard hook
        assert local == {"standby": None, "warm_next": False}
        calls.append(exp.resume)
        if len(calls) == 1:
            raise run_mod.ExperimentFailedError("model_worker/0 is lost", "model_worker/0")
        return [{"step": 1}]

    monkeypatch.setattr(run_mod, "run_experiment", flaky)
    monkeypatch.setattr(run_mod, "draw_graph", lambda graph, path: path)
    cfg = build_config("sft", [f"fileroot={tmp_path}", "recover_mode=auto", "recover_retries=1"])
    assert run_mod.run_one(cfg) == [{"step": 1}]
    assert calls == [False, True]
    cfg = build_config("sft", [f"fileroot={tmp_path}", "recover_mode=auto", "recover_retries=0"])
    calls.clear()
    with pytest.raises(run_mod.ExperimentFailedError):
        run_mod.run_one(cfg)


def test_ppo_with_lora_moves_only_adapters_into_a_kept_copy_and_writes_peft_folders(fileroot):
    """LoRA actor (FSDP over two workers, generating in a one-worker copy it keeps) and LoRA
    critic: the actor is its own reference (adapters off), the first move fills the copy with
    base and adapters, every later one moves the adapters alone, and both roles' final folders
    hold the merged model and the peft adapter folder."""
    from realrl.api.core.lora import LoRAConfig, adapter_param_count
    from realrl.api.core.model_api import ReaLModelConfig
    from realrl.experiments.common import task_model_config
    from realrl.impl.model.nn import ReaLModel

    layout = 'allocation_mode="actor_train:d2m1p1,actor_gen:d1m1p1,*:d1m1p1"'
    lora = ("actor.lora.rank=8", "critic.lora.rank=8", "actor.keep_gen_copy=true", "actor.engine.fsdp=true")
    cfg, summary = run("ppo", fileroot, *PPO_EXTRA, EVALUATED, layout, *lora, "trial_name=lora")
    assert "ref" not in cfg.initial_setup().models
    records = [json.loads(line) for line in open(os.path.join(cfg.run_dir, "stats.jsonl"))]
    model_cfg = ReaLModelConfig(**task_model_config(cfg))
    adapters = adapter_param_count(model_cfg, LoRAConfig(rank=8))
    base = sum(p.numel() for p in ReaLModel(model_cfg, device="meta").parameters())
    # fp32 over the wire; worker 0 holds half of every FSDP shard itself: the other half crosses
    moved = [r["realloc/actor/bytes"] for r in records]
    assert moved == [4 * (base + adapters) / 2, 4 * adapters / 2]  # then the adapters alone
    assert summary["kl"] is not None and records[0]["compute_adv/ref_kl"] == pytest.approx(0.0, abs=1e-6)
    for role in ("actor", "critic"):
        final = os.path.join(cfg.run_dir, "checkpoints", role, "final")
        assert {"config.json", "model.safetensors", "adapter"} <= set(os.listdir(final))
        assert {"adapter_config.json", "adapter_model.safetensors"} <= set(
            os.listdir(os.path.join(final, "adapter"))
        )


def test_asynchronous_ppo_at_staleness_zero_is_the_synchronous_run(fileroot):
    """``async_rl.max_staleness=0``: the same statistics, number for number, as the synchronous
    default run of this file (its samples all carry the version that trains on them, so the
    decoupled objective adds nothing)."""
    cfg, _ = run(
        "ppo", fileroot, *PPO_EXTRA, "async_rl.enabled=true", "async_rl.max_staleness=0", "trial_name=async0"
    )
    base = default_run("ppo", fileroot, *PPO_EXTRA)
    want = [json.loads(line) for line in open(os.path.join(base.run_dir, "stats.jsonl"))]
    got = [json.loads(line) for line in open(os.path.join(cfg.run_dir, "stats.jsonl"))]
    assert [g["async/staleness_max"] for g in got] == [0.0, 0.0]
    assert "staleness.png" not in os.listdir(
        os.path.join(base.run_dir, "plots")
    )  # a synchronous run has none
    for g, w in zip(got, want, strict=True):
        for k, v in w.items():
            if isinstance(v, float) and k != "time" and not k.startswith(("timing", "realloc/")):
                assert g[k] == v, (g["step"], k)


@pytest.mark.slow  # the default suite runs asynchronous RL in benchmarks/bench_async.py's smoke test
def test_asynchronous_ppo_generates_ahead_on_its_own_worker_within_the_bound(fileroot):
    """Generation on a worker of its own runs up to two steps ahead of training: the samples of
    step 3 come from the policy of step 1, never older, and the decoupled objective reweights them."""
    layout = 'allocation_mode="actor_gen:d1m1p1@1,*:d1m1p1"'
    steps = ["exp_ctrl.total_train_steps=4", "async_rl.enabled=true", "async_rl.max_staleness=2"]
    cfg, _ = run("ppo", fileroot, *PPO_EXTRA, layout, *steps, "trial_name=async2")
    records = [json.loads(line) for line in open(os.path.join(cfg.run_dir, "stats.jsonl"))]
    staleness = [r["async/staleness_max"] for r in records]
    # the call of step k samples version k - 2 exactly (0 for the first ones), whatever the timing
    assert staleness == [0.0, 1.0, 2.0, 2.0], staleness
    # after the first fill, each new version reaches the generation worker pushed: nobody waits
    moves = [r for r in records if "realloc/actor/count" in r]
    assert moves and all(r["realloc/actor/wait_seconds"] == 0.0 for r in moves[1:]), moves
    stale_steps = [r for r in records if r["async/staleness_max"] > 0]
    assert all(
        r["actor_train/stale_answers"] > 0 and "actor_train/behav_imp_weight" in r for r in stale_steps
    )
    assert all(r["async/idle_s/actor_gen"] >= 0.0 and r["async/idle_s/actor_train"] >= 0.0 for r in records)
    plots = set(os.listdir(os.path.join(cfg.run_dir, "plots")))
    assert {"staleness.png", "idle.png"} <= plots, plots


def test_partial_rollouts_decode_in_pieces_within_the_bound(fileroot):
    """``async_rl.partial_rollout``: the generate calls decode 4 tokens at a time (the toy's answers
    are 12 tokens and EOS: 4 pieces), newer finished versions may reach them between pieces, and
    the bound holds for each answer's oldest token."""
    layout = 'allocation_mode="actor_gen:d1m1p1@1,*:d1m1p1"'
    partial = ["async_rl.enabled=true", "async_rl.partial_rollout=true", "async_rl.interrupt_every=4"]
    cfg, _ = run("ppo", fileroot, *PPO_EXTRA, layout, *partial, "trial_name=partial")
    records = [json.loads(line) for line in open(os.path.join(cfg.run_dir, "stats.jsonl"))]
    assert [r["actor_gen/pieces"] for r in records] == [4.0, 4.0], records
    assert all(0.0 <= r["async/staleness_max"] <= 1.0 for r in records)
    assert all(0.0 <= r["actor_gen/answers_spanning_versions"] <= 1.0 for r in records)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_asynchronous_critic_free_runs_generate_ahead_within_the_bound(fileroot, name):
    layout = 'allocation_mode="actor_gen:d1m1p1@1,*:d1m1p1"'
    steps = ["exp_ctrl.total_train_steps=3", "async_rl.enabled=true", "toy_eval_prompts=32"]
    cfg, summary = run(name, fileroot, layout, *steps, f"trial_name=async-{name}")
    records = [json.loads(line) for line in open(os.path.join(cfg.run_dir, "stats.jsonl"))]
    staleness = [r["async/staleness_max"] for r in records]
    assert staleness[:2] == [0.0, 1.0] and max(staleness) == 1.0, staleness  # step 2 ran ahead
    assert summary["true_reward_mean"] is not None
