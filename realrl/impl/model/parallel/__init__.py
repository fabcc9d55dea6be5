"""Parallel models on torch's own engine: a model's device mesh over its workers, tensor
parallelism with DTensor (``torch.distributed.tensor.parallel``) and sharded training with FSDP2
(``torch.distributed.fsdp.fully_shard``). The engines take an already-parallel module."""
