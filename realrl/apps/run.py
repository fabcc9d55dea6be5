"""Run a quickstart experiment: its prerequisites, the run itself (with recovery), and what the
user sees at the end (learning curves, the summary table and ``summary.json``)."""

from __future__ import annotations

import os
import time

from realrl.api.core.dfg import build_graph, draw_graph
from realrl.api.quickstart.base import CommonExperimentConfig
from realrl.apps.main import ExperimentFailedError, run_experiment
from realrl.base import logging, stats
from realrl.experiments.toy import final_checkpoint, has_checkpoint
from realrl.system.standby import StandbyWorkers

logger = logging.getLogger("quickstart")

CURVES = {
    "reward": ["actor_train/task_reward", "actor_train/reward", "rwTrain/eval_accuracy"],
    "kl": ["actor_train/kl", "actor_train/kl_rewards"],
    "loss": [
        "trainDefault/loss",
        "rwTrain/loss",
        "actor_train/loss",
        "critic_train/loss",
        "actor_train/dpo_loss",
    ],
    "accuracy": ["rwTrain/accuracy", "actor_train/accuracy"],
}


# what the progress bar shows, by the first key present in a step's record
PROGRESS_KEYS = {
    "reward": ("actor_train/task_reward", "rwTrain/accuracy", "actor_train/accuracy"),
    "kl": ("actor_train/ref_kl", "actor_train/kl"),
    "loss": ("trainDefault/loss", "rwTrain/loss", "actor_train/loss", "actor_train/dpo_loss"),
}


class RunMonitor:
    """What a user sees while a run goes: a tqdm bar (step, epoch, reward, KL, loss) and the
    records mirrored to TensorBoard / wandb."""

    def __init__(self, run_dir: str, wandb_project: str | None = None):
        self.run_dir, self.wandb_project = run_dir, wandb_project
        self.writer: stats.StatsWriter | None = None
        self.bar = None

    def __call__(self, record: dict, total_steps: int) -> None:
        from tqdm import tqdm

        if self.writer is None:  # at the first record: importing TensorBoard delays no worker
            self.writer = stats.StatsWriter(self.run_dir, wandb_project=self.wandb_project)
        if self.bar is None:
            self.bar = tqdm(total=total_steps, initial=record["step"] - 1, unit="step", dynamic_ncols=True)
        shown = {"epoch": record.get("epoch")}
        for label, keys in PROGRESS_KEYS.items():
            value = next((record[k] for k in keys if k in record), None)
            if value is not None:
                shown[label] = f"{value:.3g}"
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(1)
        self.writer.write(record["step"], record)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()


def _shared_overrides(cfg: CommonExperimentConfig) -> list[str]:
    """What a prerequisite phase inherits: where to write, the seed, how to launch."""
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
    if cfg.prerequisite_overrides:
        out.append(f"prerequisite_overrides=[{','.join(cfg.prerequisite_overrides)}]")
    return out


def run_prerequisites(cfg: CommonExperimentConfig, standby: StandbyWorkers | None = None) -> None:
    """Run the phases ``cfg`` builds on unless their final checkpoints already exist (each one
    warms up standby workers for the phase after it)."""
    from realrl.apps.quickstart import build_config

    for name, extra in getattr(cfg, "prerequisites", lambda: [])():
        pre = build_config(name, _shared_overrides(cfg) + extra + list(cfg.prerequisite_overrides))
        if has_checkpoint(final_checkpoint(pre.fileroot, pre.experiment_name, pre.trial_name, "default")):
            logger.info("reusing the %s checkpoint under %s", name, pre.run_dir)
            continue
        logger.info("running the %s phase first (no checkpoint under %s)", name, pre.run_dir)
        run_prerequisites(pre, standby)
        run_one(pre, standby, warm_next=True)


def run_one(
    cfg: CommonExperimentConfig, standby: StandbyWorkers | None = None, warm_next: bool = False
) -> list[dict]:
    """Launch ``cfg`` (in ``standby`` processes first, local mode). ``recover_mode=resume``
    continues from the run's last recover point; ``auto`` restarts a failed run from its last
    recover point up to ``recover_retries`` times."""
    exp = cfg.initial_setup()
    os.makedirs(exp.run_dir, exist_ok=True)
    draw_graph(build_graph(exp.mfcs), os.path.join(exp.run_dir, "dataflow_graph.png"))
    attempts = 1 + (cfg.recover_retries if cfg.recover_mode == "auto" else 0)
    monitor = RunMonitor(exp.run_dir, cfg.wandb_project)
    local = {"standby": standby, "warm_next": warm_next} if cfg.mode == "local" else {}
    try:
        for attempt in range(1, attempts + 1):
            try:
                return run_experiment(
                    exp, mode=cfg.mode, ray_address=cfg.ray_address, on_step=monitor, **local
                )
            except ExperimentFailedError as e:
                if attempt == attempts:
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
    raise AssertionError("unreachable")


def run_quickstart(name: str, cfg: CommonExperimentConfig, standby: StandbyWorkers | None = None) -> dict:
    start = time.time()
    run_prerequisites(cfg, standby)
    records = run_one(cfg, standby)
    run_dir = cfg.run_dir
    stats_path = os.path.join(run_dir, "stats.jsonl")
    plots = (
        stats.plot_curves(stats_path, os.path.join(run_dir, "plots"), CURVES)
        if os.path.exists(stats_path)
        else []
    )
    summary: dict = {"experiment": name, "steps": len(records)}
    if records:
        summary.update({k: v for k, v in records[-1].items() if "/" in k and isinstance(v, float)})
    summary.update(getattr(cfg, "summarize", lambda: {})())
    summary["wall_seconds"] = round(time.time() - start, 1)
    stats.write_summary(run_dir, summary)
    logger.info(
        "outputs under %s (stats.jsonl, plots: %s, summary.json)",
        run_dir,
        [os.path.basename(p) for p in plots],
    )
    return summary
