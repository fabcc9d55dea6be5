"""A worker's life: find the master, say hello, serve its requests in order, exit when told.

A failing request is answered with the formatted traceback (the master raises it, naming the
worker); the worker keeps serving. A worker whose master stops answering heartbeats exits on its
own, so no worker outlives its run even if the launcher was killed without cleaning up.
A request id is served once: a repeated one (a replay the stream missed) is dropped and counted.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from realrl.api.core.system_api import Timeouts
from realrl.base import logging
from realrl.base.name_resolve import NameRecordRepository
from realrl.system import names
from realrl.system.signed_messages import Codec, Message, format_exception
from realrl.system.worker_stream import WorkerStream

logger = logging.getLogger("worker")


class MasterLostError(RuntimeError):
    pass


class SeenIds:
    """The last ``capacity`` request ids served (the master never repeats one; a bounded window
    keeps a long run's memory flat)."""

    def __init__(self, capacity: int = 1 << 16):
        self.capacity = capacity
        self.ids: OrderedDict[str, None] = OrderedDict()

    def first_time(self, request_id: str) -> bool:
        if request_id in self.ids:
            return False
        self.ids[request_id] = None
        if len(self.ids) > self.capacity:
            self.ids.popitem(last=False)
        return True


class WorkerBase:
    """Subclasses fill ``handlers``: request name -> ``fn(data) -> reply data``."""

    def __init__(
        self,
        name: str,
        codec: Codec,
        name_record: NameRecordRepository,
        experiment_name: str,
        trial_name: str,
        timeouts: Timeouts,
        exit_on_master_lost: bool = True,
    ):
        self.name = name
        self.codec = codec
        self.name_record = name_record
        self.experiment_name = experiment_name
        self.trial_name = trial_name
        self.timeouts = timeouts
        self.exit_on_master_lost = exit_on_master_lost
        self.handlers: dict[str, Callable[[Any], Any]] = {}
        self.stream: WorkerStream | None = None
        self.seen = SeenIds()
        self.n_repeated = 0

    def describe_state(self) -> str:
        """What this worker still holds, for its last log line."""
        return "nothing held"

    def _on_master_lost(self, silent_for: float) -> None:
        logger.error("%s: the master has not answered for %.1f s; exiting", self.name, silent_for)
        if self.exit_on_master_lost:
            os._exit(3)  # the main thread may be stuck in a computation or a collective

    def run(self) -> None:
        key = names.master_stream(self.experiment_name, self.trial_name)
        address = self.name_record.wait(key, timeout=self.timeouts.connect)
        self.name_record.add(
            names.worker_pid(self.experiment_name, self.trial_name, self.name), str(os.getpid()), replace=True
        )
        self.stream = WorkerStream(self.codec, self.name, address)
        try:
            self.stream.say_hello()
            self.stream.start_heartbeat(
                self.timeouts.heartbeat_interval, self.timeouts.heartbeat, self._on_master_lost
            )
            logger.info("%s connected to the master at %s (pid %d)", self.name, address, os.getpid())
            self._serve()
        finally:
            self.stream.close()

    def _serve(self) -> None:
        assert self.stream is not None
        while True:
            msg = self.stream.recv(timeout=1.0)
            if msg is None:
                if not self.stream.master_alive:
                    raise MasterLostError(f"{self.name}: the master stopped answering heartbeats")
                continue
            if msg.kind != "request":
                continue
            if not self.seen.first_time(msg.request_id):
                self.n_repeated += 1
                logger.warning(
                    "%s: request %s (%r) came again; ignored", self.name, msg.request_id, msg.handler
                )
                continue
            if msg.handler == "exit":
                self.before_exit()
                self.stream.reply(msg)
                logger.info("%s exits as asked (%s)", self.name, self.describe_state())
                return
            self._handle(msg)

    def before_exit(self) -> None:
        """What must finish before the worker answers the master's exit request."""

    def _handle(self, msg: Message) -> None:
        assert self.stream is not None
        handler = self.handlers.get(msg.handler)
        tik = time.monotonic()
        try:
            if handler is None:
                raise KeyError(f"{self.name} has no handler {msg.handler!r}; known: {sorted(self.handlers)}")
            result = handler(msg.data)
        except Exception as e:  # noqa: BLE001 - every failure goes back to the master
            logger.error("%s: request %r failed:\n%s", self.name, msg.handler, format_exception(e))
            self.stream.reply(msg, error=format_exception(e))
            return
        logger.debug("%s: %s took %.3f s", self.name, msg.handler, time.monotonic() - tik)
        self.stream.reply(msg, result)
