"""GRPO on SmolLM2-135M-Instruct, the whole recipe: data, the base model's held-out accuracy,
training per seed, the learning curve, the final accuracy through realrl and through
transformers, and the same with a LoRA actor reloaded by peft; one table and one picture.

    python examples/real_model/make_hf_folder.py --out outputs/smollm2-135m-instruct
    python examples/real_model/recipe.py --model outputs/smollm2-135m-instruct --out outputs/smollm2_recipe

Every stage writes its result under ``--out`` (``data/``, ``runs/``, ``eval/*.json``) and is
skipped when that result is there already, so an interrupted recipe goes on where it stopped.
The end: ``results.json`` (every figure), ``results.md`` (the table) and ``curve.png``.

The task: "What is 7 * 12?" with both operands below 20 (``make_arith_prompts.py --ops '+*'
--max-operand 20``): 800 distinct questions, of which ``--n-valid`` (500) are held out and never
trained on. The reward is realrl's ``math_answer`` checker (1 for the right final number, else
0); no format reward. Training is ``examples/configs/smollm2_grpo.yaml`` from the released
checkpoint itself (no SFT phase).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CONFIGS = os.path.join(REPO, "examples", "configs")


def log(msg: str) -> None:
    print(f"[recipe {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[str], log_path: str, steps: tuple[int, str] | None = None) -> float:
    """Run ``cmd`` with its output in ``log_path``; its wall seconds. ``steps``: (total, the
    run's ``stats.jsonl``), polled for a progress bar of its training steps. A failure stops the
    recipe with the log's last lines."""
    log(" ".join(cmd) + f"  (log: {log_path})")
    t = time.time()
    with open(log_path, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
        if steps is None:
            code = proc.wait()
        else:
            code = follow_steps(proc, *steps)
    if code != 0:
        with open(log_path) as f:
            tail = f.readlines()[-15:]
        raise SystemExit(f"failed (exit {code}): {' '.join(cmd)}\n{''.join(tail)}")
    return round(time.time() - t, 1)


def follow_steps(proc: subprocess.Popen, total: int, stats_path: str) -> int:
    """A progress bar of a training run's steps (the lines of its ``stats.jsonl``) until it ends."""
    from tqdm import tqdm

    with tqdm(total=total, desc="GRPO steps", unit="step") as bar:
        while proc.poll() is None:
            time.sleep(2.0)
            if os.path.exists(stats_path):
                with open(stats_path) as f:
                    done = sum(1 for line in f if line.strip())
                if done > bar.n:
                    bar.update(done - bar.n)
    return proc.returncode


class Recipe:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = os.path.abspath(args.out)
        self.data = os.path.join(self.out, "data")
        for sub in ("data", "runs", "eval", "logs"):
            os.makedirs(os.path.join(self.out, sub), exist_ok=True)

    # -- stages ----------------------------------------------------------------------------------

    def make_data(self) -> None:
        a = self.args
        if os.path.exists(os.path.join(self.data, "rl_valid.jsonl")):
            return
        run(
            [
                sys.executable,
                os.path.join(HERE, "make_arith_prompts.py"),
                "--model",
                a.model,
                "--out",
                self.data,
                "--ops",
                "+*",
                "--max-operand",
                "20",
                "--phases",
                "rl",
                "--n-rl",
                str(a.n_train),
                "--n-valid",
                str(a.n_valid),
                "--seed",
                "1",
            ],
            os.path.join(self.out, "logs", "data.log"),
        )

    def evaluate(
        self, name: str, checkpoint: str, *, n: int, k: int, mode: str = "realrl", adapter: str | None = None
    ) -> dict:
        """``evaluate.py`` on ``checkpoint`` (cached in ``eval/<name>.json``)."""
        path = os.path.join(self.out, "eval", f"{name}.json")
        if not os.path.exists(path):
            cmd = [
                sys.executable,
                os.path.join(HERE, "evaluate.py"),
                checkpoint,
                "--data",
                os.path.join(self.data, "rl_valid.jsonl"),
                "-n",
                str(n),
                "--k",
                str(k),
                "--pass-n",
                str(self.args.pass_n),
                "--tokenizer",
                self.args.model,
                "--out",
                path,
            ]
            if mode != "realrl":
                cmd.append("--hf")
            if adapter:
                cmd += ["--adapter", adapter]
            run(cmd, os.path.join(self.out, "logs", f"eval-{name}.log"))
        with open(path) as f:
            return json.load(f)

    def train(self, name: str, seed: int, extra: list[str]) -> dict:
        """One GRPO run (``runs/<name>``); its summary and the wall seconds of the command."""
        a = self.args
        run_dir = os.path.join(self.out, "runs", name, "default")
        summary_path = os.path.join(run_dir, "summary.json")
        if not os.path.exists(summary_path):
            cmd = [
                sys.executable,
                "-m",
                "realrl.apps.quickstart",
                "grpo",
                "--config-path",
                CONFIGS,
                "--config-name",
                "smollm2_grpo",
                f"actor.path={a.model}",
                f"dataset.path={os.path.join(self.data, 'rl_train.jsonl')}",
                f"exp_ctrl.total_train_steps={a.steps}",
                f"exp_ctrl.save_freq_steps={a.curve_every}",
                "exp_ctrl.eval_freq_steps=null",  # evaluate.py scores the saved checkpoints instead
                f"seed={seed}",
                f"experiment_name={name}",
                "trial_name=default",
                f"fileroot={os.path.join(self.out, 'runs')}",
                *extra,
                *a.override,
            ]
            stats = os.path.join(run_dir, "stats.jsonl")
            wall = run(cmd, os.path.join(self.out, "logs", f"train-{name}.log"), steps=(a.steps, stats))
            with open(os.path.join(run_dir, "command_wall_seconds"), "w") as f:
                f.write(str(wall))
        with open(summary_path) as f:
            summary = json.load(f)
        with open(os.path.join(run_dir, "command_wall_seconds")) as f:
            summary["command_wall_seconds"] = float(f.read())
        with open(os.path.join(run_dir, "stats.jsonl")) as f:
            summary["batch_reward"] = [
                json.loads(line).get("compute_adv/task_reward") for line in f if line.strip()
            ]
        summary["run_dir"] = run_dir
        return summary

    def checkpoints(self, run_dir: str) -> list[tuple[int, str]]:
        """The run's saved actor checkpoints: (step, folder), the final one as ``--steps``."""
        root = os.path.join(run_dir, "checkpoints", "actor")
        found = []
        for entry in sorted(os.listdir(root)):
            if entry == "final":
                found.append((self.args.steps, os.path.join(root, entry)))
            elif entry.startswith("step") and entry[4:].isdigit() and int(entry[4:]) < self.args.steps:
                found.append((int(entry[4:]), os.path.join(root, entry)))
        return sorted(found)

    # -- the whole recipe ------------------------------------------------------------------------

    def go(self) -> dict:
        a = self.args
        self.make_data()
        results: dict = {"config": vars(a), "seeds": {}, "lora": {}}
        base = self.evaluate("base", a.model, n=a.n_valid, k=a.k)
        results["base"] = base
        curve_base = (
            base if a.curve_n == a.n_valid else self.evaluate("base-curve", a.model, n=a.curve_n, k=0)
        )
        for seed in a.lora_seeds:
            lora = [
                f"actor.lora.rank={a.lora_rank}",
                f"actor.lora.alpha={2 * a.lora_rank}",
                f"actor.optimizer.lr={a.lora_lr}",
            ]
            r = self.one_seed(f"lora-s{seed}", seed, lora, curve_base)
            adapter = os.path.join(r["final_checkpoint"], "adapter")
            peft_eval = self.evaluate(
                f"lora-s{seed}-peft", a.model, n=a.n_valid, k=0, mode="hf", adapter=adapter
            )
            r["peft"] = {
                "accuracy": peft_eval["accuracy"],
                "seconds": peft_eval["seconds"],
                "same_answers": same_answers(peft_eval, self.final_eval(f"lora-s{seed}")),
            }
            results["lora"][seed] = r
        for seed in a.seeds:
            lr = [f"actor.optimizer.lr={a.lr}"]
            results["seeds"][seed] = self.one_seed(f"grpo-s{seed}", seed, lr, curve_base)
        if a.hf_check and a.seeds:
            s = a.seeds[0]
            final = results["seeds"][s]["final_checkpoint"]
            hf = self.evaluate(f"grpo-s{s}-hf", final, n=a.n_valid, k=0, mode="hf")
            results["hf_check"] = {
                "seed": s,
                "accuracy": hf["accuracy"],
                "seconds": hf["seconds"],
                "same_answers": same_answers(hf, self.final_eval(f"grpo-s{s}")),
            }
        return results

    def final_eval(self, name: str) -> dict:
        with open(os.path.join(self.out, "eval", f"{name}-final.json")) as f:
            return json.load(f)

    def one_seed(self, name: str, seed: int, extra: list[str], curve_base: dict) -> dict:
        a = self.args
        summary = self.train(name, seed, extra)
        saved = self.checkpoints(summary["run_dir"])
        curve = [(0, curve_base["accuracy"])]
        for step, folder in saved:
            if step == a.steps:
                final = self.evaluate(f"{name}-final", folder, n=a.n_valid, k=a.k)
                if a.curve_n == a.n_valid:
                    curve.append((step, final["accuracy"]))
                else:
                    curve.append(
                        (step, self.evaluate(f"{name}-curve{step}", folder, n=a.curve_n, k=0)["accuracy"])
                    )
            else:
                curve.append(
                    (step, self.evaluate(f"{name}-curve{step}", folder, n=a.curve_n, k=0)["accuracy"])
                )
        return {
            "final_checkpoint": saved[-1][1],
            "accuracy": final["accuracy"],
            "pass_at_k": final.get("pass_at_k"),
            "sampled_accuracy": final.get("sampled_accuracy"),
            "eval_seconds": final["seconds"],
            "ref_kl": summary.get("compute_adv/ref_kl"),
            "curve": curve,
            "batch_reward": summary["batch_reward"],
            "train_wall_seconds": summary["command_wall_seconds"],
            "phase_seconds": summary.get("phase_seconds"),
            "worker_peak_rss_gb": summary.get("phase_worker_peak_rss_gb", {}).get("grpo"),
            "master_peak_rss_gb": summary.get("master_peak_rss_gb"),
        }


def batch_of(overrides: list[str]) -> str:
    """The batch of a step in words, from the config and the overrides (``8 prompts x 4 answers``)."""
    values = {"dataset.train_bs_n_seqs": "8", "ppo.gen.n": "4"}  # examples/configs/smollm2_grpo.yaml
    values.update(o.split("=", 1) for o in overrides if o.split("=", 1)[0] in values)
    return f"{values['dataset.train_bs_n_seqs']} prompts x {values['ppo.gen.n']} answers"


def same_answers(a: dict, b: dict) -> int:
    """How many problems two evaluations answered with the very same greedy text."""
    return sum(x == y for x, y in zip(a["greedy"], b["greedy"]))


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def table(results: dict) -> str:
    a, base = results["config"], results["base"]
    k = a["k"]
    lines = [
        f"GRPO from SmolLM2-135M-Instruct, {a['steps']} steps of {a['batch']}; greedy accuracy on "
        f"{base['n']} held-out problems, pass@{k} and the sampled answers' accuracy (temperature 1) "
        f"on the first {base.get('pass_n', base['n'])} of them",
        "",
        f"| run | greedy accuracy | gain (points) | pass@{k} | sampled accuracy | KL to the reference (nats) | training wall | worker peak RSS |",
        "|---|---|---|---|---|---|---|---|",
        f"| base model | {pct(base['accuracy'])} | | {pct(base.get('pass_at_k'))} | {pct(base.get('sampled_accuracy'))} | | | |",
    ]
    gains = []
    for kind, rows in (("seed", results["seeds"]), ("LoRA, seed", results["lora"])):
        for seed, r in rows.items():
            gain = 100 * (r["accuracy"] - base["accuracy"])
            if kind == "seed":
                gains.append(gain)
            kl = "-" if r["ref_kl"] is None else f"{r['ref_kl']:.2f}"
            rss = "-" if r["worker_peak_rss_gb"] is None else f"{r['worker_peak_rss_gb']:.2f} GB"
            lines.append(
                f"| {kind} {seed} | {pct(r['accuracy'])} | {gain:+.1f} | {pct(r['pass_at_k'])} | "
                f"{pct(r['sampled_accuracy'])} | {kl} | {r['train_wall_seconds'] / 60:.1f} min | {rss} |"
            )
            if "peft" in r:
                lines.append(
                    f"| LoRA, seed {seed}, reloaded by peft | {pct(r['peft']['accuracy'])} | | | | | | |"
                )
    if gains:
        lines.append(
            f"| mean gain over {len(gains)} seeds | | **{sum(gains) / len(gains):+.1f}** | | | | | |"
        )
    hf = results.get("hf_check")
    if hf:
        lines.append(f"| seed {hf['seed']}, reloaded by transformers | {pct(hf['accuracy'])} | | | | | | |")
    return "\n".join(lines) + "\n"


def draw(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    a = results["config"]
    for kind, rows, style in (("seed", results["seeds"], "-o"), ("LoRA seed", results["lora"], "--s")):
        for seed, r in rows.items():
            steps, acc = zip(*r["curve"])
            left.plot(steps, [100 * x for x in acc], style, label=f"{kind} {seed}")
            reward = [x for x in r["batch_reward"] if x is not None]
            right.plot(
                range(1, len(reward) + 1),
                [100 * x for x in reward],
                style[:-1] if style != "-o" else "-",
                alpha=0.7,
                label=f"{kind} {seed}",
            )
    left.set_title(f"held-out greedy accuracy ({a['curve_n']} problems)")
    left.set_xlabel("GRPO step")
    left.set_ylabel("%")
    left.legend()
    right.set_title("batch reward (answers at temperature 1)")
    right.set_xlabel("GRPO step")
    right.set_ylabel("% right")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the HF folder make_hf_folder.py wrote")
    p.add_argument("--out", default="outputs/smollm2_recipe")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=30, help="GRPO steps of 8 prompts x 4 answers")
    p.add_argument("--lr", type=float, default=5e-6)
    p.add_argument("--n-train", type=int, default=300, help="training questions")
    p.add_argument("--n-valid", type=int, default=500, help="held-out questions")
    p.add_argument("--k", type=int, default=8, help="answers per problem for pass@k (0: none)")
    p.add_argument("--pass-n", type=int, default=100, help="held-out problems pass@k is measured on")
    p.add_argument("--curve-every", type=int, default=10, help="steps between the curve's checkpoints")
    p.add_argument("--curve-n", type=int, default=200, help="held-out problems each curve point is scored on")
    p.add_argument(
        "--no-hf-check",
        dest="hf_check",
        action="store_false",
        help="skip transformers' evaluation of the first seed's checkpoint",
    )
    p.add_argument(
        "--lora-seeds", type=int, nargs="*", default=[1], help="seeds of the LoRA variant (none: skip)"
    )
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-lr", type=float, default=5e-5)
    p.add_argument("--override", nargs="*", default=[], help="more key=value options for every run")
    args = p.parse_args(argv)
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        print(
            f"error: --model {args.model} is not an HF folder (no config.json); make it with "
            "examples/real_model/make_hf_folder.py",
            file=sys.stderr,
        )
        return 2
    args.model = os.path.abspath(args.model)
    args.curve_n = min(args.curve_n, args.n_valid)
    args.pass_n = min(args.pass_n, args.n_valid)
    args.batch = batch_of(args.override)
    recipe = Recipe(args)
    started = time.time()
    results = recipe.go()
    results["wall_seconds"] = round(time.time() - started, 1)
    with open(os.path.join(recipe.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    text = table(results)
    with open(os.path.join(recipe.out, "results.md"), "w") as f:
        f.write(text)
    draw(results, os.path.join(recipe.out, "curve.png"))
    print(text)
    log(f"results.json, results.md and curve.png under {recipe.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
