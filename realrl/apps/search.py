"""``python -m realrl.apps.search <experiment> key=value ... search.n_nodes=N search.n_gpus_per_node=G``.

Finds the execution plan (a placement for every model function call) with the shortest step.
It profiles each call in each layout it may get (short runs, cached:
``realrl.apps.plan_search.profiles``), replays the graph under every plan with the master's rules
(``realrl.apps.plan_search.simulator``), and prints the plans best first. Each plan is an
``allocation_mode`` to paste, with its predicted step time, per-call and reallocation seconds and
peak memory per device; the plans rejected follow, each with why. On a CPU machine
``search.n_gpus_per_node`` counts model workers (default: its cores). ``allocation_mode=search`` on
any experiment does the same and then runs the best plan. Exit status 2 with one ``error:`` line
for a wrong option or when no plan is feasible.

This module reads the options and prints the result; the search itself is the package
``realrl.apps.plan_search`` (``choose.search_plan``).
"""

from __future__ import annotations

import dataclasses
import sys

from realrl.api.quickstart.base import PlanSearchOptions
from realrl.apps.errors import EXIT_USER_ERROR, UserError, one_line
from realrl.apps.plan_search.choose import distinct, n_workers, search_plan
from realrl.apps.plan_search.search import Candidate, NoFeasiblePlan, SearchResult

GiB = 1024**3
# the short names this command reads as search.<name> (n_nodes=2 is search.n_nodes=2)
SEARCH_KEYS = tuple(f.name for f in dataclasses.fields(PlanSearchOptions))
USAGE = "usage: python -m realrl.apps.search <experiment> [search.<option>=value ...] [key=value ...]"


def format_result(
    name: str,
    workers: int,
    result: SearchResult,
    top: int,
    measured: dict[str, float] | None = None,
    skipped: str | None = None,
) -> str:
    """The plans best predicted first (``measured``: the s/step of those run briefly;
    ``skipped``: the line saying what the time limit left undone, printed last)."""
    measured = measured or {}
    how = "every plan" if result.exhaustive else "a Metropolis search"
    how += ", stopped at the time limit" if result.stopped else ""
    lines = [
        f"{name} on {workers} workers: {result.evaluated} plans tried ({how}, {result.seconds:.1f} s), "
        f"{len(result.ranked)} feasible, best first",
        "| rank | step s | measured s | reallocation s/step | peak GiB/device | calls s | allocation_mode |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, (first, *alike) in enumerate(distinct(result.ranked)[:top], 1):
        rank = f"{i} (+{len(alike)} alike)" if alike else str(i)
        lines.append(_row(rank, first, measured.get(first.allocation_mode)))
    if measured:
        fastest = min(measured, key=measured.__getitem__)
        lines.append(
            f"chosen: {_quoted(fastest)} (the fastest of the {len(measured)} best predicted, run briefly)"
        )
    if result.compared:
        lines.append("compared (rank: where it falls among the plans searched):")
        for mode, c in result.compared.items():
            if isinstance(c, str):
                lines.append(f"  {mode}: {c}")
                continue
            rank = 1 + sum(r.simulation.step_seconds < c.simulation.step_seconds for r in result.ranked)
            lines.append(_row(f"~{rank}", c, None))
    if result.rejected:
        lines.append(f"rejected: {len(result.rejected)} plans")
        for mode, why in result.rejected[:top]:
            lines.append(f"  {mode}: {why}")
    if skipped:
        lines.append(skipped)
    return "\n".join(lines)


def _row(rank: str, c: Candidate, measured: float | None) -> str:
    sim = c.simulation
    calls = ", ".join(f"{k} {v:.3f}" for k, v in sim.call_seconds.items())
    peak = "-" if c.peak_bytes is None else f"{c.peak_bytes / GiB:.2f}"
    seen = "-" if measured is None else f"{measured:.3f}"
    return (
        f"| {rank} | {sim.step_seconds:.3f} | {seen} | {sim.realloc_seconds:.3f} | {peak} | {calls} "
        f"| '{_quoted(c.allocation_mode)}' |"
    )


def _quoted(mode: str) -> str:
    """As it goes on a hydra command line: a value with commas quoted."""
    return f'allocation_mode="{mode}"' if "," in mode else f"allocation_mode={mode}"


def command_line(argv: list[str]) -> int:
    from realrl.apps.configs import build_config, register_everything

    if not argv or argv[0] in ("-h", "--help", "help"):
        print(search_help())
        return 0
    name, overrides = argv[0], [_search_key(a) for a in argv[1:]]
    try:
        register_everything()
        cfg = build_config(name, overrides)
        found = search_plan(name, cfg)
    except (UserError, NoFeasiblePlan, ValueError) as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return EXIT_USER_ERROR
    print(format_result(name, n_workers(cfg), found.result, cfg.search.top, found.measured, found.skipped))
    return 0


def search_help() -> str:
    """``--help``: the usage line, what the command does, then every option of
    ``PlanSearchOptions`` by its ``search.`` name, with its default and meaning."""
    from realrl.apps.help_text import command_help, dataclass_options

    return "\n".join(
        [
            command_help(USAGE, __doc__.split("\n\nThis module")[0]),
            "",
            "options (the short name works too: n_nodes=2 is search.n_nodes=2):",
            *dataclass_options(PlanSearchOptions, "search"),
            "",
            "Every other key=value is an option of the experiment.",
            "python -m realrl.apps.quickstart <experiment> --help lists them.",
        ]
    )


def _search_key(arg: str) -> str:
    """``n_nodes=2`` is ``search.n_nodes=2`` (the pinned short names of this command)."""
    key, sep, value = arg.partition("=")
    return f"search.{key}={value}" if sep and key in SEARCH_KEYS else arg


def main() -> None:
    status = command_line(sys.argv[1:])
    if status:
        sys.exit(status)


if __name__ == "__main__":
    main()
