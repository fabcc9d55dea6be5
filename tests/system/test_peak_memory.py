"""Peak memory in a run's records: each model worker reports its own with every reply, the step
records carry the largest and the sum (``"memory"``, beside ``"timing"``), and a run's summary has them per phase."""

from __future__ import annotations

import json
import os

import numpy as np

from realrl.api.core.dfg import MFCDef
from realrl.apps.run import phase_memory
from realrl.base.peak_memory import GB, peak_rss_bytes, process_peaks
from realrl.system.function_call import CallResult
from realrl.system.step_log import StepLog, memory_figures


def resident_bytes_now() -> int:
    """This process's resident memory at this moment (Linux ``/proc``), which the peak is at least."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_process_peak_grows_with_what_it_touches():
    # Compared with what is resident now, not with the peak before: a process that once held more
    # (earlier tests in the same session) may not raise its peak by the whole block.
    now = resident_bytes_now()
    block = np.ones(300 * 2**20 // 8)  # 300 MiB, every page written
    after = peak_rss_bytes()
    assert block.sum() > 0
    assert after >= now + 250 * 2**20, (now, after)
    peaks = process_peaks()
    assert peaks["host_rss_gb"] >= after / GB - 1e-3
    assert "device_gb" not in peaks  # CUDA never initialised in this process: nothing to report


def test_step_records_carry_the_largest_and_the_sum_of_the_workers_peaks(tmp_path):
    log = StepLog(str(tmp_path))
    gen = MFCDef("actor_gen", "actor", "generate", "ppo_actor")
    train = MFCDef("actor_train", "actor", "train_step", "ppo_actor")
    log.open(0, 0)
    log.call(
        0, gen, CallResult([], {}, 1.0, 0, peak_memory={0: {"host_rss_gb": 1.0}, 1: {"host_rss_gb": 2.0}})
    )
    log.call(0, train, CallResult([], {}, 1.0, 0, peak_memory={0: {"host_rss_gb": 3.0}}))  # worker 0 grew
    log.write(0, total_steps=2)
    log.open(1, 0)
    log.call(1, gen, CallResult([], {}, 1.0, 0))  # a call with no report keeps the known peaks
    log.write(1, total_steps=2)
    lines = [json.loads(x) for x in (tmp_path / "stats.jsonl").read_text().splitlines()]
    for line in lines:
        assert line["memory"] == {"worker_peak_rss_gb": 3.0, "workers_peak_rss_gb": 5.0}
        assert not any(k.startswith("memory/") for k in line)  # no statistic: kept out of curves
    assert phase_memory(lines) == {"worker_peak_rss_gb": 3.0, "workers_peak_rss_gb": 5.0}
    assert phase_memory([]) == {}


def test_device_peaks_are_reported_where_workers_have_them():
    figures = memory_figures(
        {0: {"host_rss_gb": 1.5, "device_gb": 10.0}, 1: {"host_rss_gb": 1.0, "device_gb": 12.5}}
    )
    assert figures == {"worker_peak_rss_gb": 1.5, "workers_peak_rss_gb": 2.5, "device_peak_gb": 12.5}
    assert memory_figures({}) == {}


def test_a_call_in_pieces_keeps_every_pieces_report():
    first = CallResult([], {}, 1.0, 0, peak_memory={0: {"host_rss_gb": 1.0}, 1: {"host_rss_gb": 1.0}})
    later = CallResult([], {}, 1.0, 0, peak_memory={0: {"host_rss_gb": 1.25}})
    assert first.then(later).peak_memory == {0: {"host_rss_gb": 1.25}, 1: {"host_rss_gb": 1.0}}
