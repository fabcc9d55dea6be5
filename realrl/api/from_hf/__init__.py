"""One module per Hugging Face family; each calls ``register_hf_family`` on import."""

from realrl.api.from_hf import gpt2, llama, mistral, qwen2, qwen3  # noqa: F401
