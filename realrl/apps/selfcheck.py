"""``python -m realrl.apps.selfcheck``: one command that checks a machine, GPU or not.

On a CUDA machine it runs, each as a subprocess with a time limit: the ``gpu``-marked tests, the
main job (toy PPO on the GPU), GRPO with two workers sharing the GPU, tensor parallelism, FSDP,
a per-call layout with reallocation, ``benchmarks/bench_generate.py`` against its targets, and
``benchmarks/bench_forward.py`` (forward + backward against transformers). Without CUDA it runs the
same experiment checks with ``device=cpu`` and the generation benchmark at a tiny size. A failing
check does not stop the others; at the end one report, ``selfcheck.json`` with ``selfcheck.md``
beside it, and a table on stdout. Exit status 0 when every check passed or was skipped, else 1
(2 for a wrong option). ``docs/selfcheck.md`` says how to read the report.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from realrl.apps.selfcheck_report import (
    FAIL,
    SKIPPED,
    CheckResult,
    Parser,
    Target,
    build_report,
    exit_status,
    judge_targets,
    parse_bench_forward,
    parse_bench_generate,
    parse_pytest,
    render_markdown,
    render_table,
    summary_figures,
    tail,
    verdict,
)

NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is false"
STOP_GRACE_S = 30  # after SIGTERM, how long a timed-out check may take to stop its workers

# README.md, "Benchmarks": realrl's eager decoding of the 1.1B llama on one H100 (2,538 tok/s); the
# CUDA-graph decoding's targets are 5x that and 30 % of the memory-bandwidth roofline
EAGER_H100_TOK_S = 2538
GENERATE_TARGETS = (
    Target("decode_tok_s", ">=", 5 * EAGER_H100_TOK_S, "5 x 2,538 tok/s, eager decoding on one H100"),
    Target("roofline_pct", ">=", 30.0, "30 % of the bandwidth roofline"),
)
# README.md, "What the main job does": its targets on the whole (not shortened) run
MAIN_TARGETS = (
    Target("rm_accuracy", ">=", 0.9, "RM held-out accuracy"),
    Target("gain_in_sft_std", ">=", 1.0, "PPO >= SFT mean + 1 SFT std"),
    Target("wall_seconds", "<=", 600.0, "under 10 minutes"),
)
MAIN_FIGURES = (
    "rm_accuracy",
    "sft_true_reward_mean",
    "sft_true_reward_std",
    "true_reward_mean",
    "true_reward_std",
    "gain_in_sft_std",
    "kl",
    "wall_seconds",
    "steps",
)
SHORT_FIGURES = ("steps", "wall_seconds", "true_reward_mean", "kl")
# the phases a shortened run builds on, when they are not under fileroot yet, shortened too
SHORT_PREREQUISITES = 'prerequisite_overrides=["exp_ctrl.total_train_steps=2","dataset.train_bs_n_seqs=8"]'
# the decoding bench: the README's target row on CUDA; on a CPU the smallest run that still times
GENERATE_ARGS = {
    "cuda": ("--device", "cuda", "--size", "1b", "--n-seqs", "64", "--min-len", "32", "--max-len", "512")
    + ("--max-new", "256", "--eos-ids", "50"),
    "cpu": ("--device", "cpu", "--n-seqs", "4", "--min-len", "8", "--max-len", "16", "--max-new", "8")
    + ("--repeats", "1"),
}
GENERATE_HEADLINE = {"cuda": "realrl cuda_graph", "cpu": "realrl eager"}  # decoding=auto's choice
# forward + backward against transformers: the README's H100 row (1.1B llama, 16 seqs of 64-1024)
FORWARD_ARGS = ("--device", "cuda", "--size", "1b", "--n-seqs", "16", "--min-len", "64", "--max-len", "1024")


@dataclasses.dataclass(frozen=True)
class Check:
    """One check: a command run in the repository checkout with a time limit, how to read its
    figures (``parse(output, summary)``, ``summary``: the run's summary.json when ``summary_path``
    is set) and the targets they must meet."""

    name: str
    what: str
    argv: tuple[str, ...]
    timeout_s: float
    parse: Parser
    needs_cuda: bool = False
    targets: tuple[Target, ...] = ()
    summary_path: str | None = None
    requires: tuple[str, ...] = ()  # paths that must exist, else the check is skipped naming them
    shown: tuple[str, ...] = ()  # figures the table shows
    # on CUDA: GPUs it needs. Tensor parallelism and FSDP need NCCL, which refuses two workers
    # on one GPU, so their checks need a GPU per worker; everything else shares one
    gpus: int = 1

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def _from_summary(keys: Sequence[str], prefixes: Sequence[str] = ()) -> Parser:
    return lambda text, summary: summary_figures(summary, keys, prefixes)


def _generate_parser(headline: str) -> Parser:
    return lambda text, summary: parse_bench_generate(text, headline)


def build_checks(device: str, repo: str, fileroot: str, quick: bool = False) -> list[Check]:
    """Every check, in the order they run, for ``device`` ("cuda" or "cpu"): the experiment checks
    share ``fileroot``, so the SFT and reward-model phases the main job trains are reused by the
    later ones (each run has its own ``trial_name``)."""
    py = sys.executable
    steps = 2 if quick else 3
    short = (
        f"exp_ctrl.total_train_steps={steps}",
        "dataset.train_bs_n_seqs=16",
        "ppo.ppo_n_minibatches=2",
        "toy_eval_prompts=64",
        SHORT_PREREQUISITES,
    )
    shared_gpu = ("colocate=true",) if device == "cuda" else ()  # two workers on the one GPU

    def quickstart(experiment: str, trial: str, *options: str) -> tuple[tuple[str, ...], str]:
        argv = (
            py,
            "-m",
            "realrl.apps.quickstart",
            experiment,
            f"device={device}",
            f"fileroot={fileroot}",
            f"trial_name=selfcheck-{trial}",
            *options,
        )
        return argv, os.path.join(fileroot, experiment, f"selfcheck-{trial}", "summary.json")

    def shortened(
        experiment: str,
        name: str,
        what: str,
        *options: str,
        prefixes: tuple[str, ...] = (),
        targets=(),
        gpus: int = 1,
    ) -> Check:
        argv, summary = quickstart(experiment, name, *options, *shared_gpu, *short)
        return Check(
            name,
            what,
            argv,
            900,
            _from_summary(SHORT_FIGURES, prefixes),
            targets=(Target("steps", "==", steps, "the shortened run's steps"), *targets),
            summary_path=summary,
            shown=(*SHORT_FIGURES, *(f"{p}{k}" for p in prefixes for k in ("count", "bytes"))),
            gpus=gpus,
        )

    # a per-call layout's check: the actor's weights moved before every generation
    actor_moved = {
        "prefixes": ("realloc/actor/",),
        "targets": (Target("realloc/actor/bytes", ">=", 1, "the actor's weights moved"),),
    }
    main_argv, main_summary = quickstart("ppo", "main", *(short if quick else ()))
    main_targets = (Target("steps", "==", steps, "the shortened run's steps"),) if quick else MAIN_TARGETS
    tests = os.path.join(repo, "tests")
    bench_generate = os.path.join(repo, "benchmarks", "bench_generate.py")
    bench_forward = os.path.join(repo, "benchmarks", "bench_forward.py")
    return [
        Check(
            "gpu_tests",
            "the gpu-marked tests",
            (py, "-m", "pytest", "-q", "-m", "gpu", tests),
            1200,
            parse_pytest,
            needs_cuda=True,
            requires=(tests,),
            shown=("passed", "failed", "skipped", "errors"),
        ),
        Check(
            "main",
            "the main job: SFT, reward model, PPO on the toy task" + (", shortened" if quick else ""),
            main_argv,
            900 if quick else 1800,
            _from_summary(MAIN_FIGURES),
            targets=main_targets,
            summary_path=main_summary,
            shown=(
                "rm_accuracy",
                "sft_true_reward_mean",
                "true_reward_mean",
                "gain_in_sft_std",
                "kl",
                "wall_seconds",
            ),
        ),
        shortened("grpo", "grpo_d2", "GRPO, two data-parallel workers", "allocation_mode=d2"),
        # PPO: every model it holds (actor, critic, reference, reward model) is split; GRPO's reward
        # function has no weights to split
        shortened(
            "ppo",
            "tp",
            "PPO, every model split by tensor parallelism over two workers",
            "allocation_mode=d1m2p1",
            gpus=2,
        ),
        shortened(
            "grpo",
            "fsdp",
            "GRPO, the actor sharded by FSDP2 over two workers",
            "allocation_mode=d2",
            "actor.engine.fsdp=true",
            gpus=2,
        ),
        shortened(
            "grpo",
            "per_call",
            "GRPO, the actor trains split by tensor parallelism and generates as two replicas",
            # each generation replica receives the half of the weights it lacks before every step
            # (the other way round, d2 -> m2, each rank slices its own replica: no bytes move)
            'allocation_mode="actor_train:d1m2p1,actor_gen:d2m1p1,*:d1m1p1"',
            **actor_moved,
            gpus=2,
        ),
        shortened(
            "grpo",
            "per_call_shared",
            "GRPO, the actor trains on one worker and generates as two replicas (on one GPU: both)",
            # the second replica receives the whole model before every step, through host memory
            'allocation_mode="actor_train:d1m1p1,actor_gen:d2m1p1,*:d1m1p1"',
            **actor_moved,
        ),
        Check(
            "bench_generate",
            "decoding tokens/s against transformers and the bandwidth roofline",
            (py, bench_generate, *GENERATE_ARGS[device]),
            900,
            _generate_parser(GENERATE_HEADLINE[device]),
            targets=GENERATE_TARGETS if device == "cuda" else (),
            requires=(bench_generate,),
            shown=("decode_tok_s", "roofline_pct", "speedup_vs_hf", "bandwidth_gb_s"),
        ),
        Check(
            "train_vs_hf",
            "forward + backward tokens/s, packed ReaLModel against padded transformers",
            (py, bench_forward, *FORWARD_ARGS, "--repeats", "3"),
            900,
            parse_bench_forward,
            needs_cuda=True,
            requires=(bench_forward,),
            shown=("realrl_tok_s", "hf_tok_s", "speedup_vs_hf", "realrl_peak_gib", "hf_peak_gib"),
        ),
    ]


def select_checks(
    checks: Sequence[Check],
    has_cuda: bool,
    only: Sequence[str] = (),
    skip_cpu: bool = False,
    exists: Callable[[str], bool] = os.path.exists,
    n_gpus: int | None = None,
) -> list[tuple[Check, str]]:
    """The checks to report, each with why it is skipped ("" when it runs): ``only`` keeps the
    named ones (a name that is no check is a ValueError listing them); without CUDA the GPU-only
    ones are skipped, and all with ``skip_cpu``; a check whose files are missing is skipped."""
    n_gpus = (1 if has_cuda else 0) if n_gpus is None else n_gpus
    names = [c.name for c in checks]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; the checks are {names}")
    out = []
    for check in checks:
        if only and check.name not in only:
            continue
        missing = [p for p in check.requires if not exists(p)]
        if check.needs_cuda and not has_cuda:
            why = NO_CUDA
        elif has_cuda and check.gpus > n_gpus:
            why = (
                f"needs {check.gpus} GPUs, {n_gpus} visible: tensor parallelism and FSDP need NCCL, "
                "which refuses two workers on one GPU"
            )
        elif skip_cpu and not has_cuda:
            why = "--skip-cpu on a machine without CUDA"
        elif missing:
            why = f"{missing[0]} not found: run from the repository checkout or give --repo DIR"
        else:
            why = ""
        out.append((check, why))
    return out


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the check's process group (realrl stops its workers on it), SIGKILL if it lingers."""
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_check(check: Check, cwd: str, log_path: str, timeout_scale: float = 1.0) -> CheckResult:
    """Run ``check`` (output to ``log_path``), then read its figures and judge it. Whatever goes
    wrong becomes a failed result: the next check still runs."""
    timeout_s = check.timeout_s * timeout_scale
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start, started_at = time.monotonic(), time.time()
    returncode, timed_out, problem = None, False, ""
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                check.argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                if proc.poll() is None:  # timed out, or this command was interrupted
                    _stop(proc)
    except OSError as e:
        return CheckResult(check.name, check.command, FAIL, reason=f"could not start: {e}", log=log_path)
    seconds = time.monotonic() - start
    with open(log_path, errors="replace") as f:
        text = f.read()
    summary = None
    if check.summary_path:
        try:
            if os.path.getmtime(check.summary_path) < started_at:
                raise FileNotFoundError  # an earlier run's, in a --fileroot given again
            with open(check.summary_path) as f:
                summary = json.load(f)
        except (OSError, ValueError) as e:
            problem = f"no summary.json written by this run at {check.summary_path}" + (
                f" ({type(e).__name__}: {e})" if isinstance(e, ValueError) else ""
            )
    try:
        figures = check.parse(text, summary)
    except Exception as e:  # noqa: BLE001 - a parser's bug fails this check only, by name
        figures, problem = {}, problem or f"could not read its figures: {type(e).__name__}: {e}"
    targets = judge_targets(figures, check.targets)
    status, reason = verdict(returncode, timed_out, timeout_s, targets, problem)
    return CheckResult(
        check.name,
        check.command,
        status,
        round(seconds, 1),
        figures,
        targets,
        reason,
        tail(text),
        log_path,
        list(check.shown),
    )


def _version(*distributions: str) -> str:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "absent"


def _output(argv: Sequence[str], cwd: str | None = None) -> str | None:
    """A probe's first output line, None when it is absent or fails."""
    try:
        out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_environment(repo: str, has_cuda: bool) -> dict[str, Any]:
    """The machine and software the report describes (``selfcheck_report.ENV_FIELDS``)."""
    import torch

    from realrl.impl.model.backend.config import EngineConfig

    device = "cuda" if has_cuda else "cpu"
    commit = _output(["git", "rev-parse", "HEAD"], cwd=repo)
    dirty = None
    if commit is not None:
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True, text=True
        )
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    smi = shutil.which("nvidia-smi")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "device": device,
        "device_name": torch.cuda.get_device_name(0) if has_cuda else _cpu_name(),
        "driver_version": _output([smi, "--query-gpu=driver_version", "--format=csv,noheader"])
        if smi
        else None,
        "cuda_version": torch.version.cuda,
        "torch_version": torch.__version__,
        "flash_attn_version": _version("flash-attn", "flash_attn"),
        "triton_version": _version("triton"),
        "python_version": platform.python_version(),
        "cpu_count": os.cpu_count(),
        # what every run here trains and decodes in: the engines' default dtype ("auto") on this device
        "engine_dtype": str(EngineConfig().resolve_dtype(device)).removeprefix("torch."),
        "git_commit": commit,
        "git_dirty": dirty,
    }


def find_repo(given: str | None) -> str:
    """The checkout the tests and benchmarks are read from: ``--repo``, else the current directory
    when it holds ``tests/``, else the one this package was imported from when it does."""
    if given:
        return os.path.abspath(given)
    here = os.getcwd()
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for candidate in (here, package_root):
        if os.path.isdir(os.path.join(candidate, "tests")):
            return candidate
    return here


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    names = ", ".join(c.name for c in build_checks("cuda", ".", "FILEROOT"))
    ap = argparse.ArgumentParser(
        prog="python -m realrl.apps.selfcheck",
        description=__doc__.split("\n\n")[1].replace("``", ""),
        epilog=f"checks, in order: {names}. Without CUDA: the experiment checks with device=cpu and "
        "bench_generate at a tiny size. docs/selfcheck.md says what each runs and how to read the report.",
    )
    ap.add_argument("--out", default="selfcheck", help="where selfcheck.json, selfcheck.md and logs/ go")
    ap.add_argument(
        "--repo", help="the repository checkout (tests/, benchmarks/); default: the current directory"
    )
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME[,NAME]",
        help="run only these checks (repeatable)",
    )
    ap.add_argument("--quick", action="store_true", help="the main job shortened too: 2 steps everywhere")
    ap.add_argument(
        "--skip-cpu", action="store_true", help="without CUDA: run nothing, report every check skipped"
    )
    ap.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every check's time limit")
    ap.add_argument("--fileroot", help="where the experiment checks write (default: a new temporary folder)")
    ap.add_argument("--keep-runs", action="store_true", help="keep the temporary fileroot")
    ap.add_argument("--list", action="store_true", help="print the checks and their commands, run nothing")
    args = ap.parse_args(argv)
    args.only = [n.strip() for group in args.only for n in group.split(",") if n.strip()]
    if args.timeout_scale <= 0:
        ap.error("--timeout-scale must be > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    has_cuda = torch.cuda.is_available()
    device = "cuda" if has_cuda else "cpu"
    repo = find_repo(args.repo)
    made_fileroot = args.fileroot is None and not args.list
    if args.list:
        fileroot = args.fileroot or "<fileroot>"
    else:
        fileroot = os.path.abspath(args.fileroot or tempfile.mkdtemp(prefix="realrl-selfcheck-"))
    try:
        selected = select_checks(
            build_checks(device, repo, fileroot, args.quick),
            has_cuda,
            args.only,
            args.skip_cpu,
            n_gpus=torch.cuda.device_count() if has_cuda else 0,
        )
    except ValueError as e:
        if made_fileroot:
            os.rmdir(fileroot)
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.list:
        for check, why in selected:
            print(
                f"{check.name}: {check.what}\n    {check.command}" + (f"\n    skipped: {why}" if why else "")
            )
        return 0
    if not has_cuda:
        print(
            "no CUDA device (torch.cuda.is_available() is false): "
            + ("--skip-cpu, nothing runs" if args.skip_cpu else "running the CPU checks")
        )
    out = os.path.abspath(args.out)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    environment = probe_environment(repo, has_cuda)
    results = []
    try:
        for i, (check, why) in enumerate(selected, 1):
            if why:
                results.append(
                    CheckResult(check.name, check.command, SKIPPED, reason=why, shown=list(check.shown))
                )
                print(f"[{i}/{len(selected)}] {check.name}: skipped ({why})", flush=True)
                continue
            print(f"[{i}/{len(selected)}] {check.name}: {check.command}", flush=True)
            result = run_check(
                check, repo, os.path.join(out, "logs", f"{check.name}.log"), args.timeout_scale
            )
            note = f": {result.reason}" if result.reason else ""
            print(f"    {result.status} in {result.seconds:.0f} s{note}", flush=True)
            if result.status == FAIL:
                print("    " + result.tail[-1500:].replace("\n", "\n    "), flush=True)
            results.append(result)
    finally:
        if made_fileroot and not args.keep_runs:
            shutil.rmtree(fileroot, ignore_errors=True)
    options = {
        "quick": args.quick,
        "only": args.only,
        "skip_cpu": args.skip_cpu,
        "timeout_scale": args.timeout_scale,
        "repo": repo,
        "fileroot": fileroot if (args.keep_runs or not made_fileroot) else None,
    }
    report = build_report(environment, results, options)
    with open(os.path.join(out, "selfcheck.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "selfcheck.md"), "w") as f:
        f.write(render_markdown(report))
    print(render_table(report))
    print(f"report: {os.path.join(out, 'selfcheck.json')} and selfcheck.md beside it")
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
