"""PPO with the real pieces (ReaLModel, engines, ppo interfaces, prompt dataset) on 2 model workers:
2 steps in local mode and in ray mode, with identical stats for one seed."""

from __future__ import annotations

import json
import math
import os

import pytest
from system_graphs import alive, deterministic, wait_all_exited, worker_pids

from realrl.api.core.config import DatasetAbstraction, ModelAbstraction, ModelBackendAbstraction
from realrl.api.core.config import ModelInterfaceAbstraction as Impl
from realrl.api.core.system_api import ExperimentConfig, ModelSpec, Timeouts
from realrl.apps.main import run_experiment

ppo_module = pytest.importorskip("realrl.experiments.ppo")

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


def ppo_config(fileroot, trial: str, tokenizer: str, prompts: str) -> ExperimentConfig:
    def real(critic: bool) -> ModelAbstraction:
        return ModelAbstraction(
            "real_model", {"config": TINY, "is_critic": critic, "tokenizer_path": tokenizer}
        )

    train = ModelBackendAbstraction("train", {"optimizer": {"lr": 1e-3}})
    infer = ModelBackendAbstraction("inference")
    mfcs = ppo_module.ppo_mfcs(
        4, Impl("ppo_actor", {"ppo": PPO}), Impl("ppo_critic", {"ppo": PPO}), Impl("paired_rw")
    )
    return ExperimentConfig(
        experiment_name="systest-ppo",
        trial_name=trial,
        mfcs=mfcs,
        models={
            "actor": ModelSpec(real(False), train),
            "ref": ModelSpec(real(False), infer),
            "critic": ModelSpec(real(True), train),
            "reward": ModelSpec(real(True), infer),
        },
        # the actor is data parallel over both workers; the other roles share them
        allocations={"actor": [0, 1], "ref": [0], "critic": [1], "reward": [0]},
        datasets=[DatasetAbstraction("prompt", {"dataset_path": prompts})],
        tokenizer_path=tokenizer,
        fileroot=str(fileroot),
        total_train_steps=2,
        seed=3,
        timeouts=Timeouts(connect=120),
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
