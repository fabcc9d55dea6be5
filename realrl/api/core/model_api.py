"""Models, interfaces, backends and the registries that make them pluggable.

An interface receives the model it runs on (dependency injection, as in ReaL's documentation on
customizing interfaces): the model knows nothing of PPO, and PPO knows nothing of how the model
is sharded or stepped.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from realrl.api.core.config import (
    ModelAbstraction,
    ModelBackendAbstraction,
    ModelInterfaceAbstraction,
    ModelName,
)
from realrl.api.core.data_api import SequenceSample
from realrl.base.registry import Registry

if TYPE_CHECKING:  # tensors only in annotations here: the master imports this module without torch
    import torch

# ----------------------------------------------------------------------------- model config


@dataclasses.dataclass
class ReaLModelConfig:
    """Architecture of a decoder-only transformer, independent of any HF family's spelling."""

    n_layers: int
    n_q_heads: int
    n_kv_heads: int
    hidden_dim: int
    intermediate_dim: int
    vocab_size: int
    head_dim: int | None = None
    n_positions: int = 2048
    layer_norm_type: Literal["rms", "layer"] = "rms"
    layer_norm_epsilon: float = 1e-6
    mlp_type: Literal["gated", "plain"] = "gated"
    activation_function: str = "silu"
    use_attention_bias: bool = False
    use_attn_proj_bias: bool = False
    use_mlp_bias: bool = False
    qk_layernorm: bool = False
    apply_rotary: bool = True
    rotary_base: float = 10000.0
    rotary_scaling: dict[str, Any] | None = None
    abs_position_embedding: bool = False
    tied_embedding: bool = False
    sliding_window: int | None = None
    embd_pdrop: float = 0.0
    attn_pdrop: float = 0.0
    resid_pdrop: float = 0.0
    is_critic: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    # Mixture of Experts (``impl/model/nn/moe.py``); n_experts = 0 is a dense model and the other
    # fields are then unused. A block is sparse when n_experts > 0, its index is not in
    # mlp_only_layers and (index + 1) is a multiple of decoder_sparse_step (Qwen2-MoE's rule;
    # Mixtral: every block)
    n_experts: int = 0
    n_experts_per_tok: int = 0  # top-k
    moe_intermediate_dim: int | None = None  # each expert's inner size (None: intermediate_dim)
    norm_topk_prob: bool = False  # renormalise the top-k routing weights to sum to 1 (Mixtral: always)
    shared_expert_intermediate_dim: int = 0  # Qwen2-MoE's always-on expert with a sigmoid gate (0: none)
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.001  # weight of the load-balancing loss in training losses
    # the HF ``model_type`` this architecture saves as (None: inferred from the fields above)
    hf_model_type: str | None = None

    def __post_init__(self) -> None:
        if self.head_dim is None:
            if self.hidden_dim % self.n_q_heads:
                raise ValueError(
                    f"hidden_dim {self.hidden_dim} is not divisible by n_q_heads {self.n_q_heads}"
                )
            self.head_dim = self.hidden_dim // self.n_q_heads
        if self.n_q_heads % self.n_kv_heads:
            raise ValueError(f"n_q_heads {self.n_q_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        self.mlp_only_layers = tuple(sorted(int(i) for i in self.mlp_only_layers))  # a JSON list too
        self._check_moe()

    def _check_moe(self) -> None:
        if self.n_experts < 0:
            raise ValueError(f"n_experts must be >= 0 (0: a dense model), got {self.n_experts}")
        if self.n_experts == 0:
            if self.shared_expert_intermediate_dim:
                raise ValueError("shared_expert_intermediate_dim > 0 needs routed experts (n_experts > 0)")
            return
        if self.moe_intermediate_dim is None:
            self.moe_intermediate_dim = self.intermediate_dim
        if not 1 <= self.n_experts_per_tok <= self.n_experts:
            raise ValueError(
                f"a Mixture-of-Experts model needs 1 <= n_experts_per_tok <= n_experts ({self.n_experts}), "
                f"got n_experts_per_tok={self.n_experts_per_tok}"
            )
        if self.moe_intermediate_dim < 1 or self.shared_expert_intermediate_dim < 0:
            raise ValueError(
                f"moe_intermediate_dim must be >= 1 and shared_expert_intermediate_dim >= 0, got "
                f"{self.moe_intermediate_dim} and {self.shared_expert_intermediate_dim}"
            )
        if self.mlp_type != "gated" or self.use_mlp_bias:
            raise ValueError(
                f"experts are gated MLPs without biases; got mlp_type={self.mlp_type!r}, use_mlp_bias={self.use_mlp_bias}"
            )
        if self.decoder_sparse_step < 1:
            raise ValueError(f"decoder_sparse_step must be >= 1, got {self.decoder_sparse_step}")
        outside = [i for i in self.mlp_only_layers if not 0 <= i < self.n_layers]
        if outside:
            raise ValueError(f"mlp_only_layers {outside} name no block of a {self.n_layers}-layer model")
        if self.router_aux_loss_coef < 0:
            raise ValueError(f"router_aux_loss_coef must be >= 0, got {self.router_aux_loss_coef}")

    def is_moe_layer(self, idx: int) -> bool:
        """Whether block ``idx`` routes its tokens to experts (else it has a dense MLP)."""
        return (
            self.n_experts > 0
            and idx not in self.mlp_only_layers
            and (idx + 1) % self.decoder_sparse_step == 0
        )

    @property
    def moe_layers(self) -> list[int]:
        """The sparse blocks, in order."""
        return [i for i in range(self.n_layers) if self.is_moe_layer(i)]


# the stats key under which an interface reports a few decoded examples (prompt, completion, reward)
SAMPLES_KEY = "samples"
# the stats key under which a filtering call (DAPO's dynamic sampling) lists the sample ids the
# runtime should drop from the batch
DROPPED_KEY = "dropped_ids"


# how generation runs its decoding steps (GenerationHyperparameters.decoding, nn/generation.py)
DECODING_MODES = ("auto", "eager", "static", "cuda_graph")


@dataclasses.dataclass
class GenerationHyperparameters:
    """Sampling settings ("The N Implementation Details of RLHF with PPO", general detail 4 and
    policy detail 1)."""

    n: int = 1  # answers per prompt (GRPO groups)
    max_new_tokens: int = 256
    min_new_tokens: int = 0
    greedy: bool = False
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    temperature: float = 1.0
    fixed_length: bool = False  # always sample max_new_tokens (lm-human-preferences mode)
    # how decoding steps run: auto (CUDA graphs on a GPU, else eager) | eager | static (fixed
    # shapes without graphs: the graphs' logic, anywhere) | cuda_graph
    decoding: str = "auto"
    # also return each token's routed experts (a Mixture-of-Experts model; router replay), which
    # decodes eagerly
    record_experts: bool = False

    def __post_init__(self) -> None:
        if self.decoding not in DECODING_MODES:
            raise ValueError(
                f"GenerationHyperparameters.decoding must be one of {DECODING_MODES}, got {self.decoding!r}"
            )
        if self.n < 1:
            raise ValueError(f"GenerationHyperparameters.n must be >= 1, got {self.n}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens or self.max_new_tokens < 1:
            raise ValueError(
                "GenerationHyperparameters needs 0 <= min_new_tokens <= max_new_tokens and "
                f"max_new_tokens >= 1, got {self.min_new_tokens}, {self.max_new_tokens}"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"GenerationHyperparameters.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"GenerationHyperparameters.top_k must be >= 0, got {self.top_k}")
        if self.temperature <= 0:
            raise ValueError(
                f"GenerationHyperparameters.temperature must be > 0 (use greedy=True), got {self.temperature}"
            )


@dataclasses.dataclass
class GenerationOutput:
    """What generation returns, packed with no padding; sequences are prompt-major (the ``n``
    answers of prompt 0, then those of prompt 1, ...).

    ``logprobs`` follows the ``packed_logprobs`` alignment: one entry per token minus one per
    sequence, element j = log pi(token j+1 | tokens <= j) from logits / temperature, 0 where
    token j+1 is a prompt token.
    """

    sequences: torch.Tensor  # long [sum L]
    seqlens: list[int]  # L per sequence (prompt + response)
    prompt_lens: list[int]  # prompt length per sequence
    logprobs: torch.Tensor  # float [sum (L - 1)]
    no_eos: torch.Tensor  # bool [n_sequences]: the response hit max_new_tokens without EOS
    # bool [sum L] or None: True on tokens after the prompt that the policy did not sample (a
    # multi-turn trajectory's observations); None: every token after the prompt is the model's
    env_mask: torch.Tensor | None = None
    # int [sum L, sparse blocks, top_k] or None: the experts each token was routed to while
    # decoding (``record_experts``); -1 rows for tokens no decoder ran (an answer's last token)
    routed_experts: torch.Tensor | None = None

    def prompt_mask(self) -> torch.Tensor:
        """bool [sum L]: True on every token the policy did not sample (the ``prompt_mask`` key):
        the prompt, and a multi-turn trajectory's observations."""
        import torch  # a generation's output: in a worker, where torch is loaded

        parts = [
            torch.arange(L, device=self.sequences.device) < p for L, p in zip(self.seqlens, self.prompt_lens)
        ]
        mask = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool)
        return mask if self.env_mask is None else mask | self.env_mask.to(mask.device)


# ----------------------------------------------------------------------------- the model an interface sees


@dataclasses.dataclass
class ModelVersion:
    epoch: int = 0
    epoch_step: int = 0
    global_step: int = 0


@dataclasses.dataclass
class FinetuneSpec:
    """How long training runs: what LR schedules need to know."""

    total_train_epochs: int
    dataset_size: int
    train_batch_size: int

    @property
    def steps_per_epoch(self) -> int:
        return max(1, -(-self.dataset_size // self.train_batch_size))

    @property
    def total_train_steps(self) -> int:
        return self.total_train_epochs * self.steps_per_epoch


@dataclasses.dataclass
class Model:
    """A named module (usually wrapped by an engine) with its tokenizer and version counter."""

    name: ModelName
    module: Any
    tokenizer: Any
    device: torch.device | str = "cpu"
    dtype: torch.dtype | None = None
    version: ModelVersion = dataclasses.field(default_factory=ModelVersion)
    ft_spec: FinetuneSpec | None = None

    def inc_version(self) -> None:
        self.version.global_step += 1
        self.version.epoch_step += 1


class InterfaceMethodUnsupported(RuntimeError):
    """An MFC asked an interface for a call type it does not offer."""


class Rollout(abc.ABC):
    """A generate call decoded in pieces (``ModelInterface.start_rollout``): ``advance`` decodes
    up to ``tokens`` more tokens of every unfinished answer with the weights of ``version`` (the
    rollout notices when they changed since its last piece and continues under the new ones) and
    returns how many answers are unfinished; ``finish`` then returns what ``generate`` would."""

    data: SequenceSample  # the call's inputs

    @abc.abstractmethod
    def advance(self, tokens: int, version: int) -> int: ...

    @abc.abstractmethod
    def finish(self) -> SequenceSample | tuple[SequenceSample, dict]: ...


class ModelInterface:
    """What an MFC runs. Subclasses implement the calls that apply to their algorithm."""

    def _unsupported(self, call: str):
        return InterfaceMethodUnsupported(
            f"interface {type(self).__name__} does not offer {call}(); check the MFC's interface_type"
        )

    def generate(self, model: Model, data: SequenceSample, mb_spec=None) -> SequenceSample:
        """The produced keys; or ``(sample, stats)`` to report scalar statistics of the call too
        (and, under ``SAMPLES_KEY``, a few decoded examples: a list of dicts, shown to the user)."""
        raise self._unsupported("generate")

    def start_rollout(self, model: Model, data: SequenceSample, mb_spec=None) -> Rollout:
        """``generate`` in pieces (asynchronous RL's partial rollouts): the prompts prefilled, the
        answers not decoded yet; the worker advances the ``Rollout`` between its other requests."""
        raise InterfaceMethodUnsupported(
            f"interface {type(self).__name__} cannot generate in pieces (async_rl.partial_rollout); "
            "it offers generate() only"
        )

    def inference(self, model: Model, data: SequenceSample, mb_spec=None) -> SequenceSample:
        """The produced keys; or ``(sample, stats)`` to report scalar statistics of the call too
        (and, under ``DROPPED_KEY``, the ids of the samples a filtering call drops)."""
        raise self._unsupported("inference")

    def train_step(self, model: Model, data: SequenceSample, mb_spec=None) -> dict[str, float]:
        """Update the model on ``data`` and advance ``model.version`` (once per optimizer step
        that LR schedules should count); return scalar stats."""
        raise self._unsupported("train_step")

    def evaluate(self, model: Model, eval_dataloader) -> dict[str, float]:
        return {}

    def save(self, model: Model, save_dir: str) -> None:
        return None


# ----------------------------------------------------------------------------- registries

_MODELS: Registry[Callable[..., Model]] = Registry("model")
_INTERFACES: Registry[Callable[..., ModelInterface]] = Registry("interface")
_BACKENDS: Registry[Callable[..., Any]] = Registry("backend")
_REWARD_FNS: Registry[Callable[..., list[float]]] = Registry("reward function")


def register_model(name: str, factory: Callable[..., Model]) -> None:
    """``factory(name: ModelName, device, **args) -> Model``."""
    _MODELS.register(name, factory)


def make_model(
    cfg: ModelAbstraction | str,
    name: ModelName | str,
    device: torch.device | str = "cpu",
    parallel: Any = None,
) -> Model:
    """``parallel``: the model's layout on this worker (``ParallelContext``), passed to a factory
    whose signature names ``parallel`` (it may then load the model already split)."""
    if isinstance(cfg, str):
        cfg = ModelAbstraction(cfg)
    factory = _MODELS.get(cfg.type_)
    kwargs = dict(cfg.args)
    if parallel is not None and "parallel" in inspect.signature(factory).parameters:
        kwargs["parallel"] = parallel
    return factory(ModelName.parse(name), device, **kwargs)


def registered_models() -> list[str]:
    return _MODELS.names()


def register_interface(name: str, cls: Callable[..., ModelInterface]) -> None:
    _INTERFACES.register(name, cls)


def make_interface(cfg: ModelInterfaceAbstraction | str) -> ModelInterface:
    if isinstance(cfg, str):
        cfg = ModelInterfaceAbstraction(cfg)
    return _INTERFACES.get(cfg.type_)(**cfg.args)


def registered_interfaces() -> list[str]:
    return _INTERFACES.names()


def register_backend(name: str, cls: Callable[..., Any]) -> None:
    """``cls(**args).initialize(model: Model, ft_spec: FinetuneSpec) -> Model`` wraps the
    model's module into an engine (train, inference, or null)."""
    _BACKENDS.register(name, cls)


def make_backend(cfg: ModelBackendAbstraction | str) -> Any:
    if isinstance(cfg, str):
        cfg = ModelBackendAbstraction(cfg)
    return _BACKENDS.get(cfg.type_)(**cfg.args)


def registered_backends() -> list[str]:
    return _BACKENDS.names()


def register_reward_fn(name: str, fn: Callable[..., list[float]]) -> None:
    """``fn(prompts: list[str], completions: list[str], **metadata) -> list[float]``."""
    if not callable(fn):
        raise ValueError(f"reward function {name!r} must be callable, got {fn!r}")
    _REWARD_FNS.register(name, fn)


def get_reward_fn(name: str) -> Callable[..., list[float]]:
    return _REWARD_FNS.get(name)


def registered_reward_fns() -> list[str]:
    return _REWARD_FNS.names()
