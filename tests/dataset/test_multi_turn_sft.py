"""``prompt_answer`` with a multi-turn answer: a tokenizer without a chat template trains on the
assistant turns (+ EOS) only, the tool turns tokenized as a rollout appends observations; with a
chat template, messages still render through the template."""

import pytest
from dataset_tokenizer import build_tokenizer

from realrl.api.core.chat_turns import observation_ids
from realrl.api.core.data_api import DatasetUtility, load_hf_tokenizer
from realrl.impl.dataset.errors import DataError
from realrl.impl.dataset.prompt_answer import PromptAnswerDataset

TURNS = [
    {"role": "assistant", "content": "The answer is"},
    {"role": "tool", "content": " 42."},
    {"role": "assistant", "content": " London"},
    {"role": "user", "content": " Tell me a story"},
    {"role": "assistant", "content": " about a cat."},
]
ROW = {"prompt": "Human: what is the capital of France?", "answer": TURNS}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The dataset tests' tokenizer without its chat template."""
    return load_hf_tokenizer(
        build_tokenizer(str(tmp_path_factory.mktemp("plain")), with_pad=True, chat=False)
    )


@pytest.fixture
def plain_util(plain):
    return DatasetUtility(seed=1, dp_rank=0, world_size=1, tokenizer=plain)


def expected(tok, row):
    """The ids a multi-turn rollout builds: prompt, each model turn + EOS, observations in between."""
    ids = tok(row["prompt"])["input_ids"]
    mask = [True] * len(ids)
    for m in row["answer"]:
        if m["role"] == "assistant":
            turn = tok(m["content"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        else:
            turn = observation_ids(tok, m["content"], m["role"])
        ids += turn
        mask += [m["role"] != "assistant"] * len(turn)
    return ids, mask


def test_turns_train_on_assistant_tokens_only(plain_util, plain):
    assert plain.chat_template is None
    s = PromptAnswerDataset(plain_util, dataset_path=[ROW])[0]
    ids, mask = expected(plain, ROW)
    assert s.data["packed_input_ids"].tolist() == ids
    assert s.data["prompt_mask"].tolist() == mask
    trained = [i for i, m in zip(ids, mask) if not m]
    assert trained.count(plain.eos_token_id) == 3 and ids[-1] == plain.eos_token_id
    assert plain.decode(trained, skip_special_tokens=True) == "The answer is London about a cat."


def test_loss_on_prompt_keeps_tool_turns_masked(plain_util, plain):
    s = PromptAnswerDataset(plain_util, dataset_path=[ROW], loss_on_prompt=True)[0]
    _, mask = expected(plain, ROW)
    n_prompt = len(plain(ROW["prompt"])["input_ids"])
    assert s.data["prompt_mask"].tolist() == [False] * n_prompt + mask[n_prompt:]


def test_truncation_keeps_the_mask_aligned(plain_util, plain):
    ids, mask = expected(plain, ROW)
    s = PromptAnswerDataset(plain_util, dataset_path=[ROW], max_length=len(ids) - 3, truncate=True)[0]
    assert s.data["packed_input_ids"].tolist() == ids[:-3]
    assert s.data["prompt_mask"].tolist() == mask[:-3]


@pytest.mark.parametrize(
    "answer, message",
    [
        (
            [{"role": "assistant", "content": "a"}, {"role": "system", "content": "b"}],
            r"'answer'\[1\] has role 'system'",
        ),
        ([{"role": "tool", "content": "b"}], "no assistant turn"),
        ([{"role": "assistant", "content": 3}], r"'answer'\[0\] content must be text"),
        (
            [{"role": "assistant", "content": "a"}, {"content": "b"}],
            r"'answer'\[1\] must be a \{'role', 'content'\}",
        ),
    ],
)
def test_bad_turns_are_data_errors(plain_util, answer, message):
    with pytest.raises(DataError, match=message):
        PromptAnswerDataset(plain_util, dataset_path=[{"prompt": "Tell me", "answer": answer}])


def test_chat_template_still_renders_messages(util, tokenizer):
    """With a chat template, a messages answer is the template's continuation (unchanged)."""
    prompt = [{"role": "user", "content": "hi"}]
    answer = [{"role": "assistant", "content": "hello"}, {"role": "tool", "content": "42"}]
    s = PromptAnswerDataset(util, dataset_path=[{"prompt": prompt, "answer": answer}])[0]
    full = tokenizer.apply_chat_template(prompt + answer, tokenize=True, return_dict=True)["input_ids"]
    head = tokenizer.apply_chat_template(prompt, tokenize=True, return_dict=True, add_generation_prompt=True)
    assert s.data["packed_input_ids"].tolist() == list(full)
    assert s.data["prompt_mask"].tolist() == [True] * len(head["input_ids"]) + [False] * (
        len(full) - len(head["input_ids"])
    )
