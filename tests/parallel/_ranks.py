"""Run a function on N gloo processes (one per rank, as model workers would be) and collect
what each returns."""

from __future__ import annotations

import datetime
import faulthandler
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from realrl.base.network import find_free_port

# a rank stuck in a collective its peers never join (ranks out of lockstep: gloo does not time out
# on mismatched collectives) prints every thread's stack and exits, before pytest's own timeout
# would stop the parent and leave the ranks running
WATCHDOG_S = 240

# every group of a test: a collective that one rank never joins (ranks out of lockstep) fails
# after this instead of hanging the suite
TIMEOUT = datetime.timedelta(seconds=60)


def _entry(rank: int, fn: Callable, port: int, n: int, out_dir: str, args: tuple) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n, timeout=TIMEOUT
    )
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    try:
        torch.save(fn(rank, *args), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        faulthandler.cancel_dump_traceback_later()
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], out_dir, *args: Any, n: int = 2) -> list[Any]:
    """``fn(rank, *args)`` on ``n`` processes in one process group; their results by rank.
    ``fn`` must be a module-level function (the processes import it)."""
    mp.spawn(_entry, args=(fn, find_free_port(), n, str(out_dir), args), nprocs=n, join=True)
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(n)]
