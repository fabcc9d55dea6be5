"""``python -m realrl.apps.selfcheck``: one command that checks a machine, GPU or not.

On a CUDA machine it runs, each as a subprocess with a time limit: the ``gpu``-marked tests, the
main job (toy PPO on the GPU), its train/rollout log-prob mismatch in bf16, GRPO with two workers
sharing the GPU, tensor parallelism, FSDP, a per-call layout with reallocation,
``benchmarks/bench_generate.py`` against its targets (with each Triton kernel's share of a decoding
step), and ``benchmarks/bench_forward.py`` (forward + backward against transformers). Without CUDA it runs the
same experiment checks with ``device=cpu`` and the generation benchmark at a tiny size. A failing
check does not stop the others; at the end one report, ``selfcheck.json`` with ``selfcheck.md``
beside it, and a table on stdout. Exit status 0 when every check passed or was skipped, else 1
(2 for a wrong option). ``docs/selfcheck.md`` says how to read the report.

This file is the command: its options, the machine's description, running each check and
writing the report. The checks are ``selfcheck_checks``, the report's pure parts ``selfcheck_report``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from realrl.apps.selfcheck_checks import Check, build_checks, select_checks
from realrl.apps.selfcheck_report import (
    FAIL,
    SKIPPED,
    CheckResult,
    build_report,
    exit_status,
    judge_targets,
    render_markdown,
    render_table,
    tail,
    verdict,
)

STOP_GRACE_S = 30  # after SIGTERM, how long a timed-out check may take to stop its workers


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


def engine_dtype(device: str) -> str:
    """What the engines' default dtype ("auto") resolves to on ``device``: ``bfloat16`` on CUDA."""
    from realrl.impl.model.backend.config import EngineConfig

    return str(EngineConfig().resolve_dtype(device)).removeprefix("torch.")


def probe_environment(repo: str, has_cuda: bool) -> dict[str, Any]:
    """The machine and software the report describes (``selfcheck_report.ENV_FIELDS``)."""
    import torch

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
        "engine_dtype": engine_dtype(device),
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
            build_checks(device, repo, fileroot, args.quick, engine_dtype(device)),
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
