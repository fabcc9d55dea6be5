"""Starting, watching and stopping model workers: subprocesses (local) or Ray actors (ray).

Both launchers give the master a ``check()`` that raises ``WorkerLostError`` naming a worker that
died, and a ``stop()`` that leaves no worker behind. Local workers run in their own process
group (Ctrl-C reaches only the launcher, which then stops them), die with the launcher
(``PR_SET_PDEATHSIG``), and exit on their own when the master stops answering heartbeats.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
from collections import deque

from realrl.api.core.system_api import ModelWorkerConfig
from realrl.base import config_json, logging, private_files
from realrl.base.processes import die_with_parent
from realrl.system.request_reply_stream import WorkerLostError
from realrl.system.standby import WORKER_ENV, StandbyWorkers

logger = logging.getLogger("launcher")
WORKER_CONFIGS = "worker_configs.json"  # in the run folder: data (realrl.base.config_json), not a pickle


def send_secret(proc: subprocess.Popen, secret: bytes) -> None:
    """Hand a fresh worker the run's secret on its stdin: never in its environment (which
    ``/proc/<pid>/environ`` shows to the user's other processes for the process's whole life)
    nor on its command line. A worker that died first is reported by ``check()``."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(secret.hex().encode() + b"\n")
        proc.stdin.close()
    except OSError as e:
        logger.warning("cannot hand pid %d its secret (%s): it exited", proc.pid, e)


def worker_log_path(log_dir: str, worker_name: str) -> str:
    return os.path.join(log_dir, worker_name.replace("/", "-") + ".log")


def log_tail(path: str, n: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=n))
    except OSError as e:
        return f"(no log at {path}: {e})"


class LocalLauncher:
    """``standby``: warmed-up processes to run workers in before starting fresh ones;
    ``warm_next``: start as many standby processes again once these are taken, for the run that
    follows this one (the phases of a quickstart run)."""

    def __init__(
        self,
        run_dir: str,
        log_dir: str,
        secret: bytes,
        standby: StandbyWorkers | None = None,
        warm_next: bool = False,
    ):
        self.run_dir, self.log_dir, self.secret = run_dir, log_dir, secret
        self.standby, self.warm_next = standby, warm_next
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, str] = {}

    def start(self, configs: list[ModelWorkerConfig]) -> None:
        """One process per worker config: standby processes first, fresh ones for the rest."""
        standby = self.standby
        private_files.make_private_dirs(self.log_dir, self.run_dir)
        path = os.path.join(self.run_dir, WORKER_CONFIGS)
        text = config_json.dumps(configs, plugin_modules=configs[0].import_modules if configs else ())
        private_files.write_private(path, text.encode())
        env = {**os.environ, **WORKER_ENV}
        atexit.register(self.stop)
        for cfg in configs:
            name = cfg.worker_name
            self.logs[name] = worker_log_path(self.log_dir, name)
            proc = (
                None
                if standby is None
                else standby.assign(path, cfg.worker_index, self.secret, self.logs[name])
            )
            if proc is not None:
                self.procs[name] = proc
                logger.info("%s runs in standby process %d, log %s", name, proc.pid, self.logs[name])
                continue
            with open(self.logs[name], "w") as log:
                proc = self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "realrl.apps.remote", path, str(cfg.worker_index)],
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            send_secret(proc, self.secret)
            logger.info("started %s (pid %d), log %s", name, self.procs[name].pid, self.logs[name])
        if standby is not None and self.warm_next:
            standby.spawn(len(configs))

    def check(self) -> None:
        for name, proc in self.procs.items():
            rc = proc.poll()
            if rc is None:
                continue
            how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
            raise WorkerLostError(name, f"its process (pid {proc.pid}) {how} before the run finished")

    def log_tail(self, name: str, n: int = 20) -> str:
        return log_tail(self.logs.get(name, worker_log_path(self.log_dir, name)), n)

    def stop(self, grace: float = 5.0) -> None:
        """Wait ``grace`` s for workers asked to exit, then SIGTERM, then SIGKILL their groups."""
        deadline = time.monotonic() + grace
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            alive = [p for p in self.procs.values() if p.poll() is None]
            if not alive:
                break
            for p in alive:
                if sig is not None:
                    try:
                        os.killpg(p.pid, sig)
                        if sig == signal.SIGTERM:  # a stopped (hung) worker gets it only when continued
                            os.killpg(p.pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
            for p in alive:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            deadline = time.monotonic() + 3.0
        atexit.unregister(self.stop)


class RayWorkerActor:
    """Wrapped with ``ray.remote`` by ``RayLauncher``; ``run`` blocks for the worker's whole life."""

    def run(self, config: ModelWorkerConfig, secret_ref: list, log_path: str) -> int:
        """``secret_ref``: ``[ObjectRef]`` of the run's secret, in a list so that Ray hands the
        reference over, not the bytes: the task's arguments (which Ray's state API and dashboard
        show) then hold an object id, and the secret is read from the cluster's object store."""
        import ray

        secret = ray.get(secret_ref[0])
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        handler = logging.add_file_handler(log_path)
        context = ray.get_runtime_context()
        logging.getLogger("launcher").info(
            "%s runs on Ray node %s (%s)",
            config.worker_name,
            context.get_node_id(),
            ray.util.get_node_ip_address(),
        )
        # the actor's process runs the worker and imports it (torch and all); the launcher's must not
        from realrl.system.model_worker import run_model_worker

        try:
            run_model_worker(config, secret)
        except BaseException:
            logging.getLogger("launcher").exception("%s failed", config.worker_name)
            raise
        finally:
            handler.flush()
        return 0


def ray_token_auth() -> bool | None:
    """Whether the Ray cluster this process joined checks Ray's token on every call (Ray 2.52 or
    newer with ``RAY_AUTH_MODE=token``; new local clusters have it by default from Ray 2.59);
    None where the installed Ray has no token authentication."""
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode
    except ImportError:
        return None
    return get_authentication_mode() == AuthenticationMode.TOKEN


class RayLauncher:
    """Workers as Ray actors on the cluster ``ray.init`` connected this driver to."""

    def __init__(
        self,
        log_dir: str,
        secret: bytes,
        cpus_per_worker: float = 1.0,
        gpus_per_worker: float = 0.0,
        node_groups: list[list[int]] | None = None,
        timeout: float = 120.0,
    ):
        """``node_groups``: workers that must share a node (``layout.node_groups``: a replica's
        tensor-parallel ranks and pipeline stages), each placed by a Ray placement group packed
        on one node; None: every worker wherever Ray puts it. ``timeout``: how long a group may
        wait for a node with room."""
        self.log_dir, self.secret, self.cpus, self.gpus = log_dir, secret, cpus_per_worker, gpus_per_worker
        self.node_groups, self.timeout = node_groups, timeout
        self.actors: dict[str, object] = {}
        self.refs: dict[str, object] = {}
        self.placement_groups: list[object] = []

    def start(self, configs: list[ModelWorkerConfig]) -> None:
        import ray

        if not ray_token_auth():
            logger.warning(
                "this Ray cluster runs without token authentication%s: whoever reaches its ports can run "
                "code in it; start it with RAY_AUTH_MODE=token on a private network (docs/security.md)",
                "" if ray_token_auth() is False else " (the installed Ray has none; Ray 2.52 or newer does)",
            )
        total = ray.cluster_resources().get("CPU", 0.0)
        if self.cpus * len(configs) > total:
            raise RuntimeError(
                f"{len(configs)} model workers x {self.cpus} CPU each do not fit the Ray cluster's {total:g} CPUs: "
                "the actors would wait forever; lower ray_cpus_per_worker or grow the cluster"
            )
        actor_cls = ray.remote(RayWorkerActor)
        os.makedirs(self.log_dir, exist_ok=True)
        secret_ref = [ray.put(self.secret)]  # not an argument anyone can read off the task
        try:
            where = self._place()
        except BaseException:
            self._remove_placement_groups()
            raise
        for cfg in configs:
            name = cfg.worker_name
            open(worker_log_path(self.log_dir, name), "w").close()  # a rerun of the trial starts a fresh log
            options = dict(num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=0)
            if cfg.worker_index in where:
                options["scheduling_strategy"] = where[cfg.worker_index]
            actor = actor_cls.options(**options).remote()
            self.actors[name] = actor
            self.refs[name] = actor.run.remote(cfg, secret_ref, worker_log_path(self.log_dir, name))
            logger.info("started %s as a Ray actor", name)

    def _place(self) -> dict[int, object]:
        """Worker -> the scheduling strategy that puts it in its node group's placement group (one
        bundle per worker, all on one node: ``STRICT_PACK``); {} without node groups or resources
        to pack. Waits until every group is placed, and names the one that cannot be."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {k: v for k, v in (("CPU", self.cpus), ("GPU", self.gpus)) if v > 0}
        if not self.node_groups or not bundle:
            return {}
        out = {}
        for group in self.node_groups:
            pg = placement_group([dict(bundle) for _ in group], strategy="STRICT_PACK")
            self.placement_groups.append(pg)
            try:
                ray.get(pg.ready(), timeout=self.timeout)
            except ray.exceptions.GetTimeoutError:
                raise RuntimeError(
                    f"model workers {group} must share a node (tensor-parallel ranks or pipeline stages of "
                    f"one replica) and need {len(group)} x {bundle} there, but no node of the Ray cluster "
                    f"had room within {self.timeout:g} s: use smaller tensor/pipeline groups or bigger nodes"
                ) from None
            for index, w in enumerate(group):
                out[w] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index)
        return out

    def check(self) -> None:
        import ray

        ready, _ = ray.wait(list(self.refs.values()), num_returns=len(self.refs), timeout=0)
        for name, ref in self.refs.items():
            if ref not in ready:
                continue
            try:
                ray.get(ref)
                reason = "its actor returned before the run finished"
            except ray.exceptions.RayActorError as e:
                reason = f"its actor died: {e}"
            except ray.exceptions.RayTaskError as e:
                reason = f"its actor failed: {e}"
            raise WorkerLostError(name, reason)

    def log_tail(self, name: str, n: int = 20) -> str:
        return log_tail(worker_log_path(self.log_dir, name), n)

    def stop(self, grace: float = 5.0) -> None:
        import ray

        if self.refs:
            ray.wait(list(self.refs.values()), num_returns=len(self.refs), timeout=grace)
        for actor in self.actors.values():
            ray.kill(actor, no_restart=True)
        self.actors.clear()
        self._remove_placement_groups()

    def _remove_placement_groups(self) -> None:
        import ray

        for pg in self.placement_groups:
            ray.util.remove_placement_group(pg)
        self.placement_groups.clear()
