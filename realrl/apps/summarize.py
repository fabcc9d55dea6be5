"""A task's held-out evaluation in a process of its own:
``python -m realrl.apps.summarize <request.json> <figures.json>``.

The command line that runs experiments holds configs only and imports no torch (docs/runtime.md);
an embedded task's evaluation loads models and generates, so it runs here, once the run's workers
are gone, and hands its figures back as JSON. The request holds the experiment's name and its
config (``realrl.base.config_json``: data, read back only if it is this user's and private).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from realrl.base import config_json, private_files

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


def summarize_in_child(experiment: str, cfg: Any, run_dir: str, timeout_s: float) -> dict[str, Any]:
    """The figures of the task recipe of ``experiment`` (one with a recipe of ``cfg.task``) for
    ``cfg``, computed in a child process (its output in ``<run_dir>/logs/summary.log``);
    ``RuntimeError`` naming the log when it fails or runs past ``timeout_s``.

    The child imports the plugins ``cfg`` names and, for a user's config class registered some
    other way (a script importing its module), that module too, on this process's import path."""
    module = type(cfg).__module__
    plugins, path = list(cfg.import_modules), [p for p in sys.path if p]
    if module.split(".")[0] != "realrl":
        plugins.append(module)
        path.insert(0, _import_root(module))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    request, figures = os.path.join(run_dir, REQUEST), os.path.join(run_dir, FIGURES)
    log_path = os.path.join(run_dir, "logs", LOG)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    for path in (request, figures):
        if os.path.lexists(path):
            os.unlink(path)
    text = config_json.dumps({"experiment": experiment, "config": cfg}, plugin_modules=plugins)
    private_files.write_private(request, text.encode())
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "realrl.apps.summarize", request, figures],
                stdin=subprocess.DEVNULL,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the evaluation ran past {timeout_s:.0f} s (its log: {log_path})") from None
    if proc.returncode != 0:
        with open(log_path, errors="replace") as f:
            tail = "".join(f.readlines()[-15:])
        raise RuntimeError(f"the evaluation failed with exit code {proc.returncode} ({log_path}):\n{tail}")
    with open(figures) as f:
        out = json.load(f)
    os.unlink(request)
    os.unlink(figures)
    return out


def main(argv: list[str] | None = None) -> None:
    request, figures = sys.argv[1:] if argv is None else argv
    import realrl.impl.builtin  # noqa: F401  (the models, backends and datasets the evaluation builds)
    from realrl.base import plugins
    from realrl.experiments.tasks import get_task

    order = config_json.loads(private_files.read_private(request), plugins.import_plugins)
    cfg = order["config"]
    out = get_task(cfg.task).recipe(order["experiment"]).summarize(cfg)
    private_files.write_private(figures, json.dumps(out).encode())


if __name__ == "__main__":
    main()
