"""One module per Hugging Face family; each calls ``register_hf_family`` on import."""
