"""Generation that pauses between tokens, for partial rollouts under asynchronous RL.

The engine prefills every micro-batch (``InferenceEngine.start_generation``) and hands back a
``GenerationSession``; the caller decodes a few tokens at a time (``advance``), and when the
model's weights changed in between (a newer policy arrived), ``refresh`` recomputes each
unfinished answer's KV cache under the new weights before decoding goes on ("AReaL: A
Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning", Fu et al. 2025,
interruptible rollout workers). Every token is tagged with the version that sampled it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from realrl.api.core.model_api import GenerationOutput


def concat_generation_outputs(outs: list[GenerationOutput]) -> GenerationOutput:
    """Micro-batch outputs back to back: prompt-major order is kept because pieces are contiguous."""
    return GenerationOutput(
        sequences=torch.cat([o.sequences for o in outs]),
        seqlens=[x for o in outs for x in o.seqlens],
        prompt_lens=[x for o in outs for x in o.prompt_lens],
        logprobs=torch.cat([o.logprobs for o in outs]),
        no_eos=torch.cat([o.no_eos for o in outs]),
        routed_experts=None
        if any(o.routed_experts is None for o in outs)
        else torch.cat([o.routed_experts for o in outs]),
    )


class GenerationSession:
    """The paused decodings of one generate call's micro-batches (``nn.generation.EagerDecoding``),
    advanced together under ``context`` (the engine's eval mode, device, gathered weights and
    autocast)."""

    def __init__(self, decodings: list, context: Callable[[], contextlib.AbstractContextManager]):
        self.decodings = decodings
        self.context = context
        self.versions: list[int] = []  # the version of every advance so far, in order

    @property
    def n_live(self) -> int:
        return sum(d.n_live for d in self.decodings)

    @property
    def tokens_done(self) -> int:
        """Tokens every unfinished answer has sampled (the decodings advance in step)."""
        return max(d.step for d in self.decodings)

    def advance(self, n: int | None, version: int) -> int:
        """Decode up to ``n`` more tokens of every unfinished answer (None: to the end) with the
        weights of ``version``; the answers still unfinished after it."""
        self.versions.append(version)
        with self.context(), torch.no_grad():
            return sum(d.advance(n, version) for d in self.decodings)

    def refresh(self) -> None:
        """The model's weights changed since the last ``advance``: rebuild the unfinished answers'
        caches from their tokens so far."""
        with self.context(), torch.no_grad():
            for d in self.decodings:
                d.refresh()

    def output(self) -> tuple[GenerationOutput, torch.Tensor]:
        """The answers, prompt-major, and the version of each answer token (aligned like the
        log-probs; ``EagerDecoding.token_versions``)."""
        outs = [d.output() for d in self.decodings]
        return concat_generation_outputs(outs), torch.cat([d.token_versions() for d in self.decodings])
