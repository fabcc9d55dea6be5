"""Tiny registered pieces for runtime tests, imported by every worker through ``import_modules``.

They make the runtime testable without real models: keys are computed deterministically from
input keys and a one-number "model" whose value training changes, so stats depend on the
parameter-version rule, on data moving correctly between workers and on the data-parallel split.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist

from realrl.api.core import data_api, model_api
from realrl.api.core.data_api import SequenceSample

VOCAB = 50


class RandomTokens(torch.utils.data.Dataset):
    """``n`` prompts of random tokens; this dp rank keeps every ``world_size``-th one."""

    def __init__(self, util: data_api.DatasetUtility, n: int = 16, min_len: int = 3, max_len: int = 9):
        self.samples = []
        for i in range(util.dp_rank, n, util.world_size):
            g = torch.Generator().manual_seed(util.seed * 1000 + i)
            length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
            tokens = torch.randint(1, VOCAB, (length,), generator=g)
            self.samples.append(SequenceSample.from_default([f"t{i}"], [length], {"packed_prompts": tokens}))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> SequenceSample:
        return self.samples[i]


class Scalar(torch.nn.Module):
    """One trainable number; ``save`` / ``load`` play the training engine's resumable checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(1.0 + 0.1 * torch.randn(()))
        self.dp_group = None

    def _file(self, path: str) -> str:
        rank = 0 if self.dp_group is None else dist.get_rank(self.dp_group)
        return os.path.join(path, f"scalar_rank{rank}.pt")

    def save(self, path: str, extra_state=None) -> None:
        os.makedirs(path, exist_ok=True)
        torch.save({"w": self.w.detach().clone(), "extra": extra_state}, self._file(path))

    def load(self, path: str):
        state = torch.load(self._file(path))
        with torch.no_grad():
            self.w.copy_(state["w"])
        return state["extra"]


def make_scalar_model(name, device, **_):
    module = Scalar()
    module.built_on = str(device)  # where the worker asked for it to be built (and initialised)
    return model_api.Model(name, module, tokenizer=None, device=device)


class ScalarBackend:
    """Keeps the dp group so the training interface can average over data-parallel ranks."""

    def __init__(self, *, parallel=None):
        self.dp_group = None if parallel is None else parallel.dp_group

    def initialize(self, model, ft_spec):
        model.module.dp_group = self.dp_group
        model.ft_spec = ft_spec
        return model


class Generate(model_api.ModelInterface):
    """Appends 1-3 random tokens (global torch RNG) shifted by the model's current value."""

    def generate(self, model, data, mb_spec=None):
        shift = int(round(float(model.module.w.detach()) * 10))
        seqs, masks, no_eos = [], [], []
        for prompt in torch.split(data.data["packed_prompts"], data.flat_seqlens("packed_prompts")):
            k = int(torch.randint(1, 4, (1,)))
            resp = (torch.randint(1, VOCAB, (k,)) + shift) % VOCAB
            seqs.append(torch.cat([prompt, resp]))
            masks.append(torch.arange(len(prompt) + k) < len(prompt))
            no_eos.append(bool(k == 3))
        lens = [len(s) for s in seqs]
        return SequenceSample.from_default(
            data.ids,
            lens,
            {
                "packed_input_ids": torch.cat(seqs),
                "prompt_mask": torch.cat(masks),
                "seq_no_eos_mask": torch.tensor(no_eos),
            },
        )


class Values(model_api.ModelInterface):
    def inference(self, model, data, mb_spec=None):
        ids = data.data["packed_input_ids"]
        lens = [sum(r) for r in data.seqlens["packed_input_ids"]]
        values = ids.float() * float(model.module.w.detach()) / VOCAB
        return SequenceSample.from_default(data.ids, lens, {"values": values})


class Reward(model_api.ModelInterface):
    def inference(self, model, data, mb_spec=None):
        means = [v.mean() for v in torch.split(data.data["values"], data.flat_seqlens("values"))]
        rewards = torch.stack(means) * float(model.module.w.detach())
        return SequenceSample.from_default(
            data.ids, [[n] for n in data.flat_seqlens("values")], {"rewards": rewards}
        )


class Train(model_api.ModelInterface):
    """w += lr * (mean reward over every dp rank); counts its calls."""

    def __init__(self, lr: float = 0.1):
        self.lr = lr
        self.calls = 0

    def train_step(self, model, data, mb_spec=None):
        self.calls += 1
        t = torch.tensor([float(data.data["rewards"].sum()), float(data.bs)], dtype=torch.float64)
        if model.module.dp_group is not None:
            dist.all_reduce(t, group=model.module.dp_group)
        mean_reward = float(t[0] / t[1])
        with torch.no_grad():
            model.module.w += self.lr * mean_reward
        model.inc_version()  # interfaces own the version counter
        return {
            "reward": mean_reward,
            "w": float(model.module.w.detach()),
            "calls": self.calls,
            "n_seqs": float(t[1]),
            "built_on_host": float(model.module.built_on == "cpu"),
        }

    def evaluate(self, model, eval_dataloader) -> dict[str, float]:
        batches = list(eval_dataloader)
        return {"eval_n": float(sum(b.bs for b in batches)), "eval_batches": float(len(batches))}

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]

    def save(self, model, save_dir: str) -> None:
        os.makedirs(save_dir, exist_ok=True)
        with open(os.path.join(save_dir, "scalar.json"), "w") as f:
            json.dump({"w": float(model.module.w.detach()), "version": model.version.global_step}, f)


class Raise(model_api.ModelInterface):
    def inference(self, model, data, mb_spec=None):
        raise ValueError("boom from the mock interface")


class Slow(model_api.ModelInterface):
    def __init__(self, delay: float = 0.3):
        self.delay = delay

    def inference(self, model, data, mb_spec=None):
        time.sleep(self.delay)
        lens = [sum(r) for r in data.seqlens["packed_prompts"]]
        return SequenceSample.from_default(data.ids, lens, {"values": torch.zeros(sum(lens))})


def dataset_index(sid: str) -> int:
    """``t<i>@e<epoch>`` -> i."""
    return int(sid.split("@")[0][1:])


class DropMultiples(model_api.ModelInterface):
    """A dynamic-sampling filter: drops the samples whose dataset index is a multiple of
    ``modulus`` (1: all of them)."""

    def __init__(self, modulus: int = 2):
        self.modulus = modulus

    def inference(self, model, data, mb_spec=None):
        dropped = [sid for sid in data.ids if dataset_index(sid) % self.modulus == 0]
        return None, {"seen": float(data.bs), model_api.DROPPED_KEY: dropped}


class Census(model_api.ModelInterface):
    """Reports how many samples it got and how many of them have an odd dataset index."""

    def inference(self, model, data, mb_spec=None):
        odd = [dataset_index(sid) % 2 for sid in data.ids]
        return None, {"n": float(data.bs), "odd": float(sum(odd))}


data_api.register_dataset("sys_test_tokens", RandomTokens)
model_api.register_model("sys_test_scalar", make_scalar_model)
model_api.register_backend("sys_test_backend", ScalarBackend)
for _name, _cls in [
    ("sys_test_gen", Generate),
    ("sys_test_values", Values),
    ("sys_test_reward", Reward),
    ("sys_test_train", Train),
    ("sys_test_raise", Raise),
    ("sys_test_slow", Slow),
    ("sys_test_drop_multiples", DropMultiples),
    ("sys_test_census", Census),
]:
    model_api.register_interface(_name, _cls)
