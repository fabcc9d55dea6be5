"""What a run records about itself: per-step stats, learning curves and a summary.

``StatsWriter`` mirrors the per-step records (which the master appends to ``stats.jsonl``) to
TensorBoard and, when asked and installed, to wandb.
``plot_curves`` turns the JSON lines into PNGs; ``write_summary`` prints a table and writes
``summary.json`` atomically.
"""

from __future__ import annotations

import fnmatch
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


def _cell(value: object) -> str:
    """A markdown table cell."""
    return _plain(value).replace("|", "\\|")


class StatsWriter:
    """Mirrors per-step stats to TensorBoard (``run_dir/tensorboard``, when the ``tensorboard``
    package is installed) and to wandb (when asked for and installed). The master worker itself
    appends every record to ``stats.jsonl``."""

    def __init__(self, run_dir: str, use_tensorboard: bool = True, wandb_project: str | None = None):
        os.makedirs(run_dir, exist_ok=True)
        self._tb = None
        self._wandb = None
        if use_tensorboard:
            try:  # imported here: tensorboard is optional, and a run without it must not pay for it
                from realrl.base.tensorboard_events import EventWriter

                self._tb = EventWriter(os.path.join(run_dir, "tensorboard"))
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

    def write_samples(self, step: int, samples: list[dict]) -> None:
        """A few prompts, completions and rewards of a step, as TensorBoard text (a markdown table)."""
        if self._tb is None or not samples:
            return
        keys = list(samples[0])
        rows = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        for s in samples:
            rows.append("| " + " | ".join(_cell(s.get(k)) for k in keys) + " |")
        self._tb.add_text("samples", "\n".join(rows), step)
        self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_stats(path: str) -> list[dict[str, float]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def curve_keys(rows: Iterable[Mapping[str, object]], keys: Iterable[str]) -> list[str]:
    """The numeric keys of ``rows`` that ``keys`` name, in their order: a key with ``*``, ``?`` or
    ``[`` is a pattern (``"*/eval_loss"``: every model's evaluation loss, whatever its MFC's name)."""
    present = sorted(
        {k for r in rows for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    )
    out: list[str] = []
    for key in keys:
        found = fnmatch.filter(present, key) if any(c in key for c in "*?[") else [key] * (key in present)
        out += [k for k in found if k not in out]
    return out


def plot_curves(stats_path: str, out_dir: str, groups: Mapping[str, Iterable[str]]) -> list[str]:
    """One PNG per group (e.g. ``{"reward": ["actor_train/reward"]}``) of the keys that exist
    (``curve_keys``), with one panel per MFC (the part of a key before ``/``): an actor's and a
    critic's losses differ by orders of magnitude, a model's training and evaluation loss do not.
    Series with few points (evaluations, short runs) are drawn with markers."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = read_stats(stats_path)
    written = []
    os.makedirs(out_dir, exist_ok=True)
    for group, keys in groups.items():
        panels: dict[str, list[str]] = {}
        for k in curve_keys(rows, keys):
            panels.setdefault(k.split("/")[0], []).append(k)
        if not panels:
            continue
        width = 6 if len(panels) == 1 else 4.5 * len(panels)
        fig, axes = plt.subplots(1, len(panels), figsize=(width, 3.5), squeeze=False)
        for ax, (mfc, present) in zip(axes[0], panels.items()):
            for k in present:
                xs = [r["step"] for r in rows if k in r]
                ax.plot(
                    xs, [r[k] for r in rows if k in r], label=k, marker="o" if len(xs) < 30 else None, ms=4
                )
            ax.set_xlabel("step")
            ax.set_title(group if len(panels) == 1 else f"{group}: {mfc}")
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
    """One line per figure; a list of examples (dicts: prompt, completion, reward) one line each."""
    width = max((len(k) for k in summary), default=0)
    lines = []
    for k, v in summary.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            lines.append(k)
            lines += [f"  {_example(x)}" for x in v]
            continue
        if isinstance(v, Mapping):  # e.g. phase_seconds: "sft 11.2, rw 13.0, ..."
            text = ", ".join(f"{name} {_plain(x)}" for name, x in v.items())
        else:
            text = f"{v:.4g}" if isinstance(v, float) else str(v)
        lines.append(f"{k.ljust(width)}  {text}")
    return "\n".join(lines)


def _example(example: Mapping[str, object]) -> str:
    """``prompt => completion  [reward 1.0, ...]`` on one line."""
    prompt, completion = example.get("prompt", ""), example.get("completion", "")
    rest = ", ".join(f"{k} {_plain(v)}" for k, v in example.items() if k not in ("prompt", "completion"))
    return f"{_plain(prompt)!r} => {_plain(completion)!r}" + (f"  [{rest}]" if rest else "")


def _plain(value: object) -> str:
    return (f"{value:.4g}" if isinstance(value, float) else str(value)).replace("\n", " ")


def write_summary(run_dir: str, summary: Mapping[str, object], print_fn=print) -> str:
    """Print ``summary`` as a table and write it to ``run_dir/summary.json``."""
    path = os.path.join(run_dir, "summary.json")
    atomic_write_json(path, dict(summary))
    print_fn(format_table(summary))
    return path
