"""Datasets: ``prompt_answer`` (SFT), ``rw_paired`` (reward modeling), ``prompt`` (PPO / GRPO)
and ``dschat`` (DeepSpeed-Chat sources split by phase), registered by ``realrl.impl.builtin``.
See docs/datasets.md."""
