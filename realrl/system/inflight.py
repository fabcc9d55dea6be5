"""Asynchronous RL's answers in flight at a recover point: kept by the point, read back on resume.

The generate calls of steps k .. k + max_staleness - 1 sample from weights older than those of
the recover point of step k, which a resumed run could not draw again. The point keeps their
answers (each data-parallel part's tensors, written by the part's first worker) and what each
call reported; a resumed run reads them back instead of generating, and trains on exactly the
samples the uninterrupted run did. The master's half: which calls, which files, which workers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Hashable

from realrl.api.core.dfg import MFCDef
from realrl.api.core.system_api import ExperimentConfig
from realrl.impl.model.backend.integrity import write_json_atomic
from realrl.system import checkpointing
from realrl.system.buffer import SampleBuffer
from realrl.system.function_call import CallResult, PostedCall, ReallocResult, post_all
from realrl.system.protocol import SamplesRequest
from realrl.system.request_reply_stream import MasterStream


@dataclasses.dataclass
class Generated:
    """One generate call as a recover point needs it."""

    replicas: list[list[int]]  # the workers of each data-parallel part
    part_ids: list[list[Hashable]]
    result: CallResult
    version: int | None  # the model version it sampled from


class InflightAnswers:
    def __init__(self, config: ExperimentConfig, stream: MasterStream, buffer: SampleBuffer):
        self.config, self.stream, self.buffer = config, stream, buffer
        self.generated: dict[tuple[str, int], Generated] = {}  # (mfc, step) -> the call
        self.kept: dict[tuple[str, int], dict] = {}  # resuming: the calls the point kept
        self.resumed_step = 0  # the recover point they come from

    def resume_from(self, step: int) -> None:
        """The calls the recover point of ``step`` kept are read back instead of run."""
        self.kept = checkpointing.read_inflight(self.config.run_dir, step)
        self.resumed_step = step

    def is_kept(self, mfc: MFCDef, step: int) -> bool:
        return (mfc.name, step) in self.kept

    def remember(
        self, mfc: MFCDef, step: int, posted: PostedCall, result: CallResult, version, done: int
    ) -> None:
        """Keep a generate call until its step is trained on (``done``: steps finished)."""
        self.generated[(mfc.name, step)] = Generated(
            posted.replicas, [list(p.ids) for p in posted.parts], result, version
        )
        for key in [k for k in self.generated if k[1] < done]:
            del self.generated[key]  # trained on, and older than any recover point still to come

    async def save(self, mfc: MFCDef, call_step: int, steps_done: int) -> None:
        """The answers and report of ``mfc``'s call at ``call_step`` into the point of ``steps_done``."""
        cfg, call = self.config, self.generated[(mfc.name, call_step)]
        result = call.result
        record = {
            "mfc": mfc.name,
            "step": call_step,
            "version": call.version,
            "parts": [],
            "stats": result.stats,
            "rank_stats": result.rank_stats,
            "samples": result.samples,
            "n_tokens": result.n_tokens,
            "seconds": result.seconds,
            "realloc": None if result.realloc is None else dataclasses.asdict(result.realloc),
        }
        requests = {}
        for r, (workers, ids) in enumerate(zip(call.replicas, call.part_ids)):
            path = checkpointing.inflight_part(cfg.run_dir, steps_done, mfc.name, call_step, r)
            meta = self.buffer.gather_meta(ids, mfc.output_keys)
            requests[workers[0]] = SamplesRequest(path, meta, steps_done)
            record["parts"].append(
                {"workers": list(workers), "ids": list(ids), "file": os.path.basename(path)}
            )
        await post_all(self.stream, requests, "samples", cfg.timeouts.request)
        write_json_atomic(checkpointing.inflight_record(cfg.run_dir, steps_done, mfc.name, call_step), record)

    async def restore(self, mfc: MFCDef, step: int, ids: list) -> tuple[CallResult, int | None]:
        """Every worker of each part reads the kept answers back into its store and the buffer
        learns where they are; the call's saved report and the version it sampled from."""
        cfg, start = self.config, self.resumed_step
        record = self.kept.pop((mfc.name, step))
        saved = [sid for part in record["parts"] for sid in part["ids"]]
        if list(ids) != saved:
            raise checkpointing.RecoverPointError(
                f"the answers kept for {mfc.name!r} at step {step} are for samples {saved[:4]}..., but "
                f"this run's batch holds {list(ids)[:4]}... (was the dataset changed?)",
                start,
            )
        folder = checkpointing.inflight_dir(cfg.run_dir, start)
        requests = {
            w: SamplesRequest(os.path.join(folder, part["file"]), None, start)
            for part in record["parts"]
            for w in part["workers"]
        }
        replies = await post_all(self.stream, requests, "samples", cfg.timeouts.request)
        for part in record["parts"]:
            head, *others = part["workers"]
            self.buffer.update(replies[head], owner=head)
            for w in others:
                self.buffer.add_owner(part["ids"], mfc.output_keys, w)
        result = CallResult(
            ids=list(ids),
            stats=dict(record["stats"]),
            seconds=float(record["seconds"]),
            n_tokens=int(record["n_tokens"]),
            samples=record["samples"],
            rank_stats=record["rank_stats"],
            realloc=None if record["realloc"] is None else ReallocResult(**record["realloc"]),
        )
        replicas = [part["workers"] for part in record["parts"]]
        part_ids = [part["ids"] for part in record["parts"]]
        self.generated[(mfc.name, step)] = Generated(replicas, part_ids, result, record["version"])
        return result, record["version"]
