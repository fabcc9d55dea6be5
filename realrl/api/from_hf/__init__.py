"""One module per Hugging Face family; each calls ``register_hf_family`` on import."""

from realrl.api.from_hf import (  # noqa: F401
    gpt2,
    llama,
    mistral,
    mixtral,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_moe,
)
