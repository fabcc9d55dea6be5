"""A step's record as the master writes it to stats.jsonl: what each finished call adds."""

from __future__ import annotations

from realrl.api.core.dfg import MFCDef
from realrl.api.core.model_api import SAMPLES_KEY
from realrl.system.function_call import CallResult


def record_call(record: dict, mfc: MFCDef, result: CallResult) -> None:
    """A finished call in its step's record: ``<mfc>/<stat>``, its time, its samples, its move."""
    record.update({f"{mfc.name}/{k}": v for k, v in sorted(result.stats.items())})
    record["timing"][mfc.name] = round(result.seconds, 4)
    if result.samples:
        record.setdefault(SAMPLES_KEY, []).extend(result.samples)
    record_realloc(record, mfc.role, result)


def record_realloc(record: dict, role: str, result: CallResult) -> None:
    """A step's reallocations of ``role`` under ``realloc/<role>/...``: bytes received (all
    workers), seconds moving and seconds waiting for busy workers to arrive (the slowest worker,
    summed over the step's moves), count and moves."""
    moved = result.realloc
    if moved is None:
        return
    prefix = f"realloc/{role}"
    record[f"{prefix}/bytes"] = record.get(f"{prefix}/bytes", 0.0) + float(moved.bytes)
    record[f"{prefix}/seconds"] = round(record.get(f"{prefix}/seconds", 0.0) + moved.seconds, 4)
    waited = record.get(f"{prefix}/wait_seconds", 0.0) + moved.wait_seconds
    record[f"{prefix}/wait_seconds"] = round(waited, 4)
    record[f"{prefix}/count"] = record.get(f"{prefix}/count", 0.0) + 1.0
    moves = record.get(f"{prefix}/moves")
    record[f"{prefix}/moves"] = moved.move if moves is None else f"{moves}; {moved.move}"
    record["timing"][prefix] = record[f"{prefix}/seconds"]


def record_staleness(record: dict, step: int, versions: list[int]) -> None:
    """Asynchronous RL: how many versions behind the training step's policy (version ``step``)
    the samples it trains on were drawn: ``async/staleness_max`` and ``async/staleness_mean``."""
    if versions:
        lags = [step - v for v in versions]
        record["async/staleness_max"] = float(max(lags))
        record["async/staleness_mean"] = float(sum(lags) / len(lags))


def record_idle(record: dict, mfc: MFCDef, last_reply: float | None, now: float) -> None:
    """Asynchronous RL: seconds between ``mfc``'s previous reply and this call's posting, the
    time its workers waited for it (when they run nothing else in between):
    ``async/idle_s/<mfc>``; None: posted behind the previous call, which it waited 0 s for."""
    record[f"async/idle_s/{mfc.name}"] = 0.0 if last_reply is None else max(0.0, now - last_reply)


def brief(record: dict) -> str:
    """The float statistics of a record, for one log line."""
    return ", ".join(f"{k}={v:.4g}" for k, v in record.items() if isinstance(v, float) and "/" in k)
