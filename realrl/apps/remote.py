"""Worker entry point of ``mode=local``: ``python -m realrl.apps.remote <worker_configs.pkl> <index>``.

The run's secret comes in the ``REALRL_RUN_SECRET`` environment variable (hex), never on the
command line where ``ps`` would show it. ``kill -USR1 <pid>`` dumps every thread's stack to the
worker's log (what to do when a run seems stuck).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import pickle
import signal
import sys

from realrl.api.core.system_api import ModelWorkerConfig
from realrl.system.launcher import SECRET_ENV, run_model_worker


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("configs", help="pickled list of ModelWorkerConfig written by the launcher")
    parser.add_argument("index", type=int)
    args = parser.parse_args(argv)
    secret_hex = os.environ.pop(SECRET_ENV, None)
    if not secret_hex:
        sys.exit(f"{SECRET_ENV} is not set: workers are started by realrl.apps.main, not by hand")
    faulthandler.register(signal.SIGUSR1)
    with open(args.configs, "rb") as f:
        configs: list[ModelWorkerConfig] = pickle.load(f)
    run_model_worker(configs[args.index], bytes.fromhex(secret_hex))


if __name__ == "__main__":
    main()
