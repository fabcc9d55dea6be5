"""Shared-prefix packing: compute a prompt once for all the sequences that start with it.

A paired reward-model sample holds [chosen, rejected] of one prompt; a GRPO sample holds K
answers to one prompt. Packed plainly, every sequence carries its own copy of the prompt and
every layer computes it again. Here each group of sequences (one sample) keeps one copy of the
prefix its members share: the projections, the MLP and the norms run on the compressed tokens,
and attention expands keys, values and queries back to the original sequences, so each
sequence attends exactly to its own tokens, as before. Outputs are exact (equal to the plain
forward up to float rounding), gradients too: a shared token's gradient is the sum over the
sequences that read it, which is what the plain forward computes for its identical copies.

With dropout, the copies of a shared token share one dropout mask (RL and reward-model training
run without dropout: "The N Implementation Details of RLHF with PPO", policy detail 4).
"""

from __future__ import annotations

import dataclasses

import torch

from realrl.impl.model.modules.attention import PackedMeta

# share only when it spares at least this fraction of the tokens (else the gathers cost more)
MIN_SAVED_FRACTION = 0.05


@dataclasses.dataclass
class SharedPrefixes:
    expand: torch.Tensor  # long [T]: original token -> the compressed token that computes it
    represent: torch.Tensor  # long [Tc]: compressed token -> an original token it stands for
    shared_lens: list[int]  # per group: how many leading tokens its sequences share

    @property
    def n_compressed(self) -> int:
        return self.represent.shape[0]

    @classmethod
    def find(cls, input_ids: torch.Tensor, meta: PackedMeta, group_sizes: list[int]) -> SharedPrefixes | None:
        """The longest prefix each group's sequences all share (leaving each at least one token
        of its own), or None when sharing would spare less than ``MIN_SAVED_FRACTION``.

        ``group_sizes``: how many consecutive sequences form each group (one sample's sequences).
        """
        B, L, T = len(meta.seqlens), meta.max_seqlen, input_ids.shape[0]
        if sum(group_sizes) != B:
            raise ValueError(f"group sizes {group_sizes[:8]}... cover {sum(group_sizes)} sequences, not {B}")
        if B == len(group_sizes):  # every group is one sequence: nothing to share
            return None
        device = input_ids.device
        sizes = torch.tensor(group_sizes, device=device)
        group = torch.repeat_interleave(torch.arange(len(group_sizes), device=device), sizes, output_size=B)
        root = (torch.cumsum(sizes, 0) - sizes)[group]  # the first sequence of each sequence's group
        lens = torch.tensor(meta.seqlens, device=device)

        ids = torch.full((B * L,), -1, dtype=input_ids.dtype, device=device)
        ids = ids.index_copy(0, meta.pad_index, input_ids).view(B, L)
        cols = torch.arange(L, device=device)
        inside = cols[None, :] < torch.minimum(lens, lens[root])[:, None]
        same = (ids == ids[root]) & inside
        lcp = torch.cumprod(same.long(), dim=1).sum(1)  # common prefix with the group's root
        # a group shares what all its members share with the root, keeping >= 1 own token each
        cap = torch.minimum(lcp, lens - 1).clamp(min=0)
        shared = torch.full((len(group_sizes),), L, dtype=torch.long, device=device)
        shared = shared.scatter_reduce(0, group, cap, reduce="amin")
        shared = torch.where(sizes > 1, shared, torch.zeros_like(shared))
        saved = int(((sizes - 1) * shared).sum())
        if saved < MIN_SAVED_FRACTION * T:
            return None

        # a token is computed unless it lies in a non-root member's shared prefix
        seq_of_token = torch.div(meta.pad_index, L, rounding_mode="floor")
        is_root = (torch.arange(B, device=device) == root)[seq_of_token]
        own = is_root | (meta.positions >= shared[group][seq_of_token])
        represent = torch.nonzero(own, as_tuple=True)[0]
        slot = torch.cumsum(own.long(), 0) - 1  # compressed index of each kept token
        root_token = meta.cu_seqlens.long()[root][seq_of_token] + meta.positions  # same position in root
        expand = torch.where(own, slot, slot[root_token])
        return cls(expand, represent, shared.tolist())
