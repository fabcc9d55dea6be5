"""A tiny packed model honouring ReaLModel's call contract, batches to train it on, and the tests'
tiny ReaLModel.

Embedding, per-sequence causal mixing (mean of the tokens so far within each sequence), an MLP
block with dropout, and a head: enough for outputs to depend on sequence boundaries, so a wrong
cu_seqlens or micro-batch split changes the numbers.
"""

from __future__ import annotations

import torch

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_api import GenerationHyperparameters, GenerationOutput, ReaLModelConfig
from realrl.impl.model.nn import ReaLModel
from realrl.impl.model.utils.functional import gather_packed_shifted_log_probs

VOCAB = 17


def tiny_config(**kw) -> ReaLModelConfig:
    """The tests' tiny model: 2 layers, grouped-query attention, the toy batches' 17 tokens."""
    return ReaLModelConfig(
        n_layers=2, n_q_heads=4, n_kv_heads=2, hidden_dim=32, intermediate_dim=64, vocab_size=VOCAB, **kw
    )


def tiny_model(seed: int = 0) -> ReaLModel:
    """``tiny_config``'s model with weights drawn under ``seed``."""
    torch.manual_seed(seed)
    return ReaLModel(tiny_config())


def causal_segment_mean(h: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    cu = cu_seqlens.long()
    lens = cu[1:] - cu[:-1]
    seg = torch.repeat_interleave(torch.arange(len(lens), device=h.device), lens)
    pos = torch.arange(h.shape[0], device=h.device) - cu[:-1][seg]
    csum = h.cumsum(0)
    before = torch.cat([torch.zeros_like(h[:1]), csum])[cu[:-1]][seg]
    return (csum - before) / (pos + 1).unsqueeze(-1).to(h.dtype)


class Block(torch.nn.Module):
    def __init__(self, hidden: int, pdrop: float) -> None:
        super().__init__()
        self.mix = torch.nn.Linear(hidden, hidden)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(hidden, 2 * hidden), torch.nn.GELU(), torch.nn.Linear(2 * hidden, hidden)
        )
        self.drop = torch.nn.Dropout(pdrop)

    def forward(self, h: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        h = h + self.mix(causal_segment_mean(h, cu_seqlens))
        return h + self.drop(self.mlp(h))


class PackedToyLM(torch.nn.Module):
    def __init__(self, hidden: int = 16, n_blocks: int = 2, pdrop: float = 0.0, critic: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, hidden)
        self.blocks = torch.nn.ModuleList(Block(hidden, pdrop) for _ in range(n_blocks))
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, 1 if critic else VOCAB)
        self.critic = critic
        self.checkpointing = False

    def gradient_checkpointing_enable(self) -> None:
        self.checkpointing = True

    def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for block in self.blocks:
            if self.checkpointing and self.training:
                h = torch.utils.checkpoint.checkpoint(block, h, cu_seqlens, use_reentrant=False)
            else:
                h = block(h, cu_seqlens)
        out = self.head(self.norm(h))
        return out.squeeze(-1) if self.critic else out

    @torch.no_grad()
    def generate(self, input_ids, cu_seqlens, gconfig: GenerationHyperparameters, eos_token_id=None):
        """Greedy decoding, one prompt at a time (a test double, not a fast generator)."""
        seqs, lens, plens, nos = [], [], [], []
        for i in range(len(cu_seqlens) - 1):
            prompt = input_ids[cu_seqlens[i] : cu_seqlens[i + 1]]
            for _ in range(gconfig.n):
                seq, hit_eos = prompt.clone(), False
                for _ in range(gconfig.max_new_tokens):
                    logits = self(seq, torch.tensor([0, len(seq)], dtype=torch.int32))
                    nxt = logits[-1].argmax().view(1)
                    seq = torch.cat([seq, nxt])
                    if eos_token_id is not None and int(nxt) == eos_token_id:
                        hit_eos = True
                        break
                seqs.append(seq)
                lens.append(len(seq))
                plens.append(len(prompt))
                nos.append(not hit_eos)
        sequences = torch.cat(seqs)
        cu = torch.nn.functional.pad(torch.tensor(lens).cumsum(0), (1, 0)).int()
        logp = gather_packed_shifted_log_probs(self(sequences, cu) / gconfig.temperature, cu, sequences)
        keep = torch.cat([(torch.arange(1, n) >= p).float() for n, p in zip(lens, plens)])
        return GenerationOutput(sequences, lens, plens, logp * keep, torch.tensor(nos))


def make_batch(lengths: list[int], seed: int = 0, n_seqs_per_sample: int = 1) -> SequenceSample:
    """A batch whose samples hold ``n_seqs_per_sample`` sequences each; ``prompt_mask`` marks
    the first third of every sequence as prompt."""
    g = torch.Generator().manual_seed(seed)
    seqlens = [[n] * n_seqs_per_sample for n in lengths]
    flat = [n for row in seqlens for n in row]
    ids = torch.randint(0, VOCAB, (sum(flat),), generator=g)
    mask = torch.cat([torch.arange(n) < max(1, n // 3) for n in flat])
    return SequenceSample.from_default(
        ids=list(range(len(lengths))),
        seqlens=seqlens,
        data={"packed_input_ids": ids, "prompt_mask": mask},
    )


def token_loss(logits: torch.Tensor, mb: SequenceSample) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean next-token NLL over response tokens of the micro-batch (the loss_fn contract)."""
    ids = mb.data["packed_input_ids"]
    cu = mb.cu_seqlens("packed_input_ids").to(logits.device)
    logp = gather_packed_shifted_log_probs(logits, cu, ids)
    mask = loss_mask(mb)
    loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"nll": float(loss.detach())}


def loss_mask(mb: SequenceSample) -> torch.Tensor:
    """1 where the predicted token (j+1) is a response token: the ``packed_logprobs`` alignment."""
    pm = mb.data["prompt_mask"]
    parts, off = [], 0
    for n in mb.flat_seqlens("packed_input_ids"):
        parts.append((~pm[off + 1 : off + n]).float())
        off += n
    return torch.cat(parts)


def n_loss_tokens(mb: SequenceSample) -> float:
    return float(loss_mask(mb).sum())
