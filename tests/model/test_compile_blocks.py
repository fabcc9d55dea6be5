"""``EngineConfig.compile``: transformer blocks through ``torch.compile`` (``nn/compiled_blocks.py``).

Compiled and eager agree within fp32 rounding (logits and every gradient) for a dense llama
model and a Mixture-of-Experts one on packed batches of unequal lengths; a batch with another
token count compiles nothing new (the token dimension is dynamic), and the graphs stay within
``GRAPH_BOUND``; "off" never calls ``torch.compile``. Compiling is slow on a loaded CPU (~10-30 s
per model and mode), so the inference check runs under ``-m slow``.
"""

from __future__ import annotations

import os

import pytest
import torch
from model_fixtures import VOCAB, make_hf_model, packed, tiny_config

from realrl.api.core.data_api import SequenceSample
from realrl.impl.model.backend.compile import CACHE_ENV, wants_compile
from realrl.impl.model.backend.config import EngineConfig
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.nn.compiled_blocks import GRAPH_BOUND
from realrl.impl.model.nn.real_model import ReaLModel

# total token counts 17 and 28: the second batch must not compile again
BATCHES = ([5, 9, 3], [7, 11, 4, 6])
ATOL = 2e-5


def _pair(kind: str, tmp_path) -> tuple[ReaLModel, ReaLModel]:
    make_hf_model(kind).save_pretrained(str(tmp_path))
    eager = ReaLModel.from_pretrained(str(tmp_path))
    compiled = ReaLModel.from_pretrained(str(tmp_path))
    compiled.compile_blocks()
    return eager, compiled


def _grads(model: ReaLModel) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["llama", "qwen2_moe"])
def test_training_matches_eager_without_recompiling(kind, tmp_path):
    eager, compiled = _pair(kind, tmp_path)
    eager.train(), compiled.train()
    graphs = []
    for lengths in BATCHES:
        ids, cu = packed(lengths)
        outs = []
        for model in (eager, compiled):
            model.zero_grad(set_to_none=True)
            logits = model(ids, cu)
            (logits.square().mean() + logits[:, 3].sum()).backward()
            outs.append((logits.detach(), _grads(model)))
        (a, grads_a), (b, grads_b) = outs
        torch.testing.assert_close(b, a, atol=ATOL, rtol=1e-5)
        assert grads_a.keys() == grads_b.keys() and grads_a
        for name in grads_a:
            torch.testing.assert_close(grads_b[name], grads_a[name], atol=ATOL, rtol=1e-4, msg=name)
        graphs.append(compiled.compiled_blocks.stats()["compile/graphs"])
    assert 0 < graphs[0] <= GRAPH_BOUND
    assert graphs[1] == graphs[0], f"another token count compiled {graphs[1] - graphs[0]} more graphs"
    assert compiled.compiled_blocks.stats()["compile/seconds"] > 0


def test_shared_prefix_batches_with_kept_rows_match_eager_without_recompiling(tmp_path):
    """Pairs sharing their prompts (``prefix_groups``, as reward modeling packs them), the last
    token of each kept (``output_index``): other counts of tokens, pairs and rows compile nothing new."""
    eager, compiled = _pair("llama", tmp_path)
    eager.train(), compiled.train()
    graphs = []
    for n_pairs, prompt in ((2, 6), (3, 9)):
        g = torch.Generator().manual_seed(n_pairs)
        seqs = []
        for _ in range(n_pairs):
            shared = torch.randint(2, VOCAB, (prompt,), generator=g)
            seqs += [torch.cat([shared, torch.randint(2, VOCAB, (k,), generator=g)]) for k in (3, 5)]
        ids = torch.cat(seqs)
        cu = torch.tensor([0, *torch.tensor([len(s) for s in seqs]).cumsum(0).tolist()], dtype=torch.int32)
        last = cu[1:].long() - 1
        outs = []
        for model in (eager, compiled):
            model.zero_grad(set_to_none=True)
            out = model(ids, cu, output_index=last, prefix_groups=[2] * n_pairs)
            out.square().sum().backward()
            outs.append((out.detach(), _grads(model)))
        (a, grads_a), (b, grads_b) = outs
        torch.testing.assert_close(b, a, atol=ATOL, rtol=1e-5)
        for name in grads_a:
            torch.testing.assert_close(grads_b[name], grads_a[name], atol=ATOL, rtol=1e-4, msg=name)
        graphs.append(compiled.compiled_blocks.stats()["compile/graphs"])
    assert graphs[1] == graphs[0], f"another batch compiled {graphs[1] - graphs[0]} more graphs"


@pytest.mark.slow
def test_inference_matches_eager(tmp_path):
    eager, compiled = _pair("llama", tmp_path)
    eager.eval(), compiled.eval()
    with torch.no_grad():
        for lengths in BATCHES:
            ids, cu = packed(lengths)
            index = torch.tensor([0, 4, sum(lengths) - 1])
            torch.testing.assert_close(compiled(ids, cu), eager(ids, cu), atol=ATOL, rtol=1e-5)
            torch.testing.assert_close(
                compiled(ids, cu, output_index=index),
                eager(ids, cu, output_index=index),
                atol=ATOL,
                rtol=1e-5,
            )
    assert compiled.compiled_blocks.stats()["compile/graphs"] <= 2 * GRAPH_BOUND


def _batch(lengths: list[int]) -> SequenceSample:
    ids, _ = packed(lengths)
    return SequenceSample.from_default(
        ids=list(range(len(lengths))), seqlens=lengths, data={"packed_input_ids": ids % VOCAB}
    )


def test_off_never_calls_torch_compile(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch.compile called with engine.compile off")

    monkeypatch.setattr(torch, "compile", refuse)
    torch.manual_seed(0)
    model = ReaLModel(tiny_config(vocab_size=VOCAB))
    engine = InferenceEngine(model, EngineConfig())
    engine.forward(_batch([4, 6]))
    # "auto" on a short run stays off too, and an inference engine has no step count to repay it
    TrainEngine(ReaLModel(tiny_config(vocab_size=VOCAB)), engine_config=EngineConfig(compile="auto"))
    assert model.compiled_blocks is None and engine.compile_stats() == {}


def test_modes_and_cache_dir(monkeypatch, tmp_path):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not wants_compile(EngineConfig(), 10_000, cuda)
    assert wants_compile(EngineConfig(compile="on"), None, cpu)
    assert wants_compile(EngineConfig(compile="auto"), 10_000, cuda)
    assert not wants_compile(EngineConfig(compile="auto"), 10_000, cpu)
    assert not wants_compile(EngineConfig(compile="auto"), 10, cuda)
    assert not wants_compile(EngineConfig(compile="auto"), None, cuda)
    with pytest.raises(ValueError, match="compile must be one of"):
        EngineConfig(compile="yes")
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        EngineConfig(compile="on", gradient_checkpointing=True)
    monkeypatch.setenv(CACHE_ENV, "unset")
    monkeypatch.delenv(CACHE_ENV)  # restored (absent) after the test
    cache = str(tmp_path / ".inductor_cache")
    engine = InferenceEngine(ReaLModel(tiny_config()), EngineConfig(compile="on", compile_cache_dir=cache))
    # compiled on first use: building the engine compiles nothing
    assert engine.module.compiled_blocks is not None
    assert engine.compile_stats() == {"compile/graphs": 0.0, "compile/seconds": 0.0}
    assert os.environ[CACHE_ENV] == cache
