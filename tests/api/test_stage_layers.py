"""Pipeline stages split the blocks so the fullest stage holds as few parameters as possible,
the embedding counted on the first stage and the final norm and head on the last."""

import itertools

import pytest

from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.core.model_size import block_params, count_params, stage_layers

LLAMA_LIKE = dict(n_layers=8, n_q_heads=4, n_kv_heads=2, hidden_dim=16, intermediate_dim=32, vocab_size=512)


def fullest(cfg, bounds):
    held = [block_params(cfg, i)[0] for i in range(cfg.n_layers)]
    h = cfg.hidden_dim
    first, last = cfg.vocab_size * h, h + cfg.vocab_size * h
    return max(
        sum(held[i] for i in r) + (first if s == 0 else 0) + (last if s == len(bounds) - 1 else 0)
        for s, r in enumerate(bounds)
    )


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 8])
def test_stages_are_contiguous_and_no_split_has_a_smaller_fullest_stage(pp):
    cfg = ReaLModelConfig(**LLAMA_LIKE)
    bounds = stage_layers(cfg, pp)
    assert len(bounds) == pp and all(len(r) >= 1 for r in bounds)
    assert [i for r in bounds for i in r] == list(range(cfg.n_layers))
    best = min(
        fullest(cfg, [range(a, b) for a, b in zip((0, *cuts), (*cuts, cfg.n_layers))])
        for cuts in itertools.combinations(range(1, cfg.n_layers), pp - 1)
    )
    assert fullest(cfg, bounds) == best
    assert count_params(cfg, pp=pp).total == best


def test_the_embedding_and_head_stages_get_fewer_blocks():
    # the embedding and the head each weigh about as much as three blocks here
    bounds = stage_layers(ReaLModelConfig(**LLAMA_LIKE), 4)
    sizes = [len(r) for r in bounds]
    assert sizes[0] < max(sizes) and sizes[-1] < max(sizes), sizes


def test_more_stages_than_layers_is_refused():
    with pytest.raises(ValueError, match="p9 stages needs 1 <= p <= the model's 8 layers"):
        stage_layers(ReaLModelConfig(**LLAMA_LIKE), 9)
