"""The command line: ``python -m realrl.apps.quickstart <experiment> key=value ...``.

Experiments are structured configs (dataclasses registered with ``register_quickstart_exp``
and stored in hydra's ``ConfigStore``) composed by hydra's compose API with hydra's override
grammar, optionally over a YAML file (``--config-path DIR --config-name NAME``);
``--multirun`` sweeps (``realrl.apps.sweep``). Every override is checked (unknown keys, wrong
types, values outside their choices) before any worker starts. With no dataset path the
experiment runs on the embedded toy task: its preset overrides come first, so anything in the
file or on the command line still wins, and the phases it builds on (SFT, reward model) run
first unless their checkpoints are already under ``fileroot`` (``realrl.apps.configs``).

A mistake in the options or the input (``realrl.apps.errors``) is one ``error:`` line naming the
key, or the data file and line, and exit status 2, before any worker starts where it can be
found then (``debug=true`` adds the traceback). Ctrl-C and SIGTERM stop the run and every worker
(``realrl.apps.signals``): exit status 130 and 143.
"""

from __future__ import annotations

import dataclasses
import os
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
)
from realrl.apps.overrides import parse_override, to_object, wants_traceback
from realrl.apps.signals import exit_code, interrupted_message, stop_on_signals
from realrl.base import logging
from realrl.system.standby import StandbyWorkers

logger = logging.getLogger("quickstart")

HELP_FLAGS = ("-h", "--help", "help")
MAX_STANDBY = 64  # standby processes start before any option is checked: a typo must not fork 10**6


@dataclasses.dataclass(frozen=True)
class Command:
    """What a command line asks for: print ``text`` (help, ``--cfg job``), or run ``config``
    (``phases``: it and the phases it builds on, once ``prepare`` has checked them), or, for
    ``--multirun``, run each of ``runs`` in turn."""

    name: str = ""
    config: Any = None
    text: str = ""
    phases: tuple = ()
    runs: tuple = ()  # --multirun: one Command per combination, each with its config


@dataclasses.dataclass
class Flags:
    """The ``--`` flags of a command line (hydra's spelling)."""

    help: bool = False
    cfg: bool = False
    multirun: bool = False
    config_path: str | None = None
    config_name: str | None = None

    def config_file(self) -> Any:
        """The YAML file ``--config-path/--config-name`` name (None: none)."""
        from realrl.apps.configs import ConfigFile

        if self.config_name is None:
            if self.config_path is not None:
                raise UserError(f"--config-path {self.config_path}: name the file with --config-name NAME")
            return None
        name = self.config_name.removesuffix(".yaml")
        path = self.config_path
        if path is None:  # --config-name dir/name.yaml alone
            path, name = os.path.dirname(name) or ".", os.path.basename(name)
        return ConfigFile(path, name)


def prepare(argv: list[str]) -> Command:
    """``argv`` checked as far as it can be before any worker starts: the options
    (``parse_command``), then every phase's paths and runtime config (``plan_phases``). What
    ``main`` runs, or a ``UserError`` naming the argument, file or key at fault."""
    from realrl.apps.run import plan_phases  # heavy: imported once the standby workers started

    command = parse_command(argv)
    if command.runs:
        runs = [searched(r) for r in command.runs]
        runs = [dataclasses.replace(r, phases=tuple(plan_phases(r.name, r.config))) for r in runs]
        return dataclasses.replace(command, runs=tuple(runs))
    if command.config is None:
        return command
    command = searched(command)
    return dataclasses.replace(command, phases=tuple(plan_phases(command.name, command.config)))


def searched(command: Command) -> Command:
    """``allocation_mode=search``: the command with the best plan the search finds
    (``realrl.apps.search``; profiling runs first where its cache lacks them)."""
    if command.config.allocation_mode.strip() != "search":
        return command
    from realrl.apps.plan_search.choose import n_workers, search_plan
    from realrl.apps.plan_search.search import NoFeasiblePlan

    try:
        found = search_plan(command.name, command.config)
    except NoFeasiblePlan as e:
        raise UserError(f"allocation_mode=search: {e}") from e
    best = found.best
    logger.info(
        "allocation_mode=search: %s (predicted %.3f s/step%s; %d plans on %d workers)",
        best.allocation_mode,
        best.simulation.step_seconds,
        f", measured {found.measured[best.allocation_mode]:.3f}" if found.measured else "",
        found.result.evaluated,
        n_workers(command.config),
    )
    config = dataclasses.replace(command.config, allocation_mode=best.allocation_mode)
    return dataclasses.replace(command, config=config)


def parse_command(argv: list[str]) -> Command:
    """What ``argv`` asks for, every option checked; a mistake is a ``UserError`` naming the
    argument. The files and plugins it names are checked first (``preflight.check_node``), then
    the options; ``realrl.apps.run.plan_phases`` checks every phase's next."""
    from omegaconf import OmegaConf

    from realrl.apps.configs import config_node, register_everything
    from realrl.apps.preflight import check_node

    register_everything()
    if not argv or argv[0] in HELP_FLAGS:
        return Command(text=usage())
    name, rest = argv[0], argv[1:]
    if name.startswith("-") or "=" in name:
        raise UserError(f"{name!r}: the experiment comes first, one of {quickstart_experiments()}")
    overrides, flags = _split_flags(rest)
    config_file = flags.config_file()
    if flags.multirun and not flags.help:
        return _sweep(name, overrides, config_file, flags.cfg)
    node, user = config_node(name, overrides, config_file)
    if flags.help:
        return Command(name, text=experiment_help(name, node))
    if flags.cfg:
        to_object(node, user)
        return Command(name, text=OmegaConf.to_yaml(node))
    check_node(name, node)  # files and plugins first: a missing file beats what it makes wrong
    return Command(name, to_object(node, user))


def _sweep(name: str, overrides: list[str], config_file: Any, cfg: bool) -> Command:
    """``--multirun``: every combination's config, checked before the first run starts."""
    from omegaconf import OmegaConf

    from realrl.apps.configs import config_node
    from realrl.apps.preflight import check_node
    from realrl.apps.sweep import check_distinct, expand

    runs, texts = [], []
    for combination in expand(overrides):
        node, user = config_node(name, combination.overrides, config_file, combination.label)
        if not cfg:
            check_node(name, node)
        config = to_object(node, user)
        runs.append(Command(name, config))
        texts.append(f"# {config.trial_name}: {' '.join(combination.overrides)}\n{OmegaConf.to_yaml(node)}")
    check_distinct([r.config.run_dir for r in runs], [r.config.trial_name for r in runs])
    if cfg:
        return Command(name, text="\n".join(texts))
    return Command(name, runs=tuple(runs))


def _split_flags(args: list[str]) -> tuple[list[str], Flags]:
    """(the key=value overrides, the flags)."""
    overrides: list[str] = []
    flags = Flags()
    it = iter(args)
    for arg in it:
        flag, eq, inline = arg.partition("=")
        if arg in HELP_FLAGS[:2]:
            flags.help = True
        elif flag in ("--cfg", "-c"):
            value = inline if eq else next(it, "")
            if value != "job":
                raise UserError(f"{arg} {value}: only '--cfg job' (print the resolved config) is supported")
            flags.cfg = True
        elif arg in ("--multirun", "-m"):
            flags.multirun = True
        elif flag in ("--config-path", "-cp", "--config-name", "-cn"):
            value = inline if eq else next(it, "")
            if not value or value.startswith("-"):
                raise UserError(f"{flag} needs a value (--config-path DIR --config-name NAME)")
            field = "config_path" if flag in ("--config-path", "-cp") else "config_name"
            setattr(flags, field, value)
        elif arg.startswith("-"):
            raise UserError(
                f"unknown flag {arg!r}; the flags are --help, --cfg job, --multirun, "
                "--config-path DIR and --config-name NAME"
            )
        else:
            overrides.append(arg)
    return overrides, flags


def experiment_help(name: str, node: Any) -> str:
    """``<experiment> --help``: its summary, then every option it reads with its value for these
    arguments (the groups it never reads, such as a critic-free experiment's ``critic``, left out)."""
    from omegaconf import OmegaConf

    from realrl.apps.help_text import experiment_summary, unread_groups

    cls = get_quickstart_exp(name)
    unread = sorted(unread_groups(cls))
    options = OmegaConf.to_container(node, resolve=False)
    lines = [
        f"usage: python -m realrl.apps.quickstart {name} [key=value ...] [--cfg job] [--multirun]",
        "           [--config-path DIR --config-name NAME]",
        "",
        experiment_summary(cls),
        "",
        "Every option, with its value for these arguments, follows; set any with key=value on the command line.",
        "A YAML file read with --config-path DIR --config-name NAME sets them too.",
        "Hydra's +key=value adds a key to a dict option such as manual.",
    ]
    if unread:
        lines.append(f"Left out: {', '.join(unread)}, which {name} never reads.")
    shown = {k: v for k, v in options.items() if k not in unread}
    return "\n".join([*lines, "", OmegaConf.to_yaml(shown)])


def usage() -> str:
    """The command's help: its flags, then the experiments, tasks and presets it knows
    (``realrl.apps.help_text``: from the registries it reads)."""
    from realrl.apps.help_text import experiments_section, presets_section, tasks_section

    lines = [
        "usage: python -m realrl.apps.quickstart <experiment> [key=value ...] [--cfg job] [--help]",
        "           [--config-path DIR --config-name NAME] [--multirun]",
        "",
        *experiments_section(),
        "",
        *tasks_section(),
        "",
        *presets_section(),
        "",
        "flags:",
        "  --help                                Every option of the experiment, with its value.",
        "  --cfg job                             Print the resolved config and run nothing.",
        "  --config-path DIR --config-name NAME  Read DIR/NAME.yaml; key=value on the command line beats it.",
        "  --multirun (-m)                       Run every combination of seed=1,2 'ppo.kl_ctl=0.05,0.1' in turn.",
        "                                        Each run writes a trial folder named after its values.",
        "                                        A table of their summaries follows the last run.",
        "                                        Quote a comma that is no sweep: 'allocation_mode=\"actor:d2,*:d1\"'.",
    ]
    return "\n".join(lines)


def standby_count(argv: list[str]) -> int:
    """How many standby worker processes to start before anything else (``realrl.system.standby``):
    only the raw arguments are known then. ``standby_workers=N`` decides; otherwise a local run
    gets one per worker its ``allocation_mode`` uses (one for ``manual``), a Ray run or a command
    that runs nothing (help, ``--cfg``) none."""
    if not argv or argv[0] in ("-h", "--help", "help") or any(a.startswith("-") for a in argv[1:]):
        return 0
    values = _values(argv[1:])
    asked = values.get("standby_workers")
    if isinstance(asked, int) and not isinstance(asked, bool) and asked >= 0:
        return min(asked, MAX_STANDBY)  # anything else is left to the config's own check (or the default)
    if values.get("mode", "local") != "local":
        return 0
    return min(_workers_used(str(values.get("allocation_mode", "d1"))), MAX_STANDBY)


def _values(overrides: list[str]) -> dict[str, Any]:
    """key -> value of the overrides hydra's parser reads (the others are checked later)."""
    values = {}
    for o in overrides:
        try:
            parsed = parse_override(o)
        except UserError:
            continue
        if not parsed.is_sweep_override():
            values[parsed.key_or_group] = parsed.value()
        elif parsed.is_choice_sweep() and parsed.value().simple_form:  # its text, outside --multirun
            values[parsed.key_or_group] = parsed.get_value_string().strip().strip("\"'")
    return values


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
    from realrl.apps.run import run_quickstart

    command = prepare(argv)
    if command.runs:
        _run_sweep(command, standby)
        return
    if command.config is None:
        print(command.text)
        return
    run_quickstart(command.name, command.config, standby, list(command.phases))


def _run_sweep(command: Command, standby: StandbyWorkers | None) -> None:
    """Each run in turn (a later one planned again: earlier ones may have made the checkpoints
    it builds on), then the table of their summaries."""
    from realrl.apps.run import run_quickstart
    from realrl.apps.sweep import summary_table

    done = []
    for i, run in enumerate(command.runs):
        logger.info("sweep: run %d of %d, trial %s", i + 1, len(command.runs), run.config.trial_name)
        summary = run_quickstart(run.name, run.config, standby, list(run.phases) if i == 0 else None)
        done.append((run.config.trial_name, summary))
    print(summary_table(done))


if __name__ == "__main__":
    main()
