"""Multi-turn rollouts over two gloo ranks, as model workers run them.

- FSDP over two data-parallel ranks: one rank's trajectories end after one turn while the other's
  take three; the finished rank joins the other's weight gathers (``join_generation``) and both
  return, with the same trajectories the replicated engine samples.
- Tensor parallelism over two ranks, and two pipeline stages: an environment whose observations
  differ by process (a clock, a live tool) is stepped on the replica's first rank only and its
  answers shared, so both ranks hold the same trajectories."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from _ranks import TIMEOUT, run_ranks
from model_fixtures import tiny_config

from realrl.api.core.config import ModelName
from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.layout import Layout, Placement
from realrl.api.core.model_api import GenerationHyperparameters, Model
from realrl.impl.interface.env_rollout import EnvOptions, env_generate
from realrl.impl.interface.multi_turn import TurnBudget
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.apply import parallelize
from realrl.impl.model.parallel.mesh import build_contexts
from realrl.impl.model.parallel.pipeline import PipelineStage, StageSpec

CFG = tiny_config(hf_model_type="llama", eos_token_id=2, pad_token_id=0)
WORDS = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(CFG.vocab_size - 4)]
GEN = GenerationHyperparameters(max_new_tokens=3, min_new_tokens=1, top_p=1.0, top_k=0, n=2)


class TurnsByPrompt:
    """Done after as many turns as the prompt's first word says (``w1``: one, else three)."""

    def __init__(self, prompt: str, **_):
        self.turns = 1 if prompt.startswith("w1") else 3
        self.n = 0

    def step(self, completion: str):
        self.n += 1
        return ("w9 w9", 0.5, self.n >= self.turns)


class ByProcess:
    """Observations that differ by process: only one rank's may reach the trajectories."""

    def __init__(self, prompt: str, **_):
        pass

    def step(self, completion: str):
        return (f"w{10 + os.getpid() % 20}", 1.0, False)


def tokenizer(folder: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def prompts(tok, texts: list[str], first_id: int) -> SequenceSample:
    samples = [
        SequenceSample.from_default(
            ids=[first_id + i],
            seqlens=[len(ids)],
            data={"packed_prompts": torch.tensor(ids)},
        )
        for i, ids in enumerate(tok.encode(t, add_special_tokens=False) for t in texts)
    ]
    return SequenceSample.gather(samples)


def model(parallel, fsdp: bool, tok) -> Model:
    torch.manual_seed(0)
    module = ReaLModel(CFG)
    if parallel is not None and parallel.layout.pp > 1:  # this rank's stage
        module = PipelineStage(module, StageSpec.of(CFG, parallel.stage, parallel.layout.pp))
    if parallel is not None:
        parallel = dataclasses.replace(parallel, fsdp=fsdp)
        parallelize(module, parallel)
    return Model(ModelName("actor"), InferenceEngine(module, parallel=parallel), tok)


def rollout(m: Model, data: SequenceSample, env: type, max_turns: int):
    opts = EnvOptions(f"{__name__}:{env.__name__}", budget=TurnBudget(max_turns, GEN.max_new_tokens))
    torch.manual_seed(1)  # every rank draws the same sampling seeds, as model workers do
    gen, rewards, stats = env_generate(m, data, MicroBatchSpec(), GEN, opts)
    return {
        "ids": gen.sequences.tolist(),
        "mask": gen.prompt_mask().tolist(),
        "rewards": rewards.tolist(),
        **stats,
    }


def worker(rank: int, out_dir: str) -> dict:
    """Both checks in one pair of processes (starting them is most of the time)."""
    tok = tokenizer(out_dir)
    contexts = build_contexts(
        {
            "fsdp": Placement(Layout(dp=2), (0, 1)),
            "tp": Placement(Layout(tp=2), (0, 1)),
            "pp": Placement(Layout(pp=2), (0, 1)),
        },
        rank,
        "cpu",
        TIMEOUT,
    )
    # rank 0's prompts finish after one turn, rank 1's take three
    data = prompts(tok, ["w1 w5", "w1 w6"] if rank == 0 else ["w2 w5", "w3"], first_id=10 * rank)
    return {
        "sharded": rollout(model(contexts["fsdp"], True, tok), data, TurnsByPrompt, max_turns=4),
        "whole": rollout(model(None, False, tok), data, TurnsByPrompt, max_turns=4),
        **{
            split: rollout(
                model(contexts[split], False, tok), prompts(tok, ["w2 w5", "w3"], 0), ByProcess, max_turns=3
            )
            for split in ("tp", "pp")
        },
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("multi_turn_ranks")
    return run_ranks(worker, out, str(out))


def test_fsdp_ranks_turn_in_lockstep_and_sample_what_one_worker_samples(results):
    assert [r["sharded"]["turns_max"] for r in results] == [1.0, 3.0]
    for r in results:
        assert r["sharded"]["ids"] == r["whole"]["ids"] and r["sharded"]["mask"] == r["whole"]["mask"]
        assert r["sharded"]["rewards"] == r["whole"]["rewards"]


@pytest.mark.parametrize("split", ["tp", "pp"])
def test_a_replica_of_two_ranks_holds_the_same_trajectories_whatever_its_environments_say(results, split):
    a, b = (r[split] for r in results)
    assert a["turns_mean"] == 3.0
    assert a["ids"] == b["ids"] and a["mask"] == b["mask"] and a["rewards"] == b["rewards"]
