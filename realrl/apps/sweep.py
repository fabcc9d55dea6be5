"""``--multirun``: hydra's basic sweeper over the command line's overrides.

``seed=1,2 'ppo.kl_ctl=0.05,0.1'`` is expanded by hydra's own parser and ``BasicSweeper`` into
every combination (the first key varies slowest); each combination is one run, one after
another, through the ordinary run path. A run's trial folder is named after its swept overrides
(``seed=1,ppo.kl_ctl=0.05``) unless the file or the command line gives ``trial_name`` (then
it should interpolate a swept key, ``trial_name='kl${ppo.kl_ctl}'``, or the runs would share it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from realrl.apps.errors import UserError
from realrl.apps.overrides import parse_override, parse_overrides


@dataclasses.dataclass(frozen=True)
class Combination:
    """One run of a sweep: its overrides, and the trial name its swept values give it."""

    overrides: list[str]
    label: str | None


def expand(overrides: list[str]) -> list[Combination]:
    """Every combination of the sweeps among ``overrides`` (hydra's basic sweeper)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    parsed = parse_overrides(overrides, multirun=True)
    swept = set()
    for o in parsed:
        if o.is_sweep_override():
            if not o.is_discrete_sweep():
                raise UserError(f"{o.input_line}: only a list of values (a,b or choice(a,b) or range) sweeps")
            swept.add(o.get_key_element())
    out = []
    for combination in BasicSweeper.split_arguments(parsed, None)[0]:
        keys = [parse_override(c) for c in combination]
        label = ",".join(c for c, o in zip(combination, keys) if o.get_key_element() in swept)
        out.append(Combination(combination, label.replace("/", "_") or None))
    return out


def check_distinct(run_dirs: list[str], labels: list[str | None]) -> None:
    """Two runs of a sweep never write to the same folder."""
    seen: dict[str, str | None] = {}
    for run_dir, label in zip(run_dirs, labels):
        if run_dir in seen:
            raise UserError(
                f"the runs {seen[run_dir]} and {label} of the sweep both write to {run_dir}: give each "
                "run its own trial_name (leave it out, or interpolate a swept key: trial_name='kl${ppo.kl_ctl}')"
            )
        seen[run_dir] = label


def summary_table(runs: list[tuple[str, Mapping[str, Any]]]) -> str:
    """One row per run (its trial name): the figures of its summary, one column each."""
    columns: list[str] = []
    for _, summary in runs:
        columns += [k for k, v in summary.items() if _is_figure(v) and k not in columns]
    lines = ["| trial | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for trial, summary in runs:
        cells = [_cell(summary.get(k, "")) for k in columns]
        lines.append(f"| {trial} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _is_figure(value: Any) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
