"""ReaLModel: a decoder-only transformer over packed, unpadded sequences.

``model(input_ids [T], cu_seqlens [B+1])`` -> logits [T, vocab] (critic: values [T]). Positions
restart at 0 for each sequence and attention never crosses a sequence boundary.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from realrl.api.core.model_api import GenerationHyperparameters, GenerationOutput, ReaLModelConfig
from realrl.impl.model.modules.attention import PackedMeta, activation_dtype, resolve_attn_impl
from realrl.impl.model.modules.kv_cache import PackedContext
from realrl.impl.model.modules.norm import make_norm
from realrl.impl.model.modules.rotary import RotaryEmbedding
from realrl.impl.model.modules.shared_prefix import SharedPrefixes
from realrl.impl.model.nn.compiled_blocks import CompiledBlocks, block_runner, compile_blocks
from realrl.impl.model.nn.moe_stats import RouterLog, attach_router_stats
from realrl.impl.model.nn.router_replay import ExpertRouting
from realrl.impl.model.nn.transformer_block import TransformerBlock

CRITIC_HEAD_INITS = ("reward", "zeros")


class Embedding(nn.Module):
    def __init__(self, cfg: ReaLModelConfig, dtype=None, device=None):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_dim, dtype=dtype, device=device)
        if cfg.abs_position_embedding:
            self.wpe = nn.Embedding(cfg.n_positions, cfg.hidden_dim, dtype=dtype, device=device)
        self.drop = nn.Dropout(cfg.embd_pdrop)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.wte(input_ids)
        if hasattr(self, "wpe"):
            x = x + self.wpe(positions)
        return self.drop(x)


@torch.no_grad()
def reset_critic_head(head: nn.Linear, mode: str, seed: int) -> None:
    """``head`` initialised as ``init_critic_head`` does, from ``seed``: drawn in fp32 by a CPU
    generator, then copied where the head is, so the values are the same on every device, dtype
    and layout (a whole model, a tensor-parallel rank, a pipeline's last stage); a device's own
    generator (CUDA's) draws another stream from the same seed. Nothing to do on "meta"."""
    if head.weight.device.type == "meta":
        return
    # allocated without its default initialisation, which would draw from the global RNG
    drawn = nn.utils.skip_init(nn.Linear, head.in_features, head.out_features, bias=head.bias is not None)
    init_critic_head(drawn, mode, torch.Generator(device="cpu").manual_seed(seed))
    for param, value in zip(head.parameters(), drawn.parameters(), strict=True):
        param.copy_(value)


def init_critic_head(head: nn.Linear, mode: str = "reward", generator: torch.Generator | None = None) -> None:
    """Reward head weight ~ N(0, std=1/sqrt(d_model+1)), bias 0 ("Reward head layer initialization"
    in "The N Implementation Details of RLHF with PPO"); "zeros" is the value-head option (N(0, 0)
    in "Value head layer initialization")."""
    if mode == "reward":
        nn.init.normal_(head.weight, mean=0.0, std=1.0 / math.sqrt(head.in_features + 1), generator=generator)
    elif mode == "zeros":
        nn.init.zeros_(head.weight)
    else:
        raise ValueError(f"unknown critic head init {mode!r}; expected one of {CRITIC_HEAD_INITS}")
    nn.init.zeros_(head.bias)


class ReaLModel(nn.Module):
    # forward() options the engines may pass: outputs at some tokens only; shared-prefix packing
    packed_forward_options = ("output_index", "prefix_groups", "routed_experts")
    # generate() options the engines may pass: per-prompt sampling keys (see nn/generation.py)
    generate_options = ("prompt_keys",)

    def __init__(
        self,
        config: ReaLModelConfig,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        attn_impl: str = "auto",
        critic_head_init: str = "reward",
        initializer_range: float = 0.02,
    ):
        super().__init__()
        self.config = config
        # drawn first, so a critic's new head is the same however the model is built (on "meta",
        # to be filled shard by shard, nothing else draws from the generator)
        self.critic_head_seed = int(torch.randint(0, 2**62, (1,)))
        self.critic_head_init = critic_head_init
        self.lora = None  # nn/lora.py's LoRAConfig once adapters are added
        self.base_path: str | None = None  # the checkpoint the weights came from (a peft folder names it)
        self.compiled_blocks: CompiledBlocks | None = None  # set by ``compile_blocks``
        self.requested_attn_impl = attn_impl
        # re-resolved when inputs come on another device type or activations in another dtype
        self._attn_key = (torch.device(device or "cpu").type, dtype or torch.get_default_dtype())
        self.attn_impl = resolve_attn_impl(attn_impl, *self._attn_key)
        kw = dict(dtype=dtype, device=device)
        self.embed = Embedding(config, **kw)
        self.layers = nn.ModuleList(TransformerBlock(config, i, **kw) for i in range(config.n_layers))
        self.final_ln = make_norm(config.layer_norm_type, config.hidden_dim, config.layer_norm_epsilon, **kw)
        out_dim, bias = (1, True) if config.is_critic else (config.vocab_size, False)
        self.head = nn.Linear(config.hidden_dim, out_dim, bias=bias, **kw)
        self.rotary = (
            RotaryEmbedding(config.head_dim, config.rotary_base, config.rotary_scaling, device=device)
            if config.apply_rotary
            else None
        )
        self._init_weights(initializer_range)
        if config.is_critic:
            self.reset_critic_head()
        elif config.tied_embedding:
            self.head.weight = self.embed.wte.weight

    @torch.no_grad()
    def materialize(self, device: torch.device | str) -> None:
        """Allocate a model built on "meta" (or split there) on ``device``, values undefined, and
        recompute what no parameter holds: the rotary frequencies (a non-persistent buffer) and
        the tied head, which ``to_empty`` unties. The caller fills the parameters."""
        from realrl.impl.model.modules.rotary import rotary_inv_freq

        cfg = self.config
        self.to_empty(device=device)
        if cfg.tied_embedding and not cfg.is_critic:
            self.head.weight = self.embed.wte.weight
        if self.rotary is not None:
            self.rotary.inv_freq.copy_(rotary_inv_freq(cfg.head_dim, cfg.rotary_base, cfg.rotary_scaling))

    def reset_critic_head(self) -> None:
        """A critic's new head from its own seed (nothing to do on "meta": no values yet)."""
        reset_critic_head(self.head, self.critic_head_init, self.critic_head_seed)

    @torch.no_grad()
    def _init_weights(self, std: float) -> None:
        """HF-style: N(0, initializer_range) for linear and embedding weights, zero biases."""
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, 0.0, std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.wte.weight.dtype

    @property
    def local_kv_heads(self) -> int:
        """KV heads this process holds (all of them, or its share under tensor parallelism)."""
        return self.layers[0].attn.n_kv if len(self.layers) else self.config.n_kv_heads

    @property
    def device(self) -> torch.device:
        return self.embed.wte.weight.device

    # ------------------------------------------------------------------ forward

    def hidden_states(
        self, input_ids: torch.Tensor, ctx, output_index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Final-norm hidden states [T, hidden] under an attention context (packed or decode).

        With ``output_index`` only those tokens' states come out ([N, hidden]), and the last
        layer computes only them past its attention: exact, because no later layer reads the rest.
        """
        x = self.embed(input_ids, ctx.positions)
        if self.rotary is None:
            rope = None
        else:  # in the projections' dtype: bf16 under autocast, where x stays fp32
            dtype = activation_dtype(x.dtype, x.device)
            rope = self.rotary(ctx.positions, ctx.max_position, dtype)
        # recording the routing of every token (the load-balancing loss reads them all), or
        # replaying every token's, the last layer computes every row too
        routed = getattr(ctx, "router_log", None) is not None or getattr(ctx, "routing", None) is not None
        last = len(self.layers) - 1
        run = block_runner(self.compiled_blocks, ctx)
        for i, layer in enumerate(self.layers):
            x = run(layer, x, rope, ctx, output_index if i == last and not routed else None)
        if (routed or not self.layers) and output_index is not None:
            x = ctx.rows(x, output_index)
        return self.final_ln(x)

    def compile_blocks(self) -> CompiledBlocks:
        """Run the blocks of packed forwards (training, inference) through ``torch.compile`` from
        now on (``nn/compiled_blocks.py``); prefill and decoding stay eager."""
        return compile_blocks(self)

    def packed_context(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        prefix_groups: list[int] | None = None,
        **kw: Any,
    ) -> PackedContext:
        """The attention context of a packed forward; with ``prefix_groups`` (sequences per
        group), the prefix each group's sequences share is computed once (``shared_prefix``)."""
        if input_ids.dim() != 1:
            raise ValueError(
                f"ReaLModel expects packed 1-D input_ids [T], got shape {tuple(input_ids.shape)}"
            )
        if cu_seqlens.device != input_ids.device:
            raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but input_ids on {input_ids.device}")
        meta = PackedMeta.from_cu_seqlens(cu_seqlens, input_ids.shape[0])
        self.check_length(meta.max_seqlen, "a packed sequence")
        dropout = self.config.attn_pdrop if self.training else 0.0
        shared = None if not prefix_groups else SharedPrefixes.find(input_ids, meta, prefix_groups)
        impl = self._attn_impl_for(input_ids.device, activation_dtype(self.dtype, input_ids.device))
        return PackedContext(meta, impl, dropout, shared=shared, **kw)

    def check_length(self, length: int, what: str) -> None:
        """Learned absolute positions (GPT-2) end at n_positions; rotary models extrapolate."""
        if self.config.abs_position_embedding and length > self.config.n_positions:
            raise ValueError(
                f"{what} has {length} tokens but this model's learned positions stop at "
                f"n_positions={self.config.n_positions}"
            )

    def _attn_impl_for(self, device: torch.device, dtype: torch.dtype) -> str:
        """The backend for activations of ``dtype`` on ``device``, re-resolved when either changes:
        a model built on CPU with ``attn_impl="auto"`` and moved to CUDA picks the CUDA kernels, and
        fp32 activations on a GPU take sdpa (the varlen kernels are fp16/bf16 only)."""
        if (device.type, dtype) != self._attn_key:
            self.attn_impl = resolve_attn_impl(self.requested_attn_impl, device, dtype)
            self._attn_key = (device.type, dtype)
        return self.attn_impl

    def forward(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        output_index: torch.Tensor | None = None,
        prefix_groups: list[int] | None = None,
        routed_experts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """logits [T, vocab] for an LM; values [T] for a critic. A Mixture-of-Experts model's
        output, in a forward that records gradients, also carries its routing statistics
        (``nn/moe_stats.router_stats_of``: the load-balancing loss and the experts' load).

        ``output_index`` (long [N], ascending token indices into ``input_ids``): the outputs at
        those tokens only, [N, vocab] / [N], equal to ``forward(...)[output_index]`` at a fraction
        of the last layer's and the head's cost (a reward model reads one token per sequence, a
        policy loss only the answer). ``prefix_groups`` (how many consecutive sequences form each
        group, e.g. one sample's [chosen, rejected] or K answers): the prefix a group's sequences
        share is computed once (``modules/shared_prefix.py``); outputs are the same.
        ``routed_experts`` (int [T, sparse blocks, top_k], a Mixture-of-Experts model): the experts
        each token takes instead of routing again (router replay, ``nn/router_replay.py``).
        """
        if output_index is not None:
            output_index = output_index.to(device=input_ids.device, dtype=torch.long)
        ctx = self.packed_context(input_ids, cu_seqlens, prefix_groups)
        shared = ctx.shared
        ctx.router_log = self._router_log(ctx)
        ctx.routing = self._replay(routed_experts, ctx, input_ids.shape[0])
        h = self.hidden_states(
            input_ids if shared is None else input_ids[shared.represent], ctx, output_index
        )
        out = self.head(h)
        if shared is not None and output_index is None:
            out = out[shared.expand]  # back to one row per original token
        out = out.squeeze(-1) if self.config.is_critic else out
        if ctx.router_log is not None:
            attach_router_stats(out, ctx.router_log.stats(self.config.router_aux_loss_coef))
        return out

    def _router_log(self, ctx: PackedContext) -> RouterLog | None:
        """Where the sparse blocks of a Mixture-of-Experts model record their routing, in a forward
        that records gradients (its loss may add the load-balancing term, ``nn/moe_stats.py``);
        None for a dense model or without gradients. Its output then carries ``RouterStats``."""
        if not self.config.n_experts or not torch.is_grad_enabled() or not self.config.moe_layers:
            return None
        shared = ctx.shared  # a shared prefix's row stands for each sequence that shares it
        weights = None if shared is None else torch.bincount(shared.expand, minlength=shared.n_compressed)
        return RouterLog(self.config.n_experts, weights)

    def _replay(self, routed: torch.Tensor | None, ctx: PackedContext, n_tokens: int) -> ExpertRouting | None:
        """The experts to replay, one row per computed token (a shared prefix: its first
        sequence's rows); None when none are given."""
        if routed is None:
            return None
        if not self.config.moe_layers:
            raise ValueError(
                "routed_experts replays a Mixture-of-Experts model's routing; this model is dense"
            )
        if routed.shape[0] != n_tokens:
            raise ValueError(f"routed_experts has {routed.shape[0]} rows for {n_tokens} tokens")
        routed = routed.to(self.device)
        rows = routed if ctx.shared is None else routed[ctx.shared.represent]
        return ExpertRouting(self.config.moe_layers, rows)

    # ------------------------------------------------------------------ generation and HF I/O

    def generate(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        gconfig: GenerationHyperparameters,
        eos_token_id: int | list[int] | None = None,
        prompt_keys: torch.Tensor | None = None,
    ) -> GenerationOutput:
        """``prompt_keys`` (int64 [n_prompts]): each prompt's sampling randomness, so its answers do
        not depend on the batch it is generated in; None draws them from torch's global RNG."""
        from realrl.impl.model.nn.generation import generate

        return generate(self, input_ids, cu_seqlens, gconfig, eos_token_id, prompt_keys)

    def start_generation(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        gconfig: GenerationHyperparameters,
        eos_token_id: int | list[int] | None = None,
        prompt_keys: torch.Tensor | None = None,
    ):
        """The prefilled, paused eager decoding (``nn.generation.EagerDecoding``) that
        interruptible generation advances a few tokens at a time."""
        from realrl.impl.model.nn.generation import start_decoding

        return start_decoding(self, input_ids, cu_seqlens, gconfig, eos_token_id, prompt_keys)

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        is_critic: bool = False,
        dtype: torch.dtype | None = None,
        attn_impl: str = "auto",
        device: torch.device | str | None = None,
        critic_head_init: str = "reward",
        tp_mesh: Any = None,
        cut: Any = None,
    ) -> nn.Module:
        """``tp_mesh`` (a 1-D DeviceMesh): load split over it by tensor parallelism, each rank
        reading only its slices of the checkpoint (safetensors) onto the mesh's device. ``cut``:
        whole model -> the part this rank holds (a pipeline stage), which alone is read."""
        from realrl.impl.model.nn.hf_io import load_pretrained

        return load_pretrained(
            cls, path, is_critic, dtype, attn_impl, device, critic_head_init, tp_mesh, cut=cut
        )

    def save_pretrained(
        self, save_dir: str, tokenizer: Any = None, state_dict: dict[str, torch.Tensor] | None = None
    ) -> None:
        """``state_dict``: whole weights to write instead of this module's own (a tensor-parallel or
        FSDP-sharded module's, gathered)."""
        from realrl.impl.model.nn.hf_io import save_pretrained

        save_pretrained(self, save_dir, tokenizer, state_dict)
