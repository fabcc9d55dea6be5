"""PPO with the real pieces (ReaLModel, engines, ppo interfaces, prompt dataset) on 2 model workers:
2 steps in local mode and in ray mode, with identical stats for one seed."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal

import pytest
import torch
from system_graphs import alive, deterministic, kill_when_running, wait_all_exited, worker_pids

from realrl.api.core.config import DatasetAbstraction, ModelAbstraction, ModelBackendAbstraction
from realrl.api.core.layout import Layout, Placement
from realrl.api.core.system_api import ExperimentConfig, ModelSpec, Timeouts
from realrl.apps.main import run_experiment
from realrl.impl.interface.ppo_config import make_ppo_hyperparameters

ppo_module = pytest.importorskip("realrl.experiments.ppo_graph")

WORDS = ["<pad>", "<bos>", "<eos>", "<unk>", ".", "good", "great", "bad", "awful"] + [
    f"w{i}" for i in range(23)
]
TINY = {
    "n_layers": 1,
    "n_q_heads": 2,
    "n_kv_heads": 2,
    "hidden_dim": 32,
    "intermediate_dim": 64,
    "vocab_size": len(WORDS),
    "n_positions": 64,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
PPO = {
    "gen": {"max_new_tokens": 4, "min_new_tokens": 1, "top_p": 1.0, "top_k": 0},
    "ppo_n_minibatches": 1,
}


@pytest.fixture(scope="module")
def ppo_files(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("ppo_files")
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    ).save_pretrained(folder / "tokenizer")
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 1} w{2 * i}"}) + "\n" for i in range(8)))
    return str(folder / "tokenizer"), str(prompts)


# the actor is data parallel over both workers; the other roles share them
TWO_WORKERS = {"actor": [0, 1], "ref": [0], "critic": [1], "reward": [0]}


def ppo_config(
    fileroot,
    trial: str,
    tokenizer: str,
    prompts: str,
    allocations: dict | None = None,
    layouts: dict | None = None,
    fsdp: bool = False,
    n_layers: int = TINY["n_layers"],
    **extra,
) -> ExperimentConfig:
    def real(critic: bool) -> ModelAbstraction:
        config = {**TINY, "n_layers": n_layers}
        return ModelAbstraction(
            "real_model", {"config": config, "is_critic": critic, "tokenizer_path": tokenizer}
        )

    train = ModelBackendAbstraction("train", {"optimizer": {"lr": 1e-3}, "engine": {"fsdp": fsdp}})
    infer = ModelBackendAbstraction("inference")
    hp = make_ppo_hyperparameters(PPO)
    mfcs = ppo_module.ppo_mfcs(4, hp, ppo_module.PPOInterfaces.of(hp))
    return ExperimentConfig(
        experiment_name="systest-ppo",
        trial_name=trial,
        mfcs=mfcs,
        models={
            "actor": ModelSpec(real(False), train),
            "ref": ModelSpec(real(False), infer),
            "critic": ModelSpec(real(True), train),
            "reward": ModelSpec(real(True), infer),
            # the advantage computation: a tokenizer-only model, one worker
            "adv": ModelSpec(
                ModelAbstraction("null", {"tokenizer_path": tokenizer}), ModelBackendAbstraction("null")
            ),
        },
        allocations={"adv": [0], **(allocations or TWO_WORKERS)},
        layouts={r: Layout.parse(t) for r, t in (layouts or {}).items()},
        datasets=[DatasetAbstraction("prompt", {"dataset_path": prompts})],
        tokenizer_path=tokenizer,
        fileroot=str(fileroot),
        total_train_steps=2,
        seed=3,
        timeouts=Timeouts(connect=120),
        **extra,
    )


def test_ppo_two_steps_local_and_ray_give_identical_stats(ppo_files, tmp_path, ray_cluster):
    tokenizer, prompts = ppo_files
    local_cfg = ppo_config(tmp_path, "local", tokenizer, prompts)
    local = run_experiment(local_cfg, "local")
    assert [s["step"] for s in local] == [1, 2]
    for record in local:
        actor_stats = {k: v for k, v in record.items() if k.startswith("actor_train/")}
        critic_stats = {k: v for k, v in record.items() if k.startswith("critic_train/")}
        assert actor_stats and critic_stats, record
        assert all(math.isfinite(v) for v in [*actor_stats.values(), *critic_stats.values()])
    assert alive(worker_pids(local_cfg).values()) == []
    ray_cfg = ppo_config(tmp_path, "ray", tokenizer, prompts)
    ray_stats = run_experiment(ray_cfg, "ray")
    assert deterministic(ray_stats) == deterministic(local)
    assert wait_all_exited(worker_pids(ray_cfg).values()) == []
    # the trained models were saved as HF checkpoints at the end
    for role in ("actor", "critic"):
        assert os.path.isfile(os.path.join(ray_cfg.run_dir, "checkpoints", role, "final", "config.json"))


def assert_close_stats(got: list[dict], want: list[dict], rel: float = 2e-3) -> None:
    """Same records, every statistic within ``rel`` (fp32 sums in another order); a clip fraction
    counts tokens past a threshold, so one borderline token of the 16 here may tip it."""
    got, want = deterministic(got), deterministic(want)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w)
        for k, v in w.items():
            if isinstance(v, float):
                tipped = 1 / 16 + 1e-6 if k.endswith("clip_frac") else 1e-4
                assert g[k] == pytest.approx(v, rel=rel, abs=tipped), (g["step"], k)


ONE_WORKER = {"actor": [0], "ref": [0], "critic": [0], "reward": [0]}


@pytest.fixture(scope="module")
def one_worker_run(ppo_files, tmp_path_factory):
    """Every model on one worker: the statistics (and weights) other layouts must give."""
    tokenizer, prompts = ppo_files
    cfg = ppo_config(tmp_path_factory.mktemp("d1"), "d1", tokenizer, prompts, allocations=ONE_WORKER)
    return cfg, run_experiment(cfg, "local")


TP_LAYOUT = {"actor": [0, 1], "ref": [0], "critic": [0, 1], "reward": [1]}


def test_tensor_parallel_ppo_matches_one_worker_local_and_ray(
    ppo_files, tmp_path, ray_cluster, one_worker_run
):
    """actor and critic split over two workers (d1m2p1) give one worker's statistics and weights."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    tokenizer, prompts = ppo_files
    whole_cfg, whole = one_worker_run
    layouts = {"actor": "d1m2p1", "critic": "d1m2p1"}
    tp_cfg = ppo_config(tmp_path, "tp", tokenizer, prompts, allocations=TP_LAYOUT, layouts=layouts)
    assert_close_stats(run_experiment(tp_cfg, "local"), whole)
    assert alive(worker_pids(tp_cfg).values()) == []
    # the HF checkpoint of a tensor-parallel model is one ordinary folder, the same weights
    final = os.path.join(tp_cfg.run_dir, "checkpoints", "actor", "final")
    assert AutoModelForCausalLM.from_pretrained(final).num_parameters() > 0
    tp_weights = load_file(os.path.join(final, "model.safetensors"))
    d1_weights = load_file(
        os.path.join(whole_cfg.run_dir, "checkpoints", "actor", "final", "model.safetensors")
    )
    assert sorted(tp_weights) == sorted(d1_weights)
    for k, v in d1_weights.items():
        torch.testing.assert_close(tp_weights[k], v, rtol=1e-4, atol=1e-5)
    ray_cfg = ppo_config(tmp_path, "tp-ray", tokenizer, prompts, allocations=TP_LAYOUT, layouts=layouts)
    assert_close_stats(run_experiment(ray_cfg, "ray"), whole)


@pytest.mark.slow  # FSDP in the default suite: tests/parallel/test_fsdp.py and grpo over d2 FSDP end to end
def test_fsdp_ppo_matches_replicated_data_parallel_and_saves_shards(ppo_files, tmp_path):
    """engine.fsdp=true over two dp ranks gives the replicated engine's statistics; its recover
    points hold every rank's shards."""
    tokenizer, prompts = ppo_files
    both = {"actor": [0, 1], "ref": [0, 1], "critic": [0, 1], "reward": [0, 1]}
    replicated = run_experiment(ppo_config(tmp_path, "d2", tokenizer, prompts, allocations=both), "local")
    cfg = ppo_config(tmp_path, "fsdp", tokenizer, prompts, allocations=both, fsdp=True, ckpt_freq_steps=1)
    assert_close_stats(run_experiment(cfg, "local"), replicated)
    recover = os.path.join(cfg.run_dir, "recover", "step2", "actor")
    assert os.path.isdir(os.path.join(recover, "sharded"))
    assert sorted(f for f in os.listdir(recover) if f.startswith("rng_state")) == [
        "rng_state_rank0.pt",
        "rng_state_rank1.pt",
    ]
    # FSDP over "dp" composed with tensor parallelism over "tp": a 2-D mesh on four workers
    four = {"actor": [0, 1, 2, 3], "ref": [0, 1], "critic": [0, 1, 2, 3], "reward": [2, 3]}
    layouts = {"actor": "d2m2p1", "critic": "d2m2p1"}
    cfg = ppo_config(tmp_path, "fsdp-tp", tokenizer, prompts, allocations=four, layouts=layouts, fsdp=True)
    assert_close_stats(run_experiment(cfg, "local"), replicated)


@pytest.mark.parametrize(
    "allocations, layouts, match",
    [
        (
            {"actor": [0, 1, 2, 3], "ref": [0], "critic": [1], "reward": [0]},
            {"actor": "d1m4p1"},
            r"model 'actor' in layout d1m4p1: tensor-parallel size m4 does not divide the model's 2 query heads",
        ),
        (TWO_WORKERS, {"actor": "d1m4p1"}, r"model 'actor': layout d1m4p1 has 4 ranks but 2 workers"),
        (TWO_WORKERS, {"actor": "d1m2p2"}, r"model 'actor': layout d1m2p2 has 4 ranks but 2 workers"),
        (
            TWO_WORKERS,
            {"actor": "d1m1p2"},
            r"model 'actor' in layout d1m1p2: 2 pipeline stages need at least one block each, and the "
            r"model has 1 \(n_layers\); choose p <= 1",
        ),
    ],
)
def test_layouts_that_cannot_work_are_named_before_any_worker_starts(
    ppo_files, tmp_path, allocations, layouts, match
):
    tokenizer, prompts = ppo_files
    with pytest.raises(ValueError, match=match):
        cfg = ppo_config(tmp_path, "bad", tokenizer, prompts, allocations=allocations, layouts=layouts)
        run_experiment(cfg, "local")
    assert not os.path.exists(os.path.join(tmp_path, "systest-ppo", "bad", "logs", "model_worker-0.log"))


@pytest.mark.parametrize("split", ["m2", "p2"])
def test_a_worker_killed_during_tensor_or_pipeline_parallel_training_stops_the_run(
    ppo_files, tmp_path, split
):
    """Its partner waits in a collective (tensor parallel) or for the next stage's activations or
    gradients (pipeline stages); the run still stops at once, naming the dead worker."""
    import threading
    import time

    from realrl.apps.main import ExperimentFailedError

    tokenizer, prompts = ppo_files
    layout = "d1m2p1" if split == "m2" else "d1m1p2"
    cfg = ppo_config(
        tmp_path,
        f"{split}-kill",
        tokenizer,
        prompts,
        allocations=TP_LAYOUT,
        layouts={"actor": layout, "critic": layout},
        total_train_epochs=1000,
        n_layers=2,
    )
    cfg.total_train_steps = None
    killed_at = []
    killer = threading.Thread(target=lambda: killed_at.append(kill_when_running(cfg, "model_worker/1")))
    killer.start()
    with pytest.raises(ExperimentFailedError) as info:
        run_experiment(cfg, "local")
    stopped_at = time.monotonic()
    killer.join()
    assert killed_at and killed_at[0] is not None, "the run never got going"
    assert stopped_at - killed_at[0] < 30
    assert info.value.worker == "model_worker/1"
    assert wait_all_exited(worker_pids(cfg).values()) == []


# the actor trains split over workers 0 and 1 (its home) and generates as two whole replicas,
# on the same workers (colocated, time-sharing them) or on two others (disjoint)
TP_HOME = {"actor": [0, 1], "ref": [0], "critic": [0], "reward": [0]}


def per_call_config(tmp_path, trial, ppo_files, gen_workers, **extra) -> ExperimentConfig:
    tokenizer, prompts = ppo_files
    return ppo_config(
        tmp_path,
        trial,
        tokenizer,
        prompts,
        allocations=TP_HOME,
        layouts={"actor": "d1m2p1"},
        mfc_placements={"actor_gen": Placement(Layout(2), gen_workers)},
        **extra,
    )


def without_realloc(stats: list[dict]) -> list[dict]:
    return [{k: v for k, v in s.items() if not k.startswith("realloc/")} for s in stats]


def actor_bytes() -> int:
    from realrl.api.core.model_api import ReaLModelConfig
    from realrl.impl.model.nn.real_model import ReaLModel

    return 4 * sum(p.numel() for p in ReaLModel(ReaLModelConfig(**TINY), device="meta").parameters())


@pytest.mark.parametrize(
    "trial, gen_workers, mode, keep",
    [
        ("colocated", (0, 1), "local", False),
        ("disjoint", (2, 3), "local", True),
        ("colocated-ray", (0, 1), "ray", False),
    ],
)
def test_per_call_layouts_give_one_workers_statistics(
    ppo_files, tmp_path, ray_cluster, one_worker_run, trial, gen_workers, mode, keep
):
    """actor_train in d1m2p1, actor_gen in d2m1p1: the weights move before every generation and
    the run gives the statistics of everything on one worker; each move is in stats.jsonl. On
    disjoint workers the actor trains with gradient checkpointing, whose wrapped blocks the move
    must still find."""
    _, whole = one_worker_run
    cfg = per_call_config(tmp_path, trial, ppo_files, gen_workers)
    cfg.models["actor"].keep_gen_copy = keep
    if trial == "disjoint":  # the actor's own backend (the critic shares the one it was built with)
        engine = {"fsdp": False, "gradient_checkpointing": True}
        backend = ModelBackendAbstraction("train", {"optimizer": {"lr": 1e-3}, "engine": engine})
        cfg.models["actor"] = dataclasses.replace(cfg.models["actor"], backend=backend)
    stats = run_experiment(cfg, mode)
    assert_close_stats(without_realloc(stats), whole)
    target = ",".join(map(str, gen_workers))
    for record in stats:
        assert record["realloc/actor/count"] == 1.0  # before each step's generation
        assert record["realloc/actor/moves"] == f"d1m2p1@0,1 -> d2m1p1@{target}"
        assert record["realloc/actor/seconds"] > 0 and record["timing"]["realloc/actor"] > 0
        assert record["realloc/actor/wait_seconds"] >= 0
        if gen_workers == (0, 1):  # each worker lacks only the other's half of the split weights
            assert 0 < record["realloc/actor/bytes"] < actor_bytes()
        else:  # two workers that hold nothing receive the whole model each
            assert record["realloc/actor/bytes"] == 2 * actor_bytes()
    assert wait_all_exited(worker_pids(cfg).values()) == []


def test_a_worker_killed_during_a_reallocation_stops_the_run(ppo_files, tmp_path):
    """The receiving worker dies as it starts a reallocation; its senders wait on it in vain.
    The run stops at once, naming it, with no process left."""
    import threading
    import time

    from realrl.apps.main import ExperimentFailedError

    cfg = per_call_config(tmp_path, "realloc-kill", ppo_files, (2, 3), total_train_epochs=1000)
    cfg.total_train_steps = None
    victim = "model_worker/3"
    killed_at = []

    def kill_at_second_reallocation() -> None:
        log = os.path.join(cfg.log_dir, "model_worker-3.log")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if os.path.exists(log):
                with open(log) as f:
                    if f.read().count("reallocating actor") >= 2:
                        os.kill(worker_pids(cfg)[victim], signal.SIGKILL)
                        killed_at.append(time.monotonic())
                        return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_at_second_reallocation)
    killer.start()
    with pytest.raises(ExperimentFailedError) as info:
        run_experiment(cfg, "local")
    stopped_at = time.monotonic()
    killer.join()
    assert killed_at, "the run never reached its second reallocation"
    assert stopped_at - killed_at[0] < 30
    assert info.value.worker == victim
    assert wait_all_exited(worker_pids(cfg).values()) == []
