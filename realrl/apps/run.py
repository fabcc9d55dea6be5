"""Run a quickstart experiment: its prerequisites, the run itself (with recovery), and what the
user sees at the end (learning curves, the summary table and ``summary.json``)."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from realrl.api.core.dfg import build_graph, draw_graph
from realrl.api.core.model_api import SAMPLES_KEY
from realrl.api.core.system_api import ExperimentConfig
from realrl.api.quickstart.base import CommonExperimentConfig
from realrl.apps.configs import build_config
from realrl.apps.errors import UserError, data_error_message, one_line
from realrl.apps.feasibility import check_feasible, local_devices, oversubscription
from realrl.apps.main import ExperimentFailedError, run_experiment
from realrl.apps.preflight import check_paths
from realrl.apps.run_records import set_aside
from realrl.apps.summarize import EvaluationProcess, can_hand_over
from realrl.base import logging, stats
from realrl.base.peak_memory import GB, peak_rss_bytes
from realrl.experiments.common import task_model_config
from realrl.experiments.tasks import get_task, has_checkpoint
from realrl.experiments.tasks.base import Recipe
from realrl.system.standby import StandbyWorkers

logger = logging.getLogger("quickstart")
T = TypeVar("T")
SUMMARY_TIMEOUT_S = 4 * 3600.0  # an embedded task's held-out evaluation (seconds on the toy, 2 cores)

# what every experiment draws besides its own curves: evaluations on the valid set, beside the
# training curve of the same group
EVAL_CURVES = {
    "loss": ["*/eval_loss"],
    "accuracy": ["*/eval_accuracy"],
    "perplexity": ["*/eval_ppl"],
    "pair_reward": ["*/eval_chosen_reward", "*/eval_rejected_reward"],
}


def curves_of(config_cls: type[CommonExperimentConfig]) -> dict[str, list[str]]:
    """plots/<group>.png: the keys (or ``*`` patterns, ``stats.curve_keys``) each group draws: the
    experiment's own ``CURVES``, then the evaluation curves."""
    out = {group: list(keys) for group, keys in config_cls.CURVES.items()}
    for group, keys in EVAL_CURVES.items():
        out.setdefault(group, []).extend(keys)
    return out


class RunMonitor:
    """What a user sees while a run goes: a tqdm bar (step, epoch, reward, KL, loss) on a
    terminal, and the records mirrored to TensorBoard / wandb."""

    def __init__(self, run_dir: str, progress: dict[str, tuple[str, ...]], wandb_project: str | None = None):
        self.run_dir, self.wandb_project = run_dir, wandb_project
        self.progress = progress  # label -> the keys it shows, the first present in a record
        self.writer: stats.StatsWriter | None = None
        self.bar = None
        self.hidden = None  # where the bar draws when stderr is no terminal: nowhere

    def __call__(self, record: dict, total_steps: int) -> None:
        from tqdm import tqdm

        if self.writer is None:  # at the first record: importing TensorBoard delays no worker
            self.writer = stats.StatsWriter(self.run_dir, wandb_project=self.wandb_project)
        if self.bar is None:
            # no bar frames when stderr is not a terminal (a file, a pipe): the step's log line
            # says it there; the bar still counts the steps
            self.hidden = None if sys.stderr.isatty() else open(os.devnull, "w")  # noqa: SIM115
            self.bar = tqdm(
                total=total_steps,
                initial=record["step"] - 1,
                unit="step",
                dynamic_ncols=True,
                file=self.hidden or sys.stderr,
            )
        shown = {"epoch": record.get("epoch")}
        for label, keys in self.progress.items():
            value = next((record[k] for k in keys if k in record), None)
            if value is not None:
                shown[label] = f"{value:.3g}"
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(1)
        self.writer.write(record["step"], record)
        self.writer.write_samples(record["step"], record.get(SAMPLES_KEY, []))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.hidden is not None:
            self.hidden.close()
        if self.writer is not None:
            self.writer.close()


def _shared_overrides(cfg: CommonExperimentConfig) -> list[str]:
    """What a prerequisite phase inherits: where to write, the seed, how to launch, the plugins."""
    out = [f"fileroot={cfg.fileroot}", f"seed={cfg.seed}", f"mode={cfg.mode}", f"device={cfg.device}"]
    if cfg.torch_threads:
        out.append(f"torch_threads={cfg.torch_threads}")
    if cfg.colocate:
        out.append("colocate=true")
    if not cfg.retain_freed_memory:
        out.append("retain_freed_memory=false")
    if cfg.ray_address:
        out.append(f"ray_address={cfg.ray_address}")
    if ":" not in cfg.allocation_mode and cfg.allocation_mode != "manual":
        out.append(f"allocation_mode={cfg.allocation_mode}")
    if cfg.task:
        out.append(f"task={cfg.task}")
    if cfg.import_modules:  # the user's plugins serve every phase (their datasets, rewards, models)
        out.append("import_modules=[" + ",".join(f'"{m}"' for m in cfg.import_modules) + "]")
    if cfg.prerequisite_overrides:
        out.append(f"prerequisite_overrides=[{','.join(cfg.prerequisite_overrides)}]")
    return out


@dataclasses.dataclass
class Phase:
    """One run of a quickstart command: its experiment name, its options and what they make."""

    name: str
    config: CommonExperimentConfig
    experiment: ExperimentConfig


def plan_phases(name: str, cfg: CommonExperimentConfig) -> list[Phase]:
    """The phases ``cfg`` builds on that have no final checkpoint yet (each after the ones it
    builds on), then ``cfg``'s own. Every phase's options, paths and runtime config are checked
    here (``check_paths``, then ``check_feasible``), before the first of them starts and before
    anything is written: a mistake is found in seconds, not after an SFT run, and leaves no file.
    A phase whose workers outnumber this machine's CPU cores is then said in one warning line.
    On an embedded task, its files are written here once every phase passed (once per seed), and
    the phases whose checkpoints its recipe reads run first."""
    phases: list[Phase] = []
    planned: set[str] = set()
    task_files: dict[tuple, Callable[[], Any]] = {}  # written once every phase is checked

    def visit(name: str, cfg: CommonExperimentConfig, context: str) -> None:
        task = get_task(cfg.task) if cfg.task else None
        provided = task.provided(name, cfg.fileroot, cfg.seed) if task else {}
        checked(context, check_paths, cfg, provided)  # before the phases it builds on start
        for key, pre_name in task.recipe(name).checkpoints.items() if task else ():
            if key.split(".")[0] in cfg.unused_groups() or _option(cfg, key) != provided[key]:
                continue  # not read, or the user gave another checkpoint
            where = f"the {pre_name} phase this run builds on"
            try:
                pre = build_config(pre_name, _shared_overrides(cfg) + list(cfg.prerequisite_overrides))
            except UserError as e:
                raise UserError(f"{where} (prerequisite_overrides): {e}") from e
            if pre.run_dir in planned:
                continue
            if has_checkpoint(provided[key]):
                logger.info("reusing the %s checkpoint under %s", pre_name, pre.run_dir)
                planned.add(pre.run_dir)
                continue
            visit(pre_name, pre, where)
        planned.add(cfg.run_dir)
        phases.append(Phase(name, cfg, checked(context, feasible_experiment, cfg)))
        if task:
            key = (task.name, os.path.abspath(cfg.fileroot), cfg.seed)
            task_files.setdefault(key, functools.partial(task.files, cfg.fileroot, cfg.seed))

    visit(name, cfg, "")
    warn_oversubscribed(phases)
    for write in task_files.values():
        write()
    return phases


def feasible_experiment(cfg: CommonExperimentConfig) -> ExperimentConfig:
    """``cfg``'s runtime config, once the pre-run feasibility check accepts it (a model an
    earlier phase has yet to train is planned from the embedded task's model config) and, run
    locally, this machine has the GPUs its workers need (as ``run_experiment`` checks them)."""
    exp = cfg.initial_setup()
    check_feasible(exp, fallback=task_model_config(cfg))
    if cfg.mode == "local":  # the GPUs its workers get (a Ray cluster's are known once joined)
        local_devices(exp)
    return exp


def warn_oversubscribed(phases: list[Phase]) -> None:
    """One warning line when a local phase's workers outnumber the CPU cores (the phase with
    the most workers): the run goes on, slower."""
    local = [p for p in phases if p.config.mode == "local"]
    if not local:
        return
    busiest = max(local, key=lambda p: p.experiment.n_model_workers)
    note = oversubscription(busiest.experiment)
    if note is not None:
        logger.warning("%s (%s): %s", busiest.name, busiest.config.allocation_mode, note)


def fresh_records(phase: Phase) -> None:
    """A new run of ``phase`` keeps its records apart from an earlier run's in the same trial
    folder (``realrl.apps.run_records``), said in one line; a resumed run continues its own."""
    if phase.experiment.resume:
        return
    moved = set_aside(phase.config.run_dir, phase.config.fileroot)
    if moved is not None:
        logger.info(
            "%s: the earlier run's records in this trial folder moved to %s (checkpoints stay in place)",
            phase.name,
            moved,
        )


def _option(cfg: Any, key: str) -> Any:
    """The value of a dotted option key (``actor.path``) of a config dataclass."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def checked(context: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, a configuration error raised as a ``UserError`` led by ``context``."""
    try:
        return fn(*args)
    except (ValueError, LookupError, OSError) as e:  # ValueError includes UserError, DataError
        raise UserError(f"{context}: {one_line(str(e))}" if context else one_line(str(e))) from e


def run_one(
    cfg: CommonExperimentConfig,
    standby: StandbyWorkers | None = None,
    warm_next: bool = False,
    exp: ExperimentConfig | None = None,
) -> list[dict]:
    """Launch ``cfg`` (in ``standby`` processes first, local mode); ``exp``: its runtime config
    when already made. ``recover_mode=resume`` continues from the run's last recover point;
    ``auto`` restarts a failed run from its last recover point up to ``recover_retries`` times
    (not when the data is at fault: a restart would fail the same way)."""
    exp = exp or cfg.initial_setup()
    os.makedirs(exp.run_dir, exist_ok=True)
    graph = build_graph(exp.mfcs)  # checked now; drawn once the workers are gone (matplotlib's memory)
    attempts = 1 + (cfg.recover_retries if cfg.recover_mode == "auto" else 0)
    monitor = RunMonitor(exp.run_dir, dict(type(cfg).PROGRESS), cfg.wandb_project)
    local = {"standby": standby, "warm_next": warm_next} if cfg.mode == "local" else {}
    try:
        for attempt in range(1, attempts + 1):
            try:
                return run_experiment(
                    exp, mode=cfg.mode, ray_address=cfg.ray_address, on_step=monitor, **local
                )
            except ExperimentFailedError as e:
                if attempt == attempts or data_error_message(e) is not None:
                    raise
                logger.error(
                    "run failed (attempt %d of %d): %s; resuming from the last recover point",
                    attempt,
                    attempts,
                    e,
                )
                exp.resume = True
    finally:
        monitor.close()
        draw_graph(graph, os.path.join(exp.run_dir, "dataflow_graph.png"))
    raise AssertionError("unreachable")


def run_quickstart(
    name: str,
    cfg: CommonExperimentConfig,
    standby: StandbyWorkers | None = None,
    phases: list[Phase] | None = None,
) -> dict:
    """Every phase checked first (``plan_phases``, unless ``phases`` is its answer already), then
    run; the summary of the last one, ``cfg``'s own."""
    start = time.time()
    seconds: dict[str, float] = {}  # where the time went, phase by phase (summary.json)
    memory: dict[str, dict[str, float]] = {}  # and the workers' peak memory, phase by phase
    *before, phase = phases or plan_phases(name, cfg)
    for pre in before:
        logger.info("running the %s phase first (no checkpoint under %s)", pre.name, pre.config.run_dir)
        fresh_records(pre)
        t = time.time()
        memory[pre.name] = phase_memory(run_one(pre.config, standby, warm_next=True, exp=pre.experiment))
        seconds[pre.name] = round(time.time() - t, 2)
    fresh_records(phase)  # before the evaluation's process opens its log there
    recipe = get_task(cfg.task).recipe(name) if cfg.task else None
    evaluation = None
    if recipe is not None and recipe.summarize is not None and not evaluates(cfg):
        recipe = dataclasses.replace(recipe, summarize=None)  # toy_eval_prompts=0: none wanted
    if recipe is not None and recipe.summarize is not None and can_hand_over(cfg):
        # in a process of its own (it loads models; this one imports no torch), started now so
        # that its imports overlap the phase
        evaluation = EvaluationProcess(cfg, cfg.run_dir)
    try:
        t = time.time()
        records = run_one(cfg, standby, exp=phase.experiment)
        seconds[name] = round(time.time() - t, 2)
        memory[name] = phase_memory(records)
        return _summarize(name, cfg, records, recipe, evaluation, start, seconds, memory)
    finally:
        if evaluation is not None:
            evaluation.close()


def evaluates(cfg: CommonExperimentConfig) -> bool:
    """Whether the run ends with its embedded task's held-out evaluation (``toy_eval_prompts``,
    where the experiment has it: 0 turns it off, for runs whose summary needs no task figures)."""
    return getattr(cfg, "toy_eval_prompts", 1) > 0


def phase_memory(records: list[dict]) -> dict[str, float]:
    """A phase's peak memory: its last step record's ``memory`` (each worker's peak since it
    started for the phase); empty for a phase with no steps."""
    return dict(records[-1].get("memory", {})) if records else {}


def _summarize(
    name: str,
    cfg: CommonExperimentConfig,
    records: list[dict],
    recipe: Recipe | None,
    evaluation: EvaluationProcess | None,
    start: float,
    seconds: dict[str, float],
    memory: dict[str, dict[str, float]],
) -> dict:
    """The run's plots and ``summary.json``: the last step's figures, samples, the task's
    held-out evaluation and where the time went."""
    run_dir = cfg.run_dir
    stats_path = os.path.join(run_dir, "stats.jsonl")
    evaluating = time.time()
    if evaluation is not None:
        evaluation.request(name)  # it evaluates while this process draws the plots
    t = time.time()
    plots = (
        stats.plot_curves(stats_path, os.path.join(run_dir, "plots"), curves_of(type(cfg)))
        if os.path.exists(stats_path)
        else []
    )
    seconds["plots"] = round(time.time() - t, 2)
    summary: dict = {"experiment": name, "steps": len(records), "allocation_mode": cfg.allocation_mode}
    if records:
        summary.update({k: v for k, v in records[-1].items() if "/" in k and isinstance(v, float)})

    last_samples = next((r[SAMPLES_KEY] for r in reversed(records) if r.get(SAMPLES_KEY)), None)
    if last_samples:  # what the policy writes, on any data (a task's summary may show its own)
        summary[SAMPLES_KEY] = last_samples
    if recipe is not None and recipe.summarize is not None:
        if evaluation is not None:
            try:
                summary.update(evaluation.figures(SUMMARY_TIMEOUT_S))
            except RuntimeError as e:
                raise ExperimentFailedError(f"{name}: the run finished, but {e}") from e
        else:  # a config class of the user's script: only this process knows it
            summary.update(recipe.summarize(cfg))
        seconds["evaluation"] = round(time.time() - evaluating, 2)  # beside the plots
    summary["wall_seconds"] = round(time.time() - start, 1)
    summary["phase_seconds"] = seconds
    for figure in dict.fromkeys(k for figures in memory.values() for k in figures):
        # e.g. phase_worker_peak_rss_gb: {"sft": 1.1, "rw": 1.0, "ppo": 1.4}
        summary[f"phase_{figure}"] = {p: f[figure] for p, f in memory.items() if figure in f}
    summary["master_peak_rss_gb"] = round(peak_rss_bytes() / GB, 4)
    stats.write_summary(run_dir, summary)
    logger.info(
        "outputs under %s (stats.jsonl, plots: %s, summary.json)",
        run_dir,
        [os.path.basename(p) for p in plots],
    )
    return summary
