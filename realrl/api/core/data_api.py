"""The stable public import path of realrl's data API: import from here, not from the modules below.

``from realrl.api.core.data_api import SequenceSample, MicroBatchSpec, register_dataset, ...`` is
pinned: user code, plugins and pickles name these classes through this module. Each piece lives in
a module of its own, and this one only re-exports them:

  key_spec.py          KeyKind, KeySpec, register_key_spec, get_key_spec, registered_keys:
                       the length rules of keys (the key contract: docs/datasets.md)
  microbatch.py        MicroBatchSpec: how a batch is cut into micro-batches
  sequence_sample.py   SequenceSample: packed, unpadded, variable-length batches
  dataset_registry.py  DatasetUtility, register_dataset, registered_datasets, make_dataset
  tokenizer.py         load_hf_tokenizer: a local HF tokenizer with realrl's pad-token rules
"""

from __future__ import annotations

from realrl.api.core.dataset_registry import (
    DatasetUtility,
    make_dataset,
    register_dataset,
    registered_datasets,
)
from realrl.api.core.key_spec import (
    KeyKind,
    KeySpec,
    get_key_spec,
    register_key_spec,
    registered_keys,
)
from realrl.api.core.microbatch import MicroBatchSpec
from realrl.api.core.sequence_sample import SequenceSample
from realrl.api.core.tokenizer import load_hf_tokenizer

__all__ = [
    "DatasetUtility",
    "KeyKind",
    "KeySpec",
    "MicroBatchSpec",
    "SequenceSample",
    "get_key_spec",
    "load_hf_tokenizer",
    "make_dataset",
    "register_dataset",
    "register_key_spec",
    "registered_datasets",
    "registered_keys",
]
