"""Embedded tasks: what an experiment runs on when the user names no dataset path.

A task is data the project generates (files under ``fileroot/<label>_task/seed<seed>/``), a tiny
model config, and one recipe per experiment: the options it sets before the user's own (its
preset), the config keys it points at its files, and the keys it points at the final checkpoint
of an earlier phase (which the command line runs first when it is missing). The command line
applies a task in one place (``realrl.apps.configs``), so the experiments themselves never ask
whether they run on a task: they read ordinary paths, as with a user's files and checkpoints.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

from realrl.api.quickstart.entrypoint import get_quickstart_exp, quickstart_experiments
from realrl.base.registry import Registry


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How one experiment runs on a task."""

    preset: tuple[str, ...] = ()  # key=value options applied before the user's
    files: dict[str, str] = dataclasses.field(default_factory=dict)  # config key -> task file name
    # config key -> the phase (experiment name) whose final checkpoint the key points at
    checkpoints: dict[str, str] = dataclasses.field(default_factory=dict)
    # (run config) -> figures for summary.json, measured on the task's held-out data
    summarize: Callable[[Any], dict[str, Any]] | None = None
    # config key of ``checkpoints`` -> the role whose final checkpoint it reads (default "default",
    # the one model of SFT and reward modelling; an RL phase's policy is "actor")
    roles: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EmbeddedTask:
    name: str
    label: str  # names its folder (``<label>_task``) and its runs' trial (``<label>-seed<seed>``)
    doc: str  # one line for --help
    build: Callable[[str, int], dict[str, str]]  # (data dir, seed) -> file name -> path, written once
    paths: Callable[[str], dict[str, str]]  # (data dir) -> file name -> path, without writing
    model_config: Callable[[], dict[str, Any]]
    recipes: dict[str, Recipe]
    # names its data folder instead of ``label`` (a variant of a task that differs only in its
    # model reads the same files; its runs and checkpoints stay apart, under its own trial)
    data_label: str | None = None

    def recipe(self, experiment: str) -> Recipe:
        """The recipe of ``experiment``, else of the nearest experiment its config class extends
        (a user's ``my-ppo`` subclassing the PPO config runs on PPO's recipe)."""
        return self.recipes[self.recipe_experiment(experiment)]

    def recipe_experiment(self, experiment: str) -> str:
        """The experiment whose recipe ``experiment`` runs on: itself, or the nearest one its
        config class extends."""
        if experiment in self.recipes:
            return experiment
        by_class = {get_quickstart_exp(n): n for n in quickstart_experiments() if n in self.recipes}
        if experiment in quickstart_experiments():
            for base in get_quickstart_exp(experiment).__mro__[1:]:
                if base in by_class:
                    return by_class[base]
        raise ValueError(
            f"task={self.name!r} has no recipe for the {experiment!r} experiment; it runs "
            f"{sorted(self.recipes)} (give dataset paths to run {experiment!r} on your own data)"
        )

    def data_dir(self, fileroot: str, seed: int) -> str:
        return os.path.join(os.path.abspath(fileroot), f"{self.data_label or self.label}_task", f"seed{seed}")

    def files(self, fileroot: str, seed: int) -> dict[str, str]:
        """Write the task's files for ``seed`` (once; later calls reuse them) and return their paths."""
        return self.build(self.data_dir(fileroot, seed), seed)

    def trial(self, seed: int) -> str:
        """The trial name of every run of this task and seed, so later phases find earlier ones."""
        return f"{self.label}-seed{seed}"

    def checkpoint(self, fileroot: str, experiment: str, seed: int, role: str = "default") -> str:
        return final_checkpoint(fileroot, experiment, self.trial(seed), role)

    def overrides(self, experiment: str, fileroot: str, seed: int) -> list[str]:
        """The recipe as key=value options: preset, then its files and earlier phases' checkpoints."""
        out = [f"task={self.name}", f"trial_name={self.trial(seed)}", *self.recipe(experiment).preset]
        return out + [f"{key}={path}" for key, path in self.provided(experiment, fileroot, seed).items()]

    def provided(self, experiment: str, fileroot: str, seed: int) -> dict[str, str]:
        """config key -> the path the task puts there (what preflight leaves to the task)."""
        recipe = self.recipe(experiment)
        files = self.paths(self.data_dir(fileroot, seed))
        out = {key: files[name] for key, name in recipe.files.items()}
        out.update(
            {
                key: self.checkpoint(fileroot, phase, seed, recipe.roles.get(key, "default"))
                for key, phase in recipe.checkpoints.items()
            }
        )
        return out


def sft_recipe(preset: tuple[str, ...]) -> Recipe:
    """Supervised fine-tuning on a task's ``sft_train`` / ``sft_valid`` files, from random weights
    of the task's model config (the model has no checkpoint path)."""
    files = {
        "dataset.train_path": "sft_train",
        "dataset.valid_path": "sft_valid",
        "tokenizer_path": "tokenizer",
    }
    return Recipe(preset, files)


# every recipe's first option: the task models are tiny, and one thread per worker beats several
# (per-op overhead dominates)
ONE_THREAD = ("torch_threads=1",)
# the RL prompts of a task written by ``realrl.impl.dataset.toy.task_files``, with reference answers
RL_FILES = {"dataset.path": "rl_train", "dataset.valid_path": "rl_valid", "tokenizer_path": "tokenizer"}
GROUP_EXPERIMENTS = ("grpo", "rloo", "reinforce_pp")  # group-relative RL: one recipe serves them all


def answer_sft_preset(epochs: int, max_seqlen: int) -> tuple[str, ...]:
    """Supervised fine-tuning of an answer task's model from random weights: a cosine schedule
    from 1e-3, batches of 64 sequences."""
    return ONE_THREAD + (
        f"exp_ctrl.total_train_epochs={epochs}",
        "model.optimizer.lr=1e-3",
        "model.optimizer.lr_scheduler_type=cosine",
        "model.optimizer.warmup_steps_proportion=0.05",
        "model.optimizer.min_lr_ratio=0.05",
        "model.optimizer.weight_decay=0.0",
        "dataset.train_bs_n_seqs=64",
        f"dataset.max_seqlen={max_seqlen}",
    )


def answer_rl_preset(
    steps: int, max_new_tokens: int, rollout: tuple[str, ...] = (), scoring: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """RL on an answer task's prompts (their reference answer passed on as metadata): 8 samples a
    prompt, one update a batch, no KL loss, the actor's learning rate 1e-4; ``rollout`` options come
    before the learning rate, ``scoring`` options last."""
    return (
        ONE_THREAD
        + (
            f"exp_ctrl.total_train_steps={steps}",
            "dataset.train_bs_n_seqs=32",
            "dataset.max_prompt_len=16",
            "dataset.metadata_keys=[answer]",
        )
        + rollout
        + (
            "actor.optimizer.lr=1e-4",
            "ppo.gen.n=8",
            f"ppo.gen.max_new_tokens={max_new_tokens}",
            "ppo.gen.top_p=1.0",
            "ppo.gen.top_k=0",
            "ppo.ppo_n_epochs=1",
            "ppo.ppo_n_minibatches=1",
            "ppo.kl_loss_coef=0.0",
        )
        + scoring
    )


def rl_recipe(preset: tuple[str, ...], summarize: Callable[[Any], dict[str, Any]]) -> Recipe:
    """Reinforcement learning from the SFT policy on a task's ``rl_train`` / ``rl_valid`` prompts."""
    return Recipe(preset, RL_FILES, {"actor.path": "sft"}, summarize=summarize)


def register_answer_task(
    name: str,
    doc: str,
    build_files: Callable[[str, Any], dict[str, str]],
    task_config: Callable[..., Any],
    paths: Callable[[str], dict[str, str]],
    model_config: Callable[[], dict[str, Any]],
    sft_preset: tuple[str, ...],
    group_recipe: Recipe,
    **more_recipes: Recipe,
) -> EmbeddedTask:
    """Register a task of supervised rows and RL prompts with reference answers (named and
    labelled ``name``), its files written by ``build_files(data_dir, task_config(seed=seed))``:
    supervised on ``sft_preset``, ``group_recipe`` for each group-relative RL experiment
    (``GROUP_EXPERIMENTS``), and ``more_recipes`` by experiment name."""
    recipes = {
        "sft": sft_recipe(sft_preset),
        **dict.fromkeys(GROUP_EXPERIMENTS, group_recipe),
        **more_recipes,
    }
    task = EmbeddedTask(
        name=name,
        label=name,
        doc=doc,
        build=functools.partial(_build_seeded, build_files, task_config),
        paths=paths,
        model_config=model_config,
        recipes=recipes,
    )
    return register_task(task)


def _build_seeded(
    build_files: Callable[[str, Any], dict[str, str]],
    task_config: Callable[..., Any],
    data_dir: str,
    seed: int,
) -> dict[str, str]:
    return build_files(data_dir, task_config(seed=seed))


@dataclasses.dataclass(frozen=True)
class BeforeAfter:
    """What a task's summary compares on its held-out data: the policy before RL and after."""

    files: dict[str, str]  # the task's file name -> path
    before: str  # the policy RL started from (the reference, else the actor's initial weights)
    after: str  # the run's final actor checkpoint


def before_after(task: EmbeddedTask, cfg: Any) -> BeforeAfter:
    """The files and the two policies of the run configured by ``cfg`` on ``task``."""
    return BeforeAfter(
        task.paths(task.data_dir(cfg.fileroot, cfg.seed)),
        cfg.ref.path or cfg.actor.path,
        final_checkpoint(cfg.fileroot, cfg.experiment_name, cfg.trial_name, "actor"),
    )


def final_checkpoint(fileroot: str, experiment_name: str, trial_name: str, role: str) -> str:
    """Where a run saves the final HF checkpoint of ``role``."""
    return os.path.join(os.path.abspath(fileroot), experiment_name, trial_name, "checkpoints", role, "final")


def has_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))


_TASKS: Registry[EmbeddedTask] = Registry("embedded task")


def register_task(task: EmbeddedTask) -> EmbeddedTask:
    return _TASKS.register(task.name, task)


def get_task(name: str) -> EmbeddedTask:
    return _TASKS.get(name)


def task_names() -> list[str]:
    return _TASKS.names()


DEFAULT_TASK = "sentiment"
