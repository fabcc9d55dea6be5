"""Shared pieces of ``bench_vs_trl.py``: the settings both sides use, the common starting point
(toy data, one random-weight checkpoint and its tokenizer), and how a side is measured (a child
process whose whole process tree is sampled for RSS)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

TRIAL = "bench"


# what ``--smoke`` shrinks (the GRPO batch stays a whole number of groups per minibatch)
SMOKE_BATCHES = {"rw_pairs": 8, "grpo_prompts": 4, "ppo_epochs": 2}


@dataclasses.dataclass
class BenchSpec:
    """What both sides share: data, model, batch sizes, lengths, optimiser, number of steps."""

    fileroot: str
    seed: int = 1
    # (a) reward modeling: 64 pairs a step, max 64 tokens a sequence, constant LR (the toy recipe's RM LR)
    rw_steps: int = 20
    rw_pairs: int = 64
    rw_lr: float = 5e-4
    max_seqlen: int = 64
    # (b) GRPO: 64 prompts x 4 answers a step, 13 new tokens, 4 epochs x 4 minibatches, k3 KL 0.04
    grpo_steps: int = 6
    grpo_prompts: int = 64
    grpo_n: int = 4
    max_new_tokens: int = 13
    max_prompt_len: int = 16
    grpo_lr: float = 1e-4
    ppo_epochs: int = 4
    ppo_minibatches: int = 4
    kl_coef: float = 0.04
    # shared AdamW settings (realrl's OptimizerConfig defaults)
    beta2: float = 0.95
    adam_eps: float = 1e-5
    grad_clip: float = 1.0
    # held-out evaluation
    eval_prompts: int = 800
    # None: both sides start from the same random weights; else an HF checkpoint folder (e.g. the
    # toy SFT model) whose body both sides start from (the RM head is drawn from ``seed``)
    init: str | None = None
    # realrl's model workers (allocation d<workers>: every model data-parallel over them, the
    # batch split between them); TRL runs one process
    workers: int = 1
    # realrl's trained model with its blocks through torch.compile (engine.compile=on), Inductor's
    # cache under the bench folder: a benchmark's first round compiles cold, later ones warm
    compile: bool = False

    @classmethod
    def sized(cls, fileroot: str, smoke: bool = False, **fields) -> BenchSpec:
        """The settings on ``fileroot``; with ``smoke`` (a benchmark's ``--smoke``), batches of a
        few sequences and 2 GRPO epochs: every part of a step still runs, in a fraction of a second."""
        return cls(fileroot=fileroot, **{**(SMOKE_BATCHES if smoke else {}), **fields})

    @property
    def bench_dir(self) -> str:
        root = os.path.join(os.path.abspath(self.fileroot), "bench_vs_trl")
        if self.init is None:
            return root
        tag = hashlib.sha1(os.path.abspath(self.init).encode()).hexdigest()[:8]
        return os.path.join(root, f"init-{tag}")

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(dataclasses.asdict(self), f)

    @classmethod
    def load(cls, path: str) -> BenchSpec:
        with open(path) as f:
            return cls(**json.load(f))


def prepare(spec: BenchSpec) -> dict[str, str]:
    """The toy data (built once per seed), and the SAME initial weights for both sides: ``init_lm``
    (policy) and ``init_rm`` (the same body with a scalar head), both HF llama folders holding the
    toy tokenizer, random from ``seed`` or read from ``spec.init``. TRL reads the RM head from
    ``critic_head.safetensors``."""
    import torch

    from realrl.api.core.data_api import load_hf_tokenizer
    from realrl.api.core.model_api import ReaLModelConfig
    from realrl.experiments.tasks import SENTIMENT
    from realrl.impl.model.nn import ReaLModel

    paths = SENTIMENT.files(spec.fileroot, spec.seed)
    os.makedirs(spec.bench_dir, exist_ok=True)
    tokenizer = load_hf_tokenizer(paths["tokenizer"])
    for name, is_critic in (("init_lm", False), ("init_rm", True)):
        out = os.path.join(spec.bench_dir, name)
        paths[name] = out
        if os.path.isfile(os.path.join(out, "config.json")):
            continue
        torch.manual_seed(spec.seed)  # same seed: init_rm's body equals init_lm's
        if spec.init is None:
            cfg = ReaLModelConfig(**SENTIMENT.model_config(), is_critic=is_critic)
            model = ReaLModel(cfg, dtype=torch.float32)
        else:
            model = ReaLModel.from_pretrained(spec.init, is_critic=is_critic, dtype=torch.float32)
        model.save_pretrained(out, tokenizer)
    return paths


def known_paths(spec: BenchSpec) -> dict[str, str]:
    """The paths ``prepare`` wrote, without loading a tokenizer or building a model: what the
    measured children use, so their memory holds only what each side itself needs."""
    from realrl.experiments.tasks import SENTIMENT

    paths = SENTIMENT.paths(SENTIMENT.data_dir(spec.fileroot, spec.seed))
    paths.update({n: os.path.join(spec.bench_dir, n) for n in ("init_lm", "init_rm")})
    missing = [p for p in paths.values() if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(f"bench_vs_trl: run prepare() first; missing {missing}")
    return paths


def rw_tokens_per_pair(train_path: str, tokenizer_path: str, max_seqlen: int, limit: int = 4000) -> float:
    """Mean real (unpadded) tokens of chosen + rejected, tokenized as both sides do
    (prompt + answer + EOS, TRL's recipe that realrl's rw_paired follows)."""
    from realrl.api.core.data_api import load_hf_tokenizer

    tok = load_hf_tokenizer(tokenizer_path)
    totals = []
    with open(train_path) as f:
        for i, line in enumerate(f):
            if i >= limit:
                break
            row = json.loads(line)
            lens = [
                len(tok(row["prompt"] + row[k] + tok.eos_token)["input_ids"]) for k in ("chosen", "rejected")
            ]
            if max(lens) <= max_seqlen:
                totals.append(sum(lens))
    return statistics.fmean(totals)


# ---------------------------------------------------------------------------------- measuring


def tree_usage(proc) -> tuple[int, float, dict[int, tuple[str, int, float]]]:
    """(RSS bytes, CPU seconds, {pid: (name, RSS, CPU seconds)}) of a process and all its
    descendants (ones that vanished meanwhile count 0)."""
    import psutil

    rss, cpu, per = 0, 0.0, {}
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0, 0.0, {}
    for p in procs:
        try:
            with p.oneshot():
                r = p.memory_info().rss
                t = p.cpu_times()
                name = "worker" if "realrl.apps.remote" in p.cmdline() else "main"
        except psutil.NoSuchProcess:
            continue
        rss += r
        cpu += t.user + t.system
        per[p.pid] = (name, r, t.user + t.system)
    return rss, cpu, per


def run_measured(argv: list[str], log_path: str, threads: int | None = None, interval: float = 0.05) -> dict:
    """Run ``argv`` as a child; sample the RSS and CPU time of its whole process tree (realrl's
    workers are its subprocesses) every ``interval`` s. ``threads`` sets OMP/MKL threads for the
    whole tree (realrl's workers inherit the environment; torch reads it at start). Returns the peak summed RSS, the CPU-time
    series (to charge CPU seconds to each step), wall time and the load averages."""
    import psutil

    load_before = os.getloadavg()
    start = time.time()
    series: list[tuple[float, float]] = []
    peak = 0
    per_peak: dict[int, tuple[str, int]] = {}
    by_name: dict[str, list[tuple[float, float]]] = {}  # CPU series per process kind
    with open(log_path, "w") as log:
        env = dict(os.environ)
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        proc = psutil.Process(child.pid)
        while child.poll() is None:
            rss, cpu, per = tree_usage(proc)
            peak = max(peak, rss)
            for pid, (name, r, _) in per.items():
                seen, top = per_peak.get(pid, (name, 0))
                # a worker stays one (an exiting process's command line reads empty)
                per_peak[pid] = ("worker" if "worker" in (seen, name) else name, max(r, top))
            now = time.time()
            series.append((now, cpu))
            for kind in {n for n, _, _ in per.values()}:
                by_name.setdefault(kind, []).append((now, sum(c for n, _, c in per.values() if n == kind)))
            time.sleep(interval)
    if child.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{' '.join(argv)} exited with {child.returncode}; log {log_path}:\n{tail}")
    return {
        "t_start": start,
        "peak_rss_mb": peak / 2**20,
        "peak_rss_mb_per_process": {f"{pid} {n}": r / 2**20 for pid, (n, r) in per_peak.items()},
        "process_wall_s": time.time() - start,
        "load_before": load_before[0],
        "load_after": os.getloadavg()[0],
        "cpu_series": series,
        "cpu_series_by_process": by_name,
    }


def cpu_at(series: list[tuple[float, float]], t: float) -> float:
    """Tree CPU seconds at time ``t``, interpolated between samples. CPU time only grows, but
    a sample can miss a process that just started, so take the running maximum."""
    best, prev = 0.0, (series[0][0], 0.0)
    for ts, cpu in series:
        best = max(best, cpu)
        if ts >= t:
            t0, c0 = prev
            return c0 + (best - c0) * ((t - t0) / (ts - t0) if ts > t0 else 1.0)
        prev = (ts, best)
    return best


def cpu_per_step(series: list[tuple[float, float]], ends: list[float]) -> float:
    """Median CPU seconds of the whole process tree per step (steps after the first)."""
    cpus = [cpu_at(series, t) for t in ends]
    per = [b - a for a, b in zip(cpus, cpus[1:])]
    return statistics.median(per) if per else float("nan")


def step_seconds(end_times: list[float], start: float | None = None) -> list[float]:
    """Durations of steps from their end timestamps (the first from ``start`` when given)."""
    times = ([start] if start is not None else []) + list(end_times)
    return [b - a for a, b in zip(times, times[1:])]


def summarize_steps(ends: list[float], start: float) -> dict:
    """Median step time over steps after the first (warm-up), the first step on its own (from
    the start of training), and the steps' end timestamps (to charge CPU time to steps)."""
    durations = step_seconds(ends, start)
    steady = durations[1:] if len(durations) > 1 else durations
    return {
        "step_s": statistics.median(steady),
        "step_s_mean": statistics.fmean(steady),
        "first_step_s": durations[0],
        "n_steps": len(durations),
        "step_ends": list(ends),
    }


def python() -> str:
    return sys.executable
