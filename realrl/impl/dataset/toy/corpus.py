"""The toy corpus: a random bigram language, a hidden true reward, and the phase files.

``build_toy_task`` writes everything the default experiments read, as ordinary local files
(JSONL data, a Hugging Face tokenizer folder, a model config), so the toy task goes through
exactly the code path a user's real data and checkpoints take.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import os
import shutil

import numpy as np

from realrl.api.core.model_api import register_reward_fn
from realrl.impl.dataset.dschat.split import phase_indices
from realrl.impl.dataset.toy.model_config import DecoderShape, tiny_decoder_config
from realrl.impl.dataset.toy.task_files import write_jsonl
from realrl.impl.dataset.toy.vocab import PERIOD, SEPARATOR, ToyVocab
from realrl.impl.interface.rule_reward import word_sentiment_reward

TOY_DECODER = DecoderShape(n_layers=2, hidden_dim=64, intermediate_dim=256)


@dataclasses.dataclass
class ToyTaskConfig:
    seed: int = 1
    n_prompts: int = 40000  # the one corpus, split over SFT / RM / PPO
    data_split: str = "2,4,4"  # DeepSpeed-Chat's default phase ratios
    valid_fraction: float = 0.05  # held out inside each phase
    prompt_min_words: int = 4
    prompt_max_words: int = 8
    response_words: int = 11  # then '.' (a 12-token answer)
    # set: each answer's word count is drawn uniformly from response_words..response_words_max
    response_words_max: int | None = None
    density_reward: bool = False  # the true reward per 10 words (toy_sentiment_density)
    successors: int = 8  # bigram fan-out, Dirichlet(1) weights
    rm_no_period_fraction: float = 0.1  # RM continuations cut before '.', so the RM sees the penalty
    n_neutral: int = 160

    def fingerprint(self) -> str:
        added = {
            "response_words_max": None,
            "density_reward": False,
        }  # defaults left out: older data stays valid
        fields = {k: v for k, v in dataclasses.asdict(self).items() if not (k in added and v == added[k])}
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def true_reward(completion: str, vocab: ToyVocab | None = None, density: bool = False) -> float:
    """Positive minus negative words (``density``: per 10 words), -2 when the completion does not
    end with '.'."""
    score = toy_sentiment_density_reward if density else toy_sentiment_reward
    return score([""], [completion], vocab=vocab)[0]


def toy_sentiment_reward(
    prompts: list[str],
    completions: list[str],
    vocab: ToyVocab | None = None,
    per_words: int | None = None,
    **metadata,
) -> list[float]:
    """The hidden true reward as a reward plugin: ``word_sentiment`` with the toy word lists."""
    vocab = vocab or ToyVocab()
    return word_sentiment_reward(
        prompts,
        completions,
        positive_words=vocab.positive,
        negative_words=vocab.negative,
        end_token=PERIOD,
        missing_end_penalty=-2.0,
        per_words=per_words,
    )


def toy_sentiment_density_reward(
    prompts: list[str], completions: list[str], vocab: ToyVocab | None = None, **metadata
) -> list[float]:
    """The hidden true reward per 10 words: the long-answer task's, which length cannot game."""
    return toy_sentiment_reward(prompts, completions, vocab, per_words=10)


register_reward_fn("toy_sentiment", toy_sentiment_reward)
register_reward_fn("toy_sentiment_density", toy_sentiment_density_reward)


class BigramLanguage:
    """Each content word has ``successors`` next words with Dirichlet(1) probabilities."""

    def __init__(self, vocab: ToyVocab, successors: int, rng: np.random.Generator):
        self.words = vocab.content_words
        n = len(self.words)
        self.next_ids = np.stack([rng.choice(n, size=successors, replace=False) for _ in range(n)])
        self.next_probs = rng.dirichlet(np.ones(successors), size=n)
        cdf = np.cumsum(self.next_probs, axis=1)
        cdf[:, -1] = 1.0
        # as Python lists: a sequence is drawn word by word, and bisect on a list is ~10x faster
        # than a numpy call per word, with the same result (np.searchsorted side="right")
        self._cdf, self._next = cdf.tolist(), self.next_ids.tolist()

    def continue_from(self, last: int, n_words: int, rng: np.random.Generator) -> list[int]:
        out = []
        for u in rng.random(n_words).tolist():
            last = self._next[last][bisect.bisect_right(self._cdf[last], u)]
            out.append(last)
        return out

    def text(self, ids: list[int]) -> str:
        return " ".join(self.words[i] for i in ids)


def _split_valid(indices: list[int], fraction: float) -> tuple[list[int], list[int]]:
    n_valid = max(1, int(len(indices) * fraction))
    return indices[n_valid:], indices[:n_valid]


def build_toy_task(out_dir: str, cfg: ToyTaskConfig | None = None) -> dict:
    """Write the toy task under ``out_dir`` (reused when already built with the same config).

    Layout: ``tokenizer/``, ``{sft,rm,ppo}/{train,valid}.jsonl``, ``manifest.json``.
    Returns the manifest (paths, counts, the reward of generator samples).
    """
    cfg = cfg or ToyTaskConfig()
    manifest_path = os.path.join(out_dir, "manifest.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        if manifest.get("fingerprint") == cfg.fingerprint():
            return manifest
    tmp_dir = out_dir.rstrip("/") + ".building"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    os.makedirs(tmp_dir)

    vocab = ToyVocab(cfg.n_neutral)
    rng = np.random.default_rng(cfg.seed)
    lang = BigramLanguage(vocab, cfg.successors, rng)
    prompts = []
    for _ in range(cfg.n_prompts):
        n = int(rng.integers(cfg.prompt_min_words, cfg.prompt_max_words + 1))
        first = int(rng.integers(len(lang.words)))
        prompts.append([first] + lang.continue_from(first, n - 1, rng))

    def prompt_text(p: list[int]) -> str:
        return f"{lang.text(p)} {SEPARATOR}"

    def answer(p: list[int], with_period: bool = True) -> str:
        n = cfg.response_words
        if cfg.response_words_max is not None:
            n = int(rng.integers(cfg.response_words, cfg.response_words_max + 1))
        words = lang.continue_from(p[-1], n, rng)
        return " " + lang.text(words) + (f" {PERIOD}" if with_period else "")

    phases = {phase: phase_indices(cfg.n_prompts, cfg.data_split, phase, cfg.seed) for phase in (1, 2, 3)}
    counts: dict[str, int] = {}
    sft_rewards = []
    for part, idx in zip(("train", "valid"), _split_valid(list(phases[1]), cfg.valid_fraction)):
        rows = [{"prompt": prompt_text(prompts[i]), "answer": answer(prompts[i])} for i in idx]
        sft_rewards += [true_reward(r["answer"], vocab, cfg.density_reward) for r in rows]
        os.makedirs(os.path.join(tmp_dir, "sft"), exist_ok=True)
        write_jsonl(os.path.join(tmp_dir, "sft", f"{part}.jsonl"), rows)
        counts[f"sft_{part}"] = len(rows)
    ties = 0
    for part, idx in zip(("train", "valid"), _split_valid(list(phases[2]), cfg.valid_fraction)):
        rows = []
        for i in idx:
            a = answer(prompts[i], with_period=rng.random() >= cfg.rm_no_period_fraction)
            b = answer(prompts[i], with_period=rng.random() >= cfg.rm_no_period_fraction)
            ra, rb = true_reward(a, vocab, cfg.density_reward), true_reward(b, vocab, cfg.density_reward)
            if ra == rb:
                ties += 1
                continue
            chosen, rejected = (a, b) if ra > rb else (b, a)
            rows.append({"prompt": prompt_text(prompts[i]), "chosen": chosen, "rejected": rejected})
        os.makedirs(os.path.join(tmp_dir, "rm"), exist_ok=True)
        write_jsonl(os.path.join(tmp_dir, "rm", f"{part}.jsonl"), rows)
        counts[f"rm_{part}"] = len(rows)
    for part, idx in zip(("train", "valid"), _split_valid(list(phases[3]), cfg.valid_fraction)):
        rows = [{"prompt": prompt_text(prompts[i])} for i in idx]
        os.makedirs(os.path.join(tmp_dir, "ppo"), exist_ok=True)
        write_jsonl(os.path.join(tmp_dir, "ppo", f"{part}.jsonl"), rows)
        counts[f"ppo_{part}"] = len(rows)
    vocab.save_tokenizer(os.path.join(tmp_dir, "tokenizer"))

    manifest = {
        "fingerprint": cfg.fingerprint(),
        "config": dataclasses.asdict(cfg),
        "counts": counts,
        "rm_ties_dropped": ties,
        "generator_true_reward_mean": float(np.mean(sft_rewards)),
        "generator_true_reward_std": float(np.std(sft_rewards)),
        "max_new_tokens": (cfg.response_words_max or cfg.response_words) + 2,  # words, '.', EOS
    }
    with open(os.path.join(tmp_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp_dir, out_dir)
    return manifest


def toy_paths(out_dir: str) -> dict[str, str]:
    """Where ``build_toy_task`` put each file."""
    return {
        "tokenizer": os.path.join(out_dir, "tokenizer"),
        **{
            f"{p}_{s}": os.path.join(out_dir, p, f"{s}.jsonl")
            for p in ("sft", "rm", "ppo")
            for s in ("train", "valid")
        },
    }


def toy_model_config(
    vocab: ToyVocab | None = None, n_positions: int = 64, n_experts: int = 0, top_k: int = 2
) -> dict:
    """The tiny llama-family decoder of the toy task (d=64, 2 layers, 4 heads).

    A ``ReaLModelConfig`` field dict: what the "real_model" factory takes as ``config=``.
    ``n_experts`` > 0 makes every MLP a Mixture of Experts (a Mixtral-shaped model): ``top_k``
    experts per token, each ``256 / top_k`` wide, so a token runs through as many MLP weights as
    in the dense model (about the same active parameters) while the model holds ``n_experts / top_k``
    times the MLP weights; top-k weights renormalised, as Mixtral's router does.
    """
    inner = TOY_DECODER.intermediate_dim
    moe = {}
    if n_experts:
        moe = {
            "n_experts": n_experts,
            "n_experts_per_tok": top_k,
            "moe_intermediate_dim": inner // top_k,
            "norm_topk_prob": True,
        }
    return tiny_decoder_config(TOY_DECODER, (vocab or ToyVocab()).tokens, n_positions, **moe)
