"""Where a realrl training step goes, by ablation: the same step with one part of the model
swapped for a trivial stand-in (wrong numbers, real timings), interleaved with the untouched step,
CPU time of this process, medians. Answers "what is the most a faster X could save?" without a
profiler's per-op overhead, which inflates small ops several-fold on this kind of step.

    python benchmarks/ablate_train_step.py [--task rw|grpo] [--iters 20]
    python benchmarks/ablate_train_step.py --smoke [--task grpo]   # a few sequences, 1 timed step

rw: ``paired_rw.train_step`` on 64 pairs of the toy RM data (what ``bench_vs_trl.py`` times);
grpo: one of GRPO's 16 updates (64 sequences, 16 prompts x 4 answers) after a real generation.
Stand-ins: attention returns its queries (no grid, no kernel), the MLP is skipped, RMSNorm only
scales, rotary is the identity, the optimizer step only zeroes the gradients.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _smoke import parse_args  # noqa: E402
from _trl_common import BenchSpec, prepare  # noqa: E402


def rw_step(spec: BenchSpec, paths: dict[str, str]):
    from _trl_profile import realrl_rw_step

    step, _ = realrl_rw_step(spec, paths)
    return step


def grpo_update(spec: BenchSpec, paths: dict[str, str]):
    return grpo_pieces(spec, paths)["update"]


def grpo_pieces(spec: BenchSpec, paths: dict[str, str]) -> dict:
    """The toy policy after one real generation: ``model``, ``interface``, ``prompts``, the
    ``rollout`` (with reference log-probs and random rewards), ``advantages`` (the rollout plus
    what ``compute_adv`` adds, as the actor's update reads it) and ``update`` (one of the 16)."""
    import realrl.impl.builtin  # noqa: F401  (the model, backend and interface by name)
    from realrl.api.core.config import ModelAbstraction, ModelBackendAbstraction, ModelInterfaceAbstraction
    from realrl.api.core.model_api import FinetuneSpec, make_backend, make_interface, make_model
    from realrl.experiments.toy_eval import load_batch
    from realrl.impl.interface.common import logprob_index, per_sequence_sample
    from realrl.impl.interface.ppo_advantages import AdvantageInterface
    from realrl.impl.interface.ppo_rollout import shuffled_minibatches

    model = make_model(
        ModelAbstraction("real_model", {"path": paths["init_lm"], "tokenizer_path": paths["tokenizer"]}),
        "default",
    )
    opt = {"lr": spec.grpo_lr, "betas": (0.9, spec.beta2), "eps": spec.adam_eps, "grad_clip": spec.grad_clip}
    backend = ModelBackendAbstraction("train", {"optimizer": opt, "engine": {"dtype": "fp32"}})
    model = make_backend(backend).initialize(model, FinetuneSpec(1, 10_000, spec.grpo_prompts))
    gen = {"n": spec.grpo_n, "max_new_tokens": spec.max_new_tokens, "min_new_tokens": spec.max_new_tokens}
    ppo = {
        "gen": {**gen, "temperature": 1.0, "top_k": 0, "top_p": 1.0},
        "ppo_n_minibatches": spec.ppo_minibatches,
    }
    iface = make_interface(
        ModelInterfaceAbstraction("grpo_actor", {"ppo": {**ppo, "kl_loss_coef": spec.kl_coef}})
    )
    prompts = load_batch(
        "prompt", {"dataset_path": paths["ppo_train"]}, model.tokenizer, limit=spec.grpo_prompts
    )
    out = iface.generate(model, prompts)
    out.update_(iface.inference(model, out))
    n = len(out.flat_seqlens("packed_input_ids"))
    out.update_(
        per_sequence_sample(out, "rewards", torch.randn(n, generator=torch.Generator().manual_seed(0)))
    )
    # the compute_adv node, with the actor's hyperparameters (one computation for the batch)
    adv_out, _ = AdvantageInterface(ppo=iface.hp).inference(model, out)
    full = out.select(sorted(out.keys))
    full.update_(adv_out)
    mb = shuffled_minibatches(full.unpack(), spec.ppo_minibatches, torch.Generator().manual_seed(0))[0]
    index_fn = logprob_index(lambda m: m.data["ppo_loss_mask"])
    engine = model.module

    def update():
        engine.train_batch(mb, None, iface._loss_fn, iface._loss_weight, output_index_fn=index_fn)

    return {
        "model": model,
        "interface": iface,
        "prompts": prompts,
        "rollout": out,
        "advantages": full,
        "update": update,
    }


def stand_ins() -> dict[str, contextlib.AbstractContextManager | None]:
    import realrl.impl.model.backend.train_engine as engine_mod
    import realrl.impl.model.modules.kv_cache as kv_cache
    import realrl.impl.model.modules.norm as norm
    import realrl.impl.model.nn.transformer_block as block

    def queries_only(q, k, v, meta, impl, scale, window, dropout_p, keep=None, shared=None):
        if keep is None:
            return q * 1.0
        return q[keep] if shared is None else q[shared[0][keep]]

    def block_without_mlp(self, x, rope, ctx, keep=None):
        x = (x if keep is None else ctx.rows(x, keep)) + self.attn(self.attn_ln(x), rope, ctx, keep)
        return x + self.mlp_ln(x)

    def zero_grad_only(self, version_steps=None):
        self.optimizer.zero_grad(set_to_none=True)
        return {}

    return {
        "full step": None,
        "attention": mock.patch.object(kv_cache, "packed_attention", queries_only),
        "MLP": mock.patch.object(block.TransformerBlock, "forward", block_without_mlp),
        "RMSNorm": mock.patch.object(norm.RMSNorm, "forward", lambda self, x: x * self.weight),
        "rotary": mock.patch.object(block, "apply_rotary", lambda x, cos, sin: x * 1.0),
        "optimizer step": mock.patch.object(engine_mod.TrainEngine, "optimizer_step", zero_grad_only),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=("rw", "grpo"), default="rw")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--fileroot", default="outputs/bench_vs_trl")
    args = parse_args(parser, argv, iters=1)
    torch.set_num_threads(1)
    from realrl.base.host_memory import retain_freed_memory

    retain_freed_memory()  # as the model workers do
    spec = BenchSpec.sized(args.fileroot, args.smoke)
    paths = prepare(spec)
    step = rw_step(spec, paths) if args.task == "rw" else grpo_update(spec, paths)
    variants = stand_ins()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(args.iters + 2):
        for name, patch in variants.items():
            with patch or contextlib.nullcontext():
                tik = time.process_time()
                step()
                if i >= 2:  # two warm-up rounds
                    times[name].append(time.process_time() - tik)
    full = statistics.median(times["full step"])
    print(f"{args.task}: CPU ms per step (median of {args.iters}, 1 thread); what each part costs at most")
    for name, ts in times.items():
        t = statistics.median(ts)
        if name == "full step":
            print(f"  {name:<22} {1e3 * t:7.2f} ms")
        else:
            print(
                f"  without {name:<8} {1e3 * t:7.2f} ms   {name} <= {100 * (full - t) / full:4.1f} % of the step"
            )


if __name__ == "__main__":
    main()
