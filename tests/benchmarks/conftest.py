"""Fixtures the benchmark smoke tests share."""

import pytest


@pytest.fixture(scope="session")
def sentiment_runs(tmp_path_factory) -> str:
    """One fileroot for the benchmark scripts whose runs build on the sentiment task's SFT phase
    (the loss and estimator groups, the mismatch, rollout correction and distillation): the
    first script to need it trains it, the later ones reuse its checkpoint, as each script does
    among its own runs."""
    return str(tmp_path_factory.mktemp("sentiment_runs") / "runs")  # made by the first script
