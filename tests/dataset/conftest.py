import logging

import pytest
from dataset_tokenizer import build_tokenizer

from realrl.api.core.data_api import DatasetUtility, load_hf_tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    return build_tokenizer(str(tmp_path_factory.mktemp("tok")), with_pad=True)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    return load_hf_tokenizer(tokenizer_dir)


@pytest.fixture
def util(tokenizer):
    return DatasetUtility(seed=1, dp_rank=0, world_size=1, tokenizer=tokenizer)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(f"{record.levelname} {record.getMessage()}")


@pytest.fixture
def realrl_logs():
    """Messages logged under the ``realrl`` namespace (it does not propagate to pytest's caplog)."""
    handler = _Records()
    root = logging.getLogger("realrl")
    root.addHandler(handler)
    yield handler.messages
    root.removeHandler(handler)
