"""Every experiment's config and its workers' configs survive JSON exactly: what a run saves and
what its workers read are data, and nothing of them is lost on the way."""

from __future__ import annotations

import pytest

from realrl.api.core.system_api import NameResolveConfig
from realrl.api.quickstart.entrypoint import quickstart_experiments
from realrl.apps.configs import build_config, register_everything
from realrl.base import config_json

register_everything()


@pytest.mark.parametrize("name", quickstart_experiments())
def test_experiment_and_worker_configs_round_trip(name, tmp_path):
    exp = build_config(name, [f"fileroot={tmp_path}", 'allocation_mode="d2m1p1"']).initial_setup()
    workers = exp.model_worker_configs(
        NameResolveConfig("nfs", root=str(tmp_path)),
        bind_host="127.0.0.1",
        devices=["cpu"] * exp.n_model_workers,
        dist_backend="gloo",
    )
    for value in (exp, workers):
        text = config_json.dumps(value, plugin_modules=exp.import_modules)
        back = config_json.loads(text)
        assert back == value
        assert config_json.dumps(back, plugin_modules=exp.import_modules) == text  # nothing added either
