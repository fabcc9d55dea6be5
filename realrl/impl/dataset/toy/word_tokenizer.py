"""The embedded tasks' tokenizers: a word-level Hugging Face tokenizer folder over a fixed list of
tokens, written atomically, that ``AutoTokenizer`` loads offline like any checkpoint's."""

from __future__ import annotations

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
    beside the tokenizer (name -> content)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoder
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )
    tmp = folder.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    fast.save_pretrained(tmp)
    for name, content in (extra or {}).items():
        with open(os.path.join(tmp, name), "w") as f:
            json.dump(content, f)
    os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder
