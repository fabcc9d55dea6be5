"""One adapter per source DeepSpeed-Chat supports, each reading that source's own schema.

Formatting facts (prompt " Human: ... Assistant:", responses " ...", which field holds what)
follow DeepSpeed-Chat's ``raw_datasets.py``; ``get_raw_dataset(name, data_path)`` picks the adapter.
"""

from __future__ import annotations

import re
from typing import Any

from realrl.base.registry import Registry
from realrl.impl.dataset.dschat.base import PromptRawDataset, human, reply

_ADAPTERS: Registry[type[PromptRawDataset]] = Registry("DeepSpeed-Chat source")


def _adapter(cls: type[PromptRawDataset]) -> type[PromptRawDataset]:
    _ADAPTERS.register(cls.dataset_name, cls)
    return cls


def adapter_names() -> list[str]:
    return _ADAPTERS.names()


def get_raw_dataset(
    name: str, data_path: Any, seed: int = 1234, cache_dir: str | None = None
) -> PromptRawDataset:
    """The adapter for source ``name`` over the local copy at ``data_path``."""
    return _ADAPTERS.get(name)(data_path, seed=seed, cache_dir=cache_dir)


class _PlainPair(PromptRawDataset):
    """Rows already hold DeepSpeed-Chat-formatted prompt / chosen / rejected text."""

    def get_prompt(self, s):
        return self.text(s, "prompt")

    def get_chosen(self, s):
        return self.text(s, "chosen")

    def get_rejected(self, s):
        return self.text(s, "rejected")


@_adapter
class DahoasRmstaticDataset(_PlainPair):
    dataset_name = "Dahoas/rm-static"


@_adapter
class DahoasFullhhrlhfDataset(_PlainPair):
    dataset_name = "Dahoas/full-hh-rlhf"


@_adapter
class DahoasSyntheticinstructgptjpairwiseDataset(PromptRawDataset):
    dataset_name = "Dahoas/synthetic-instruct-gptj-pairwise"
    eval_split = None

    def get_prompt(self, s):
        return human(self.text(s, "prompt"))

    def get_chosen(self, s):
        return reply(self.text(s, "chosen"))

    def get_rejected(self, s):
        return reply(self.text(s, "rejected"))


@_adapter
class YitingxieRlhfrewarddatasetsDataset(PromptRawDataset):
    """Its chosen / rejected texts repeat "Assistant:"; the pair texts are prompt + raw answer."""

    dataset_name = "yitingxie/rlhf-reward-datasets"

    def get_prompt(self, s):
        return self.text(s, "prompt") + "Assistant:"

    def get_chosen(self, s):
        return self.text(s, "chosen").split("Assistant:")[-1]

    def get_rejected(self, s):
        return self.text(s, "rejected").split("Assistant:")[-1]

    def get_prompt_and_chosen(self, s):
        return self.text(s, "prompt") + self.text(s, "chosen")

    def get_prompt_and_rejected(self, s):
        return self.text(s, "prompt") + self.text(s, "rejected")


def _strip_citations(text: str) -> str:
    """WebGPT answers cite sources as "[1]" or "(2)"; not doing browser-assisted training, drop them."""
    text = re.sub(r" [\(\[].*?[\)\]]", "", text)
    return re.sub(r"[\(\[].*?[\)\]]", "", text)


@_adapter
class OpenaiWebgptcomparisonsDataset(PromptRawDataset):
    """Two scored answers per question; the higher score (ties: answer_0) is chosen."""

    dataset_name = "openai/webgpt_comparisons"
    eval_split = None

    def _answers(self, s) -> tuple[str, str]:
        a0, a1 = self.text(s, "answer_0"), self.text(s, "answer_1")
        first = float(self.field(s, "score_0")) >= float(self.field(s, "score_1"))
        return (a0, a1) if first else (a1, a0)

    def get_prompt(self, s):
        return human(self.text(s, "question", "full_text"))

    def get_chosen(self, s):
        return reply(_strip_citations(self._answers(s)[0]))

    def get_rejected(self, s):
        return reply(_strip_citations(self._answers(s)[1]))


@_adapter
class StanfordnlpSHPDataset(PromptRawDataset):
    """``labels`` = 1 when human_ref_A is preferred."""

    dataset_name = "stanfordnlp/SHP"
    eval_split = "validation"

    def _refs(self, s) -> tuple[str, str]:
        a, b = self.text(s, "human_ref_A"), self.text(s, "human_ref_B")
        return (a, b) if int(self.field(s, "labels")) == 1 else (b, a)

    def get_prompt(self, s):
        return human(self.text(s, "history"))

    def get_chosen(self, s):
        return reply(self._refs(s)[0])

    def get_rejected(self, s):
        return reply(self._refs(s)[1])


class _NoRejected(PromptRawDataset):
    """Instruction data: a prompt and one good answer, no rejected one."""

    has_rejected = False
    prompt_path: tuple = ()
    answer_path: tuple = ()

    def get_prompt(self, s):
        return human(self.text(s, *self.prompt_path))

    def get_chosen(self, s):
        return reply(self.text(s, *self.answer_path))


@_adapter
class PvduySharegptalpacaoavicunaformatDataset(_NoRejected):
    """Vicuna-format prompts ("USER: ... ASSISTANT:"), renamed to Human / Assistant."""

    dataset_name = "pvduy/sharegpt_alpaca_oa_vicuna_format"

    def get_prompt(self, s):
        p = self.text(s, "prompt")
        return p.replace("USER", "Human").replace("ASSISTANT", "Assistant") if p else None

    def get_chosen(self, s):
        label = self.text(s, "label")
        return reply(label) if label else None


@_adapter
class Wangrui6ZhihuKOLDataset(_NoRejected):
    dataset_name = "wangrui6/Zhihu-KOL"
    eval_split = None
    prompt_path = ("INSTRUCTION",)
    answer_path = ("RESPONSE",)


class _Miracl(PromptRawDataset):
    """Retrieval queries: the first positive passage is chosen, the first negative rejected."""

    eval_split = "dev"

    def get_prompt(self, s):
        return human(self.text(s, "query"))

    def get_chosen(self, s):
        return reply(self.text(s, "positive_passages", 0, "text"))

    def get_rejected(self, s):
        negatives = self.field(s, "negative_passages")
        return reply(self.text(s, "negative_passages", 0, "text")) if negatives else None


@_adapter
class CohereMiraclzhqueries2212Dataset(_Miracl):
    dataset_name = "Cohere/miracl-zh-queries-22-12"


@_adapter
class CohereMiracljaqueries2212Dataset(_Miracl):
    dataset_name = "Cohere/miracl-ja-queries-22-12"


@_adapter
class HelloSimpleAIHC3ChineseDataset(_NoRejected):
    dataset_name = "Hello-SimpleAI/HC3-Chinese"
    eval_split = None
    prompt_path = ("question",)
    answer_path = ("human_answers", 0)


@_adapter
class MkqaChineseDataset(_NoRejected):
    dataset_name = "mkqa-Chinese"
    eval_split = None
    prompt_path = ("queries", "zh_cn")
    answer_path = ("answers", "zh_cn", 0, "text")


@_adapter
class MkqaJapaneseDataset(_NoRejected):
    dataset_name = "mkqa-Japanese"
    eval_split = None
    prompt_path = ("queries", "ja")
    answer_path = ("answers", "ja", 0, "text")


@_adapter
class LmqgQgjaquadDataset(_NoRejected):
    dataset_name = "lmqg/qg_jaquad"
    eval_split = "validation"
    prompt_path = ("question",)
    answer_path = ("sentence",)


@_adapter
class LmqgQagjaquadDataset(_NoRejected):
    dataset_name = "lmqg/qag_jaquad"
    eval_split = "validation"
    prompt_path = ("questions", 0)
    answer_path = ("paragraph",)


@_adapter
class LocalJsonFileDataset(PromptRawDataset):
    """Your own data: ``train.json`` and ``eval.json`` (in the folder or its ``data/``) with
    prompt / chosen / rejected fields; each text gets a leading space, DeepSpeed-Chat's way."""

    dataset_name = "local/jsonfile"
    eval_split = "eval"

    def get_prompt(self, s):
        return reply(self.text(s, "prompt"))

    def get_chosen(self, s):
        return reply(self.text(s, "chosen"))

    def get_rejected(self, s):
        return reply(s.get("rejected"))
