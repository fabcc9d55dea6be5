"""Every script in benchmarks/ runs end to end at tiny sizes (``--smoke``), so that an API change
cannot break a benchmark unnoticed: each test runs one script as a subprocess, from the repository
root, with every file it writes under a temporary folder, and checks the figures its report
promises (a script that prints nothing, or a table of "n/a", fails)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from realrl.apps.selfcheck_report import parse_bench_forward, parse_bench_generate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUMBER = r"[+-]?[\d,]+(?:\.\d+)?(?:e[+-]?\d+)?"


def run_bench(script: str, tmp_path, *args: str, timeout: float = 280) -> str:
    """The stdout of ``python benchmarks/<script> --smoke <args>``, which must exit with 0.
    Temporary folders the script makes land under ``tmp_path`` too."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp), "HF_DATASETS_CACHE": str(tmp / "hf_datasets")}
    argv = [sys.executable, os.path.join("benchmarks", script), "--smoke", *args]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(argv)} exited with {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n"
        f"--- stderr\n{done.stderr[-6000:]}"
    )
    return done.stdout


def figures(pattern: str, text: str) -> list[tuple[str, ...]]:
    """Every match of ``pattern`` (one line each) in ``text``; at least one."""
    found = re.findall(pattern, text, flags=re.MULTILINE)
    assert found, f"no line matches {pattern!r} in:\n{text[-3000:]}"
    return [m if isinstance(m, tuple) else (m,) for m in found]


def table_rows(text: str, first_cell: str) -> list[list[str]]:
    """The cells of the markdown table rows whose first cell is ``first_cell``."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            rows.append(cells)
    assert rows, f"no table row {first_cell!r} in:\n{text[-3000:]}"
    return rows


def is_number(cell: str) -> bool:
    return re.fullmatch(NUMBER + r"(?: ± [\d.]+)?", cell) is not None


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory) -> str:
    """One fileroot for the scripts that only read the toy task's files and the initial models
    (they write them on first use), so the task is built once for all of them."""
    return str(tmp_path_factory.mktemp("toy_root"))


@pytest.fixture(scope="module")
def job_root(tmp_path_factory) -> str:
    """One fileroot for the scripts that run quickstart jobs: the SFT and reward-model phases run
    once, for the first of them (the toy job's, listed first, from an empty fileroot), and the
    later ones reuse them, as each script does among its own runs."""
    return str(tmp_path_factory.mktemp("job_root") / "runs")  # made by the first script


def test_bench_forward(tmp_path):
    f = parse_bench_forward(run_bench("bench_forward.py", tmp_path, "--device", "cpu"))
    assert f["realrl_tok_s"] > 0 and f["hf_tok_s"] > 0, f
    assert f["speedup_vs_hf"] > 0 and f["speedup_vs_hf_cpu_time"] > 0, f
    assert f["n_seqs"] == 4, f


def test_bench_generate(tmp_path):
    out = run_bench("bench_generate.py", tmp_path, "--device", "cpu", "--torch-kernels", "--kernel-shares")
    f = parse_bench_generate(out, "realrl eager")
    assert not [k for k in f if k.endswith("_error")], f  # every side ran
    assert f["realrl_eager_tok_s"] > 0 and f["realrl_static_tok_s"] > 0, f
    assert f["transformers_generate_tok_s"] > 0 and f["speedup_vs_hf"] > 0, f
    assert f["bandwidth_gb_s"] > 0, f
    figures(rf"^ratio realrl static / realrl eager\s+({NUMBER})x wall$", out)
    figures(rf"^ratio realrl eager / realrl eager torch kernels\s+({NUMBER})x wall$", out)  # the kernels' A/B
    for op in ("rms_norm", "decode_attention"):  # and each kernel's own share
        figures(rf"^ratio realrl eager / realrl eager torch {op}\s+({NUMBER})x wall$", out)


def test_bench_train(tmp_path):
    out = run_bench("bench_train.py", tmp_path)
    (real, hf), *_ = figures(rf"^first-step loss: realrl ({NUMBER})  hf ({NUMBER}) ", out)
    assert abs(float(real) - float(hf)) < 1e-3, out  # the two sides compute the same loss
    for side in ("realrl TrainEngine", "HF padded loop"):
        figures(rf"^{side}.*\s({NUMBER}) tokens/s .* peak RSS\s+({NUMBER}) MiB", out)
    figures(rf"^throughput ratio realrl / hf: ({NUMBER})x wall-clock, ({NUMBER})x CPU time$", out)
    figures(rf"^peak RSS ratio realrl / hf: ({NUMBER}) ", out)


def test_bench_tp(tmp_path):
    out = run_bench("bench_tp.py", tmp_path)
    figures(rf"^train step, .*\s({NUMBER})s\s+({NUMBER})s\s+({NUMBER})x$", out)
    figures(rf"^generate 2 prompts x 4 tokens\s+({NUMBER})s\s+({NUMBER})s\s+({NUMBER})x$", out)
    figures(r"^same greedy tokens: (True|False)$", out)


def test_bench_pipeline(tmp_path):
    out = run_bench("bench_pipeline.py", tmp_path)
    for m, ideal in ((1, "0.50"), (2, "0.33")):
        ((_, ideal_cell, train, gen, one, two, ratio, tp, vs_tp),) = table_rows(out, str(m))
        assert ideal_cell == ideal, out  # (p - 1) / (m + p - 1) with p = 2
        assert all(is_number(c) for c in (train, gen, one, two, tp)), out
        assert is_number(ratio.removesuffix("x")) and is_number(vs_tp.removesuffix("x")), out


def test_bench_moe(tmp_path):
    out = run_bench("bench_moe.py", tmp_path)
    ((diff,),) = figures(rf"^outputs: max \|realrl - transformers\| = ({NUMBER})$", out)
    assert float(diff) < 1e-5, out  # the same weights give the same outputs
    for name in ("forward", "forward+backward"):
        (row,) = table_rows(out, name)
        realrl, eager, ratio = row[1], row[2], row[3]
        assert is_number(realrl) and is_number(eager) and is_number(ratio.removesuffix("x")), row
    layouts = [c for line in out.splitlines() if line.startswith("| ") for c in [line.split("|")[1].strip()]]
    if "expert parallel" in layouts:  # realrl's expert parallelism is absent: the row says so
        assert "not available:" in out, out
    else:
        for name in ("replicated, d2", "tensor parallel, d1m2", "expert parallel, d1m2"):
            (row,) = table_rows(out, name)
            assert all(is_number(c.removesuffix("x")) for c in row[1:5]), row


def test_bench_sharded_memory(tmp_path):
    out = run_bench("bench_sharded_memory.py", tmp_path)
    for label in (
        "params \\+ grads \\+ optimizer",
        "peak memory in steps \\(RSS\\)",
        "step time \\(median\\)",
    ):
        figures(rf"^{label}\s+{NUMBER} \S+\s+{NUMBER} \S+\s+({NUMBER})x$", out)
    figures(r"^target: state ratio <= 0.55 at N=2: (met|NOT met) \(", out)


def test_bench_realloc(tmp_path):
    out = run_bench("bench_realloc.py", tmp_path)
    rows = figures(
        rf"^(\S+ -> \S+)\s+{NUMBER}\s+{NUMBER}\s+\S+\s+({NUMBER})\s+({NUMBER})\s+(\S+)  bytes", out
    )
    assert len(rows) == 14, out
    ((same, pairs),) = figures(r"same B weights in (\d+)/(\d+)$", out)
    assert same == pairs == "14", out


def test_bench_data(tmp_path, toy_root):
    out = run_bench("bench_data.py", tmp_path, "--root", toy_root)
    for name in (
        "prompt_answer",
        "rw_paired",
        "prompt",
        "dschat phase 1",
        "dschat phase 2",
        "dschat phase 3",
    ):
        figures(rf"^{name}\s+(\d+)\s+(\d+)\s+({NUMBER})\s+({NUMBER})\s+(\d+)\s+(\d+)$", out)
    gathers = figures(rf"^(prompt_answer|rw_paired) x(\d+)\s+({NUMBER})\s+(\d+)$", out)
    assert {g[0] for g in gathers} == {"prompt_answer", "rw_paired"}, out


def test_trl_profile(tmp_path, toy_root):
    out = run_bench("_trl_profile.py", tmp_path, "--fileroot", toy_root)
    for name in ("realrl paired_rw.train_step", "HF padded step"):
        figures(rf"^{re.escape(name)}\s+wall ({NUMBER}) s  cpu ({NUMBER}) s$", out)
    figures(r"function calls .* in [\d.]+ seconds", out)


# the stand-ins are the same for both tasks; rw's step also runs in _trl_profile and bench_cpu_kernels
@pytest.mark.parametrize("task", ["grpo", pytest.param("rw", marks=pytest.mark.slow)])
def test_ablate_train_step(tmp_path, toy_root, task):
    out = run_bench("ablate_train_step.py", tmp_path, "--fileroot", toy_root, "--task", task)
    figures(rf"^  full step\s+({NUMBER}) ms$", out)
    parts = figures(rf"^  without (.+?)\s+({NUMBER}) ms\s+.+ <=\s*({NUMBER}) % of the step$", out)
    assert {p[0] for p in parts} == {"attention", "MLP", "RMSNorm", "rotary", "optimizer step"}, out


def test_bench_cpu_kernels(tmp_path, toy_root):
    from realrl.impl.model import kernels

    if not kernels.available("varlen_attention"):
        pytest.skip("the C kernels are not built here (no C compiler)")
    out = run_bench("bench_cpu_kernels.py", tmp_path, "--fileroot", toy_root)
    row = rf"\s+({NUMBER})ms\s+({NUMBER})ms\s+({NUMBER})x$"
    for phase in ("GRPO update", "generate", "reference inference", r"RM step \(8 pairs\)"):
        figures(rf"^  {phase}{row}", out)
    assert len(figures(rf"^  GRPO update{row}", out)) == 2, out  # attention and RMSNorm


def test_bench_host_memory(tmp_path, toy_root):
    out = run_bench("bench_host_memory.py", tmp_path, "--fileroot", toy_root)
    for mode in ("default", "retained"):
        figures(rf"^\| {mode} \| ({NUMBER}) \| ({NUMBER}) \|$", out)
    figures(rf"^speed-up retained / default: ({NUMBER})x$", out)


def test_bench_vs_trl(tmp_path, toy_root):
    """Both sides (realrl's workers, TRL's trainers), both tasks, then the one evaluator on both."""
    out = run_bench("bench_vs_trl.py", tmp_path, "--fileroot", toy_root)
    for task, score in (("rw", "held-out pair accuracy"), ("grpo", "held-out true reward")):
        table = out.split(f"| {task} | realrl | TRL | ratio |", 1)[1].split("\n\n", 1)[0]
        for label in ("step time, s (median)", "tokens/s", "peak RSS, process tree, MB", score):
            ((_, real, trl, ratio),) = table_rows(table, label)
            assert is_number(real) and is_number(trl), (label, real, trl)
            assert re.fullmatch(rf"{NUMBER}x|[+-]\d\.\d+", ratio), (label, ratio)
    figures(r"^ratio: times and CPU times as TRL / realrl", out)
    with open(os.path.join(toy_root, "bench_vs_trl", "results.json")) as f:
        results = json.load(f)
    for side in ("realrl", "trl"):
        assert 0.0 <= results["rw"][side]["accuracy"] <= 1.0, results["rw"][side]
        assert isinstance(results["grpo"][side]["true_reward"], float), results["grpo"][side]


def test_bench_toy_default(tmp_path, job_root):
    """The whole default job: toy data, SFT, reward model, PPO, evaluation."""
    out = run_bench("bench_toy_default.py", tmp_path, "--fileroot", job_root)
    (_, *cells), (_, *phases), (_, *calls) = table_rows(out, "1")  # learning, time by phase, by call
    assert len(cells) == 7 and all(re.match(NUMBER, c) for c in cells), cells
    # before the first phase, sft, rw, ppo, plots, evaluation, wall: seconds each
    assert len(phases) == 7 and all(re.fullmatch(rf"{NUMBER} s", c) for c in phases), phases
    # the PPO step and each of its calls (actor_gen ... critic_train): milliseconds each
    assert len(calls) >= 8 and all(re.fullmatch(rf"{NUMBER} ms", c) for c in calls), calls


@pytest.mark.parametrize("task", ["sentiment", pytest.param("arith", marks=pytest.mark.slow)])
def test_bench_algorithms(tmp_path, job_root, task):
    out = run_bench("bench_algorithms.py", tmp_path, "--task", task, "--fileroot", job_root)
    for label in ("grpo", "dapo" if task == "sentiment" else "dapo_without_dynamic_sampling"):
        ((_, *cells),) = table_rows(out, label)
        assert len(cells) == 6 and all(re.match(NUMBER, c) for c in cells), cells


def test_bench_layouts(tmp_path, job_root):
    out = run_bench("bench_layouts.py", tmp_path, "--fileroot", job_root)
    ((_, step, ratio, *_, realloc_mb),) = table_rows(out, "`actor_gen:d2m1p1,*:d1m1p1`")
    assert float(step) > 0 and re.fullmatch(rf"{NUMBER}x", ratio), out
    assert float(realloc_mb) > 0, out  # generation's layout differs from training's: weights moved
    ((_, _, base_ratio, *_),) = table_rows(out, "`d1`")
    assert base_ratio == "1.00x", out
    figures(rf"^fastest: .* at ({NUMBER}) s/step, ({NUMBER})x the speed of d1$", out)


def test_bench_faults(tmp_path):
    out = run_bench("bench_faults.py", tmp_path, "--fileroot", str(tmp_path / "runs"))
    for failpoint in ("0:train@2", "1:generate@1:stop"):
        ((_, seconds, clean, error),) = table_rows(out, f"`{failpoint}`")
        assert is_number(seconds) and clean == "yes" and "is lost" in error, (
            failpoint,
            seconds,
            clean,
            error,
        )
    ((_, seconds, code, clean),) = table_rows(out, "SIGTERM")
    assert is_number(seconds) and code == "143" and clean == "yes", out
    figures(r"^\| SIGINT \(started as .*\| ([\d.]+) \| 130 \| yes \|$", out)


def test_bench_lora(tmp_path, job_root):
    out = run_bench("bench_lora.py", tmp_path, "--fileroot", job_root)
    for row in ("parameters trained", "optimizer state (MiB)", "moved per realloc (MiB)"):
        ((full, lora, ratio),) = figures(rf"^{re.escape(row)}\s+({NUMBER})\s+({NUMBER})\s+({NUMBER})x$", out)
        assert float(ratio) < 1.0, (row, full, lora)  # LoRA trains, holds and moves less
    ((_, *cells),) = [line.split() for line in out.splitlines() if line.startswith("grpo-lora")]
    assert len(cells) == 3 and all(re.fullmatch(NUMBER, c) for c in cells), cells


def test_bench_async(tmp_path, job_root):
    out = run_bench("bench_async.py", tmp_path, "--fileroot", job_root)
    for label in ("sync d2", "sync split", "async eta=1"):
        ((_, rate, ratio, *_, stale, spanning, weights),) = table_rows(out, label)
        assert float(rate) > 0 and re.fullmatch(rf"{NUMBER}x", ratio), out
        moved = re.fullmatch(rf"({NUMBER}) MB in ({NUMBER}) ms", weights)
        assert moved, weights
        # d2 keeps the policy where it trains; the split layouts send it to the generation worker
        assert (float(moved.group(1)) > 0) == (label != "sync d2"), weights
        assert float(stale) == (1.0 if label == "async eta=1" else 0.0) and float(spanning) == 0.0
    # the 8-GPU comparison on paper, from the per-call seconds just measured
    for label in ("sync d8 (every call on 8)", "async 6:2, eta >= 1"):
        ((_, seconds, ratio),) = table_rows(out, label)
        assert float(seconds) > 0 and re.fullmatch(rf"{NUMBER}x", ratio), out


def test_bench_search(tmp_path, job_root):
    out = run_bench("bench_search.py", tmp_path, "--fileroot", job_root)
    rows = [r for r in out.splitlines() if r.startswith("| d")]
    assert len(rows) == 3, out  # d1, d2 and m2: sft's every plan on 2 workers
    for row in rows:
        _, plan, predicted, measured, error, rank, guessed, guess_error, rounds = [
            c.strip() for c in row.split("|")[:9]
        ]
        assert float(predicted) > 0 and float(measured) > 0 and re.fullmatch(rf"[+-]{NUMBER} %", error), row
        assert rounds == measured, row  # one round in the smoke run: its mean is that run's
        if plan.startswith("d1m1p1"):  # the interpolation search had one worker: d1 alone
            assert float(guessed) > 0 and re.fullmatch(rf"[+-]{NUMBER} %", guess_error), row
    assert sum("(chosen)" in r for r in rows) == 1
    assert re.search(r"predicted within 15 % of measured: \d of 3", out), out
    assert "interpolation: profiled at 4 and 16 sequences per step, searched at 8" in out, out
    assert re.search(r"interpolated within 15 % of measured: \d of 1", out), out
    assert re.search(rf"the chosen plan measured {NUMBER} s/step, [+-]{NUMBER} % from the best measured", out)
