"""Experiment configs over the mock plugins, shared by the runtime tests."""

from __future__ import annotations

import os
import re
import signal
import time

import psutil

from realrl.api.core.config import DatasetAbstraction, ModelAbstraction, ModelBackendAbstraction
from realrl.api.core.config import ModelInterfaceAbstraction as Impl
from realrl.api.core.dfg import MFCDef
from realrl.api.core.system_api import ExperimentConfig, ModelSpec, Timeouts

PLUGINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mock_plugins.py")
SPEC = ModelSpec(ModelAbstraction("sys_test_scalar"), ModelBackendAbstraction("sys_test_backend"))
ROLLOUT = ("packed_input_ids", "prompt_mask", "seq_no_eos_mask")


def mock_rlhf_mfcs(n_seqs: int = 4) -> list[MFCDef]:
    """gen -> values -> reward -> {actor_train, critic_train}: a PPO-shaped graph of mock calls."""

    def mfc(name, role, kind, impl, inputs, outputs):
        return MFCDef(name, role, kind, impl, n_seqs=n_seqs, input_keys=inputs, output_keys=outputs)

    return [
        mfc("gen", "actor", "generate", "sys_test_gen", ("packed_prompts",), ROLLOUT),
        mfc("values", "critic", "inference", "sys_test_values", ("packed_input_ids",), ("values",)),
        mfc("reward", "reward", "inference", "sys_test_reward", ("values",), ("rewards",)),
        mfc("actor_train", "actor", "train_step", "sys_test_train", ("packed_input_ids", "rewards"), ()),
        mfc("critic_train", "critic", "train_step", "sys_test_train", ("values", "rewards"), ()),
    ]


def mock_config(
    fileroot, trial: str, mfcs=None, allocations=None, n_samples: int = 16, **kwargs
) -> ExperimentConfig:
    mfcs = mfcs or mock_rlhf_mfcs()
    roles = sorted({m.role for m in mfcs})
    return ExperimentConfig(
        experiment_name="systest",
        trial_name=trial,
        mfcs=mfcs,
        models=dict.fromkeys(roles, SPEC),
        allocations=allocations or {"actor": [0, 1], "critic": [1], "reward": [0]},
        datasets=[DatasetAbstraction("sys_test_tokens", {"n": n_samples})],
        fileroot=str(fileroot),
        import_modules=[PLUGINS],
        timeouts=kwargs.pop("timeouts", Timeouts(connect=90, heartbeat=10)),
        **kwargs,
    )


def single_call_config(fileroot, trial: str, impl: Impl | str, steps: int = 2, **kwargs) -> ExperimentConfig:
    mfcs = [
        MFCDef(
            "only",
            "actor",
            "inference",
            impl,
            n_seqs=4,
            input_keys=("packed_prompts",),
            output_keys=("values",),
        )
    ]
    return mock_config(fileroot, trial, mfcs, {"actor": [0, 1]}, total_train_steps=steps, **kwargs)


def worker_pids(config: ExperimentConfig) -> dict[str, int]:
    """Worker pids as each worker logged them when it connected."""
    pids = {}
    for name in sorted(os.listdir(config.log_dir)):
        if not name.startswith("model_worker"):
            continue
        with open(os.path.join(config.log_dir, name), errors="replace") as f:
            found = re.findall(r"(model_worker/\d+) connected to the master .* \(pid (\d+)\)", f.read())
        if found:
            pids[found[-1][0]] = int(found[-1][1])
    return pids


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def wait_all_exited(pids, timeout: float = 10.0) -> list[int]:
    """The pids still alive after ``timeout`` s (Ray kills actors asynchronously)."""
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


def deterministic(stats: list[dict]) -> list[dict]:
    """Stats without the measurements (wall clock, peak memory)."""
    return [{k: v for k, v in s.items() if k not in ("time", "timing", "memory")} for s in stats]


def kill_when_running(cfg, victim: str, signum=signal.SIGKILL):
    """SIGKILL ``victim`` once the run has finished a step; the time it was killed (None: never)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = worker_pids(cfg) if os.path.isdir(cfg.log_dir) else {}
        if victim in pids and os.path.exists(os.path.join(cfg.run_dir, "stats.jsonl")):
            os.kill(pids[victim], signum)
            return time.monotonic()
        time.sleep(0.1)
