"""FSDP2 over two data-parallel ranks (gloo) against the replicated data-parallel engine: the same
weights after every step, exact resume from a sharded recover point, and an HF export whole."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from _ranks import TIMEOUT, run_ranks
from model_fixtures import tiny_config

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.layout import Layout, Placement
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.apply import parallelize
from realrl.impl.model.parallel.dtensor import is_dtensor
from realrl.impl.model.parallel.mesh import build_contexts

CFG = tiny_config(hf_model_type="llama")
# the TensorFlow-style epsilon runs realrl's own AdamW on the shards (the PPO runtime test covers
# torch's AdamW under FSDP); clipping, decay and a warmed-up cosine schedule act on every step
OPT = OptimizerConfig(
    lr=1e-2,
    weight_decay=0.1,
    grad_clip=0.5,
    lr_scheduler_type="cosine",
    warmup_steps_proportion=0.2,
    tf_style_eps=True,
)
LENGTHS = [[5, 9, 3, 12], [7, 4, 10]]  # rank r's sequences: uneven token counts and sample counts
STEPS = 3


def batch(rank: int, step: int) -> SequenceSample:
    g = torch.Generator().manual_seed(100 * step + rank)
    lens = LENGTHS[rank]
    ids = torch.randint(0, CFG.vocab_size, (sum(lens),), generator=g)
    return SequenceSample.from_default(
        ids=[f"r{rank}s{step}i{i}" for i in range(len(lens))], seqlens=lens, data={"packed_input_ids": ids}
    )


def token_loss(logits: torch.Tensor, mb: SequenceSample) -> tuple[torch.Tensor, dict]:
    ids = mb.data["packed_input_ids"]
    cu = mb.cu_seqlens("packed_input_ids").tolist()
    keep = torch.ones(len(ids), dtype=torch.bool)
    keep[torch.tensor(cu[1:]) - 1] = False  # the last token of a sequence predicts nothing
    logp = torch.log_softmax(logits.float()[:-1], -1).gather(-1, ids[1:, None])[:, 0]
    loss = -(logp * keep[:-1]).sum() / keep[:-1].sum()
    return loss, {}


def n_tokens(mb: SequenceSample) -> float:
    return float(sum(mb.flat_seqlens("packed_input_ids")) - len(mb.flat_seqlens("packed_input_ids")))


def engine(parallel, fsdp: bool) -> TrainEngine:
    torch.manual_seed(0)
    module = ReaLModel(CFG)
    parallel = dataclasses.replace(parallel, fsdp=fsdp)
    parallelize(module, parallel)
    return TrainEngine(module, OPT, EngineConfig(), total_train_steps=STEPS, parallel=parallel)


def whole(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        k: (v.full_tensor() if is_dtensor(v) else v).detach().clone() for k, v in module.state_dict().items()
    }


def step(e: TrainEngine, rank: int, i: int) -> dict:
    # rank 1 cuts its share in more micro-batches: FSDP ranks must still run in lockstep
    mbs = MicroBatchSpec(n_mbs=1 + rank)
    return e.train_batch(batch(rank, i), mbs, token_loss, n_tokens, version_steps=i)


def worker(rank: int, out_dir: str) -> dict:
    parallel = build_contexts({"m": Placement(Layout(dp=2), (0, 1))}, rank, "cpu", TIMEOUT)["m"]
    replicated, sharded = engine(parallel, False), engine(parallel, True)
    result = {"diff": [], "grad_norm": [], "sharded_params": 0}
    result["sharded_params"] = sum(p.to_local().numel() for p in sharded.module.parameters())
    result["whole_params"] = sum(p.numel() for p in replicated.module.parameters())
    ckpt = os.path.join(out_dir, "recover")
    for i in range(STEPS):
        if i == STEPS - 1:
            sharded.save(ckpt, extra_state={"rank": rank})
        a, b = step(replicated, rank, i), step(sharded, rank, i)
        wa, wb = whole(replicated.module), whole(sharded.module)
        result["diff"].append(max(float((wa[k] - wb[k]).abs().max()) for k in wa))
        result["grad_norm"].append((a["grad_norm"], b["grad_norm"]))
    resumed = engine(parallel, True)
    result["extra"] = resumed.load(ckpt)
    step(resumed, rank, STEPS - 1)
    wr, wb = whole(resumed.module), whole(sharded.module)
    result["resumed_equal"] = all(torch.equal(wr[k], wb[k]) for k in wb)
    result["lr"] = (resumed.lr_scheduler.n_updates, sharded.lr_scheduler.n_updates)
    # collective; each rank names its own folder, so the parent sees which ranks wrote
    sharded.save_pretrained(os.path.join(out_dir, f"hf{rank}"))
    result["gathered"] = whole(sharded.module)
    probe = batch(0, 9).data["packed_input_ids"]
    with torch.no_grad():  # the sharded module's own forward (each block gathered by FSDP)
        result["logits"] = sharded.module(probe, torch.tensor([0, len(probe)], dtype=torch.int32))
    return result


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    return out, run_ranks(worker, out, str(out))


def test_fsdp_steps_equal_the_replicated_engine(results):
    _, ranks = results
    for r in ranks:
        assert all(d < 1e-5 for d in r["diff"]), r["diff"]
        for a, b in r["grad_norm"]:
            assert b == pytest.approx(a, rel=1e-5)
        assert r["sharded_params"] <= r["whole_params"] // 2 + 64  # each rank holds about half


def test_fsdp_resumes_bit_exactly_from_its_sharded_recover_point(results):
    out, ranks = results
    for rank, r in enumerate(ranks):
        assert r["resumed_equal"] and r["extra"] == {"rank": rank}
        assert r["lr"][0] == r["lr"][1]
    assert os.path.isdir(out / "recover" / "sharded")
    assert not (out / "recover" / "model.safetensors").exists()  # shards only, nothing gathered


def test_fsdp_hf_export_is_one_ordinary_folder(results):
    from transformers import AutoModelForCausalLM

    out, ranks = results
    assert os.path.isdir(out / "hf0") and not (out / "hf1").exists()  # only model rank 0 writes
    # the export holds the gathered weights bit for bit
    reloaded = ReaLModel.from_pretrained(str(out / "hf0")).state_dict()
    gathered = ranks[0]["gathered"]
    assert sorted(reloaded) == sorted(gathered)
    assert all(torch.equal(reloaded[k], gathered[k]) for k in gathered)
    # and transformers reads it as an ordinary checkpoint with the sharded model's logits
    hf = AutoModelForCausalLM.from_pretrained(out / "hf0").eval()
    with torch.no_grad():
        got = hf(batch(0, 9).data["packed_input_ids"][None]).logits[0]
    torch.testing.assert_close(got, ranks[0]["logits"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ranks[1]["logits"], ranks[0]["logits"], rtol=0, atol=0)
