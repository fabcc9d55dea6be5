"""Damaged and unwritable checkpoints: every problem is an error naming the file, the role and
the step; a resumed run falls back to the previous complete recover point; a save that cannot be
written leaves the previous checkpoint whole.

Tests run as root, where ``chmod`` stops no write: a write is made to fail by putting a file
where a folder must be created, or by a tokenizer whose ``save_pretrained`` raises ENOSPC.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import time
import zipfile

import pytest
import safetensors.torch
import torch

from realrl.api.core.model_api import Model
from realrl.apps.configs import build_config
from realrl.apps.main import ExperimentFailedError
from realrl.apps.run import run_quickstart
from realrl.impl.interface.common import save_model
from realrl.impl.interface.rw_interface import PairedRewardInterface
from realrl.impl.model.backend.config import OptimizerConfig
from realrl.impl.model.backend.integrity import CheckpointError, verify_hf_checkpoint
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.system import checkpointing as ck
from realrl.system import recover_state as rs
from realrl.system.checkpointing import RecoverPointError

# -- recover points at the function level ------------------------------------------------------


def actor(seed: int) -> Model:
    torch.manual_seed(seed)
    return Model("actor", TrainEngine(torch.nn.Linear(4, 3), OptimizerConfig()), None)


def write_point(run_dir: str, step: int, mark: bool = True) -> None:
    """A PPO-shaped point: a trained role ("actor", weights and optimizer) and a frozen role's
    interface state ("reward": the normalisation fitted on the first batch)."""
    model = actor(step)
    model.version.global_step = step
    rs.save_recover(model, "actor", {}, ck.recover_dir(run_dir, step, "actor"), step)
    rew = PairedRewardInterface(gain=float(step), bias=0.5)
    rs.save_interface_state(rew, ck.state_file(run_dir, step, "reward", "rew_inf", 0), "reward", step)
    if mark:
        ck.mark_recover_point(run_dir, step)


@pytest.fixture
def run_dir(tmp_path):
    path = str(tmp_path / "run")
    write_point(path, 2)
    write_point(path, 4)
    return path


def load_point(run_dir: str, step: int) -> tuple[Model, PairedRewardInterface]:
    model, rew = actor(99), PairedRewardInterface()
    rs.load_recover(model, "actor", {}, ck.recover_dir(run_dir, step, "actor"), step)
    rs.load_interface_state(rew, ck.state_file(run_dir, step, "reward", "rew_inf", 0), "reward", step)
    return model, rew


def cut(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def overwrite(path: str) -> None:
    """Same size, other bytes (a block of another file, a disk returning garbage)."""
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(os.urandom(size))


def flip_a_byte(path: str) -> None:
    """One bit flipped in the data of a torch archive's largest member (a disk's silent error)."""
    with zipfile.ZipFile(path) as z:
        member = max(z.infolist(), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(member.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        f.seek(member.header_offset + 30 + name_len + extra_len + member.file_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


DAMAGES = {
    "weights cut short": ("actor/model.safetensors", cut, "actor", "bytes"),
    "weights overwritten": ("actor/model.safetensors", overwrite, "actor", "model.safetensors"),
    "optimizer state missing": ("actor/engine_state.pt", os.remove, "actor", "missing"),
    "a flipped bit in the optimizer state": ("actor/engine_state.pt", flip_a_byte, "actor", "CRC"),
    "a frozen role's state cut short": ("reward/rew_inf.rank0.state.pt", cut, "reward", "bytes"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_point_is_named_and_the_previous_one_is_used(run_dir, damage):
    rel, harm, role, what = DAMAGES[damage]
    path = os.path.join(ck.step_dir(run_dir, 4), rel)
    harm(path)
    with pytest.raises(RecoverPointError) as info:
        ck.verify_recover_point(run_dir, 4)
    message = str(info.value)
    assert "step 4" in message and f"role {role!r}" in message and what in message, message
    assert info.value.step == 4 and info.value.role == role
    choice = ck.choose_recover_point(run_dir)
    assert choice.step == 2 and len(choice.skipped) == 1 and os.path.basename(rel) in choice.skipped[0]
    model, rew = load_point(run_dir, 2)
    assert model.version.global_step == 2 and (rew.gain, rew.bias) == (2.0, 0.5)
    saved = actor(2).module.module.state_dict()
    assert all(torch.equal(v, model.module.module.state_dict()[k]) for k, v in saved.items())


def test_loading_a_damaged_file_names_it_even_without_verifying_first(run_dir):
    cut(os.path.join(ck.recover_dir(run_dir, 4, "actor"), "engine_state.pt"))
    with pytest.raises(RecoverPointError, match=r"step 4, role 'actor'.*engine_state\.pt"):
        rs.load_recover(actor(0), "actor", {}, ck.recover_dir(run_dir, 4, "actor"), 4)
    cut(ck.state_file(run_dir, 4, "reward", "rew_inf", 0))
    with pytest.raises(RecoverPointError, match=r"step 4, role 'reward'.*rew_inf\.rank0\.state\.pt"):
        rs.load_interface_state(
            PairedRewardInterface(), ck.state_file(run_dir, 4, "reward", "rew_inf", 0), "reward", 4
        )


@pytest.mark.parametrize("garbage", [b"", b"{not json", b'{"stop": 4}', b"\x00\xff" * 8])
def test_garbage_in_latest_json_is_named_and_the_manifests_decide(run_dir, garbage):
    latest = os.path.join(ck.recover_root(run_dir), ck.LATEST)
    with open(latest, "wb") as f:
        f.write(garbage)
    with pytest.raises(RecoverPointError, match="latest.json is damaged"):
        ck.read_latest(run_dir)
    choice = ck.choose_recover_point(run_dir)
    assert choice.step == 4 and "latest.json" in choice.skipped[0]


def test_a_damaged_manifest_is_named(run_dir):
    with open(os.path.join(ck.step_dir(run_dir, 4), ck.MANIFEST), "w") as f:
        f.write('{"step": 4, "fil')
    with pytest.raises(RecoverPointError, match=r"step 4\).*manifest.json is damaged"):
        ck.verify_recover_point(run_dir, 4)
    assert ck.choose_recover_point(run_dir).step == 2


def test_a_point_never_marked_complete_is_not_used(run_dir):
    write_point(run_dir, 6, mark=False)  # killed before the master marked it
    assert ck.choose_recover_point(run_dir).step == 4
    with open(os.path.join(ck.recover_root(run_dir), ck.LATEST), "w") as f:
        json.dump({"step": 6}, f)  # even where latest.json names it
    choice = ck.choose_recover_point(run_dir)
    assert choice.step == 4 and "never marked complete" in choice.skipped[0]


def test_no_usable_point_is_an_error_listing_every_problem(run_dir):
    cut(os.path.join(ck.recover_dir(run_dir, 4, "actor"), "model.safetensors"))
    os.remove(ck.state_file(run_dir, 2, "reward", "rew_inf", 0))
    with pytest.raises(RecoverPointError) as info:
        ck.choose_recover_point(run_dir)
    message = str(info.value)
    assert "no usable recover point" in message
    assert "step 4, role 'actor'" in message and "step 2, role 'reward'" in message


def test_a_point_lacking_a_part_this_run_needs_is_named(run_dir):
    def needs_a_critic(step: int) -> None:
        ck.require_parts(run_dir, step, ["actor", "critic"], [])

    with pytest.raises(RecoverPointError, match=r"step 4, role 'critic'.*step 2, role 'critic'"):
        ck.choose_recover_point(run_dir, needs_a_critic)


def test_no_recover_point_starts_from_step_0(tmp_path):
    assert ck.choose_recover_point(str(tmp_path)) == ck.RecoverChoice(None, [])
    write_point(str(tmp_path), 2, mark=False)  # killed while writing its first point
    assert ck.choose_recover_point(str(tmp_path)) == ck.RecoverChoice(None, [])


def test_the_two_newest_complete_points_are_kept(run_dir):
    write_point(run_dir, 8, mark=False)  # a newer point still being written
    write_point(run_dir, 6)
    assert ck.step_dirs(run_dir) == [4, 6, 8]
    assert ck.complete_steps(run_dir) == [4, 6] and ck.read_latest(run_dir) == 6


# -- writes that fail ----------------------------------------------------------------------------


def test_a_recover_point_that_cannot_be_written_is_named_and_the_previous_one_stays(run_dir):
    blocked = ck.step_dir(run_dir, 6)
    with open(blocked, "w") as f:  # where the folder of step 6 must go
        f.write("not a folder")
    with pytest.raises(RecoverPointError, match=r"step 6, role 'actor'.*cannot write"):
        rs.save_recover(actor(6), "actor", {}, ck.recover_dir(run_dir, 6, "actor"), 6)
    with pytest.raises(RecoverPointError, match=r"step 6, role 'reward'.*cannot write"):
        rs.save_interface_state(
            PairedRewardInterface(), ck.state_file(run_dir, 6, "reward", "rew_inf", 0), "reward", 6
        )
    ck.verify_recover_point(run_dir, 4)
    assert ck.choose_recover_point(run_dir) == ck.RecoverChoice(4, [])


def test_a_recover_point_that_cannot_be_marked_is_named_and_the_previous_one_stays(run_dir):
    write_point(run_dir, 6, mark=False)
    os.makedirs(os.path.join(ck.step_dir(run_dir, 6), ck.MANIFEST + ".tmp"))  # blocks the manifest
    with pytest.raises(RecoverPointError, match=r"step 6\).*cannot mark"):
        ck.mark_recover_point(run_dir, 6)
    assert ck.read_latest(run_dir) == 4 and ck.complete_steps(run_dir) == [2, 4]
    assert ck.choose_recover_point(run_dir).step == 4


class FullDisk:
    """A tokenizer whose files do not fit on the disk."""

    def save_pretrained(self, path: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", path)


def test_an_hf_checkpoint_that_cannot_be_written_is_named_and_the_previous_one_stays(tmp_path):
    final = str(tmp_path / "checkpoints" / "actor" / "final")
    model = actor(0)
    save_model(model, final, {"reward_normalization": {"gain": 1.0}})
    before = {n: open(os.path.join(final, n), "rb").read() for n in os.listdir(final)}
    model.tokenizer = FullDisk()
    with torch.no_grad():
        model.module.module.weight.add_(1.0)
    with pytest.raises(CheckpointError, match=r"model actor: cannot write its checkpoint .*final.*No space"):
        save_model(model, final, {"reward_normalization": {"gain": 2.0}})
    assert {n: open(os.path.join(final, n), "rb").read() for n in os.listdir(final)} == before
    assert sorted(os.listdir(os.path.dirname(final))) == ["final"]  # no temporary folder left


# -- damaged Hugging Face checkpoints ----------------------------------------------------------


def hf_folder(path: str, critic: bool = False) -> str:
    os.makedirs(path)
    config = {
        "model_type": "llama",
        **({"realrl_critic": {"head_file": "critic_head.safetensors"}} if critic else {}),
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    safetensors.torch.save_file({"w": torch.ones(64, 8)}, os.path.join(path, "model.safetensors"))
    if critic:
        safetensors.torch.save_file(
            {"weight": torch.ones(1, 8)}, os.path.join(path, "critic_head.safetensors")
        )
    return path


@pytest.mark.parametrize(
    "damage, match",
    [
        ("weights cut short", r"model\.safetensors: \d+ bytes but its header describes \d+"),
        ("weights missing", r"no \*\.safetensors or \*\.bin weights"),
        ("config missing", r"config\.json: missing"),
        ("config garbage", r"config\.json: not valid JSON"),
        ("critic head missing", r"critic_head\.safetensors: missing"),
        ("index names a missing shard", r"model-00002-of-00002\.safetensors: missing"),
    ],
)
def test_a_damaged_hf_checkpoint_is_named(tmp_path, damage, match):
    path = hf_folder(str(tmp_path / "final"), critic=damage == "critic head missing")
    verify_hf_checkpoint(path, "model 'actor'")  # whole: no error
    if damage == "weights cut short":
        cut(os.path.join(path, "model.safetensors"))
    elif damage == "weights missing":
        os.remove(os.path.join(path, "model.safetensors"))
    elif damage == "config missing":
        os.remove(os.path.join(path, "config.json"))
    elif damage == "config garbage":
        with open(os.path.join(path, "config.json"), "w") as f:
            f.write("{")
    elif damage == "critic head missing":
        os.remove(os.path.join(path, "critic_head.safetensors"))
    else:
        index = {
            "weight_map": {"w": "model-00001-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"}
        }
        os.rename(
            os.path.join(path, "model.safetensors"), os.path.join(path, "model-00001-of-00002.safetensors")
        )
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f)
    with pytest.raises(CheckpointError, match=r"model 'actor': damaged Hugging Face checkpoint: .*" + match):
        verify_hf_checkpoint(path, "model 'actor'")


# -- end to end (SFT on the toy task) ----------------------------------------------------------

SFT = ["exp_ctrl.total_train_steps=5", "exp_ctrl.ckpt_freq_steps=2", "dataset.train_bs_n_seqs=8"]


def sft(fileroot: str, trial: str, *extra: str):
    return build_config("sft", [f"fileroot={fileroot}", f"trial_name={trial}", *SFT, *extra])


def final_weights(run_dir: str) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(
        os.path.join(run_dir, "checkpoints", "default", "final", "model.safetensors")
    )


def stats(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "stats.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if k not in ("time", "timing", "memory")} for r in rows]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted SFT run: 5 steps, recover points after steps 4 and 5 on disk."""
    fileroot = str(tmp_path_factory.mktemp("faults"))
    cfg = sft(fileroot, "straight")
    run_quickstart("sft", cfg)
    return fileroot, cfg.run_dir, final_weights(cfg.run_dir), stats(cfg.run_dir)


def test_resuming_past_a_damaged_recover_point_uses_the_previous_one(straight):
    fileroot, run_dir, weights, records = straight
    assert ck.complete_steps(run_dir) == [4, 5]
    cut(os.path.join(ck.recover_dir(run_dir, 5, "default"), "model.safetensors"))
    summary = run_quickstart("sft", sft(fileroot, "straight", "recover_mode=resume"))
    assert summary["steps"] == 1  # step 5 again, from the point of step 4
    assert_same_weights(weights, final_weights(run_dir))
    assert stats(run_dir) == records
    with open(os.path.join(run_dir, "logs", "master.log")) as f:
        log = f.read()
    assert "skipping a recover point: recover point (step 5, role 'default')" in log
    assert "model.safetensors holds" in log
    ck.verify_recover_point(run_dir, 5)  # written again, whole


def test_a_recover_point_that_cannot_be_written_stops_the_run_naming_it(straight):
    fileroot, _, weights, records = straight
    cfg = sft(fileroot, "blocked")
    os.makedirs(ck.recover_root(cfg.run_dir))
    blocked = ck.step_dir(cfg.run_dir, 4)
    with open(blocked, "w") as f:  # the folder of the second recover point cannot be made
        f.write("not a folder")
    tik = time.monotonic()
    with pytest.raises(ExperimentFailedError) as info:
        run_quickstart("sft", cfg)
    assert time.monotonic() - tik < 60
    assert "recover point (step 4, role 'default'): cannot write" in str(info.value), str(info.value)
    assert ck.read_latest(cfg.run_dir) == 2
    ck.verify_recover_point(cfg.run_dir, 2)
    os.remove(blocked)  # the disk is back: the run resumes to the same weights
    run_quickstart("sft", sft(fileroot, "blocked", "recover_mode=resume"))
    assert_same_weights(weights, final_weights(cfg.run_dir))
    assert stats(cfg.run_dir) == records


@pytest.mark.parametrize("given_as", ["model.path", "prerequisite"])
def test_a_damaged_hf_checkpoint_given_as_input_is_named(straight, given_as):
    """``model.path=`` of an SFT run, or the SFT phase a reward-model run reuses (its folder
    exists, so it is not run again)."""
    fileroot, run_dir, _, _ = straight
    if given_as == "model.path":
        damaged = os.path.join(fileroot, "damaged_final")
        name, extra = "sft", [f"model.path={damaged}"]
    else:
        damaged = os.path.join(fileroot, "sft", "toy-seed1", "checkpoints", "default", "final")
        name, extra = "rw", []
    source = os.path.join(run_dir, "checkpoints", "default", "final")
    os.makedirs(damaged)
    for file in os.listdir(source):
        with open(os.path.join(source, file), "rb") as f, open(os.path.join(damaged, file), "wb") as g:
            g.write(f.read())
    cut(os.path.join(damaged, "model.safetensors"))
    cfg = build_config(name, [f"fileroot={fileroot}", f"trial_name=from-damaged-{name}", *SFT, *extra])
    with pytest.raises(ExperimentFailedError) as info:
        run_quickstart(name, cfg)
    message = str(info.value)
    assert "model 'default': damaged Hugging Face checkpoint" in message, message
    assert os.path.join(damaged, "model.safetensors") in message
