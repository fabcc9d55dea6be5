"""The TRL side of ``bench_vs_trl.py``: ``RewardTrainer`` and ``GRPOTrainer`` (TRL 1.16) on the
same toy files, starting from the same HF checkpoint folders, with realrl's settings mirrored:
fp32, no gradient checkpointing, no dropout, AdamW(0.9, beta2, eps), grad clip, constant LR."""

from __future__ import annotations

import os
import time

from _trl_common import BenchSpec, summarize_steps


def _step_clock():
    """A TrainerCallback that stamps the end of every optimizer step."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []
            self.logs: list[dict] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.time())

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs or {}))

    return StepClock()


def _shared_args(spec: BenchSpec, out_dir: str, lr: float, max_steps: int, log_every: int = 1) -> dict:
    return dict(
        output_dir=out_dir,
        max_steps=max_steps,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=spec.beta2,
        adam_epsilon=spec.adam_eps,
        max_grad_norm=spec.grad_clip,
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,  # TRL's default is True; realrl does not recompute
        bf16=False,
        fp16=False,
        use_cpu=True,
        disable_dropout=True,
        logging_steps=log_every,  # once per realrl step, as realrl logs
        save_strategy="no",
        report_to=[],
        seed=spec.seed,
        data_seed=spec.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def load_reward_model(init_rm: str):
    """LlamaForSequenceClassification with realrl's initial scalar head copied into ``score``."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaForSequenceClassification

    model = LlamaForSequenceClassification.from_pretrained(init_rm, num_labels=1, dtype=torch.float32)
    head = load_file(os.path.join(init_rm, "critic_head.safetensors"))
    with torch.no_grad():
        model.score.weight.copy_(head["weight"])  # realrl's head bias starts at 0; HF's score has none
    return model


def run_rw(spec: BenchSpec, paths: dict[str, str], out_dir: str) -> dict:
    from datasets import load_dataset
    from transformers import AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    tokenizer = AutoTokenizer.from_pretrained(paths["tokenizer"])
    model = load_reward_model(paths["init_rm"])
    model.config.pad_token_id = tokenizer.pad_token_id
    train = load_dataset("json", data_files=paths["rm_train"], split="train")
    args = RewardConfig(
        per_device_train_batch_size=spec.rw_pairs,
        max_length=spec.max_seqlen,
        **_shared_args(spec, out_dir, spec.rw_lr, spec.rw_steps),
    )
    clock = _step_clock()
    trainer = RewardTrainer(
        model=model, args=args, train_dataset=train, processing_class=tokenizer, callbacks=[clock]
    )
    start = time.time()
    trainer.train()
    wall = time.time() - start
    trainer.save_model(os.path.join(out_dir, "final"))
    out = summarize_steps(clock.ends, start)
    out.update({"train_wall_s": wall, "checkpoint": os.path.join(out_dir, "final"), "logs": clock.logs})
    return out


def run_grpo(spec: BenchSpec, paths: dict[str, str], out_dir: str) -> dict:
    """One realrl step = one TRL generation round: ``grpo_prompts`` x ``grpo_n`` answers, then
    ``ppo_epochs`` (num_iterations) x ``ppo_minibatches`` (steps_per_generation) optimizer steps."""
    import torch
    from datasets import load_dataset
    from transformers import AutoTokenizer, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from realrl.impl.dataset.toy.corpus import toy_sentiment_reward

    def toy_sentiment(prompts, completions, **kwargs) -> list[float]:
        return toy_sentiment_reward(prompts, completions)

    tokenizer = AutoTokenizer.from_pretrained(paths["tokenizer"])
    model = LlamaForCausalLM.from_pretrained(paths["init_lm"], dtype=torch.float32)
    train = load_dataset("json", data_files=paths["ppo_train"], split="train")
    n_seqs = spec.grpo_prompts * spec.grpo_n
    updates_per_step = spec.ppo_epochs * spec.ppo_minibatches
    args = GRPOConfig(
        per_device_train_batch_size=n_seqs // spec.ppo_minibatches,
        steps_per_generation=spec.ppo_minibatches,
        num_iterations=spec.ppo_epochs,
        num_generations=spec.grpo_n,
        max_completion_length=spec.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=spec.kl_coef,
        epsilon=0.2,
        scale_rewards="group",
        use_vllm=False,
        **_shared_args(spec, out_dir, spec.grpo_lr, spec.grpo_steps * updates_per_step, updates_per_step),
    )
    clock = _step_clock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=toy_sentiment,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    start = time.time()
    trainer.train()
    wall = time.time() - start
    trainer.save_model(os.path.join(out_dir, "final"))
    rounds = clock.ends[updates_per_step - 1 :: updates_per_step]  # end of each generation round
    out = summarize_steps(rounds, start)
    out.update({"train_wall_s": wall, "checkpoint": os.path.join(out_dir, "final"), "logs": clock.logs})
    out["update_ends"] = clock.ends  # every optimizer step: splits a round into generation and updates
    return out


def run(task: str, spec: BenchSpec, paths: dict[str, str]) -> dict:
    out_dir = os.path.join(spec.bench_dir, f"trl_{task}")
    return run_rw(spec, paths, out_dir) if task == "rw" else run_grpo(spec, paths, out_dir)
