"""Train and inference engines (``engine``, ``train_engine``) and their options (``config``),
registered as the "train", "inference" and "null" backends by ``realrl.impl.builtin``."""
