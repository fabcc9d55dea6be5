"""The step log: one record per training step, the one vocabulary of its keys, and its files.

A record opens when the step's batch joins the graph (``{"step", "epoch", "timing"}``, 1-based),
collects what each finished call adds (``<mfc>/<stat>``, ``timing/<mfc>``, reallocations under
``realloc/<role>/...``, weight pushes under ``push/<role>/...``, the parts' own keys: ``eval/*``, ``async/*``, ``dynamic_sampling/*``) and
is written, in step order, once every call of its step is done, with the model workers' peak
memory so far beside ``timing`` (``"memory": {...}``, measurements like it, which two runs of the
same numbers do not share): a line of ``stats.jsonl``, the
decoded samples in ``samples.jsonl``, one short log line (the step's seconds and a few key
figures), the ``on_step`` callback (progress bar, TensorBoard).
The master and its parts write records only through this object.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from realrl.api.core.dfg import MFCDef
from realrl.api.core.model_api import SAMPLES_KEY
from realrl.base import logging
from realrl.system.function_call import CallResult

logger = logging.getLogger("master_worker")
# the statistics a step's log line shows (the rest stays in stats.jsonl): rewards, KL, losses
BRIEF_STATS = ("task_reward", "ref_kl", "loss", "accuracy")


class StepLog:
    def __init__(self, run_dir: str, on_step: Callable[[dict, int], None] | None = None):
        self.on_step = on_step or (lambda record, total_steps: None)
        self.records: dict[int, dict] = {}  # open records, by 0-based step
        self.stats: list[dict] = []  # one finished record per step, in order
        self.opened: dict[int, float] = {}  # when each open record's step began, by 0-based step
        self.stats_path = os.path.join(run_dir, "stats.jsonl")
        # a few decoded prompts, completions and rewards per step, one line per step
        self.samples_path = os.path.join(run_dir, "samples.jsonl")
        self.peaks: dict[int, dict[str, float]] = {}  # each model worker's peak memory, as last reported

    # -- writing a record ------------------------------------------------------------------------

    def open(self, step: int, epoch: int) -> dict:
        """The record of ``step`` (0-based), whose batch comes from ``epoch`` (0-based)."""
        self.records[step] = {"step": step + 1, "epoch": epoch + 1, "timing": {}}
        self.opened[step] = time.time()
        return self.records[step]

    def add(self, step: int, values: dict) -> None:
        self.records[step].update(values)

    def timing(self, step: int, name: str, seconds: float) -> None:
        self.records[step]["timing"][name] = round(seconds, 4)

    def call(self, step: int, mfc: MFCDef, result: CallResult) -> None:
        """A finished call: ``<mfc>/<stat>``, its time, its samples, its move."""
        record = self.records[step]
        record.update({f"{mfc.name}/{k}": v for k, v in sorted(result.stats.items())})
        self.timing(step, mfc.name, result.seconds)
        self.peaks.update(result.peak_memory)
        if result.samples:
            record.setdefault(SAMPLES_KEY, []).extend(result.samples)
        self.realloc(step, mfc.role, result)

    def realloc(self, step: int, role: str, result: CallResult) -> None:
        """A step's reallocations of ``role`` under ``realloc/<role>/...``: bytes received (all
        workers), seconds moving and seconds waiting for busy workers to arrive (the slowest
        worker, summed over the step's moves), count and moves. Its weight pushes too (``push``)."""
        self.push(step, role, result)
        moved = result.realloc
        if moved is None:
            return
        record, prefix = self.records[step], f"realloc/{role}"
        record[f"{prefix}/bytes"] = record.get(f"{prefix}/bytes", 0.0) + float(moved.bytes)
        record[f"{prefix}/seconds"] = round(record.get(f"{prefix}/seconds", 0.0) + moved.seconds, 4)
        waited = record.get(f"{prefix}/wait_seconds", 0.0) + moved.wait_seconds
        record[f"{prefix}/wait_seconds"] = round(waited, 4)
        record[f"{prefix}/count"] = record.get(f"{prefix}/count", 0.0) + 1.0
        moves = record.get(f"{prefix}/moves")
        record[f"{prefix}/moves"] = moved.move if moves is None else f"{moves}; {moved.move}"
        record["timing"][prefix] = record[f"{prefix}/seconds"]

    def push(self, step: int, role: str, result: CallResult) -> None:
        """A step's weight pushes of ``role`` (asynchronous RL) under ``push/<role>/...``, summed
        over the step's calls: ``bytes`` its training calls pushed (all sending workers),
        ``send_blocked_s`` the seconds they were blocked packing and posting them, and
        ``recv_blocked_s`` the seconds its generate calls were blocked receiving and scattering
        the versions pushed to them (each the slowest worker's)."""
        pushed = result.push
        if pushed is None:
            return
        record, prefix = self.records[step], f"push/{role}"
        for key, value in (
            ("bytes", float(pushed.bytes_sent)),
            ("send_blocked_s", pushed.send_blocked_s),
            ("recv_blocked_s", pushed.recv_blocked_s),
        ):
            record[f"{prefix}/{key}"] = round(record.get(f"{prefix}/{key}", 0.0) + value, 6)

    # -- finishing records -------------------------------------------------------------------------

    def write(self, step: int, total_steps: int) -> None:
        """The record of ``step``, complete: into the files, the log and ``on_step``."""
        record = self.records.pop(step)
        memory = memory_figures(self.peaks)
        if memory:
            record["memory"] = memory
        record["time"] = time.time()
        self.stats.append(record)
        samples = record.get(SAMPLES_KEY)
        with open(self.stats_path, "a") as f:
            f.write(json.dumps({k: v for k, v in record.items() if k != SAMPLES_KEY}) + "\n")
        if samples:
            with open(self.samples_path, "a") as f:
                f.write(json.dumps({"step": record["step"], SAMPLES_KEY: samples}) + "\n")
        seconds = record["time"] - self.opened.pop(step, record["time"])
        logger.info("step %d/%d done in %.2f s%s", step + 1, total_steps, seconds, brief(record))
        self.on_step(record, total_steps)

    def keep_until(self, steps_done: int) -> None:
        """Keep the records (and samples) of the first ``steps_done`` steps only: a resumed run
        continues the files, a new one starts them empty."""
        for path in (self.stats_path, self.samples_path):
            kept = []
            if steps_done and os.path.exists(path):
                with open(path) as f:
                    kept = [line for line in f if line.strip() and json.loads(line)["step"] <= steps_done]
            if kept or path == self.stats_path:
                with open(path, "w") as f:
                    f.writelines(kept)
            elif os.path.exists(path):
                os.remove(path)


def memory_figures(peaks: dict[int, dict[str, float]]) -> dict[str, float]:
    """The model workers' peak memory so far (each worker's own peak since it started):
    ``worker_peak_rss_gb`` the largest worker's, ``workers_peak_rss_gb`` their sum (an upper
    bound of what the workers held at once), ``device_peak_gb`` the largest worker's accelerator
    peak where it has one."""
    if not peaks:
        return {}
    host = [p["host_rss_gb"] for p in peaks.values() if "host_rss_gb" in p]
    device = [p["device_gb"] for p in peaks.values() if "device_gb" in p]
    figures = {}
    if host:
        figures["worker_peak_rss_gb"] = max(host)
        figures["workers_peak_rss_gb"] = round(sum(host), 4)
    if device:
        figures["device_peak_gb"] = max(device)
    return figures


def brief(record: dict) -> str:
    """A record's key figures for its one log line (``: key=value, ...``; empty when it has
    none): the statistics named in ``BRIEF_STATS`` of every call (``actor_train/loss``,
    ``compute_adv/task_reward``); the whole record is in ``stats.jsonl``."""
    shown = [
        f"{k}={v:.4g}"
        for k, v in record.items()
        if isinstance(v, float) and "/" in k and k.rsplit("/", 1)[1] in BRIEF_STATS
    ]
    return ": " + ", ".join(shown) if shown else ""
