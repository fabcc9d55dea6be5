"""A tiny byte-level BPE tokenizer saved as a local PreTrainedTokenizerFast folder (no hub access).

Reusable: ``build_tokenizer(dir, with_pad=..., with_bos=..., chat=...)`` returns the folder path.
"""

from __future__ import annotations

import os

EOS = "<|endoftext|>"
PAD = "<|pad|>"
BOS = "<|bos|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Human: what is the capital of France? Assistant: Paris is the capital.",
    "The answer is 42. I don't know. London is the capital of England.",
    "Tell me a story about a quiet cat and a loud dog.",
    "人工智能是什么？ 東京は日本の首都です。",
] * 4


def build_tokenizer(
    out_dir: str,
    with_pad: bool = False,
    pad_is_eos: bool = False,
    with_bos: bool = False,
    chat: bool = True,
    vocab_size: int = 400,
) -> str:
    """Train a byte-level BPE on ``CORPUS`` and save it to ``out_dir``; returns ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [EOS, "<|im_start|>", "<|im_end|>"] + ([PAD] if with_pad else []) + ([BOS] if with_bos else [])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    if with_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))]
        )
    kwargs = {"eos_token": EOS}
    if with_pad:
        kwargs["pad_token"] = PAD
    elif pad_is_eos:
        kwargs["pad_token"] = EOS
    if with_bos:
        kwargs["bos_token"] = BOS
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)
    return out_dir
