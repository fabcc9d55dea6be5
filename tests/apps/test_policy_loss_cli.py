"""The command line accepts every registered policy loss, its options and its preset (configs are
built, not run); an unknown loss or a bad option is refused naming what is allowed."""

from __future__ import annotations

import re

import pytest

from realrl.apps.configs import build_config
from realrl.impl.model.utils.policy_losses import policy_loss_names

VERL_LOSSES = [
    "vanilla",
    "gspo",
    "dppo_tv",
    "dppo_kl",
    "sapo",
    "gpg",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "dro",
    "cispo",
]


def test_every_verl_loss_is_registered():
    assert set(VERL_LOSSES) | {"ppo"} <= set(policy_loss_names())


@pytest.mark.parametrize("name", VERL_LOSSES)
def test_the_cli_accepts_each_loss(name, tmp_path):
    extra = ["ppo.policy_loss_options.dro_beta=0.05"] if name == "dro" else []
    cfg = build_config("grpo", [f"fileroot={tmp_path}", f"ppo.policy_loss={name}", *extra])
    assert cfg.ppo.policy_loss == name


def test_loss_options_from_the_cli_reach_the_loss_config(tmp_path):
    args = [
        f"fileroot={tmp_path}",
        "ppo.policy_loss=kl_cov",
        "ppo.policy_loss_options.kl_cov_ratio=0.002",
        "ppo.policy_loss_options.ppo_kl_coef=1.0",
    ]
    options = build_config("grpo", args).ppo.loss_config().options
    assert (options.kl_cov_ratio, options.ppo_kl_coef) == (0.002, 1.0)


@pytest.mark.parametrize(
    "preset, loss, eps_low, eps_high, agg",
    [
        ("cispo", "cispo", 10.0, 0.2, "token-mean"),
        ("gmpo", "geo_mean", 0.4, 0.4, "seq-mean-token-mean"),
        ("sapo", "sapo", 0.2, 0.2, "seq-mean-token-mean"),
    ],
)
def test_loss_presets(preset, loss, eps_low, eps_high, agg, tmp_path):
    hp = build_config("grpo", [f"fileroot={tmp_path}", f"ppo_preset={preset}"]).ppo
    cfg = hp.loss_config()
    assert (hp.policy_loss, cfg.eps_clip_low, cfg.eps_clip_high, hp.loss_agg_mode) == (
        loss,
        eps_low,
        eps_high,
        agg,
    )
    assert hp.kl_loss_coef == 0.0 and hp.adv_estimator == "grpo"
    if preset == "sapo":
        assert (cfg.options.tau_pos, cfg.options.tau_neg) == (1.0, 1.05)
    tuned = build_config("grpo", [f"fileroot={tmp_path}", f"ppo_preset={preset}", "ppo.eps_clip_high=0.3"])
    assert tuned.ppo.loss_config().eps_clip_high == 0.3  # the user's own override wins


@pytest.mark.parametrize(
    "override, message",
    [
        ("ppo.policy_loss=trpo", "policy_loss must be one of ['cispo', 'clip_cov'"),
        ("ppo.policy_loss=dro", "needs policy_loss_options.dro_beta > 0"),
        ("ppo.policy_loss_options.tau_neg=0", "tau_pos and tau_neg must be > 0"),
        ("ppo.policy_loss_options.clip_cov_ratio=2", "clip_cov_ratio must be in (0, 1]"),
        ("ppo.eps_clip=1.5", "policy_loss='ppo' needs eps_clip < 1"),
    ],
)
def test_bad_loss_choices_are_refused_naming_the_choices(override, message, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)):
        build_config("grpo", [f"fileroot={tmp_path}", override])
