"""Command-line overrides (and a YAML file) -> an experiment's config, composed by hydra.

hydra's compose API builds every config from the experiment's structured config (stored in
hydra's ``ConfigStore`` by ``register_quickstart_exp``). The order is the rule, lowest first:
the structured config's defaults; ``experiment_name``; the embedded task's recipe (only when
neither the file nor the overrides name a dataset path: its options, its files, the checkpoints
of the phases it builds on); the trial name a sweep gives each run; ``ppo_preset=<name>``
expanded into ``ppo.*`` options; the YAML file of ``--config-path/--config-name`` (with its own
``defaults:`` list); then the command line's overrides, so whatever the user writes wins. This is
the one place a task is applied; the experiments read plain paths.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from realrl.api.quickstart.entrypoint import get_quickstart_exp, quickstart_experiments
from realrl.apps.errors import UserError, one_line
from realrl.apps.overrides import (
    command_line_form,
    omegaconf_message,
    override_key,
    parse_override,
    parse_overrides,
    to_object,
)
from realrl.base import plugins
from realrl.base.registry import UnknownNameError
from realrl.experiments.tasks import DEFAULT_TASK, EmbeddedTask, get_task, task_names
from realrl.impl.interface.ppo_presets import PRESET_EXPERIMENT_OPTIONS, PRESETS

DATA_PATH_KEYS = ("dataset.train_path", "dataset.path")
PRESET_KEY = "ppo_preset"
TASK_KEY = "task"
HEAD_NODE = "_realrl_head"  # ConfigStore: the schema with realrl's own values (task, preset)
COMMAND_NODE = "_realrl_command"  # ConfigStore: what one command composes (head, file, _self_)


@dataclasses.dataclass(frozen=True)
class ConfigFile:
    """``--config-path DIR --config-name NAME``: the YAML file ``DIR/NAME.yaml``."""

    path: str
    name: str

    @property
    def file(self) -> str:
        return os.path.join(self.path, self.name + ".yaml")

    def check(self) -> None:
        if not os.path.isdir(self.path):
            raise UserError(f"--config-path {self.path}: no such folder")
        if not os.path.isfile(self.file):
            raise UserError(f"--config-name {self.name}: no {self.name}.yaml in {self.path}")


def register_everything(overrides: list[str] = ()) -> None:
    """Import what registers by name: realrl's own experiments and implementations, the
    installed packages' plugins (``realrl.plugins`` entry points) and the modules of the user's
    ``import_modules=[...]`` override, so a user's experiment (``my-ppo``) is found by name."""
    import realrl.experiments  # noqa: F401
    import realrl.impl  # noqa: F401

    plugins.load_entry_points()
    for o in overrides:
        if override_key(o) == "import_modules":
            value = parse_override(o).value()
            modules = [str(m) for m in (value if isinstance(value, list) else [value])]
            for i, m in enumerate(modules):
                if m.endswith(".py") and not os.path.isfile(m):
                    raise UserError(f"import_modules[{i}]={m!r}: no such file")
            for m in modules:
                try:
                    plugins.import_modules([m])
                except Exception as e:  # noqa: BLE001 - the user's module: one line naming where it failed
                    where = plugins.failure_message(e, m if m.endswith(".py") else None)
                    raise UserError(f"{o}: cannot import {m}: {where}") from e


def chosen_task(experiment: str, user: list[str]) -> EmbeddedTask | None:
    """The embedded task of a command line: None when it names a dataset path (the user's data),
    else ``task=<name>`` or the default."""
    values = {o.key_or_group: o.value() for o in parse_overrides(user)}
    return _task_for(experiment, values.get(TASK_KEY), [k for k in DATA_PATH_KEYS if values.get(k)])


def _task_for(experiment: str, name: Any, data_keys: list[str]) -> EmbeddedTask | None:
    """The task ``task=name`` asks for (None or "": the default) unless a dataset path is set."""
    name = None if name in (None, "", "null") else str(name)
    if data_keys:
        if name is not None:
            raise UserError(
                f"task={name} runs on the task's own data, but {data_keys[0]} names a file; drop one of them"
            )
        return None
    try:
        task = get_task(DEFAULT_TASK if name is None else name)
    except UnknownNameError:
        raise UserError(f"task={name!r} is not an embedded task; choose one of {task_names()}") from None
    try:
        task.recipe(experiment)
    except ValueError as e:
        raise UserError(str(e)) from None
    return task


def preset_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """Expand ``ppo_preset=<name>`` into ``ppo.*`` overrides (and the experiment options the
    preset sets, such as a learning-rate schedule) placed before the user's own."""
    rest, expanded = [], []
    for o in overrides:
        if override_key(o) != PRESET_KEY:
            rest.append(o)
            continue
        name = str(parse_override(o).value())
        if name not in PRESETS:
            raise UserError(f"{PRESET_KEY}={name!r} is not a preset; choose one of {sorted(PRESETS)}")
        for key, value in PRESETS[name]().items():
            if dataclasses.is_dataclass(value):
                expanded += [f"ppo.{key}.{k}={_fmt(v)}" for k, v in dataclasses.asdict(value).items()]
            else:
                expanded.append(f"ppo.{key}={_fmt(value)}")
        expanded += PRESET_EXPERIMENT_OPTIONS.get(name, [])
    return expanded, rest


def _fmt(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value) if any(c in value for c in " ,=.") else value
    return str(value).lower() if isinstance(value, bool) else str(value)


def _quoted(override: str) -> str:
    """A ``key=value`` realrl writes (a task's path under the user's fileroot), readable by
    hydra's grammar whatever the value's characters: as it is, else the value quoted."""
    from hydra.core.override_parser.types import Quote, QuotedString

    try:
        return command_line_form(parse_overrides([override]))[0]
    except UserError:
        key, _, value = override.partition("=")
        return f"{key}={QuotedString(text=value, quote=Quote.single).with_quotes()}"


def compose(name: str, head: list[str], user: list[str], config_file: ConfigFile | None = None) -> Any:
    """The omegaconf node hydra composes for experiment ``name``: its structured config with
    ``head`` (realrl's own overrides) applied, then ``config_file``, then ``user``'s overrides.
    Any mistake is a ``UserError`` naming the override, or the file (and line) at fault."""
    from hydra import compose as hydra_compose
    from hydra import initialize, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    store = ConfigStore.instance()
    parsed = parse_overrides(user)
    cls = get_quickstart_exp(name)
    if config_file is not None:
        config_file.check()
    try:
        store.store(name=HEAD_NODE, node=_head_node(cls, head))
        defaults = [HEAD_NODE, *([config_file.name] if config_file else []), "_self_"]
        store.store(name=COMMAND_NODE, node={"defaults": defaults})
        folder = config_file and initialize_config_dir(os.path.abspath(config_file.path), version_base=None)
        with folder or initialize(version_base=None):
            node = hydra_compose(COMMAND_NODE, command_line_form(parsed))
    except (HydraException, OmegaConfBaseException, _yaml_error()) as e:
        raise UserError(_compose_message(e, list(zip(user, parsed)), cls, config_file)) from e
    _check_deletions(node, parsed)
    return node


def _head_node(cls: type, head: list[str]) -> Any:
    """``cls``'s structured config with realrl's own overrides (each read by hydra's parser)
    applied in order, as hydra applies a command line's."""
    from omegaconf import OmegaConf

    node = OmegaConf.structured(cls)
    for o in parse_overrides([_quoted(h) for h in head]):
        OmegaConf.update(node, o.key_or_group, o.value(), merge=True)
    return node


def _yaml_error() -> type:
    import yaml

    return yaml.YAMLError


def _compose_message(
    e: Exception, user: list[tuple[str, Any]], cls: type, config_file: ConfigFile | None
) -> str:
    """One line for what hydra raised: the file and line of a YAML that does not parse, the file
    of a bad key in it, or the override at fault with omegaconf's reason. ``user``: each override
    as written, and as hydra read it."""
    import yaml
    from hydra.errors import MissingConfigException

    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f"{mark.name}: line {mark.line + 1}" if mark else (config_file.file if config_file else "")
        return f"{where}: not valid YAML ({one_line(e.problem or e.context or str(e))})"
    if isinstance(e, yaml.YAMLError):
        return f"{config_file.file if config_file else 'YAML'}: not valid YAML ({one_line(str(e))})"
    text = str(e)
    if isinstance(e, MissingConfigException):
        where = config_file.path if config_file else "the config search path"
        reason = one_line(text.split("\n\nConfig search path")[0])
        return f"{where}: " + re.sub(f"^In '{COMMAND_NODE}': ", "", reason)
    in_file = re.match(r"In '([^']+)': [^\n]*\n(.*)", text, re.DOTALL)
    if in_file and in_file.group(1) not in (COMMAND_NODE, HEAD_NODE):
        base = config_file.path if config_file else ""
        full_key = re.search(r"full_key: (\S+)", in_file.group(2))
        return f"{os.path.join(base, in_file.group(1))}.yaml: " + omegaconf_message(
            in_file.group(2), full_key.group(1) if full_key else "", cls, None
        )
    cause = e.__cause__ or e
    full_key = str(getattr(cause, "full_key", "") or "")
    culprit = next((o for o, parsed in reversed(user) if parsed.input_line in text), None)
    message = omegaconf_message(str(cause), full_key, cls, culprit or full_key or None)
    if text.startswith("Could not override") and "did you mean" not in message:
        message += f"; to add a key, write +{override_key(culprit)}=..." if culprit else ""
    elif cause is e and culprit:  # hydra's own message (no omegaconf error behind it)
        message = f"{culprit}: {one_line(text)}"
    return message


def _check_deletions(node: Any, parsed: list[Any]) -> None:
    """``~key`` removes a dict entry (``~manual.actor``), never an option of the experiment."""
    from omegaconf import OmegaConf

    for o in parsed:
        if not o.is_delete():
            continue
        parent, _, _ = o.key_or_group.rpartition(".")
        owner = OmegaConf.select(node, parent) if parent else node
        if owner is not None and dataclasses.is_dataclass(OmegaConf.get_type(owner)):
            raise UserError(
                f"{o.input_line}: {o.key_or_group} is an option and cannot be removed; set it instead "
                f"({o.key_or_group}=...)"
            )


def config_node(
    name: str, overrides: list[str], config_file: ConfigFile | None = None, trial_name: str | None = None
) -> tuple[Any, list[str]]:
    """The experiment's omegaconf node, interpolations not resolved (what ``--cfg job`` shows),
    and the user's own overrides (the presets expanded out of them). ``trial_name``: a sweep's
    name for this run, beaten by a ``trial_name`` in the file or the overrides."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_everything(overrides)
    if name not in quickstart_experiments():
        raise UserError(f"unknown experiment {name!r}; choose one of {quickstart_experiments()}")
    expanded, user = preset_overrides(overrides)
    first_head = [f"experiment_name={name}"]
    trial = [f"trial_name={trial_name}"] if trial_name else []
    first = compose(name, first_head + trial + expanded, user, config_file)
    data_keys = [
        k for k in DATA_PATH_KEYS if OmegaConf.select(first, k, default=None, throw_on_missing=False)
    ]
    task = _task_for(name, OmegaConf.select(first, TASK_KEY, default=None), data_keys)
    if task is None:
        return first, user
    # the task's paths hang off fileroot and seed: read them as the file and the user set them
    try:
        recipe = task.overrides(name, str(first.fileroot), int(first.seed))
    except OmegaConfBaseException as e:  # an interpolation that does not resolve
        to_object(first, user)
        raise UserError(one_line(str(e))) from e
    return compose(name, first_head + recipe + trial + expanded, user, config_file), user


def build_config(
    name: str, overrides: list[str], config_file: ConfigFile | None = None, trial_name: str | None = None
) -> Any:
    """The experiment's config object from ``overrides`` (and ``config_file``): every key, type
    and value checked, a mistake a ``UserError`` naming the override or the file
    (``realrl.apps.overrides``)."""
    node, user = config_node(name, overrides, config_file, trial_name)
    return to_object(node, user)
