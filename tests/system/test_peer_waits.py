"""How long a worker waits for a peer: as long as the peer may be busy with its current call
(``Timeouts.request``) plus the exchange (``Timeouts.transfer``), never the exchange alone."""

from __future__ import annotations

from system_graphs import mock_config

from realrl.api.core.config import ModelInterfaceAbstraction as Impl
from realrl.api.core.dfg import MFCDef
from realrl.api.core.system_api import Timeouts
from realrl.apps.main import run_experiment


def test_the_peer_bound_covers_a_busy_peer():
    assert Timeouts(request=50.0, transfer=5.0).peer == 55.0


def test_a_transfer_waits_for_a_sender_busy_with_a_long_call(tmp_path):
    """Worker 0 runs a 3 s call while worker 1 already waits for worker 0's prompts; one
    transfer may take 1 s, a call 60 s: the receiver must outwait the busy sender."""
    mfcs = [
        MFCDef(
            "busy",
            "a",
            "inference",
            Impl("sys_test_slow", {"delay": 3.0}),
            n_seqs=4,
            input_keys=("packed_prompts",),
            output_keys=("values",),
        ),
        MFCDef(
            "waits",
            "b",
            "generate",
            "sys_test_gen",
            n_seqs=4,
            input_keys=("packed_prompts",),
            output_keys=("packed_input_ids", "prompt_mask", "seq_no_eos_mask"),
        ),
    ]
    timeouts = Timeouts(connect=90, heartbeat=10, request=60, transfer=1.0)
    cfg = mock_config(
        tmp_path, "busy-peer", mfcs, {"a": [0], "b": [1]}, total_train_steps=1, timeouts=timeouts
    )
    records = run_experiment(cfg, "local")
    assert len(records) == 1 and records[0]["timing"]["busy"] >= 3.0


def test_a_model_on_one_worker_is_built_in_host_memory_like_a_split_one(tmp_path):
    """A random model is initialised from the CPU's random stream on one worker as on a mesh, so
    d1 and d2 or tensor-parallel runs start from the same weights on a GPU too (``cpu:0``
    stands for the GPU here)."""
    from system_graphs import mock_rlhf_mfcs

    cfg = mock_config(
        tmp_path,
        "host-build",
        mock_rlhf_mfcs(),
        {"actor": [0], "critic": [0], "reward": [0]},
        total_train_steps=1,
    )
    cfg.device = "cpu:0"
    records = run_experiment(cfg, "local")
    assert records[0]["actor_train/built_on_host"] == 1.0
