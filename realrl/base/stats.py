"""What a run records about itself: per-step stats, learning curves and a summary.

``StatsWriter`` mirrors the per-step records (which the master appends to ``stats.jsonl``) to
TensorBoard and, when asked and installed, to wandb.
``plot_curves`` turns the JSON lines into PNGs; ``write_summary`` prints a table and writes
``summary.json`` atomically.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping

from realrl.base import logging

logger = logging.getLogger("stats")


def _finite_numbers(stats: Mapping[str, object]) -> dict[str, float]:
    out = {}
    for k, v in stats.items():
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[k] = float(v)
    return out


def atomic_write_json(path: str, obj: object) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


class StatsWriter:
    """Mirrors per-step stats to TensorBoard (``run_dir/tensorboard``, when the ``tensorboard``
    package is installed) and to wandb (when asked for and installed). The master worker itself
    appends every record to ``stats.jsonl``."""

    def __init__(self, run_dir: str, use_tensorboard: bool = True, wandb_project: str | None = None):
        os.makedirs(run_dir, exist_ok=True)
        self._tb = None
        self._wandb = None
        if use_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))
            except ImportError:
                logger.info("tensorboard is not installed; stats go to stats.jsonl only")
        if wandb_project:
            try:
                import wandb
            except ImportError:
                logger.warning(
                    "wandb_project=%s given but wandb is not installed; skipping wandb", wandb_project
                )
            else:
                self._wandb = wandb.init(project=wandb_project, dir=run_dir, name=os.path.basename(run_dir))

    def write(self, step: int, stats: Mapping[str, object]) -> None:
        numbers = _finite_numbers({k: v for k, v in stats.items() if "/" in k})
        if self._tb is not None:
            for k, v in numbers.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_stats(path: str) -> list[dict[str, float]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_curves(stats_path: str, out_dir: str, groups: Mapping[str, Iterable[str]]) -> list[str]:
    """One PNG per group (e.g. ``{"reward": ["actor_train/reward"]}``) of the keys that exist."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = read_stats(stats_path)
    written = []
    os.makedirs(out_dir, exist_ok=True)
    for group, keys in groups.items():
        present = [k for k in keys if any(k in r for r in rows)]
        if not present:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for k in present:
            xs = [r["step"] for r in rows if k in r]
            ax.plot(xs, [r[k] for r in rows if k in r], label=k, marker="." if len(xs) < 30 else None)
        ax.set_xlabel("step")
        ax.set_title(group)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{group}.png")
        fig.savefig(path + ".tmp.png", dpi=110)
        plt.close(fig)
        os.replace(path + ".tmp.png", path)
        written.append(path)
    return written


def format_table(summary: Mapping[str, object]) -> str:
    width = max((len(k) for k in summary), default=0)
    lines = []
    for k, v in summary.items():
        text = f"{v:.4g}" if isinstance(v, float) else str(v)
        lines.append(f"{k.ljust(width)}  {text}")
    return "\n".join(lines)


def write_summary(run_dir: str, summary: Mapping[str, object], print_fn=print) -> str:
    """Print ``summary`` as a table and write it to ``run_dir/summary.json``."""
    path = os.path.join(run_dir, "summary.json")
    atomic_write_json(path, dict(summary))
    print_fn(format_table(summary))
    return path
