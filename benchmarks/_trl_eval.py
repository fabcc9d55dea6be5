"""Held-out evaluation for ``bench_vs_trl.py``: ONE evaluator for both sides.

Both trained models are read back from their HF folders and scored by realrl's toy evaluation
(``realrl.experiments.toy_eval``): pair accuracy on the held-out RM pairs, and the hidden true
reward of one sampled answer per held-out prompt. TRL's reward model (LlamaForSequenceClassification)
is first rewritten as a realrl critic checkpoint (same body, ``score`` as the scalar head, checked
to give the same scores)."""

from __future__ import annotations

import json
import os

from _trl_common import BenchSpec


def trl_rm_as_critic(trl_dir: str, out_dir: str, tokenizer_path: str) -> str:
    """Rewrite a TRL reward model folder as a realrl critic folder; check scores agree."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM, LlamaForSequenceClassification

    from realrl.impl.model.nn import ReaLModel
    from realrl.impl.model.nn.hf_io import CRITIC_MARKER

    cls = LlamaForSequenceClassification.from_pretrained(trl_dir, dtype=torch.float32).eval()
    lm = LlamaForCausalLM(cls.config)
    lm.model.load_state_dict(cls.model.state_dict())
    body_dir = out_dir + ".body"
    lm.save_pretrained(body_dir)
    with open(os.path.join(body_dir, "config.json")) as f:
        raw = json.load(f)
    raw.pop(CRITIC_MARKER, None)  # inherited from init_rm's config: this folder holds no head
    with open(os.path.join(body_dir, "config.json"), "w") as f:
        json.dump(raw, f)
    critic = ReaLModel.from_pretrained(body_dir, is_critic=True).eval()
    with torch.no_grad():
        critic.head.weight.copy_(cls.score.weight)
        critic.head.bias.zero_()
    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    ids = tok("alpha beta gamma" + tok.eos_token, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = cls(input_ids=ids).logits[0, 0]
        got = critic(ids[0], torch.tensor([0, ids.shape[1]], dtype=torch.int32))[-1]
    if not torch.allclose(want, got, atol=1e-4):
        raise AssertionError(f"TRL RM -> realrl critic conversion changed the score: {want} vs {got}")
    critic.save_pretrained(out_dir, tok)
    return out_dir


def rm_accuracy(side: str, checkpoint: str, spec: BenchSpec, paths: dict[str, str]) -> float:
    from realrl.experiments.toy_eval import reward_model_accuracy

    if side == "trl":
        checkpoint = trl_rm_as_critic(
            checkpoint, os.path.join(spec.bench_dir, "trl_rw_as_critic"), paths["tokenizer"]
        )
    return reward_model_accuracy(checkpoint, paths["tokenizer"], paths["rm_valid"], seed=spec.seed)


def policy_true_reward(checkpoint: str, spec: BenchSpec, paths: dict[str, str]) -> tuple[float, float]:
    """Mean and std of the hidden true reward of samples on held-out prompts (temperature 1),
    scored by the same checker realrl's own toy evaluation uses (``true_reward_scorer``)."""
    from realrl.api.core.model_api import GenerationHyperparameters
    from realrl.experiments.toy_eval import evaluate_policy, true_reward_scorer

    gconfig = GenerationHyperparameters(
        max_new_tokens=spec.max_new_tokens, top_p=1.0, top_k=0, temperature=1.0
    )
    score = true_reward_scorer()
    ev = evaluate_policy(
        checkpoint, None, paths["tokenizer"], paths["ppo_valid"], gconfig, score, spec.eval_prompts, spec.seed
    )
    return ev.reward_mean, ev.reward_std
