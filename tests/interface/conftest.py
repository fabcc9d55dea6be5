"""A word-level tokenizer over the interface tests' vocabulary."""

from __future__ import annotations

import pytest
from interface_fixtures import WORDS


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    folder = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(folder)
    return PreTrainedTokenizerFast.from_pretrained(folder)
