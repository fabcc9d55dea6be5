"""Launch an experiment: ``run_experiment(config, mode="local" | "ray")``.

The master runs in this process (it holds metadata only); model workers run as subprocesses
(``local``) or Ray actors (``ray``, on ``ray.init(address=...)``'s cluster or a local one). Any
failure — an exception in a worker, a worker that dies or stops heartbeating — stops every
worker and raises ``ExperimentFailedError`` naming the worker with its last log lines; Ctrl-C or
SIGTERM (``realrl.apps.signals``) stops every worker and raises ``KeyboardInterrupt``. Options
that cannot run (``realrl.apps.feasibility``: a layout that cannot split its model, a memory plan
that does not fit; more workers than GPUs) raise ``UserError`` before any worker starts.

Every run saves its config as ``<run_dir>/experiment_config.json`` (``realrl.base.config_json``:
data, not a pickle), and ``python -m realrl.apps.main <experiment_config.json> [--mode local|ray]
[--ray-address A]`` runs such a file again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from realrl.api.core import devices
from realrl.api.core.layout import node_groups
from realrl.api.core.system_api import ExperimentConfig, NameResolveConfig
from realrl.apps.errors import EXIT_FAILED, EXIT_USER_ERROR, UserError, data_error_message, one_line
from realrl.apps.feasibility import check_feasible, local_devices, sharded_layouts
from realrl.apps.signals import exit_code, handlers_kept, interrupted_message, stop_on_signals
from realrl.base import config_json, logging, network, plugins, private_files
from realrl.base.name_resolve import NameRecordRepository
from realrl.system import names
from realrl.system.launcher import LocalLauncher, RayLauncher
from realrl.system.master_worker import MasterWorker
from realrl.system.names import make_name_record
from realrl.system.request_reply_stream import (
    Codec,
    MasterStream,
    RequestTimeoutError,
    WorkerError,
    WorkerLostError,
)
from realrl.system.standby import StandbyWorkers

logger = logging.getLogger("main")

MODES = ("local", "ray")
SAVED_CONFIG = "experiment_config.json"  # in the run folder: what `python -m realrl.apps.main` runs again
CANCEL_WAIT_S = 5.0  # after an interruption, how long the master's tasks get to finish cancelling
T = TypeVar("T")


class ExperimentFailedError(RuntimeError):
    """The run stopped early; ``worker`` names the worker at fault when one is known."""

    def __init__(self, message: str, worker: str | None = None):
        super().__init__(message)
        self.worker = worker


def run_experiment(
    config: ExperimentConfig,
    mode: str = "local",
    ray_address: str | None = None,
    ray_cpus_per_worker: float = 1.0,
    on_step: Callable[[dict, int], None] | None = None,
    standby: StandbyWorkers | None = None,
    warm_next: bool = False,
) -> list[dict]:
    """Run ``config`` to the end; return one stats record per step (also in ``stats.jsonl``).

    ``on_step(record, total_steps)`` sees every finished step's record (progress bars, TensorBoard).
    ``standby`` (local mode): warmed-up worker processes to use first (``realrl.system.standby``);
    ``warm_next``: start as many again for a run that follows."""
    if mode not in MODES:
        raise UserError(f"mode must be one of {MODES}, got {mode!r}")
    try:
        check_feasible(config)
    except ValueError as e:  # a layout that cannot split its model, or fit: the options are at fault
        raise UserError(str(e)) from e
    try:  # the run trusts what it reads back from its folder: nobody else may write there
        private_files.make_private_dirs(config.log_dir, config.fileroot)
    except private_files.UnsafePathError as e:
        raise UserError(str(e)) from e
    save_config(config, os.path.join(config.run_dir, SAVED_CONFIG))
    secret = secrets.token_bytes(32)
    if mode == "local":
        nr_cfg = NameResolveConfig("nfs", root=os.path.join(config.run_dir, "name_resolve"))
        host = network.LOOPBACK
        launcher = LocalLauncher(config.run_dir, config.log_dir, secret, standby, warm_next)
    else:
        import ray

        if not ray.is_initialized():
            with handlers_kept():  # Ctrl-C and SIGTERM keep stopping the run our way
                ray.init(address=ray_address) if ray_address else ray.init()
        nr_cfg = NameResolveConfig("ray", namespace=f"realrl/{config.experiment_name}/{config.trial_name}")
        host = ray.util.get_node_ip_address()
    try:
        placed, backend, gpus_per_worker = worker_devices(config, mode)
        devices.check_shared_gpus(placed, backend, sharded_layouts(config))
    except ValueError as e:  # more workers than GPUs without colocate=true, and such
        raise UserError(str(e)) from e
    if mode != "local":
        groups = node_groups(config.mesh_placements().values(), config.n_model_workers)
        launcher = RayLauncher(config.log_dir, secret, ray_cpus_per_worker, gpus_per_worker, groups)
    record = make_name_record(nr_cfg)
    run_root = names.run_root(config.experiment_name, config.trial_name)
    record.clear_subtree(run_root)
    log_handler = logging.add_file_handler(os.path.join(config.log_dir, "master.log"))
    worker_configs = config.model_worker_configs(
        nr_cfg, bind_host=host if mode == "local" else None, devices=placed, dist_backend=backend
    )
    ok = False
    try:
        stats = run_bounded(
            _run_master(config, Codec(secret), record, host, launcher, worker_configs, on_step)
        )
        ok = True
        return stats
    except KeyboardInterrupt:
        logger.error("interrupted: stopping every worker")
        raise
    except Exception as e:
        worker = getattr(e, "worker", None)
        message = f"experiment {run_root} failed: {e}"
        if worker is not None:
            message += f"\n--- last lines of {worker}'s log ---\n{launcher.log_tail(worker)}"
        data_error = data_error_message(e)
        if data_error is None:
            logger.error("%s", message)
        else:  # the user's data: one line; the traceback stays in the worker's log
            logger.error("experiment %s stopped by its data (%s): %s", run_root, worker, data_error)
        raise ExperimentFailedError(message, worker) from e
    finally:
        launcher.stop(grace=config.timeouts.shutdown if ok else 0.0)  # after a failure: stop them now
        record.clear_subtree(run_root)
        logging.getLogger("realrl").removeHandler(log_handler)
        log_handler.close()


def save_config(config: ExperimentConfig, path: str) -> None:
    """``config`` as JSON at ``path``, owner-only; one that holds what JSON cannot (a function, an
    object of a class defined in a function) is the user's mistake, named before any worker starts."""
    try:
        text = config_json.dumps(config, plugin_modules=config.import_modules)
    except config_json.ConfigFormatError as e:
        raise UserError(f"the experiment config cannot be written as JSON: {e}") from e
    private_files.write_private(path, text.encode())


def load_config(path: str) -> ExperimentConfig:
    """The ``ExperimentConfig`` a run saved (or a user wrote) at ``path``; ``UserError`` naming
    the file for one that is not such a config, or that another user may write (it names the
    plugin modules to import)."""
    try:
        config = config_json.loads(private_files.read_private(path), plugins.import_plugins)
    except (OSError, config_json.ConfigFormatError) as e:
        raise UserError(f"{path}: {e}") from e
    if not isinstance(config, ExperimentConfig):
        raise UserError(f"{path}: holds a {type(config).__name__}, not an ExperimentConfig")
    return config


def run_bounded(main: Coroutine[Any, Any, T], cancel_wait_s: float = CANCEL_WAIT_S) -> T:
    """``asyncio.run(main)``, but when it ends early (Ctrl-C, SIGTERM, an error) the tasks left
    get ``cancel_wait_s`` to finish their cancellation, not forever: a task that misses its
    cancellation (it raced with a reply landing at the same moment) would otherwise hang the
    interrupted run, and the workers are stopped by the launcher whatever the tasks do."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # as asyncio.run does
    loop.set_exception_handler(_quiet_on_interrupt)
    done = False
    try:
        result = loop.run_until_complete(main)
        done = True
        return result
    finally:
        # cancel what is left, again for any task a cancelled one started while it unwound (left
        # pending, its coroutine would run its cleanup at exit against the closed loop)
        deadline = time.monotonic() + cancel_wait_s
        while (pending := [t for t in asyncio.all_tasks(loop) if not t.done()]) and (
            left := deadline - time.monotonic()
        ) > 0:
            for t in pending:
                t.cancel()
            loop.run_until_complete(asyncio.wait(pending, timeout=left))
        loop.run_until_complete(loop.shutdown_asyncgens())
        if done:
            loop.run_until_complete(loop.shutdown_default_executor())
        asyncio.set_event_loop(None)
        loop.close()


def _quiet_on_interrupt(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's report of a task left holding the ``KeyboardInterrupt`` of Ctrl-C or SIGTERM, or
    the cancellation that stopping the run gave it (a traceback on stderr), is dropped: the run
    was stopped on purpose. Anything else is reported."""
    if not isinstance(context.get("exception"), KeyboardInterrupt | asyncio.CancelledError):
        loop.default_exception_handler(context)


def worker_devices(config: ExperimentConfig, mode: str) -> tuple[list[str], str, float]:
    """Each worker's device, the process groups' backend and (Ray) the GPUs each actor asks for."""
    n = config.n_model_workers
    if not devices.is_cuda(config.device):
        return [config.device] * n, devices.GLOO, 0.0
    if mode == "local":  # the command line checked the same before the first phase started
        placed = local_devices(config)
        return placed, devices.dist_backend(placed), 0.0
    import ray

    gpus = devices.ray_gpus_per_worker(
        config.device, n, ray.cluster_resources().get("GPU", 0.0), config.colocate
    )
    # Ray shows each actor only its own GPU(s); a fractional share may sit beside another worker
    return ["cuda:0"] * n, devices.GLOO_AND_NCCL if gpus >= 1 else devices.GLOO, gpus


async def _run_master(
    config: ExperimentConfig,
    codec: Codec,
    record: NameRecordRepository,
    host: str,
    launcher: LocalLauncher | RayLauncher,
    worker_configs,
    on_step: Callable[[dict, int], None] | None = None,
) -> list[dict]:
    stream = MasterStream(codec, host)
    record.add(names.master_stream(config.experiment_name, config.trial_name), stream.address, replace=True)
    master = MasterWorker(config, stream, check_workers=launcher.check, on_step=on_step)
    ok = False
    try:
        launcher.start(worker_configs)
        stats = await master.run()
        ok = True
        return stats
    finally:
        if ok:
            await master.shutdown()
        stream.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m realrl.apps.main",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "config", help=f"an ExperimentConfig as JSON (every run saves its own as {SAVED_CONFIG})"
    )
    parser.add_argument("--mode", choices=MODES, default="local")
    parser.add_argument(
        "--ray-address", default=None, help="an existing Ray cluster (default: start a local one)"
    )
    args = parser.parse_args(argv)
    try:
        with stop_on_signals():  # first: Ctrl-C / SIGTERM stop the run even when SIGINT came ignored
            run_experiment(load_config(args.config), args.mode, args.ray_address)
    except KeyboardInterrupt as e:
        print(interrupted_message(e), file=sys.stderr)
        sys.exit(exit_code(e))
    except UserError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    except ExperimentFailedError as e:
        data_error = data_error_message(e)
        print(f"error: {data_error}" if data_error else f"realrl: {e}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR if data_error else EXIT_FAILED)


__all__ = ["ExperimentFailedError", "run_experiment", "RequestTimeoutError", "WorkerError", "WorkerLostError"]

if __name__ == "__main__":
    main()
