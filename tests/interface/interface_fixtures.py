"""Tiny ReaLModels behind the real train / inference engines, and batches for the interface tests."""

from __future__ import annotations

import torch

import realrl.impl.builtin  # noqa: F401  (registers models, backends, interfaces)
from realrl.api.core.config import ModelName
from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_api import Model, ReaLModelConfig
from realrl.impl.model.backend.config import OptimizerConfig
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.nn.real_model import ReaLModel

WORDS = ["<pad>", "<bos>", "<eos>", "<unk>", ".", "good", "great", "bad", "awful"] + [
    f"w{i}" for i in range(23)
]


def tiny_config(is_critic: bool = False) -> ReaLModelConfig:
    return ReaLModelConfig(
        n_layers=1,
        n_q_heads=2,
        n_kv_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        vocab_size=len(WORDS),
        n_positions=64,
        is_critic=is_critic,
        eos_token_id=2,
        pad_token_id=0,
    )


def make_model(
    tokenizer,
    role: str = "actor",
    critic: bool = False,
    train: bool = True,
    lr: float = 1e-2,
    seed: int = 0,
    device: str = "cpu",
) -> Model:
    torch.manual_seed(seed)
    module = ReaLModel(tiny_config(critic))
    if train:
        engine = TrainEngine(module, OptimizerConfig(lr=lr, grad_clip=0.0), device=device)
    else:
        engine = InferenceEngine(module, device=device)
    return Model(ModelName(role), engine, tokenizer, device=device)


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def prompt_batch(tokenizer, prompts: list[str]) -> SequenceSample:
    samples = []
    for i, p in enumerate(prompts):
        ids = ids_of(tokenizer, p)
        samples.append(
            SequenceSample.from_default(
                ids=[i], seqlens=[len(ids)], data={"packed_prompts": torch.tensor(ids)}
            )
        )
    return SequenceSample.gather(samples)


def prompt_answer_batch(tokenizer, pairs: list[tuple[str, str]]) -> SequenceSample:
    samples = []
    for i, (p, a) in enumerate(pairs):
        pi, ai = ids_of(tokenizer, p), ids_of(tokenizer, a)
        mask = torch.tensor([True] * len(pi) + [False] * len(ai))
        samples.append(
            SequenceSample.from_default(
                ids=[i],
                seqlens=[len(pi) + len(ai)],
                data={"packed_input_ids": torch.tensor(pi + ai), "prompt_mask": mask},
            )
        )
    return SequenceSample.gather(samples)


def paired_batch(tokenizer, rows: list[list[tuple[str, str]]], margins: list[list[float]] | None = None):
    """One sample per row; a row is a list of (chosen, rejected) full texts."""
    samples = []
    for i, row in enumerate(rows):
        seqs = [ids_of(tokenizer, t) for pair in row for t in pair]
        data = {"packed_input_ids": torch.tensor([t for s in seqs for t in s])}
        if margins is not None:
            data["margins"] = torch.tensor([m for m in margins[i] for _ in range(2)], dtype=torch.float32)
        samples.append(SequenceSample.from_default(ids=[i], seqlens=[[len(s) for s in seqs]], data=data))
    return SequenceSample.gather(samples)
