"""When a node is lost, the surviving worker's request often fails first (its peer's connection
broke). The run must still name the lost worker as the cause, not the survivor's transport error."""

from __future__ import annotations

import asyncio
import time

import pytest

from realrl.system.function_call import run_guarded
from realrl.system.request_reply_stream import WorkerError, WorkerLostError

RESET = "Traceback...\nRuntimeError: [gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer.\n"


async def _fails(error: BaseException, after: float = 0.0):
    await asyncio.sleep(after)
    raise error


async def _guard(after: float | None):
    """The master's guard: raises when it finds a worker lost (never, for ``None``)."""
    if after is None:
        await asyncio.sleep(3600)
    await asyncio.sleep(after)
    raise WorkerLostError("model_worker/1", "died (exit code -9), while running gen step 3")


def _run(work_error: BaseException, guard_after: float | None, grace: float):
    async def main():
        work = [asyncio.get_running_loop().create_task(_fails(work_error))]
        guard = asyncio.get_running_loop().create_task(_guard(guard_after))
        await run_guarded(work, guard, grace=grace)

    asyncio.run(main())


def test_a_survivors_transport_error_waits_for_the_lost_peer_to_be_named():
    with pytest.raises(WorkerLostError) as e:
        _run(WorkerError("model_worker/0", "mfc", RESET), guard_after=0.3, grace=5.0)
    message = str(e.value)
    assert message.startswith("model_worker/1 is lost: died (exit code -9), while running gen step 3")
    assert "model_worker/0 then failed: RuntimeError" in message and "Connection reset by peer" in message


def test_other_failures_are_raised_at_once_and_a_peer_error_with_nobody_lost_after_the_grace():
    start = time.monotonic()
    with pytest.raises(WorkerError, match="boom"):
        _run(WorkerError("model_worker/0", "mfc", "ValueError: boom"), guard_after=0.3, grace=5.0)
    assert time.monotonic() - start < 0.25  # no grace for the worker's own fault
    start = time.monotonic()
    with pytest.raises(WorkerError, match="Connection reset by peer"):
        _run(WorkerError("model_worker/0", "mfc", RESET), guard_after=None, grace=0.5)
    assert 0.5 <= time.monotonic() - start < 2.0
