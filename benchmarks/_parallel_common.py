"""Shared by the parallel-layout benchmarks: a llama config by size, a packed batch, a token loss,
and a gloo (or NCCL) process group of N local processes."""

from __future__ import annotations

import os

import torch

SIZES = {  # name: (layers, hidden, heads, kv heads, ffn, vocab)
    "tiny": (2, 128, 4, 2, 344, 2048),
    "small": (4, 512, 8, 4, 1376, 8192),
    "medium": (8, 768, 12, 4, 2048, 16384),
}


def model_config(size: str):
    from realrl.api.core.model_api import ReaLModelConfig

    layers, hidden, heads, kv, ffn, vocab = SIZES[size]
    return ReaLModelConfig(
        n_layers=layers,
        n_q_heads=heads,
        n_kv_heads=kv,
        hidden_dim=hidden,
        intermediate_dim=ffn,
        vocab_size=vocab,
        n_positions=4096,
        hf_model_type="llama",
    )


def batch(vocab: int, lengths: list[int], seed: int, key: str = "packed_input_ids"):
    from realrl.api.core.data_api import SequenceSample

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (sum(lengths),), generator=g)
    return SequenceSample.from_default(
        ids=[f"s{seed}-{i}" for i in range(len(lengths))], seqlens=lengths, data={key: ids}
    )


def n_params(size: str) -> int:
    from realrl.impl.model.nn.real_model import ReaLModel

    return sum(p.numel() for p in ReaLModel(model_config(size), device="meta").parameters())


def token_loss(logits: torch.Tensor, mb) -> tuple[torch.Tensor, dict]:
    ids = mb.data["packed_input_ids"]
    logp = torch.log_softmax(logits.float()[:-1], -1).gather(-1, ids[1:, None])[:, 0]
    return -logp.mean(), {}


def n_tokens(mb) -> float:
    return float(sum(mb.flat_seqlens("packed_input_ids")) - 1)


def init_group(rank: int, world: int, port: int, device: str) -> str:
    """Join the benchmark's process group; the device this rank uses."""
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    backend = "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    if device == "cuda":
        torch.cuda.set_device(rank)
        return f"cuda:{rank}"
    return "cpu"
