"""``realrl.api.core.data_api`` is the stable path: it re-exports the modules that hold the code."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch

from realrl.api.core import data_api

MODULES = ["key_spec", "microbatch", "sequence_sample", "tokenizer", "dataset_registry", "data_api"]


def test_every_public_name_is_importable_from_data_api():
    from realrl.api.core.data_api import (  # noqa: F401
        DatasetUtility,
        KeyKind,
        KeySpec,
        MicroBatchSpec,
        SequenceSample,
        get_key_spec,
        load_hf_tokenizer,
        make_dataset,
        register_dataset,
        register_key_spec,
        registered_datasets,
        registered_keys,
    )

    assert all(hasattr(data_api, n) for n in data_api.__all__)


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_on_its_own(module):
    """No import cycle: each module imports first, in a fresh interpreter."""
    subprocess.run([sys.executable, "-c", f"import realrl.api.core.{module}"], check=True)


def test_a_pickle_naming_the_data_api_path_still_loads():
    x = data_api.SequenceSample.from_default([1, 2], [3, 4], {"packed_input_ids": torch.arange(7)})
    blob = pickle.dumps(x, protocol=0).replace(
        b"realrl.api.core.sequence_sample", b"realrl.api.core.data_api"
    )
    assert b"realrl.api.core.data_api" in blob
    assert pickle.loads(blob) == x
