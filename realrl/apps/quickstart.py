"""The command line: ``python -m realrl.apps.quickstart <experiment> key=value ...``.

Experiments are structured configs (dataclasses read by omegaconf, with hydra's ``key=value``
and ``+key=value``) registered with ``register_quickstart_exp``. Every override is checked
(unknown keys, wrong types, values outside their choices) before any worker starts. With no
dataset path the experiment runs on the embedded toy task: its preset overrides
come first, so anything on the command line still wins, and the phases it builds on (SFT, reward
model) run first unless their checkpoints are already under ``fileroot``.

A mistake in the options or the input (``realrl.apps.errors``) is one ``error:`` line naming the
key, or the data file and line, and exit status 2, before any worker starts where it can be
found then (``debug=true`` adds the traceback). Ctrl-C and SIGTERM stop the run and every worker
(``realrl.apps.signals``): exit status 130 and 143.
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
from typing import Any

from realrl.api.core.layout import Layout
from realrl.api.quickstart.entrypoint import get_quickstart_exp, quickstart_experiments
from realrl.apps.errors import (
    EXIT_FAILED,
    EXIT_USER_ERROR,
    UserError,
    data_error_message,
    one_line,
    wants_traceback,
)
from realrl.apps.overrides import override_key, to_object
from realrl.apps.signals import exit_code, interrupted_message, stop_on_signals
from realrl.base import logging
from realrl.system.standby import StandbyWorkers

logger = logging.getLogger("quickstart")

HELP_FLAGS = ("-h", "--help", "help")
MAX_STANDBY = 64  # standby processes start before any option is checked: a typo must not fork 10**6


@dataclasses.dataclass(frozen=True)
class Command:
    """What a command line asks for: print ``text`` (help, ``--cfg job``), or run ``config``
    (``phases``: it and the phases it builds on, once ``prepare`` has checked them)."""

    name: str = ""
    config: Any = None
    text: str = ""
    phases: tuple = ()


def prepare(argv: list[str]) -> Command:
    """``argv`` checked as far as it can be before any worker starts: the options
    (``parse_command``), then every phase's paths and runtime config (``plan_phases``). What
    ``main`` runs, or a ``UserError`` naming the argument, file or key at fault."""
    from realrl.apps.run import plan_phases  # heavy: imported once the standby workers started

    command = parse_command(argv)
    if command.config is None:
        return command
    return dataclasses.replace(command, phases=tuple(plan_phases(command.name, command.config)))


def parse_command(argv: list[str]) -> Command:
    """What ``argv`` asks for, every option checked (the paths are checked next, by
    ``realrl.apps.run.plan_phases``); a mistake is a ``UserError`` naming the argument."""
    from omegaconf import OmegaConf

    from realrl.apps.configs import config_node, register_everything

    register_everything()
    if not argv or argv[0] in HELP_FLAGS:
        return Command(text=usage())
    name, rest = argv[0], argv[1:]
    if name.startswith("-") or "=" in name:
        raise UserError(f"{name!r}: the experiment comes first, one of {quickstart_experiments()}")
    overrides, flags = _split_flags(rest)
    node, user = config_node(name, overrides)
    if "help" in flags:
        return Command(name, text=experiment_help(name, OmegaConf.to_yaml(node)))
    config = to_object(node, user)
    if "cfg" in flags:
        return Command(name, text=OmegaConf.to_yaml(node))
    return Command(name, config)


def _split_flags(args: list[str]) -> tuple[list[str], set[str]]:
    """(the key=value overrides, the flags: 'help' and 'cfg' for ``--cfg job``)."""
    overrides: list[str] = []
    flags: set[str] = set()
    it = iter(args)
    for arg in it:
        if arg in HELP_FLAGS[:2]:
            flags.add("help")
        elif arg in ("--cfg", "-c", "--cfg=job"):
            value = "job" if arg == "--cfg=job" else next(it, "")
            if value != "job":
                raise UserError(f"{arg} {value}: only '--cfg job' (print the resolved config) is supported")
            flags.add("cfg")
        elif arg.startswith("-"):
            raise UserError(f"unknown flag {arg!r}; the flags are --help and --cfg job")
        else:
            overrides.append(arg)
    return overrides, flags


def experiment_help(name: str, options: str) -> str:
    return "\n".join(
        [
            f"usage: python -m realrl.apps.quickstart {name} [key=value ...] [--cfg job]",
            "",
            "Every option, with its value for these arguments (set any with key=value; hydra's",
            "+key=value adds a key to a dict option such as manual):",
            "",
            options,
        ]
    )


def _is_group(field: dataclasses.Field) -> bool:
    """A nested dataclass option group such as ``actor`` or ``ppo``."""
    return field.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(
        field.default_factory()
    )


def usage() -> str:
    lines = [
        "usage: python -m realrl.apps.quickstart <experiment> [key=value ...] [--cfg job] [--help]",
        "",
        "experiments:",
    ]
    for name in quickstart_experiments():
        cls = get_quickstart_exp(name)
        groups = [f.name for f in dataclasses.fields(cls) if _is_group(f)]
        doc = cls.SUMMARY or (sys.modules[cls.__module__].__doc__ or "").strip().splitlines()[0]
        lines.append(f"  {name:<12} {doc}")
        lines.append(f"               groups: {', '.join(groups)}")
    lines += [
        "",
        "With no dataset path, an experiment runs on the embedded toy task (and runs the phases it",
        "needs first). 'python -m realrl.apps.quickstart <experiment> --help' lists every option;",
        "'--cfg job' prints the resolved config. ppo_preset=<name> applies a preset (real,",
        "lm_human_preferences, grpo, dr_grpo, dapo, gspo, rloo, reinforce_pp, remax); task=arith runs",
        "on the embedded arithmetic task instead of the default sentiment one.",
    ]
    return "\n".join(lines)


def standby_count(argv: list[str]) -> int:
    """How many standby worker processes to start before anything else (``realrl.system.standby``):
    only the raw arguments are known then. ``standby_workers=N`` decides; otherwise a local run
    gets one per worker its ``allocation_mode`` uses (one for ``manual``), a Ray run or a command
    that runs nothing (help, ``--cfg``) none."""
    if not argv or argv[0] in ("-h", "--help", "help") or any(a.startswith("-") for a in argv[1:]):
        return 0
    values = {override_key(o): o.split("=", 1)[1] for o in argv[1:] if "=" in o}
    asked = values.get("standby_workers", "null")
    if asked.isdigit():  # anything else is left to the config's own check (or means the default)
        return min(int(asked), MAX_STANDBY)
    if values.get("mode", "local") != "local":
        return 0
    return min(_workers_used(values.get("allocation_mode", "d1").strip().strip("\"'")), MAX_STANDBY)


def _workers_used(allocation_mode: str) -> int:
    """Workers a layout string places models on (``first + dp*tp*pp`` at most); 1 if unparsable."""
    try:
        n = 1
        for part in allocation_mode.split(","):
            layout, _, first = part.rpartition(":")[2].partition("@")
            n = max(n, int(first or 0) + Layout.parse(layout).world_size)
        return n
    except ValueError:
        return 1


def main(argv: list[str] | None = None) -> None:
    """The command line; exits with ``command_line``'s status when it is not 0."""
    status = command_line(list(sys.argv[1:] if argv is None else argv))
    if status:
        sys.exit(status)


def command_line(argv: list[str]) -> int:
    """Run ``argv``; the exit status: 0 done, 1 the run failed (a worker crashed: the message
    names it), 2 a configuration or input error (one ``error:`` line), 130 / 143 stopped by
    SIGINT / SIGTERM (every worker stopped)."""
    debug = wants_traceback(argv)
    try:
        with stop_on_signals():  # first: Ctrl-C / SIGTERM stop the run even when SIGINT came ignored
            # then the standby workers, so that their imports overlap this process's own
            n = standby_count(argv)
            standby = StandbyWorkers(n) if n else None  # None: none, not even between phases
            try:
                _main(argv, standby)
            finally:
                if standby is not None:
                    standby.close()
    except KeyboardInterrupt as e:
        print(interrupted_message(e), file=sys.stderr)
        return exit_code(e)
    except Exception as e:
        status = _failure_status(e, debug)
        if status is None:
            raise  # a bug: Python's own traceback, exit status 1
        return status
    return 0


def _failure_status(e: Exception, debug: bool) -> int | None:
    """Print what the user needs to see of ``e`` and return the exit status; None for a bug."""
    from realrl.apps.main import ExperimentFailedError

    data_error = data_error_message(e)
    if isinstance(e, ExperimentFailedError) and data_error is None:
        print(f"realrl: {e}", file=sys.stderr)  # not the user's to fix: the whole story
        return EXIT_FAILED
    if not isinstance(e, (UserError, ExperimentFailedError)) and data_error is None:
        return None
    if debug:
        traceback.print_exception(e)
    print(f"error: {data_error or one_line(str(e))}", file=sys.stderr)
    return EXIT_USER_ERROR


def _main(argv: list[str], standby: StandbyWorkers | None) -> None:
    command = prepare(argv)
    if command.config is None:
        print(command.text)
        return
    from realrl.apps.run import run_quickstart

    run_quickstart(command.name, command.config, standby, list(command.phases))


if __name__ == "__main__":
    main()
