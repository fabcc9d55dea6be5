"""Worker entry point of ``mode=local``: ``python -m realrl.apps.remote <worker_configs.json> <index>``.

The run's secret comes as one hex line on stdin, never on the command line (``ps`` shows it) nor
in the environment (``/proc/<pid>/environ`` shows it to the user's other processes). The configs
file is data (``realrl.base.config_json``), but it names the plugin modules to import: it must
be this user's and writable by nobody else. ``kill -USR1 <pid>`` dumps
every thread's stack to the worker's log (what to do when a run seems stuck).

``python -m realrl.apps.remote --standby`` is a standby process (``realrl.system.standby``): it
imports what every worker needs, then reads its configs path, index, secret and log file from
stdin, and exits quietly if stdin ends first.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys

from realrl.base import config_json, private_files
from realrl.system.standby import STANDBY_FLAG, read_assignment


def warm_up() -> None:
    """Import what a worker imports before its first step: torch, realrl's implementations and
    worker, what torch's first optimizer imports (torch._dynamo, ~1 s), and transformers'
    tokenizer machinery (a worker reads and writes model configs without transformers:
    ``realrl.api.from_hf._common.HFConfig``)."""
    import torch

    import realrl.impl.builtin  # noqa: F401
    import realrl.system.model_worker  # noqa: F401

    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])

    try:
        import transformers

        transformers.AutoTokenizer  # noqa: B018
    except Exception:  # noqa: BLE001 - only a warm-up: the worker imports what it needs itself
        pass


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    secret_hex = None
    if argv == [STANDBY_FLAG]:
        warm_up()
        order = read_assignment()
        if order is None:  # dismissed before any run needed it
            return
        argv = [order["configs"], str(order["index"])]
        secret_hex = order["secret"]
    parser = argparse.ArgumentParser(prog="python -m realrl.apps.remote", description=__doc__)
    parser.add_argument("configs", help="the ModelWorkerConfig list the launcher wrote (JSON)")
    parser.add_argument("index", type=int)
    args = parser.parse_args(argv)
    if secret_hex is None:
        secret_hex = sys.stdin.readline().strip()
    if not secret_hex:
        sys.exit("no secret on stdin: workers are started by realrl.apps.main, not by hand")
    faulthandler.register(signal.SIGUSR1)
    from realrl.system.model_worker import import_plugins, run_model_worker

    configs = config_json.loads(private_files.read_private(args.configs), import_plugins)
    run_model_worker(configs[args.index], bytes.fromhex(secret_hex))
    # The run is over and everything this worker writes is on disk, its sockets closed. Leave
    # now: the interpreter's teardown (torch's and the dataset's objects freed one by one) takes
    # 0.5-1 s that the launcher would wait for before the next phase can start.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
