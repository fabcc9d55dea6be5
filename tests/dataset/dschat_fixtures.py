"""Small local copies of every DeepSpeed-Chat source, each in that source's own schema, and the
texts DeepSpeed-Chat's raw_datasets.py gives for them (written by hand from its formatting rules)."""

from __future__ import annotations

import json
import os

import datasets


def _passage(text):
    return {"docid": "d", "title": "t", "text": text}


def _mkqa(i, lang):
    return {
        "example_id": i,
        "query": f"who {i}",
        "queries": {"en": f"who {i}", "zh_cn": f"谁{i}", "ja": f"誰{i}"},
        "answers": {
            "en": [{"type": "entity", "entity": "", "text": f"A{i}", "aliases": []}],
            "zh_cn": [{"type": "entity", "entity": "", "text": f"答{i}", "aliases": []}],
            "ja": [{"type": "entity", "entity": "", "text": f"答え{i}", "aliases": []}],
        },
    }


H = " Human: "
A = " Assistant:"

# name -> (row(i), split names, expected(i) = (prompt, chosen, rejected, prompt+chosen, prompt+rejected))
SOURCES = {
    "Dahoas/rm-static": (
        lambda i: {
            "prompt": f"\n\nHuman: q{i}\n\nAssistant:",
            "response": f" r{i}",
            "chosen": f" c{i}",
            "rejected": f" x{i}",
        },
        ["train", "test"],
        lambda i: (
            f"\n\nHuman: q{i}\n\nAssistant:",
            f" c{i}",
            f" x{i}",
            f"\n\nHuman: q{i}\n\nAssistant: c{i}",
            f"\n\nHuman: q{i}\n\nAssistant: x{i}",
        ),
    ),
    "Dahoas/full-hh-rlhf": (
        lambda i: {
            "prompt": f"Human: q{i} Assistant:",
            "response": f" r{i}",
            "chosen": f" c{i}",
            "rejected": f" x{i}",
        },
        ["train", "test"],
        lambda i: (
            f"Human: q{i} Assistant:",
            f" c{i}",
            f" x{i}",
            f"Human: q{i} Assistant: c{i}",
            f"Human: q{i} Assistant: x{i}",
        ),
    ),
    "Dahoas/synthetic-instruct-gptj-pairwise": (
        lambda i: {"prompt": f"Explain {i}", "chosen": f"Sure {i}", "rejected": f"No {i}"},
        ["train"],
        lambda i: (
            f"{H}Explain {i}{A}",
            f" Sure {i}",
            f" No {i}",
            f"{H}Explain {i}{A} Sure {i}",
            f"{H}Explain {i}{A} No {i}",
        ),
    ),
    "yitingxie/rlhf-reward-datasets": (
        lambda i: {
            "prompt": f"\n\nHuman: q{i}\n\n",
            "chosen": f"Assistant: c{i}",
            "rejected": f"Assistant: x{i}",
        },
        ["train", "test"],
        lambda i: (
            f"\n\nHuman: q{i}\n\nAssistant:",
            f" c{i}",
            f" x{i}",
            f"\n\nHuman: q{i}\n\nAssistant: c{i}",
            f"\n\nHuman: q{i}\n\nAssistant: x{i}",
        ),
    ),
    "openai/webgpt_comparisons": (
        lambda i: {
            "question": {"dataset": "eli5", "id": str(i), "full_text": f"Why {i}?"},
            "quotes_0": {"title": [], "extract": []},
            "answer_0": f"Because of scattering [1] {i}.",
            "tokens_0": [1, 2],
            "score_0": -1.0 if i % 2 else 0.0,
            "quotes_1": {"title": [], "extract": []},
            "answer_1": f"It reflects (2) the sea {i}.",
            "tokens_1": [3],
            "score_1": 1.0 if i % 2 else 0.0,  # even rows tie: answer_0 is chosen
        },
        ["train"],
        lambda i: (
            (
                (f"{H}Why {i}?{A}",)
                + (
                    (f" It reflects the sea {i}.", f" Because of scattering {i}.")
                    if i % 2
                    else (f" Because of scattering {i}.", f" It reflects the sea {i}.")
                )
            )
            + (None, None)
        ),
    ),
    "stanfordnlp/SHP": (
        lambda i: {
            "post_id": str(i),
            "domain": "askscience_train",
            "upvote_ratio": 0.9,
            "history": f"Why {i}?",
            "c_root_id_A": "a",
            "c_root_id_B": "b",
            "created_at_utc_A": 1,
            "created_at_utc_B": 2,
            "score_A": 5,
            "score_B": 3,
            "human_ref_A": f"refA{i}",
            "human_ref_B": f"refB{i}",
            "labels": i % 2,
            "seconds_difference": 1.0,
            "score_ratio": 1.6,
        },
        ["train", "validation"],
        lambda i: (
            (f"{H}Why {i}?{A}",)
            + ((f" refA{i}", f" refB{i}") if i % 2 else (f" refB{i}", f" refA{i}"))
            + (None, None)
        ),
    ),
    "pvduy/sharegpt_alpaca_oa_vicuna_format": (
        lambda i: {"prompt": f"USER: hi {i} ASSISTANT:", "label": f"hello {i}"},
        ["train", "test"],
        lambda i: (
            f"Human: hi {i} Assistant:",
            f" hello {i}",
            None,
            f"Human: hi {i} Assistant: hello {i}",
            None,
        ),
    ),
    "wangrui6/Zhihu-KOL": (
        lambda i: {
            "INSTRUCTION": f"什么是{i}？",
            "RESPONSE": f"是{i}。",
            "SOURCE": "Zhihu",
            "METADATA": "{}",
        },
        ["train"],
        lambda i: (f"{H}什么是{i}？{A}", f" 是{i}。", None, f"{H}什么是{i}？{A} 是{i}。", None),
    ),
    "Cohere/miracl-zh-queries-22-12": (
        lambda i: {
            "query_id": str(i),
            "query": f"问{i}",
            "positive_passages": [_passage(f"正{i}")],
            "negative_passages": [_passage(f"负{i}")],
        },
        ["train", "dev"],
        lambda i: (f"{H}问{i}{A}", f" 正{i}", f" 负{i}", f"{H}问{i}{A} 正{i}", f"{H}问{i}{A} 负{i}"),
    ),
    "Hello-SimpleAI/HC3-Chinese": (
        lambda i: {
            "id": str(i),
            "question": f"问题{i}",
            "human_answers": [f"人{i}"],
            "chatgpt_answers": [f"机{i}"],
        },
        ["train"],
        lambda i: (f"{H}问题{i}{A}", f" 人{i}", None, f"{H}问题{i}{A} 人{i}", None),
    ),
    "mkqa-Chinese": (
        lambda i: _mkqa(i, "zh_cn"),
        ["train"],
        lambda i: (f"{H}谁{i}{A}", f" 答{i}", None, f"{H}谁{i}{A} 答{i}", None),
    ),
    "mkqa-Japanese": (
        lambda i: _mkqa(i, "ja"),
        ["train"],
        lambda i: (f"{H}誰{i}{A}", f" 答え{i}", None, f"{H}誰{i}{A} 答え{i}", None),
    ),
    "Cohere/miracl-ja-queries-22-12": (
        lambda i: {
            "query_id": str(i),
            "query": f"質問{i}",
            "positive_passages": [_passage(f"正{i}")],
            "negative_passages": [_passage(f"負{i}")] if i % 3 else [],  # some queries have no negative
        },
        ["train", "dev"],
        lambda i: (
            (f"{H}質問{i}{A}", f" 正{i}")
            + ((f" 負{i}",) if i % 3 else (None,))
            + (f"{H}質問{i}{A} 正{i}",)
            + ((f"{H}質問{i}{A} 負{i}",) if i % 3 else (None,))
        ),
    ),
    "lmqg/qg_jaquad": (
        lambda i: {
            "answer": "a",
            "paragraph_question": "pq",
            "question": f"問{i}",
            "sentence": f"文{i}",
            "paragraph": "p",
            "sentence_answer": "sa",
            "paragraph_answer": "pa",
            "paragraph_sentence": "ps",
            "paragraph_id": str(i),
        },
        ["train", "validation"],
        lambda i: (f"{H}問{i}{A}", f" 文{i}", None, f"{H}問{i}{A} 文{i}", None),
    ),
    "lmqg/qag_jaquad": (
        lambda i: {
            "answers": [f"答{i}"],
            "questions": [f"問{i}", "別"],
            "paragraph": f"段落{i}",
            "questions_answers": "qa",
        },
        ["train", "validation"],
        lambda i: (f"{H}問{i}{A}", f" 段落{i}", None, f"{H}問{i}{A} 段落{i}", None),
    ),
    "local/jsonfile": (
        lambda i: {"prompt": f"p{i}", "chosen": f"c{i}", "rejected": f"r{i}"},
        ["train", "eval"],
        lambda i: (f" p{i}", f" c{i}", f" r{i}", f" p{i} c{i}", f" p{i} r{i}"),
    ),
}

# the expected tuple's 3rd..5th entries: for webgpt / SHP the pair texts are prompt + answer
for _name in ("openai/webgpt_comparisons", "stanfordnlp/SHP"):
    _row, _splits, _exp = SOURCES[_name]

    def _full(i, _exp=_exp):
        p, c, r, _, _ = _exp(i)
        return (p, c, r, p + c, p + r)

    SOURCES[_name] = (_row, _splits, _full)


def write_local_copy(root: str, name: str, n: int = 10, style: str = "jsonl") -> str:
    """Write ``n`` rows per split of source ``name`` under ``root``; returns the path to pass."""
    row, splits, _ = SOURCES[name]
    folder = os.path.join(root, name.replace("/", "__"))
    rows = {s: [row(i if s == "train" else 1000 + i) for i in range(n)] for s in splits}
    if name == "local/jsonfile":  # DeepSpeed-Chat's layout: <folder>/data/{train,eval}.json
        os.makedirs(os.path.join(folder, "data"), exist_ok=True)
        for s, r in rows.items():
            with open(os.path.join(folder, "data", f"{s}.json"), "w") as f:
                json.dump(r, f, ensure_ascii=False)
        return folder
    if style == "save_to_disk":
        datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in rows.items()}).save_to_disk(folder)
        return folder
    os.makedirs(folder, exist_ok=True)
    for s, r in rows.items():
        with open(os.path.join(folder, f"{s}.jsonl"), "w") as f:
            f.writelines(json.dumps(x, ensure_ascii=False) + "\n" for x in r)
    return folder
