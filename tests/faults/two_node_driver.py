"""Run the mock PPO-shaped graph on an existing Ray cluster and print how it ended: one line,
``RESULT <json>`` (Ray's own logs may come through stdout too).

    python two_node_driver.py <ray address> <fileroot> <steps> [raise]

``raise``: the critic's inference raises (a worker's own exception, with its traceback).

Each worker asks for 2 CPUs and each node of the test's cluster has 2, so the two workers run
on different nodes. Started by tests/faults/test_multi_node.py in a process of its own (a
process joins one Ray cluster, and the test session has its own local one).
"""

from __future__ import annotations

import json
import sys

from system_graphs import mock_config

from realrl.apps.main import ExperimentFailedError, run_experiment


def main() -> None:
    address, fileroot, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cfg = mock_config(fileroot, "two-nodes", total_train_steps=steps, total_train_epochs=steps)
    if sys.argv[4:] == ["raise"]:
        next(m for m in cfg.mfcs if m.name == "values").interface_impl = "sys_test_raise"
    try:
        stats = run_experiment(cfg, "ray", ray_address=address, ray_cpus_per_worker=2)
        print("RESULT", json.dumps({"ok": True, "steps": len(stats), "log_dir": cfg.log_dir}))
    except ExperimentFailedError as e:
        print(
            "RESULT", json.dumps({"ok": False, "worker": e.worker, "error": str(e), "log_dir": cfg.log_dir})
        )


if __name__ == "__main__":
    main()
