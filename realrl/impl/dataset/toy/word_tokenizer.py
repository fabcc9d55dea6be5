"""The embedded tasks' tokenizers: a word-level Hugging Face tokenizer folder over a fixed list of
tokens, written atomically, that ``AutoTokenizer`` loads offline like any checkpoint's."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
from typing import Any

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"


def save_word_level_tokenizer(
    folder: str,
    tokens: tuple[str, ...],
    pre_tokenizer: Any,
    decoder: Any,
    extra: dict[str, Any] | None = None,
) -> str:
    """``tokens`` get ids in order (the special tokens among them); ``pre_tokenizer`` splits text
    into tokens and ``decoder`` joins them (``tokenizers`` objects); ``extra``: JSON files written
    beside the tokenizer (name -> content).

    Written with the ``tokenizers`` library alone (``tokenizer.json``, the special tokens marked
    special) and a ``tokenizer_config.json`` naming the class the installed transformers would
    write: the command line builds the task, and it imports no transformers."""
    from tokenizers import AddedToken, Tokenizer, models, processors

    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoder
    tok.post_processor = processors.TemplateProcessing(single="$A", pair="$A:0 $B:1")  # no BOS / EOS
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (PAD, BOS, EOS, UNK)])
    config = {
        **_tokenizer_class(),
        "pad_token": PAD,
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(1e30),  # "no limit", as transformers writes it
    }
    tmp = folder.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    tok.save(os.path.join(tmp, "tokenizer.json"))
    for name, content in {"tokenizer_config.json": config, **(extra or {})}.items():
        with open(os.path.join(tmp, name), "w") as f:
            json.dump(content, f, indent=2)
    os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def _tokenizer_class() -> dict[str, str]:
    """How the installed transformers names a tokenizer backed by a ``tokenizer.json``, read from
    its version (package metadata: nothing is imported): ``TokenizersBackend`` from transformers 5,
    ``PreTrainedTokenizerFast`` before."""
    try:
        major = int(importlib.metadata.version("transformers").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        major = 5
    if major >= 5:
        return {"tokenizer_class": "TokenizersBackend", "backend": "tokenizers"}
    return {"tokenizer_class": "PreTrainedTokenizerFast"}
