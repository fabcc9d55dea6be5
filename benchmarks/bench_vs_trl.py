"""realrl vs TRL on the embedded toy task (target: at least 2x TRL's throughput at equal or better
reward): (a) reward modeling, realrl ``rw`` vs TRL ``RewardTrainer``; (b) GRPO, realrl ``grpo`` vs
TRL ``GRPOTrainer``.

Same toy files, same tokenizer, the SAME random initial weights (one ``ReaLModel`` written as an
HF llama folder that both sides load), same batch sizes, lengths, optimiser (AdamW 0.9/0.95,
eps 1e-5, clip 1, constant LR, fp32, no dropout, no gradient checkpointing) and number of steps.
GRPO: 64 prompts x 4 answers a step, 13 new tokens, temperature 1, k3 KL 0.04 in the loss, clip
0.2, 4 epochs x 4 minibatches (TRL: num_iterations=4, steps_per_generation=4, so one realrl step
is one TRL generation round of 16 optimizer steps). The reward is the toy task's hidden rule
(``toy_sentiment``), decoded completions in, on both sides.

Each side runs in its own child process, one after the other (never in parallel), ``--rounds``
times, alternating which side goes first; the parent samples RSS and CPU time of the child's
whole process tree (realrl's master and workers). Step time is the median over steps after the
first, then the median over rounds; tokens/s counts real (unpadded) tokens:
RM, chosen + rejected of each pair; GRPO, generated tokens + tokens trained on (epochs x
prompt + answer). Held-out scores come from ONE evaluator (realrl's toy evaluation) reading
both sides' saved HF folders.

    python benchmarks/bench_vs_trl.py [--quick] [--rounds 3] [--steps N] [--tasks rw,grpo] [--threads 1]
        [--compile]
    python benchmarks/bench_vs_trl.py --smoke   # both sides, both tasks: 2 steps of a few sequences
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _smoke import parse_args  # noqa: E402
from _trl_common import (  # noqa: E402
    BenchSpec,
    cpu_per_step,
    known_paths,
    prepare,
    python,
    run_measured,
    rw_tokens_per_pair,
)

SIDES = ("realrl", "trl")


def child_main(side: str, task: str, spec_path: str, out_path: str) -> None:
    """Inside the measured child: train one side on one task, write its figures as JSON."""
    spec = BenchSpec.load(spec_path)
    paths = known_paths(spec)
    standby = None
    if side == "realrl":  # as the CLI does first: its workers warm up while this process imports
        from realrl.system.standby import StandbyWorkers

        standby = StandbyWorkers(spec.workers)
        import _trl_real as runner
    else:  # only the TRL side imports these: the realrl master's memory is its own
        import _trl_hf as runner
        import datasets
        import transformers

        datasets.disable_progress_bars()
        transformers.logging.set_verbosity_error()
    try:
        result = runner.run(task, spec, paths, standby) if standby else runner.run(task, spec, paths)
    finally:
        if standby is not None:
            standby.close()
    if side == "trl":  # realrl's runner reports its workers' threads; its master has no torch
        import torch

        result["torch_threads"] = torch.get_num_threads()
    with open(out_path, "w") as f:
        json.dump(result, f)


def mean_prompt_tokens(spec: BenchSpec, paths: dict[str, str], limit: int = 4000) -> float:
    from realrl.api.core.data_api import load_hf_tokenizer

    tok = load_hf_tokenizer(paths["tokenizer"])
    lens = []
    with open(paths["ppo_train"]) as f:
        for i, line in enumerate(f):
            if i >= limit:
                break
            lens.append(min(len(tok(json.loads(line)["prompt"])["input_ids"]), spec.max_prompt_len))
    return statistics.fmean(lens)


def completion_length(side: str, result: dict) -> float:
    if side == "realrl":
        vals = [r["compute_adv/response_length"] for r in result["records"]]
    else:
        vals = [log["completions/mean_length"] for log in result["logs"] if "completions/mean_length" in log]
    return statistics.fmean(vals)


def measure(task: str, side: str, spec: BenchSpec, spec_path: str, threads: int | None) -> dict:
    out_path = os.path.join(spec.bench_dir, f"{side}_{task}.json")
    log_path = os.path.join(spec.bench_dir, f"{side}_{task}.log")
    argv = [python(), os.path.abspath(__file__), "--child", side, task, spec_path, out_path]
    print(f"  running {side} {task} (log: {log_path}) ...", flush=True)
    proc = run_measured(argv, log_path, threads)
    with open(out_path) as f:
        result = json.load(f)
    result["cpu_step_s"] = cpu_per_step(proc.pop("cpu_series"), result["step_ends"])
    result["cpu_step_s_by_process"] = {
        kind: cpu_per_step(series, result["step_ends"])
        for kind, series in proc.pop("cpu_series_by_process").items()
    }
    result["startup_s"] = result["step_ends"][0] - proc["t_start"]  # child start to first step done
    result.update(proc)
    return result


ROUND_MEDIANS = ("step_s", "cpu_step_s", "startup_s", "process_wall_s", "peak_rss_mb")


def combine_rounds(rounds: list[dict]) -> dict:
    """One side's figures over its rounds: the median of each timing and memory figure; the
    rest (checkpoint, records, per-MFC seconds) from the last round."""
    out = dict(rounds[-1])
    for key in ROUND_MEDIANS:
        vals = [r[key] for r in rounds if r.get(key) is not None]
        if vals:
            out[key] = statistics.median(vals)
    out["round_step_s"] = [r["step_s"] for r in rounds]
    out["round_compile_s"] = [r.get("compile_s", 0.0) for r in rounds]
    return out


def evaluate(task: str, side: str, result: dict, spec: BenchSpec, paths: dict[str, str]) -> dict:
    import _trl_eval

    ckpt = result["checkpoint"]
    if not os.path.isfile(os.path.join(ckpt, "config.json")):
        return {"eval_error": f"no checkpoint at {ckpt}"}
    if task == "rw":
        return {"accuracy": _trl_eval.rm_accuracy(side, ckpt, spec, paths)}
    mean, std = _trl_eval.policy_true_reward(ckpt, spec, paths)
    return {"true_reward": mean, "true_reward_std": std}


def throughput(task: str, side: str, r: dict, spec: BenchSpec, shared: dict) -> float:
    """Real tokens per second of one steady step."""
    if task == "rw":
        tokens = spec.rw_pairs * shared["rw_tokens_per_pair"]
    else:
        n_seqs = spec.grpo_prompts * spec.grpo_n
        answer = completion_length(side, r)
        tokens = n_seqs * (answer + spec.ppo_epochs * (shared["prompt_tokens"] + answer))
        r["completion_len"] = answer
    r["tokens_per_step"] = tokens
    return tokens / r["step_s"]


def _per_process(r: dict) -> str:
    return ", ".join(
        f"{name.split(' ')[-1][:30]} {mb:.0f}" for name, mb in r["peak_rss_mb_per_process"].items()
    )


def grpo_breakdown(res: dict[str, dict], spec: BenchSpec) -> list[tuple[str, str]]:
    """Where a GRPO step goes on each side: realrl's per-MFC seconds; TRL's optimizer steps
    (wall time between step ends), split into the round's first step (generation, rewards, old
    and ref log-probs, one update) and the other updates."""
    updates = spec.ppo_epochs * spec.ppo_minibatches
    ends = res["trl"]["update_ends"]
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    rounds = [gaps[i : i + updates] for i in range(updates - 1, len(gaps), updates)]  # rounds 2..
    first = statistics.median(r[0] for r in rounds) if rounds else float("nan")
    rest = statistics.median(t for r in rounds for t in r[1:]) if rounds else float("nan")
    mfc = res["realrl"].get("mfc_seconds", {})
    train = mfc.get("actor_train", float("nan"))
    return [
        (
            "TRL: generation step / each other update (median), s",
            f"{first:.3f} / {rest:.3f} (x{updates - 1})",
        ),
        ("realrl actor_train per update, s", f"{train / updates:.3f} (x{updates})"),
    ]


def compile_rows(res: dict[str, dict], steps: int) -> list[tuple[str, str]]:
    """What compiling realrl's model cost once (each round), and the step with that cost spread
    over the run's steps against TRL's."""
    rounds = [f"{s:.1f}" for s in res["realrl"]["round_compile_s"]]
    once = res["realrl"]["round_compile_s"][0]  # the first round compiles cold
    amortised = res["realrl"]["step_s"] + once / steps
    return [
        ("realrl one-off compile per round (first cold, then warm from the cache), s", " / ".join(rounds)),
        (
            f"realrl step with the cold compile spread over {steps} steps, s",
            f"{amortised:.3g} ({res['trl']['step_s'] / amortised:.2f}x TRL's step)",
        ),
    ]


def _fmt(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "n/a"
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}g}"
    return str(x)


def _ratio(a, b) -> str:
    if a is None or b is None or not b or a != a or b != b:
        return "n/a"
    return f"{a / b:.2f}x"


def table(task: str, res: dict[str, dict], extra_rows: list[tuple[str, str]]) -> str:
    real, trl = res["realrl"], res["trl"]
    rows = [
        ("step time, s (median)", "step_s", "time"),
        ("CPU time per step, s (whole tree)", "cpu_step_s", "time"),
        ("tokens/s", "tokens_per_s", "rate"),
        ("start-up: process start to first step done, s", "startup_s", "time"),
        ("process wall (start-up..exit), s", "process_wall_s", "time"),
        ("peak RSS, process tree, MB", "peak_rss_mb", "mem"),
    ]
    if task == "rw":
        rows.append(("held-out pair accuracy", "accuracy", "score"))
    else:
        rows += [
            ("held-out true reward", "true_reward", "score"),
            ("mean answer length", "completion_len", "-"),
        ]
    lines = [f"| {task} | realrl | TRL | ratio |", "|---|---|---|---|"]
    for label, key, kind in rows:
        a, b = real.get(key), trl.get(key)
        if kind == "time":  # throughput ratio: TRL time / realrl time
            ratio = _ratio(b, a)
        elif kind in ("rate", "mem", "score"):
            ratio = (
                _ratio(a, b)
                if kind != "score"
                else (f"{a - b:+.3f}" if a is not None and b is not None else "n/a")
            )
        else:
            ratio = ""
        if kind == "score" and key == "true_reward":
            a = None if a is None else f"{a:.3f} ± {real['true_reward_std']:.2f}"
            b = None if b is None else f"{b:.3f} ± {trl['true_reward_std']:.2f}"
        lines.append(f"| {label} | {_fmt(a)} | {_fmt(b)} | {ratio} |")
    lines += [f"| {k} | {v} | | |" for k, v in extra_rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=None, help="steps of both tasks (default rw 30, grpo 8)")
    parser.add_argument(
        "--quick", action="store_true", help="rw 8 steps, grpo 3 steps, 200 eval prompts, 1 round"
    )
    parser.add_argument("--tasks", default="rw,grpo")
    parser.add_argument("--fileroot", default="outputs/bench_vs_trl")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-prompts", type=int, default=None)
    parser.add_argument(
        "--init",
        default=None,
        help="HF checkpoint both sides start from (e.g. the toy SFT model under"
        " <fileroot>/sft/toy-seed1/checkpoints/default/final); default: random weights",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OMP/MKL threads of every process on both sides (0: torch's default). On 2 shared cores"
        " 1 thread is ~3-4x faster than 2 for both sides (see docs/bench_vs_trl.md)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="runs of each side per task, alternating which goes first; timings are the medians"
        " (the machine's speed drifts by 10-30%% over minutes here)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="realrl model workers, each model data-parallel over them (e.g. 2 on 2 cores, with"
        " --threads 1 --trl-threads 2: each side uses the whole machine its own way)",
    )
    parser.add_argument(
        "--trl-threads", type=int, default=None, help="TRL's torch threads (default: --threads)"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="realrl's trained model with engine.compile=on; adds the one-off compile and the step"
        " with it amortised over the run's steps",
    )
    parser.add_argument("--child", nargs=4, metavar=("SIDE", "TASK", "SPEC", "OUT"), help=argparse.SUPPRESS)
    args = parse_args(parser, argv, steps=2, rounds=1, eval_prompts=16)
    if args.child:
        child_main(*args.child)
        return

    spec = BenchSpec.sized(
        args.fileroot,
        args.smoke,
        seed=args.seed,
        rw_steps=30,
        grpo_steps=8,
        init=args.init,
        workers=args.workers,
        compile=args.compile,
    )
    threads = {"realrl": args.threads, "trl": args.threads if args.trl_threads is None else args.trl_threads}
    if args.quick:
        spec.rw_steps, spec.grpo_steps, spec.eval_prompts = 8, 3, 200
        args.rounds = 1
    if args.steps is not None:
        spec.rw_steps = spec.grpo_steps = args.steps
    if args.eval_prompts is not None:
        spec.eval_prompts = args.eval_prompts
    tasks = [t for t in args.tasks.split(",") if t]
    paths = prepare(spec)
    spec_path = os.path.join(spec.bench_dir, "spec.json")
    spec.save(spec_path)
    shared = {
        "rw_tokens_per_pair": rw_tokens_per_pair(paths["rm_train"], paths["tokenizer"], spec.max_seqlen),
        "prompt_tokens": mean_prompt_tokens(spec, paths),
    }
    print(f"load average at start: {os.getloadavg()}, cores: {os.cpu_count()}", flush=True)
    all_results: dict = {"spec": spec.__dict__, "shared": shared}
    reports = []
    for task in tasks:
        runs: dict[str, list[dict]] = {side: [] for side in SIDES}
        for k in range(args.rounds):  # alternate who goes first: drift of the machine hits both
            for side in SIDES if k % 2 == 0 else SIDES[::-1]:
                runs[side].append(measure(task, side, spec, spec_path, threads[side]))
        res = {side: combine_rounds(runs[side]) for side in SIDES}
        for side in SIDES:
            res[side]["tokens_per_s"] = throughput(task, side, res[side], spec, shared)
        print(f"  evaluating {task} ...", flush=True)
        for side in SIDES:
            res[side].update(evaluate(task, side, res[side], spec, paths))
        extra = [
            ("steps", str(spec.rw_steps if task == "rw" else spec.grpo_steps)),
            ("initial weights", spec.init or f"random (seed {spec.seed})"),
            (
                "load avg (1 min) before/after, realrl",
                f"{res['realrl']['load_before']:.1f} / {res['realrl']['load_after']:.1f}",
            ),
            (
                "load avg (1 min) before/after, TRL",
                f"{res['trl']['load_before']:.1f} / {res['trl']['load_after']:.1f}",
            ),
            (
                "torch threads realrl / TRL",
                f"{res['realrl']['torch_threads']} / {res['trl']['torch_threads']}",
            ),
            ("realrl model workers (data-parallel)", str(spec.workers)),
            (
                "step time per round (run order alternates), realrl / TRL, s",
                "; ".join(
                    f"{a:.3g} / {b:.3g} ({b / a:.2f}x)"
                    for a, b in zip(res["realrl"]["round_step_s"], res["trl"]["round_step_s"])
                ),
            ),
        ]
        extra.append(("peak RSS per process, realrl, MB", _per_process(res["realrl"])))
        extra.append(
            (
                "CPU s per step per process, realrl",
                ", ".join(f"{k} {v:.3f}" for k, v in res["realrl"]["cpu_step_s_by_process"].items()),
            )
        )
        if task == "grpo":
            import _trl_eval

            extra += grpo_breakdown(res, spec)

            base, base_std = _trl_eval.policy_true_reward(paths["init_lm"], spec, paths)
            extra.append(("held-out true reward of the initial policy", f"{base:.3f} ± {base_std:.2f}"))
        mfc = res["realrl"].get("mfc_seconds", {})
        extra.append(
            (
                "realrl seconds per MFC (mean, steps 2..)",
                ", ".join(f"{k} {v:.3f}" for k, v in mfc.items()) + f"; step {res['realrl']['step_s']:.3f}",
            )
        )
        if spec.compile:
            extra += compile_rows(res, spec.rw_steps if task == "rw" else spec.grpo_steps)
        reports.append(table(task, res, extra))
        for side in SIDES:
            res[side].pop("records", None)
            res[side].pop("logs", None)
            res[side].pop("step_ends", None)
            res[side].pop("update_ends", None)
        all_results[task] = res
    with open(os.path.join(spec.bench_dir, "results.json"), "w") as f:
        json.dump(all_results, f, indent=1, default=str)
    print()
    print("\n\n".join(reports))
    print(
        "\nratio: times and CPU times as TRL / realrl (a speed-up, > 1 = realrl faster); tokens/s and"
        " memory as realrl / TRL; scores as realrl - TRL."
    )
    print(f"\n(full figures: {os.path.join(spec.bench_dir, 'results.json')})")


if __name__ == "__main__":
    main()
