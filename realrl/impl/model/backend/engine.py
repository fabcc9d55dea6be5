"""The inference engine: runs a packed module over a ``SequenceSample`` in micro-batches.

The module contract (ReaLModel's): ``module(input_ids: LongTensor[T], cu_seqlens: int32[B+1])``
returns logits ``[T, V]`` (a critic: ``[T]``), and ``module.generate(input_ids, cu_seqlens,
gconfig, eos_token_id)`` returns a ``GenerationOutput``. A micro-batch's forward runs over all
sequences of all its samples packed back to back, so outputs come out in sample order.

Callers that read only some tokens' outputs (a reward at the last token, a policy loss on the
answer) pass ``output_index_fn(mb) -> LongTensor[N]``: the output is then ``[N, ...]``, those
tokens only. A module whose ``packed_forward_options`` names ``output_index`` (ReaLModel) takes
the index itself and skips the work nobody reads; any other module runs in full and is indexed
afterwards. One naming ``prefix_groups`` is told which sequences form one sample (a pair, K
answers to one prompt) and computes the prefix they share once (``EngineConfig.share_prefixes``).
A micro-batch holding ``routed_experts`` (router replay: the experts generation recorded for each
token) is handed to a module naming that option, which routes its tokens to them.
A module whose ``generate_options`` names ``prompt_keys`` (ReaLModel) is given each prompt's
sampling key, a function of (one base seed per generate call, the sample id, the prompt's index in
its sample): sampled answers then do not depend on how the batch is split, ordered or spread over
data-parallel replicas.

A parallel module (``impl/model/parallel``: tensor parallel, FSDP-sharded) comes already split;
the engine is told its ``ParallelContext`` only for what the layout changes here: FSDP ranks run
the same number of micro-batches (each block's weights are gathered collectively), generation
gathers the weights once for the whole decoding loop, and a checkpoint gathers whole weights for
the one rank that writes it.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
from realrl.api.core.model_api import GenerationHyperparameters, GenerationOutput
from realrl.impl.model.backend import dp
from realrl.impl.model.backend.checkpoint import save_module_weights
from realrl.impl.model.backend.compile import compile_module
from realrl.impl.model.backend.config import EngineConfig
from realrl.impl.model.backend.generation_session import GenerationSession, concat_generation_outputs
from realrl.impl.model.backend.pipeline_engine import PipelineRun
from realrl.impl.model.nn.router_replay import ROUTED_KEY
from realrl.impl.model.nn.sampling import derive_keys, random_keys
from realrl.impl.model.parallel.fsdp import gathered, is_fsdp, settle_root
from realrl.impl.model.parallel.mesh import ParallelContext

INPUT_KEY = "packed_input_ids"
PROMPT_KEY = "packed_prompts"
PDROP_FIELDS = ("embd_pdrop", "attn_pdrop", "resid_pdrop")
OutputIndexFn = Callable[[SequenceSample], torch.Tensor]
# domain separation of the two derivations of a prompt key from the call's base seed
SAMPLE_SALT = 0x1F83D9AB
SEQUENCE_SALT = 0x5BE0CD19


def disable_dropout(module: torch.nn.Module) -> int:
    """Zero every dropout probability the module exposes ("The N Implementation Details of RLHF with PPO",
    policy detail 4).

    Covers ``nn.Dropout``-style submodules and the ``*_pdrop`` fields of a ReaLModelConfig held
    as ``module.config``. Returns how many settings were changed.
    """
    changed = 0
    for m in module.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p != 0.0:
            m.p = 0.0
            changed += 1
    cfg = getattr(module, "config", None)
    for field in PDROP_FIELDS:
        if cfg is not None and getattr(cfg, field, 0.0):
            setattr(cfg, field, 0.0)
            changed += 1
    return changed


def stable_id_hash(sample_id: Any) -> int:
    """A 64-bit hash of ``str(sample_id)`` that is the same in every process and run (Python's
    ``hash`` of a str is salted per process); 64 bits make two ids of a batch sharing one unlikely."""
    digest = hashlib.blake2b(str(sample_id).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def prompt_keys(base: int, mb: SequenceSample, key: str = PROMPT_KEY) -> torch.Tensor:
    """int64 sampling key of every sequence of ``mb[key]`` in packing order, from (``base``, its
    sample's id, its index within the sample) only: the same wherever the sample is generated."""
    counts = [len(lens) for lens in mb.seqlens[key]]
    ids = torch.tensor(
        [stable_id_hash(i) for i, c in zip(mb.ids, counts) for _ in range(c)], dtype=torch.long
    )
    index = torch.tensor([k for c in counts for k in range(c)], dtype=torch.long)
    per_sample = derive_keys(torch.full_like(ids, base), ids, SAMPLE_SALT)
    return derive_keys(per_sample, index, SEQUENCE_SALT)


class InferenceEngine:
    """Forward and generation without gradients, in eval mode, micro-batch by micro-batch.

    Mixed precision: the module is cast to ``EngineConfig.dtype`` ("auto": fp32 on CPU, bf16 on
    CUDA); the train engine overrides this to keep fp32 master weights and use autocast.
    ``offload``: the module lives in host memory and visits the device for each call (a frozen
    model that is idle most of a step: PPO's reference and reward models).
    """

    casts_module = True

    def __init__(
        self,
        module: torch.nn.Module,
        config: EngineConfig | None = None,
        device: torch.device | str = "cpu",
        parallel: ParallelContext | None = None,
        offload: bool = False,
        total_train_steps: int | None = None,
    ) -> None:
        """``total_train_steps``: a train engine's, for ``EngineConfig.compile="auto"``."""
        self.module = module
        self.config = config or EngineConfig()
        self.device = torch.device(device)
        self.parallel = parallel
        self.offload = offload
        self.dtype = self.config.resolve_dtype(self.device)
        if self.config.disable_dropout:
            disable_dropout(module)
        self._place(module)
        self.pipeline = PipelineRun.of(module, parallel, self.device)
        self.compiled = compile_module(module, self.config, total_train_steps, self.device)

    def compile_stats(self) -> dict[str, float]:
        """``compile/graphs`` and ``compile/seconds`` so far when the blocks are compiled, else {}."""
        return {} if self.compiled is None else self.compiled.stats()

    def _place(self, module: torch.nn.Module) -> None:
        """The module on the engine's device and in its dtype (a train engine's stays fp32), then,
        when FSDP shards it, made FSDP2's root: FSDP2 gathers every unit, for good, in the dtype the
        module has at its first forward (an fp32 gather of a bf16 engine would double the gathered
        weights' memory and hand the next pipeline stage fp32 activations), unless its policy
        names one (a bf16/fp16 train engine's, ``apply_fsdp``). An offloaded module goes back to
        host memory last."""
        module.to(self.device)
        if self.casts_module:
            module.to(self.dtype)
        if is_fsdp(module):
            with self._autocast():  # the dry forward computes as every later call does
                settle_root(module)
        if self.offload:
            module.to("cpu")

    # -- layout -----------------------------------------------------------------------------

    @property
    def fsdp(self) -> bool:
        return self.parallel is not None and self.parallel.fsdp and self.parallel.layout.dp > 1

    @property
    def dp_group(self):
        """The data-parallel ranks of the model (None: one replica)."""
        return None if self.parallel is None else self.parallel.dp_group

    @property
    def is_writer(self) -> bool:
        """Whether this rank writes the model's files (one rank of the model does)."""
        return self.parallel is None or self.parallel.is_writer

    def lockstep_count(self, n: int) -> int:
        """How many micro-batches this rank runs when it holds ``n``: under FSDP every dp rank runs
        as many as the rank with the most, since each forward gathers weights collectively."""
        return dp.all_reduce_max(n, self.dp_group) if self.fsdp else n

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        """The module on the engine's device for the duration (an offloaded one goes back after)."""
        if not self.offload:
            yield
            return
        self.module.to(self.device)
        try:
            yield
        finally:
            self.module.to("cpu")

    # -- modes ------------------------------------------------------------------------------

    def eval(self) -> InferenceEngine:
        self.module.eval()
        return self

    def train(self, mode: bool = True) -> InferenceEngine:
        self.module.train(mode)
        return self

    @contextlib.contextmanager
    def mode(self, training: bool) -> Iterator[None]:
        """Run in train or eval mode and restore the caller's mode afterwards. Nothing is done when
        the module is already in that mode: ``Module.train`` walks every submodule (~0.7 ms a call
        on the toy model, twice per PPO update)."""
        before = self.module.training
        if before == training:
            yield
            return
        self.module.train(training)
        try:
            yield
        finally:
            self.module.train(before)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.casts_module or self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    # -- forward ----------------------------------------------------------------------------

    def _require(self, input_: SequenceSample, key: str, call: str) -> None:
        if input_.data is None:
            raise ValueError(
                f"{type(self).__name__}.{call}: the input is metadata only (ids {input_.ids[:4]}...)"
            )
        if key not in input_.keys or input_.data[key] is None:
            raise ValueError(
                f"{type(self).__name__}.{call}: input lacks key {key!r} (has {sorted(input_.keys)})"
            )

    def packed_forward(
        self, mb: SequenceSample, output_index_fn: OutputIndexFn | None = None, key: str = INPUT_KEY
    ) -> torch.Tensor:
        """The module's output on ``mb[key]``, all sequences of all samples packed; only at the
        tokens ``output_index_fn(mb)`` names when given."""
        input_ids = mb.data[key]
        cu_seqlens = mb.cu_seqlens(key).to(self.device)
        index = None if output_index_fn is None else output_index_fn(mb).to(self.device)
        options = getattr(self.module, "packed_forward_options", ())
        kwargs: dict[str, Any] = {}
        if index is not None and "output_index" in options:
            kwargs["output_index"] = index
        if self.config.share_prefixes and "prefix_groups" in options:
            groups = [len(lens) for lens in mb.seqlens[key]]
            if len(groups) < sum(groups):  # some sample holds several sequences
                kwargs["prefix_groups"] = groups
        if ROUTED_KEY in mb.keys:  # router replay: the experts generation recorded, per token
            if "routed_experts" not in options:
                raise ValueError(f"{type(self.module).__name__} cannot replay the batch's {ROUTED_KEY!r}")
            kwargs["routed_experts"] = mb.data[ROUTED_KEY]
        with self._autocast():
            out = self.module(input_ids, cu_seqlens, **kwargs)
        return out if index is None or "output_index" in kwargs else out[index]

    def split(self, input_: SequenceSample, mb_spec: MicroBatchSpec | None) -> list[SequenceSample]:
        """Micro-batches on the engine's device, so hooks and losses see one device (``input_``
        itself is left where it is)."""
        return [mb.to(self.device) for mb in input_.split(mb_spec or MicroBatchSpec())]

    @torch.no_grad()
    def forward(
        self,
        input_: SequenceSample,
        mb_spec: MicroBatchSpec | None = None,
        post_hook: Callable[[torch.Tensor, SequenceSample], Any] | None = None,
        aggregate_fn: Callable[[list[Any]], Any] = torch.cat,
        output_index_fn: OutputIndexFn | None = None,
    ) -> Any:
        """``aggregate_fn`` over the per-micro-batch results in sample order; each result is the
        module output on the micro-batch (at ``output_index_fn(mb)`` when given), or
        ``post_hook(output, mb)`` when given."""
        self._require(input_, INPUT_KEY, "forward")
        results = []
        mbs = self.split(input_, mb_spec)
        if self.pipeline is not None:
            with self.mode(training=False), self.on_device(), self._autocast():
                n_runs = self.lockstep_count(len(mbs))
                return self.pipeline.forward(mbs, n_runs, output_index_fn, post_hook, aggregate_fn)
        with self.mode(training=False), self.on_device():
            for mb in mbs:
                out = self.packed_forward(mb, output_index_fn)
                results.append(post_hook(out, mb) if post_hook is not None else out)
            for _ in range(self.lockstep_count(len(mbs)) - len(mbs)):
                self.packed_forward(mbs[0], output_index_fn)  # keeps the other FSDP ranks' gathers company
        return aggregate_fn(results)

    @torch.no_grad()
    def generate(
        self,
        input_: SequenceSample,
        mb_spec: MicroBatchSpec | None,
        tokenizer: Any,
        gconfig: GenerationHyperparameters,
    ) -> GenerationOutput:
        """Generate from ``packed_prompts``; outputs are prompt-major across micro-batches.

        Sampling draws one base seed from torch's global RNG per call (none when greedy), so a
        caller that seeds every replica alike gets the same answer per (sample id, prompt, answer
        index) whatever the micro-batches, sample order or number of replicas."""
        self._require(input_, PROMPT_KEY, "generate")
        eos = getattr(tokenizer, "eos_token_id", None)
        if self.pipeline is not None:  # the stages sample with the same keys as the whole model
            base = None if gconfig.greedy else int(random_keys(1))
            mbs = self.split(input_, mb_spec)
            keys = [None if base is None else prompt_keys(base, mb).to(self.device) for mb in mbs]
            with self.generating():
                return concat_generation_outputs(self.pipeline.generate(mbs, keys, gconfig, eos))
        if not hasattr(self.module, "generate"):
            raise TypeError(f"{type(self.module).__name__} has no generate(); it cannot serve generate MFCs")
        keyed = "prompt_keys" in getattr(self.module, "generate_options", ()) and not gconfig.greedy
        base = int(random_keys(1)) if keyed else None
        outs = []
        with self.generating():
            for mb in self.split(input_, mb_spec):
                cu_seqlens = mb.cu_seqlens(PROMPT_KEY).to(self.device)
                kwargs = self._key_kwargs(base, mb)
                outs.append(
                    self.module.generate(mb.data[PROMPT_KEY], cu_seqlens, gconfig, eos_token_id=eos, **kwargs)
                )
        return concat_generation_outputs(outs)

    @torch.no_grad()
    def start_generation(
        self,
        input_: SequenceSample,
        mb_spec: MicroBatchSpec | None,
        tokenizer: Any,
        gconfig: GenerationHyperparameters,
    ) -> GenerationSession:
        """Interruptible generation (partial rollouts): prefill every micro-batch of
        ``packed_prompts`` and return the paused decoding, advanced a few tokens at a time by the
        caller. Sampling keys as in ``generate``, so an uninterrupted session samples exactly what
        ``generate`` does when it decodes eagerly."""
        self._require(input_, PROMPT_KEY, "start_generation")
        if self.pipeline is not None:  # refused before launch too (ExperimentConfig)
            raise ValueError(
                f"layout {self.parallel.layout}: generation decoded in pieces (async_rl.partial_rollout) "
                "does not run through pipeline stages; generate with p1"
            )
        if not hasattr(self.module, "start_generation"):
            raise TypeError(
                f"{type(self.module).__name__} has no start_generation(); its generation cannot be "
                "interrupted (async_rl.partial_rollout needs a ReaLModel)"
            )
        eos = getattr(tokenizer, "eos_token_id", None)
        base = None if gconfig.greedy else int(random_keys(1))
        decodings = []
        with self.generating():
            for mb in self.split(input_, mb_spec):
                cu_seqlens = mb.cu_seqlens(PROMPT_KEY).to(self.device)
                decodings.append(
                    self.module.start_generation(
                        mb.data[PROMPT_KEY],
                        cu_seqlens,
                        gconfig,
                        eos_token_id=eos,
                        **self._key_kwargs(base, mb),
                    )
                )
        return GenerationSession(decodings, self.generating)

    def join_generation(self) -> None:
        """Take part in another data-parallel rank's generate call with nothing to generate (a
        multi-turn rollout whose trajectories here are done): under FSDP that call gathers and
        frees the weights collectively, so this rank gathers and frees them too."""
        with self.generating():
            pass

    def _key_kwargs(self, base: int | None, mb: SequenceSample) -> dict[str, Any]:
        return {} if base is None else {"prompt_keys": prompt_keys(base, mb).to(self.device)}

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """What decoding runs under: eval mode, the module on its device, whole weights (FSDP) and
        the engine's autocast."""
        with self.mode(training=False), self.on_device(), self.whole_weights(), self._autocast():
            yield

    def whole_weights(self) -> contextlib.AbstractContextManager:
        """FSDP: every unit's weights gathered for the duration (a decoding loop runs each block once
        per token and reads the embedding and head outside ``forward``); else nothing to do."""
        if not self.fsdp:
            return contextlib.nullcontext()
        return gathered(self.module)

    def save_pretrained(self, path: str) -> None:
        """Export the module's weights (HF format when the module offers ``save_pretrained``).

        Collective over the model's ranks when it is sharded: the shards are gathered and only the
        writing rank keeps and writes them, one ordinary folder."""
        if self.parallel is None or not self.parallel.sharded:
            if self.is_writer:
                save_module_weights(self.module, path)
            return
        from realrl.impl.model.parallel.state import full_state_dict

        if self.pipeline is None:
            state = full_state_dict(self.module, keep=self.is_writer)
            if self.is_writer:
                save_module_weights(self.module, path, state)
            return
        state = full_state_dict(self.module, keep=self.pipeline.keeps_gathered)
        whole = self.pipeline.gather_stages(state if self.pipeline.keeps_gathered else None)
        if whole is not None:  # the first stage's first rank
            save_module_weights(self.module, path, whole)
