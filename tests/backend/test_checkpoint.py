"""Checkpoints: exact resume, atomic writes (an injected failure or a killed process never
leaves a half checkpoint), HF-format safetensors weights."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import safetensors.torch
import torch
from _backend_toy import PackedToyLM, make_batch, n_loss_tokens, token_loss

from realrl.api.core.data_api import MicroBatchSpec
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.train_engine import TrainEngine

LENGTHS = [5, 9, 3, 12, 7, 4, 10, 6]
OPT = OptimizerConfig(lr=1e-2, weight_decay=0.1, lr_scheduler_type="cosine", warmup_steps_proportion=0.25)


def make_engine(seed: int) -> TrainEngine:
    torch.manual_seed(seed)
    # dropout on: resuming must restore the torch RNG for the masks to match
    return TrainEngine(PackedToyLM(pdrop=0.3), OPT, EngineConfig(disable_dropout=False), total_train_steps=4)


def step(engine: TrainEngine, i: int) -> None:
    # random draws from python/numpy/torch decide the data, as a shuffling dataloader would
    seed = random.randrange(1000) + int(np.random.randint(1000)) + int(torch.randint(1000, ()))
    engine.train_batch(
        make_batch(LENGTHS, seed=seed), MicroBatchSpec(n_mbs=2), token_loss, n_loss_tokens, version_steps=i
    )


def params(engine: TrainEngine) -> list[torch.Tensor]:
    return [p.detach().clone() for p in engine.module.parameters()]


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def test_resume_is_exact(tmp_path):
    straight = make_engine(0)
    seed_all(123)
    for i in range(4):
        step(straight, i)

    first = make_engine(0)
    seed_all(123)
    for i in range(2):
        step(first, i)
    first.save(str(tmp_path / "ckpt"), extra_state={"dataset_position": 2, "epoch": 0})
    seed_all(999)  # whatever happens in between must not matter

    resumed = make_engine(7)  # different initial weights: everything must come from the checkpoint
    extra = resumed.load(str(tmp_path / "ckpt"))
    assert extra == {"dataset_position": 2, "epoch": 0}
    assert resumed.lr_scheduler.get_last_lr() == first.lr_scheduler.get_last_lr()
    for i in range(2, 4):
        step(resumed, i)
    for a, b in zip(params(straight), params(resumed)):
        assert torch.equal(a, b)


def test_checkpoint_weights_are_safetensors_of_the_state_dict(tmp_path):
    engine = make_engine(0)
    engine.save(str(tmp_path / "c"))
    files = sorted(os.listdir(tmp_path / "c"))
    assert files == ["engine_state.pt", "extra_state_rank0.pt", "model.safetensors", "rng_state_rank0.pt"]
    weights = safetensors.torch.load_file(str(tmp_path / "c" / "model.safetensors"))
    state = engine.module.state_dict()
    assert set(weights) == set(state)
    assert all(torch.equal(weights[k], state[k]) for k in state)


class ExplodesWhenPickled:
    def __reduce__(self):
        raise RuntimeError("injected failure while writing the checkpoint")


def test_failure_mid_save_keeps_previous_checkpoint(tmp_path):
    path = str(tmp_path / "ckpt")
    engine = make_engine(0)
    engine.save(path, extra_state={"position": 1})
    before = sorted(os.listdir(path))
    step(engine, 0)
    with pytest.raises(RuntimeError, match="injected failure"):
        engine.save(path, extra_state={"position": 2, "bad": ExplodesWhenPickled()})
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no temporary folder left behind
    assert sorted(os.listdir(path)) == before
    assert make_engine(3).load(path) == {"position": 1}

    # a failure on a first save leaves nothing under the final name
    fresh = str(tmp_path / "fresh")
    with pytest.raises(RuntimeError):
        engine.save(fresh, extra_state=ExplodesWhenPickled())
    assert not os.path.exists(fresh)


CRASH_SCRIPT = textwrap.dedent(
    """
    import os, sys, torch
    sys.path.insert(0, {test_dir!r})
    from _backend_toy import PackedToyLM
    from realrl.impl.model.backend.config import OptimizerConfig
    from realrl.impl.model.backend.train_engine import TrainEngine

    class DiesWhenPickled:
        def __reduce__(self):
            os._exit(17)  # the process dies mid-save, no cleanup runs

    engine = TrainEngine(PackedToyLM(), OptimizerConfig())
    engine.save({path!r}, extra_state={{"position": 1}})
    engine.save({path!r}, extra_state={{"position": 2, "x": DiesWhenPickled()}})
    """
)


def test_killed_process_mid_save_never_leaves_half_checkpoint(tmp_path):
    path = str(tmp_path / "ckpt")
    script = CRASH_SCRIPT.format(test_dir=os.path.dirname(__file__), path=path)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 17, proc.stderr
    assert os.path.isdir(path + ".tmp")  # the crash happened mid-write ...
    assert make_engine(0).load(path) == {"position": 1}  # ... and the final name holds the old one


def test_load_errors_name_the_path(tmp_path):
    engine = make_engine(0)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        engine.load(str(tmp_path / "missing"))
    os.makedirs(tmp_path / "hf_only")
    with pytest.raises(FileNotFoundError, match="not a training checkpoint"):
        engine.load(str(tmp_path / "hf_only"))
