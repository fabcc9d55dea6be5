"""Router replay for a Mixture-of-Experts actor (``ppo.router_replay``): what the PPO interfaces
and the experiment check, and how the recording travels. No torch at import: the experiment
(built where torch is not loaded) runs ``check_router_replay``.

"Stabilizing MoE Reinforcement Learning by Aligning Training and Inference Routers" (R3, 2025):
generation records each token's top-k experts per sparse block (``GenerationOutput.
routed_experts``), the rollout carries them as the per-token key ``routed_experts`` (int16
``[tokens, sparse blocks, top_k]``, only with replay on), and the actor's forwards of the same
tokens, the recomputed log-probs (``ppo.recompute_logprobs``, a rollout correction) and every
update of ``train_step``, route them there instead of routing again (the engine hands the key to
the model: ``nn/router_replay.py``). The gate weights are the trainer's router probabilities at
those experts, so the router is still trained. The reference model routes by itself: its
inference never sees the key.

Not covered, refused before a run starts: a dense actor, an actor split into pipeline stages
(pipelined generation records nothing, and the stages' forwards take no replayed experts), and
multi-turn rollouts (``env``/``agent``: their observations are prefilled turn by turn, no record
is stitched together). Tensor and expert parallelism work: every tp rank routes every token with
the whole router, so each records, and replays, the same experts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from realrl.impl.interface.ppo_keys import ROUTED_EXPERTS

if TYPE_CHECKING:
    from realrl.api.core.data_api import SequenceSample
    from realrl.api.core.model_api import GenerationOutput
    from realrl.api.core.system_api import ExperimentConfig
    from realrl.impl.interface.ppo_config import PPOHyperparameters

ACTOR = "actor"  # the PPO graph's policy role


def check_router_replay(
    hp: PPOHyperparameters, exp: ExperimentConfig, fallback: Mapping[str, Any] | None = None
) -> None:
    """ValueError, naming ``ppo.router_replay``, when the experiment cannot replay its actor's
    routing: multi-turn rollouts, a dense actor (its config read from ``config.json``, or
    ``fallback`` for a model an earlier phase has yet to write), or one in pipeline stages."""
    if not hp.router_replay:
        return
    from realrl.api.core.model_size import model_config

    args = [getattr(m.interface_impl, "args", None) or {} for m in exp.mfcs]
    check_replay_options(hp, multi_turn=any(a.get("env") or a.get("agent") for a in args))

    spec = exp.models.get(ACTOR)
    if spec is None:
        return
    try:
        cfg = model_config(spec, fallback)
    except ValueError:  # not a ReaLModel, or no config to read yet: generation checks it
        return
    if cfg is not None and not cfg.moe_layers:
        where = spec.model.args.get("path") or "its config"
        raise ValueError(
            f"ppo.router_replay=true replays a Mixture-of-Experts actor's routing, and the actor "
            f"({where}) is a dense model: set ppo.router_replay=false"
        )
    staged = [str(lay) for lay in exp.role_layouts().get(ACTOR, []) if lay.pp > 1]
    if staged:
        raise ValueError(
            f"ppo.router_replay=true does not run an actor split into pipeline stages ({', '.join(staged)}): "
            "give the actor's calls layouts with p1"
        )


def check_replay_options(hp: PPOHyperparameters, multi_turn: bool) -> None:
    """ValueError when ``ppo.router_replay`` meets multi-turn rollouts (``env``/``agent``)."""
    if hp.router_replay and multi_turn:
        raise ValueError(
            "ppo.router_replay=true records the experts of single-turn generation; multi-turn rollouts "
            "(env=... or agent=...) record none: set ppo.router_replay=false"
        )


def require_recorded(hp: PPOHyperparameters, gen: GenerationOutput) -> None:
    """ValueError when replay is on and the generation recorded no experts (a dense model)."""
    if hp.router_replay and gen.routed_experts is None:
        raise ValueError(
            "ppo.router_replay=true: generation recorded no routed experts; the actor is a dense model "
            "(router replay needs a Mixture-of-Experts one): set ppo.router_replay=false"
        )


def without_routing(data: SequenceSample) -> SequenceSample:
    """``data`` without the recorded experts: a forward that must route by itself (the frozen
    reference model's)."""
    if ROUTED_EXPERTS not in data.keys:
        return data
    return data.select([k for k in data.keys if k != ROUTED_EXPERTS])
