"""``python -m realrl.apps.selfcheck``: the figure parsers on recorded benchmark output (each
Triton kernel's share of decoding too), the mismatch check's figures from a run's summary, the
targets, the report (json, table, markdown), which checks run without CUDA, the exit status, a
check that fails or hangs without stopping the others, and one real run of a cheap check."""

import json
import os
import subprocess
import sys

import pytest

from realrl.apps import selfcheck, selfcheck_checks
from realrl.apps.selfcheck_report import (
    ENV_FIELDS,
    FAIL,
    PASS,
    SKIPPED,
    CheckResult,
    Target,
    build_report,
    describe_target,
    exit_status,
    judge_targets,
    parse_bench_forward,
    parse_bench_generate,
    parse_pytest,
    render_markdown,
    render_table,
    rollout_corr_figures,
    summary_figures,
    tail,
    verdict,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# benchmarks/bench_generate.py --n-seqs 4 --min-len 8 --max-len 16 --max-new 8 --repeats 1 (2 CPU
# cores), with transformers' progress bar in the same stream, as the selfcheck's log holds it
BENCH_GENERATE_CPU = (
    "Loading weights:   0%|          | 0/57 [00:00<?, ?it/s]\rLoading weights: 100%|██████████| 57/57 "
    "[00:00<00:00, 43271.55it/s]\n"
    "4 prompts of 8-13 tokens, max_new_tokens=8, 1 EOS id(s); threads=2, attention cpu_varlen; weights "
    "0.06 GiB, measured bandwidth 34 GB/s\n"
    "                              wall tokens/s  CPU-time tokens/s  new tokens/run  roofline tokens/s  "
    "of roofline\n"
    "realrl eager                             22                 33              32               2138"
    "        1.0%\n"
    "realrl static                            46                 71              32               2138"
    "        2.2%\n"
    "transformers generate                    40                 46              32               2138"
    "        1.9%\n"
    "ratio realrl eager / transformers generate                     0.56x wall\n"
    "ratio realrl static / transformers generate                    1.15x wall\n"
    "ratio realrl static / realrl eager                             2.07x wall\n"
)
# the same script's format on CUDA, where the graphs' side did not run
BENCH_GENERATE_CUDA_FAILED = (
    "64 prompts of 33-510 tokens, max_new_tokens=256, 50 EOS id(s); cuda bf16, attention flash_attn; "
    "weights 2.05 GiB, measured bandwidth 2890 GB/s\n"
    "realrl eager                           2538               2601           12000             400000"
    "        0.6%\n"
    "transformers generate                  1732               1800           12000             400000"
    "        0.4%\n"
    "realrl cuda_graph            did not run: RuntimeError: CUDA error: operation not permitted when "
    "stream is capturing\n"
)
# benchmarks/bench_generate.py --smoke --kernel-shares (2 CPU cores): each mode again with one of
# the CPU's C kernels off; "ratio M / M torch OP" is kernel OP's share
BENCH_GENERATE_SHARES_CPU = (
    "4 prompts of 8-13 tokens, max_new_tokens=8, 1 EOS id(s); threads=2, attention cpu_varlen; weights 0.00 "
    "GiB, measured bandwidth 44 GB/s\n"
    "                                      wall tokens/s  CPU-time tokens/s  new tokens/run  roofline "
    "tokens/s  of roofline\n"
    "realrl eager                                    256                403              32             191270"
    "        0.1%\n"
    "realrl static                                   164                249              32             191270"
    "        0.1%\n"
    "realrl eager torch varlen_attention             199                307              32             191270"
    "        0.1%\n"
    "realrl eager torch decode_attention              88                133              32             191270"
    "        0.0%\n"
    "realrl eager torch rms_norm                      84                126              32             191270"
    "        0.0%\n"
    "realrl static torch varlen_attention            123                185              32             191270"
    "        0.1%\n"
    "realrl static torch decode_attention            213                329              32             191270"
    "        0.1%\n"
    "realrl static torch rms_norm                     67                101              32             191270"
    "        0.0%\n"
    "transformers generate                            77                116              32             191270"
    "        0.0%\n"
    "ratio realrl eager / transformers generate                                           3.33x wall\n"
    "ratio realrl static / transformers generate                                          2.14x wall\n"
    "ratio realrl eager torch varlen_attention / transformers generate                    2.59x wall\n"
    "ratio realrl eager torch decode_attention / transformers generate                    1.15x wall\n"
    "ratio realrl eager torch rms_norm / transformers generate                            1.10x wall\n"
    "ratio realrl static torch varlen_attention / transformers generate                   1.60x wall\n"
    "ratio realrl static torch decode_attention / transformers generate                   2.78x wall\n"
    "ratio realrl static torch rms_norm / transformers generate                           0.87x wall\n"
    "ratio realrl eager / realrl eager torch varlen_attention                             1.29x wall\n"
    "ratio realrl eager / realrl eager torch decode_attention                             2.90x wall\n"
    "ratio realrl eager / realrl eager torch rms_norm                                     3.03x wall\n"
    "ratio realrl static / realrl static torch varlen_attention                           1.34x wall\n"
    "ratio realrl static / realrl static torch decode_attention                           0.77x wall\n"
    "ratio realrl static / realrl static torch rms_norm                                   2.45x wall\n"
    "ratio realrl static / realrl eager                                                   0.64x wall\n"
)
# the CUDA check's run (the Triton kernels, one off at a time; one ablation failed), written with
# bench_generate.py's own print statements (names, column widths) and made-up numbers: this
# machine has no GPU
BENCH_GENERATE_SHARES_CUDA = (
    "64 prompts of 33-510 tokens, max_new_tokens=256, 50 EOS id(s); cuda bf16, attention flash_attn; "
    "weights 2.05 GiB, measured bandwidth 4210 GB/s\n"
    "                                          wall tokens/s  CPU-time tokens/s  new tokens/run  roofline "
    "tokens/s  of roofline\n"
    "realrl eager                                       2538               2601           16000             "
    "400000        0.6%\n"
    "realrl cuda_graph                                 11204              11300           16000             "
    "400000        2.8%\n"
    "realrl eager torch rms_norm                        2301               2350           16000             "
    "400000        0.6%\n"
    "realrl cuda_graph torch rms_norm                   9850               9900           16000             "
    "400000        2.5%\n"
    "realrl cuda_graph torch decode_attention           7102               7150           16000             "
    "400000        1.8%\n"
    "transformers generate                              1732               1800           16000             "
    "400000        0.4%\n"
    "realrl eager torch decode_attention      did not run: RuntimeError: out of memory\n"
    "ratio realrl eager / transformers generate                                                   1.47x wall\n"
    "ratio realrl cuda_graph / transformers generate                                              6.47x wall\n"
    "ratio realrl eager torch rms_norm / transformers generate                                    1.33x wall\n"
    "ratio realrl cuda_graph torch rms_norm / transformers generate                               5.69x wall\n"
    "ratio realrl cuda_graph torch decode_attention / transformers generate                       4.10x wall\n"
    "ratio realrl eager / realrl eager torch rms_norm                                             1.10x wall\n"
    "ratio realrl cuda_graph / realrl cuda_graph torch rms_norm                                   1.14x wall\n"
    "ratio realrl cuda_graph / realrl cuda_graph torch decode_attention                           1.58x wall\n"
    "ratio realrl cuda_graph / realrl eager                                                       4.41x wall\n"
)
# benchmarks/bench_forward.py --n-seqs 4 --min-len 8 --max-len 16 --repeats 1 (CPU), and the GPU lines
BENCH_FORWARD = (
    "model: llama-like, 15.6M params; 4 sequences, 46 tokens (padded batch 52 slots); threads=2, cpu_varlen\n"
    "peak GPU memory of a step: ReaLModel 25.20 GiB, HF 42.60 GiB\n"
    "                                wall tokens/s  CPU-time tokens/s\n"
    "ReaLModel packed fwd+bwd                  129                197\n"
    "transformers padded fwd+bwd               124                182\n"
    "ratio (ReaLModel / HF)                  1.05x              1.08x\n"
)


def test_bench_generate_figures_from_its_cpu_output():
    f = parse_bench_generate(BENCH_GENERATE_CPU, "realrl eager")
    assert f["realrl_eager_tok_s"] == 22 and f["realrl_eager_roofline_pct"] == 1.0
    assert f["realrl_static_tok_s"] == 46 and f["transformers_generate_tok_s"] == 40
    assert f["decode_tok_s"] == 22 and f["roofline_pct"] == 1.0
    assert f["speedup_vs_hf"] == pytest.approx(22 / 40, abs=1e-3)
    assert f["bandwidth_gb_s"] == 34 and f["attn_impl"] == "cpu_varlen"
    assert not any(k.startswith("ratio") for k in f)  # the ratio lines are not rows


def test_a_decoding_side_that_did_not_run_misses_its_targets_by_name():
    f = parse_bench_generate(BENCH_GENERATE_CUDA_FAILED, "realrl cuda_graph")
    assert f["realrl_eager_tok_s"] == 2538 and f["realrl_eager_roofline_pct"] == 0.6
    assert f["realrl_cuda_graph_error"].startswith("RuntimeError: CUDA error")
    assert "decode_tok_s" not in f
    targets = judge_targets(f, selfcheck_checks.GENERATE_TARGETS)
    assert [t["met"] for t in targets] == [False, False]
    status, reason = verdict(0, False, 900, targets)
    assert status == FAIL and reason == "target missed: decode_tok_s missing; roofline_pct missing"


def test_bench_generate_targets_pass_and_fail_on_the_figures():
    ok = {"decode_tok_s": 13000, "roofline_pct": 31.5}
    assert verdict(0, False, 900, judge_targets(ok, selfcheck_checks.GENERATE_TARGETS)) == (PASS, "")
    slow = {"decode_tok_s": 9000, "roofline_pct": 31.5}
    status, reason = verdict(0, False, 900, judge_targets(slow, selfcheck_checks.GENERATE_TARGETS))
    assert status == FAIL
    assert (
        reason == "target missed: decode_tok_s 9,000 < 12,690 (5 x 2,538 tok/s, eager decoding on one H100)"
    )


def test_kernel_shares_from_the_cpu_output():
    f = parse_bench_generate(BENCH_GENERATE_SHARES_CPU, "realrl eager")
    assert f["decode_tok_s"] == 256 and f["realrl_eager_torch_rms_norm_tok_s"] == 84
    assert (f["share_rms_norm"], f["share_decode_attention"], f["share_varlen_attention"]) == (
        3.03,
        2.9,
        1.29,
    )
    assert f["realrl_static_share_decode_attention"] == 0.77 and f["realrl_eager_share_rms_norm"] == 3.03
    # the ratios against transformers and between modes are no shares
    assert sorted(k for k in f if "share" in k) == sorted(
        f"{side}share_{op}"
        for side in ("", "realrl_eager_", "realrl_static_")
        for op in ("varlen_attention", "decode_attention", "rms_norm")
    )


def test_each_triton_kernels_share_on_cuda_and_an_ablation_that_did_not_run():
    f = parse_bench_generate(BENCH_GENERATE_SHARES_CUDA, "realrl cuda_graph")
    assert f["decode_tok_s"] == 11204 and f["speedup_vs_hf"] == pytest.approx(11204 / 1732, abs=1e-3)
    assert f["share_rms_norm"] == 1.14 and f["share_decode_attention"] == 1.58
    assert f["realrl_eager_share_rms_norm"] == 1.1
    assert "realrl_eager_share_decode_attention" not in f  # its run failed, and says why
    assert f["realrl_eager_torch_decode_attention_error"] == "RuntimeError: out of memory"
    # the report shows the headline's share of each Triton kernel, under the benchmark's names
    from realrl.impl.model.kernels.dispatch import TRITON_OPS

    assert selfcheck_checks.TRITON_KERNELS == TRITON_OPS
    (bench,) = [c for c in selfcheck_checks.build_checks("cuda", REPO, "runs") if c.name == "bench_generate"]
    assert "--kernel-shares" in bench.argv and "share" in bench.what
    assert {"share_rms_norm", "share_decode_attention", "decode_tok_s"} <= set(bench.shown)
    (cpu,) = [c for c in selfcheck_checks.build_checks("cpu", REPO, "runs") if c.name == "bench_generate"]
    assert "--kernel-shares" not in cpu.argv  # the tiny CPU run stays tiny


def test_the_mismatch_check_reads_the_last_steps_rollout_corr_statistics():
    """Keys as the CPU run wrote them (``--only mismatch --quick``): the actor's train call's."""
    summary = {
        "experiment": "ppo",
        "steps": 3,
        "wall_seconds": 30.4,
        "kl": 0.0066,
        "actor_train/loss": 0.1,
        "actor_train/rollout_corr/log_ratio_abs_max": 0.25,
        "actor_train/rollout_corr/log_ppl_abs_diff": 0.004,
        "actor_train/rollout_corr/kl": 0.001,
        "actor_train/rollout_corr/k3_kl": 0.0009,
        "actor_train/rollout_corr/flag": True,
        "rollout_corr/unprefixed": 1.0,
    }
    assert rollout_corr_figures(summary) == {
        "rollout_corr/log_ratio_abs_max": 0.25,
        "rollout_corr/log_ppl_abs_diff": 0.004,
        "rollout_corr/kl": 0.001,
        "rollout_corr/k3_kl": 0.0009,
    }
    assert rollout_corr_figures(None) == {}
    checks = selfcheck_checks.build_checks("cuda", REPO, "runs", engine_dtype="bfloat16")
    (check,) = [c for c in checks if c.name == "mismatch"]
    assert "ppo.recompute_logprobs=true" in check.argv and check.argv[3] == "ppo"
    figures = check.parse("", summary)
    assert figures["engine_dtype"] == "bfloat16" and figures["steps"] == 3 and figures["kl"] == 0.0066
    assert figures["rollout_corr/log_ratio_abs_max"] == 0.25 and "actor_train/loss" not in figures
    assert check.shown[:4] == (
        "engine_dtype",
        "rollout_corr/log_ratio_abs_mean",
        "rollout_corr/log_ratio_abs_max",
        "rollout_corr/log_ppl_abs_diff",
    )
    assert check.targets == (Target("steps", "==", 3, "the shortened run's steps"),)  # figures, no target
    assert check.parse("", None) == {"engine_dtype": "bfloat16"}  # a run that wrote nothing
    assert selfcheck.engine_dtype("cuda") == "bfloat16" and selfcheck.engine_dtype("cpu") == "float32"


def test_the_gpu_tests_check_names_the_fsdp_bf16_test():
    (check,) = [c for c in selfcheck_checks.build_checks("cuda", REPO, "runs") if c.name == "gpu_tests"]
    named = [w.rstrip(")") for w in check.what.split() if w.startswith("(tests/")]
    assert named == ["(tests/backend/test_compute_dtype_gpu.py"]
    path = os.path.join(REPO, named[0][1:])
    assert os.path.exists(path) and "pytest.mark.gpu" in open(path).read()  # the check runs it


def test_bench_forward_figures():
    f = parse_bench_forward(BENCH_FORWARD)
    assert f["realrl_tok_s"] == 129 and f["hf_tok_s"] == 124 and f["realrl_cpu_tok_s"] == 197
    assert f["speedup_vs_hf"] == 1.05 and f["speedup_vs_hf_cpu_time"] == 1.08
    assert f["realrl_peak_gib"] == 25.2 and f["hf_peak_gib"] == 42.6
    assert f["params_m"] == 15.6 and f["tokens"] == 46 and f["attn_impl"] == "cpu_varlen"


@pytest.mark.parametrize(
    "last, want",
    [
        ("12 passed, 3 skipped, 1400 deselected in 41.20s", {"passed": 12, "skipped": 3, "deselected": 1400}),
        ("==== 1 failed, 11 passed, 1 error in 9.01s ====", {"failed": 1, "passed": 11, "errors": 1}),
        ("1412 deselected in 3.10s", {"passed": 0, "deselected": 1412}),
    ],
)
def test_pytest_counts(last, want):
    f = parse_pytest("tests/model/test_gpu.py ..s\n" + last + "\n")
    assert {k: f[k] for k in want} == want


def test_summary_figures_keep_named_numbers_and_prefixed_keys():
    summary = {
        "steps": 3,
        "kl": 0.5,
        "rm_accuracy": None,
        "samples": [1],
        "realloc/actor/bytes": 9.0,
        "x/y": 1.0,
    }
    assert summary_figures(summary, ("steps", "kl", "rm_accuracy"), ("realloc/",)) == {
        "steps": 3,
        "kl": 0.5,
        "realloc/actor/bytes": 9.0,
    }
    assert summary_figures(None, ("steps",)) == {}


def test_verdict_order_and_target_wording():
    met = judge_targets({"steps": 3}, (Target("steps", "==", 3),))
    assert verdict(None, True, 60, met) == (FAIL, "timed out after 60 s")
    assert verdict(1, False, 60, met) == (FAIL, "exit status 1")
    assert verdict(0, False, 60, met, "no summary.json") == (FAIL, "no summary.json")
    assert verdict(0, False, 60, met) == (PASS, "")
    (t,) = judge_targets({"wall_seconds": 700.0}, (Target("wall_seconds", "<=", 600, "under 10 minutes"),))
    assert describe_target(t) == "wall_seconds 700 > 600 (under 10 minutes)"
    assert judge_targets({"kl": "n/a"}, (Target("kl", ">=", 0),))[0]["met"] is False


def test_tail_keeps_the_last_state_of_redrawn_lines():
    text = "a\nstep 1/3\rstep 2/3\rstep 3/3\n" + "".join(f"line {i}\n" for i in range(100)) + "\n\n"
    assert tail("a\nstep 1/3\rstep 3/3\nend\n") == "a\nstep 3/3\nend"
    assert tail(text, n_lines=2) == "line 98\nline 99"


def _results():
    return [
        CheckResult(
            "main",
            "python -m realrl.apps.quickstart ppo device=cuda",
            PASS,
            70.2,
            {"rm_accuracy": 1.0, "gain_in_sft_std": 2.33},
            [{"figure": "rm_accuracy", "op": ">=", "value": 0.9, "got": 1.0, "met": True, "why": ""}],
            tail="all fine",
            log="/x/logs/main.log",
            shown=["rm_accuracy", "gain_in_sft_std"],
        ),
        CheckResult(
            "bench_generate",
            "python benchmarks/bench_generate.py --device cuda",
            FAIL,
            80.0,
            {"decode_tok_s": 9000},
            reason="target missed: decode_tok_s 9,000 < 12,690",
            tail="Traceback ... the end",
            log="/x/logs/bench_generate.log",
        ),
        CheckResult(
            "train_vs_hf", "python benchmarks/bench_forward.py", SKIPPED, reason="needs a CUDA device"
        ),
    ]


def test_report_has_every_field_and_keeps_tails_of_failures_only():
    env = {
        "date": "2026-11-26T10:00:00+00:00",
        "hostname": "h",
        "device": "cuda",
        "device_name": "NVIDIA H100",
    }
    report = json.loads(json.dumps(build_report(env, _results(), {"quick": False})))
    assert set(ENV_FIELDS) <= set(report) and report["driver_version"] is None  # unknown: null
    assert report["status"] == FAIL and report["counts"] == {PASS: 1, FAIL: 1, SKIPPED: 1}
    fields = {"name", "command", "status", "seconds", "figures", "targets", "reason", "tail", "log", "shown"}
    assert all(set(c) == fields for c in report["checks"])
    main, bench, skipped = report["checks"]
    assert main["tail"] == "" and bench["tail"] == "Traceback ... the end"
    assert skipped["status"] == SKIPPED and skipped["reason"] == "needs a CUDA device"

    table = render_table(report)
    lines = table.splitlines()
    assert lines[0].split() == ["check", "status", "s", "figures", "note"]
    assert lines[2].split()[:3] == ["main", "PASS", "70"] and "gain_in_sft_std=2.33" in lines[2]
    assert "decode_tok_s=9,000" in lines[3] and lines[3].endswith("decode_tok_s 9,000 < 12,690")
    assert lines[4].split()[:2] == ["train_vs_hf", "SKIPPED"]
    assert lines[-1].startswith("FAIL: 1 passed, 1 failed, 1 skipped on h, NVIDIA H100 (cuda)")

    md = render_markdown(report)
    assert md.startswith("# realrl selfcheck: FAIL")
    assert "| device_name | NVIDIA H100 |" in md and "| main | PASS | 70 |" in md
    assert "```\nTraceback ... the end\n```" in md and "all fine" not in md
    assert "met: rm_accuracy 1 >= 0.9" in md


def test_exit_status():
    passed, failed, skipped = (CheckResult("c", "cmd", s) for s in (PASS, FAIL, SKIPPED))
    assert exit_status([passed, skipped]) == 0 and exit_status([skipped]) == 0 and exit_status([]) == 0
    assert exit_status([passed, failed, skipped]) == 1


def test_without_cuda_the_gpu_checks_are_skipped_and_the_cpu_checks_run_on_the_cpu(tmp_path):
    checks = selfcheck_checks.build_checks("cpu", REPO, str(tmp_path))
    chosen = selfcheck_checks.select_checks(checks, has_cuda=False)
    why = {c.name: reason for c, reason in chosen}
    assert list(why) == [
        "gpu_tests",
        "main",
        "mismatch",
        "grpo_d2",
        "tp",
        "fsdp",
        "per_call",
        "per_call_shared",
        "bench_generate",
        "train_vs_hf",
    ]
    assert why["gpu_tests"] == why["train_vs_hf"] == selfcheck_checks.NO_CUDA
    runs = [c for c, reason in chosen if not reason]
    assert [c.name for c in runs] == [
        "main",
        "mismatch",
        "grpo_d2",
        "tp",
        "fsdp",
        "per_call",
        "per_call_shared",
        "bench_generate",
    ]
    for c in runs[:-1]:
        assert "device=cpu" in c.argv and "colocate=true" not in c.argv and c.summary_path
    by_name = {c.name: c for c in runs}
    assert "allocation_mode=d1m2p1" in by_name["tp"].argv
    assert {"allocation_mode=d2", "actor.engine.fsdp=true"} <= set(by_name["fsdp"].argv)
    assert by_name["bench_generate"].targets == ()  # the targets are for the GPU's 1.1B run
    assert by_name["main"].targets == selfcheck_checks.MAIN_TARGETS  # not shortened without --quick

    skipped_all = selfcheck_checks.select_checks(checks, has_cuda=False, skip_cpu=True)
    assert all(reason for _, reason in skipped_all)
    only = selfcheck_checks.select_checks(checks, has_cuda=False, only=["tp", "gpu_tests"])
    assert [(c.name, bool(r)) for c, r in only] == [("gpu_tests", True), ("tp", False)]
    with pytest.raises(ValueError, match=r"unknown check\(s\) \['nope'\]"):
        selfcheck_checks.select_checks(checks, has_cuda=False, only=["nope"])


def test_on_cuda_every_check_runs_in_bf16_on_the_shared_gpu_and_missing_files_skip(tmp_path):
    checks = selfcheck_checks.build_checks("cuda", str(tmp_path), str(tmp_path / "runs"), quick=True)
    chosen = selfcheck_checks.select_checks(checks, has_cuda=True)
    why = {c.name: reason for c, reason in chosen}
    assert why["gpu_tests"].startswith(str(tmp_path / "tests") + " not found")  # not a checkout
    assert "not found" in why["bench_generate"] and "not found" in why["train_vs_hf"]
    by_name = {c.name: c for c in checks}
    assert by_name["main"].targets[0].figure == "steps"  # --quick: shortened, no learning targets
    # one GPU: tensor parallelism and FSDP cannot share it (NCCL), data parallelism and moves can
    assert {n for n, r in why.items() if r.startswith("needs 2 GPUs, 1 visible")} == {
        "tp",
        "fsdp",
        "per_call",
    }
    assert why["grpo_d2"] == why["per_call_shared"] == why["mismatch"] == ""
    two = {c.name: r for c, r in selfcheck_checks.select_checks(checks, has_cuda=True, n_gpus=2)}
    assert two["tp"] == two["fsdp"] == two["per_call"] == ""
    for name in ("mismatch", "grpo_d2", "tp", "fsdp", "per_call", "per_call_shared"):
        argv = by_name[name].argv
        assert "device=cuda" in argv and "colocate=true" in argv and "exp_ctrl.total_train_steps=2" in argv
        assert not any("dtype" in a for a in argv)  # the engines' default: bf16 on CUDA
    assert by_name["bench_generate"].targets == selfcheck_checks.GENERATE_TARGETS
    assert "1b" in by_name["bench_generate"].argv and "1b" in by_name["train_vs_hf"].argv


def _python_check(name, code, timeout_s=60.0, **kw):
    return selfcheck_checks.Check(
        name, name, (sys.executable, "-c", code), timeout_s, lambda text, s: {}, **kw
    )


def test_a_failing_or_hanging_check_is_a_failed_result_with_its_output(tmp_path):
    failing = _python_check("boom", "import sys; print('working'); sys.exit('it broke')")
    result = selfcheck.run_check(failing, str(tmp_path), str(tmp_path / "boom.log"))
    assert (result.status, result.reason) == (FAIL, "exit status 1")
    assert result.tail == "working\nit broke"

    hanging = _python_check(
        "hang", "import time; print('started', flush=True); time.sleep(60)", timeout_s=1.0
    )
    result = selfcheck.run_check(hanging, str(tmp_path), str(tmp_path / "hang.log"), timeout_scale=2.0)
    assert (result.status, result.reason) == (FAIL, "timed out after 2 s") and result.seconds < 30
    assert result.tail == "started"

    no_summary = _python_check("quiet", "pass", summary_path=str(tmp_path / "summary.json"))
    result = selfcheck.run_check(no_summary, str(tmp_path), str(tmp_path / "quiet.log"))
    assert (result.status, result.reason) == (
        FAIL,
        f"no summary.json written by this run at {tmp_path / 'summary.json'}",
    )

    path = tmp_path / "written" / "summary.json"
    code = f"import json, os; os.makedirs({str(path.parent)!r}); json.dump({{'steps': 3}}, open({str(path)!r}, 'w'))"
    writes = selfcheck_checks.Check(
        "writes",
        "writes",
        (sys.executable, "-c", code),
        60,
        selfcheck_checks._from_summary(("steps",)),
        targets=(Target("steps", "==", 3),),
        summary_path=str(path),
    )
    result = selfcheck.run_check(writes, str(tmp_path), str(tmp_path / "writes.log"))
    assert (result.status, result.figures, result.targets[0]["met"]) == (PASS, {"steps": 3}, True)

    missing = selfcheck_checks.Check(
        "absent", "absent", (str(tmp_path / "no-such-program"),), 60, lambda t, s: {}
    )
    result = selfcheck.run_check(missing, str(tmp_path), str(tmp_path / "absent.log"))
    assert result.status == FAIL and result.reason.startswith("could not start: ")


def test_one_real_cpu_run_of_the_decoding_benchmark_writes_a_passing_report(tmp_path):
    """The command itself, restricted to the tiny CPU decoding benchmark (~15 s) and the GPU tests
    (skipped here): the report says what ran, with its figures."""
    out = tmp_path / "report"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "realrl.apps.selfcheck",
            "--only",
            "bench_generate,gpu_tests",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "selfcheck.json").read_text())
    if report["device"] == "cuda":
        pytest.skip("the CPU variant of this check runs only without CUDA")
    assert proc.stdout.startswith("no CUDA device (torch.cuda.is_available() is false)")
    assert [(c["name"], c["status"]) for c in report["checks"]] == [
        ("gpu_tests", SKIPPED),
        ("bench_generate", PASS),
    ]
    bench = report["checks"][1]
    assert bench["figures"]["decode_tok_s"] > 0 and 0 < bench["figures"]["roofline_pct"] < 100
    assert bench["figures"]["realrl_eager_tok_s"] == bench["figures"]["decode_tok_s"]
    assert bench["figures"]["transformers_generate_tok_s"] > 0
    assert report["engine_dtype"] == "float32" and report["torch_version"] and report["flash_attn_version"]
    assert (out / "selfcheck.md").read_text().startswith("# realrl selfcheck: PASS")
    assert (out / "logs" / "bench_generate.log").exists()
    assert "bench_generate  PASS" in proc.stdout
