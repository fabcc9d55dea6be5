"""A task's held-out evaluation in a process of its own: ``python -m realrl.apps.summarize``.

The command line that runs experiments holds configs only and imports no torch (docs/runtime.md);
an embedded task's evaluation loads models and generates, so it runs in a child. The child is
started when the run's last phase starts: it imports torch and realrl's implementations on the
core the phase's single-threaded worker leaves free, then waits on stdin for its request (the
experiment's name and config, as ``realrl.base.config_json``: data, read back only if it is this
user's and private), evaluates once the workers are gone, and writes its figures as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from realrl.base import config_json, private_files
from realrl.base.processes import die_with_parent

REQUEST = "summary_request.json"
FIGURES = "summary_figures.json"
LOG = "summary.log"


def can_hand_over(cfg: Any) -> bool:
    """Whether a child process can rebuild ``cfg``: its class is realrl's or in a module it can
    import (not a script's ``__main__``)."""
    return type(cfg).__module__ != "__main__"


def _import_root(module: str) -> str:
    """The folder from which ``module`` (loaded in this process) imports under its name."""
    file = os.path.abspath(sys.modules[module].__file__)
    depth = module.count(".") + 1 + (os.path.basename(file) == "__init__.py")
    for _ in range(depth):
        file = os.path.dirname(file)
    return file


class EvaluationProcess:
    """The child that evaluates ``cfg``'s run (``evaluate``), started at once so that its imports
    overlap the run; ``close`` stops it if it was never used. Its output goes to
    ``<run_dir>/logs/summary.log``.

    It imports the plugins ``cfg`` names and, for a user's config class registered some other way
    (a script importing its module), that module too, on this process's import path."""

    def __init__(self, cfg: Any, run_dir: str):
        self.cfg, self.run_dir = cfg, run_dir
        module = type(cfg).__module__
        self.plugins, path = list(cfg.import_modules), [p for p in sys.path if p]
        if module.split(".")[0] != "realrl":
            self.plugins.append(module)
            path.insert(0, _import_root(module))
        self.request_path, self.figures_path = os.path.join(run_dir, REQUEST), os.path.join(run_dir, FIGURES)
        self.log_path = os.path.join(run_dir, "logs", LOG)
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "realrl.apps.summarize"],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
                preexec_fn=die_with_parent,
            )

    def request(self, experiment: str) -> None:
        """Start evaluating with the task recipe of ``experiment`` (one with a recipe of
        ``cfg.task``); ``figures`` waits for the result."""
        request, figures = self.request_path, self.figures_path
        for path in (request, figures):
            if os.path.lexists(path):
                os.unlink(path)
        text = config_json.dumps({"experiment": experiment, "config": self.cfg}, plugin_modules=self.plugins)
        private_files.write_private(request, text.encode())
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps({"request": request, "figures": figures}) + "\n").encode())
            self.proc.stdin.close()
        except OSError:
            pass  # it died while importing: its exit code and log say why (``figures``)

    def figures(self, timeout_s: float) -> dict[str, Any]:
        """What the requested evaluation measured; ``RuntimeError`` naming the log when the child
        failed or runs past ``timeout_s``."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.close()
            raise RuntimeError(
                f"the evaluation ran past {timeout_s:.0f} s (its log: {self.log_path})"
            ) from None
        if code != 0:
            with open(self.log_path, errors="replace") as f:
                tail = "".join(f.readlines()[-15:])
            raise RuntimeError(f"the evaluation failed with exit code {code} ({self.log_path}):\n{tail}")
        with open(self.figures_path) as f:
            out = json.load(f)
        os.unlink(self.request_path)
        os.unlink(self.figures_path)
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def main() -> None:
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        from realrl.apps.help_text import command_help

        print(
            command_help(
                "usage: python -m realrl.apps.summarize < request (the quickstart command starts it)", __doc__
            )
        )
        return
    import realrl.experiments.toy_eval  # noqa: F401  (torch, the implementations: what evaluating loads)
    from realrl.base import plugins
    from realrl.experiments.tasks import get_task

    line = sys.stdin.readline()
    if not line:  # the run failed or was stopped: nothing to evaluate
        return
    paths = json.loads(line)
    order = config_json.loads(private_files.read_private(paths["request"]), plugins.import_plugins)
    cfg = order["config"]
    out = get_task(cfg.task).recipe(order["experiment"]).summarize(cfg)
    private_files.write_private(paths["figures"], json.dumps(out).encode())


if __name__ == "__main__":
    main()
