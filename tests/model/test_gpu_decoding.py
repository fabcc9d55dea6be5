"""CUDA-graph decoding on a GPU: the captured steps give the fixed-shape steps' numbers exactly,
the eager loop's greedy tokens in fp32, and in bf16 log-probs a training forward reproduces, so
that a PPO update's first importance ratio is 1 within a stated tolerance.

Skipped without a CUDA device (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import make_hf_model, packed

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.nn.generation import generate
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.nn.static_decode import DecodeTrace
from realrl.impl.model.utils.functional import gather_packed_shifted_log_probs

LENGTHS = [17, 1, 40, 9, 23, 5]
EOS = list(range(1, 12))  # many EOS ids: answers end at varied steps, rows are compacted
# bf16: the largest |exp(logp_train - logp_generate) - 1| over the answers' tokens
FIRST_RATIO_TOLERANCE = 0.1


def load(tmp_path, dtype) -> ReaLModel:
    make_hf_model("llama").save_pretrained(tmp_path / "m")
    return ReaLModel.from_pretrained(str(tmp_path / "m"), dtype=dtype, device="cuda").eval()


def run(model, decoding: str, trace=None, **options):
    ids, cu = (t.cuda() for t in packed(LENGTHS, seed=4))
    g = GenerationHyperparameters(**{"n": 3, "max_new_tokens": 40, **options}, decoding=decoding)
    keys = torch.arange(len(LENGTHS), dtype=torch.long) * 7919
    return generate(model, ids, cu, g, EOS, keys, trace)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "options", [dict(greedy=True), dict(temperature=0.8), dict(top_k=7, top_p=0.9, min_new_tokens=3)]
)
def test_cuda_graphs_replay_the_fixed_shape_steps_exactly(tmp_path, options):
    model = load(tmp_path, torch.bfloat16)
    trace = DecodeTrace()
    graphed, static = run(model, "cuda_graph", trace, **options), run(model, "static", **options)
    assert trace.captured[0] == 18 and min(trace.buckets) < 18  # captured, and compacted
    assert graphed.seqlens == static.seqlens
    assert torch.equal(graphed.sequences, static.sequences)
    assert torch.equal(graphed.logprobs, static.logprobs)


@pytest.mark.gpu
def test_cuda_graphs_generate_fewer_tokens_than_there_are_buckets(tmp_path):
    """18 rows have 6 batch buckets, each rehearsed before its capture; 2 new tokens leave 2
    output columns (the 1.1B decoding benchmark's 4-token warm-up failed here on an H100)."""
    model = load(tmp_path, torch.bfloat16)
    trace = DecodeTrace()
    graphed = run(model, "cuda_graph", trace, max_new_tokens=2, temperature=1.0)
    static = run(model, "static", max_new_tokens=2, temperature=1.0)
    assert len(trace.captured) == 6
    assert graphed.seqlens == static.seqlens and torch.equal(graphed.sequences, static.sequences)


@pytest.mark.gpu
def test_cuda_graph_greedy_tokens_equal_the_eager_loop_in_fp32(tmp_path):
    model = load(tmp_path, torch.float32)
    graphed, eager = run(model, "cuda_graph", greedy=True), run(model, "eager", greedy=True)
    assert graphed.seqlens == eager.seqlens and torch.equal(graphed.sequences, eager.sequences)
    torch.testing.assert_close(graphed.logprobs, eager.logprobs, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_bf16_rollout_log_probs_agree_with_the_training_forward(tmp_path):
    model = load(tmp_path, torch.bfloat16)
    out = run(model, "cuda_graph", temperature=1.0)
    cu = torch.zeros(len(out.seqlens) + 1, dtype=torch.int32, device="cuda")
    cu[1:] = torch.tensor(out.seqlens, device="cuda").cumsum(0)
    with torch.no_grad():
        train = gather_packed_shifted_log_probs(model(out.sequences, cu).float(), cu, out.sequences)
    answer = out.logprobs != 0
    deviation = ((train[answer] - out.logprobs[answer]).exp() - 1).abs()
    assert deviation.max().item() < FIRST_RATIO_TOLERANCE
