"""Which decoding mode a generate call runs (``nn/generation.choose_decoding``, and
``decoding_mode`` for a model), decided without a GPU: CUDA graphs only for a CUDA model split neither by tensor parallelism nor by FSDP. Under FSDP
the weights are whole inside ``gathered()`` and look plain, yet FSDP's hooks still run around each
block on their own streams, which a graph capture cannot record."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import packed, tiny_config

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.nn.generation import choose_decoding, decoding_mode, generate
from realrl.impl.model.nn.real_model import ReaLModel


@pytest.mark.parametrize(
    "device_type,tensor_parallel,fsdp,mode",
    [
        ("cuda", False, False, "cuda_graph"),
        ("cuda", True, False, "eager"),
        ("cuda", False, True, "eager"),
        ("cuda", True, True, "eager"),
        ("cpu", False, False, "eager"),
        ("cpu", False, True, "eager"),
    ],
)
def test_auto_captures_graphs_only_for_an_unsplit_cuda_model(device_type, tensor_parallel, fsdp, mode):
    assert choose_decoding("auto", device_type, tensor_parallel, fsdp) == mode


def test_explicit_requests():
    assert choose_decoding("eager", "cuda", tensor_parallel=True, fsdp=True) == "eager"
    assert choose_decoding("static", "cuda", fsdp=True) == "static"  # the same steps, not captured
    assert choose_decoding("static", "cpu") == "static"
    assert choose_decoding("cuda_graph", "cuda") == "cuda_graph"
    with pytest.raises(ValueError, match="decoding='cuda_graph'.*FSDP.*'auto', 'eager' or 'static'"):
        choose_decoding("cuda_graph", "cuda", fsdp=True)
    with pytest.raises(ValueError, match="decoding='cuda_graph' needs a CUDA device"):
        choose_decoding("cuda_graph", "cpu")
    with pytest.raises(ValueError, match="tensor parallelism"):
        choose_decoding("static", "cuda", tensor_parallel=True)


def test_fsdp_model_decodes_without_graphs_and_like_the_plain_model(one_rank_group):
    """A model sharded by the FSDP engine's own ``apply_fsdp``: inside ``gathered()`` (where the
    inference engine generates) its weights are plain tensors, yet it resolves to eager decoding
    on a CUDA device; on the CPU it generates the plain model's tokens, eager and static."""
    from torch.distributed.device_mesh import init_device_mesh

    from realrl.impl.model.parallel.fsdp import apply_fsdp, gathered, is_fsdp

    torch.manual_seed(0)
    plain = ReaLModel(tiny_config()).eval()
    sharded = ReaLModel(tiny_config()).eval()
    sharded.load_state_dict(plain.state_dict())
    cuda, auto = torch.device("cuda"), GenerationHyperparameters()
    assert not is_fsdp(sharded) and decoding_mode(sharded, auto, cuda) == "cuda_graph"
    apply_fsdp(sharded, init_device_mesh("cpu", (1,)))
    ids, cu = packed([4, 7, 2], seed=3)
    ids = ids % plain.config.vocab_size
    greedy = GenerationHyperparameters(n=2, max_new_tokens=6, greedy=True)
    want = generate(plain, ids, cu, greedy, eos_token_id=[1, 2, 3])
    with gathered(sharded):
        assert type(sharded.layers[0].attn.q.weight) is torch.nn.Parameter  # whole, plain
        assert is_fsdp(sharded) and decoding_mode(sharded, auto, cuda) == "eager"
        with pytest.raises(ValueError, match="FSDP"):
            decoding_mode(sharded, GenerationHyperparameters(decoding="cuda_graph"), cuda)
        for decoding in ("auto", "static"):
            g = GenerationHyperparameters(n=2, max_new_tokens=6, greedy=True, decoding=decoding)
            out = generate(sharded, ids, cu, g, eos_token_id=[1, 2, 3])
            assert out.seqlens == want.seqlens and torch.equal(out.sequences, want.sequences)
            torch.testing.assert_close(out.logprobs, want.logprobs)
