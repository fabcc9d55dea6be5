"""LoRA adapters through peft on ReaLModel: only adapters train and the base stays bit-identical,
adapters off is the base, peft loads the adapter folder to the same logits, resume is exact, and
the options, layouts and memory plan know about them."""

from __future__ import annotations

import logging
import os

import peft
import pytest
import torch
import transformers
from _backend_toy import make_batch, n_loss_tokens, tiny_config, token_loss

from realrl.api.core.data_api import MicroBatchSpec
from realrl.api.core.lora import LoRAConfig, adapter_param_count
from realrl.api.core.model_api import ReaLModelConfig
from realrl.apps.configs import build_config, register_everything
from realrl.impl.model.backend.config import OptimizerConfig
from realrl.impl.model.backend.integrity import CheckpointError
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.nn import ReaLModel
from realrl.impl.model.nn.lora import ADAPTER_DIR, adapters_disabled, add_adapters, merged_state_dict

LENGTHS = [5, 9, 3, 12, 7, 4, 10, 6]
RANK = 4


def base_model(seed: int = 0, **kw) -> ReaLModel:
    torch.manual_seed(seed)
    return ReaLModel(tiny_config(**kw))


def adapted(seed: int = 0, **kw) -> ReaLModel:
    model = base_model(seed, **kw)
    add_adapters(model, LoRAConfig(rank=RANK, alpha=8.0), seed=7)
    return model


def engine_of(model: ReaLModel) -> TrainEngine:
    return TrainEngine(model, OptimizerConfig(lr=1e-2, weight_decay=0.1), total_train_steps=6)


def step(engine: TrainEngine, i: int) -> None:
    batch = make_batch(LENGTHS, seed=100 + i)
    engine.train_batch(batch, MicroBatchSpec(n_mbs=2), token_loss, n_loss_tokens, version_steps=i)


def forward(model: ReaLModel, n: int = 9) -> torch.Tensor:
    ids = make_batch([n]).data["packed_input_ids"]
    with torch.no_grad():
        return model(ids, torch.tensor([0, n], dtype=torch.int32))


def base_params(model: ReaLModel) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def test_fresh_adapters_compute_the_base_and_only_adapters_train():
    base, model = base_model(), adapted()
    assert torch.equal(forward(base), forward(model))  # B starts at zero
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    expected = adapter_param_count(model.config, model.lora)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected


def test_training_moves_adapters_only_and_the_optimizer_holds_nothing_else():
    model = adapted()
    before = base_params(model)
    engine = engine_of(model)
    for i in range(3):
        step(engine, i)
    after = base_params(model)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    held = [p for group in engine.optimizer.param_groups for p in group["params"]]
    assert sum(p.numel() for p in held) == adapter_param_count(model.config, model.lora)
    assert not torch.equal(forward(model), forward(base_model()))  # the adapters did learn


def test_adapters_off_is_exactly_the_separately_loaded_base():
    model = adapted()
    engine = engine_of(model)
    for i in range(2):
        step(engine, i)
    trained = forward(model)
    with adapters_disabled(model):
        off = forward(model)
    assert torch.equal(off, forward(base_model()))
    assert torch.equal(forward(model), trained)  # back on afterwards
    assert all(p.requires_grad == ("lora_" in n) for n, p in model.named_parameters())


def test_peft_loads_the_adapter_folder_to_the_same_logits(tmp_path):
    base_dir, final = str(tmp_path / "base"), str(tmp_path / "final")
    base_model().save_pretrained(base_dir)
    model = ReaLModel.from_pretrained(base_dir)
    add_adapters(model, LoRAConfig(rank=RANK, alpha=8.0, target_modules=["q_proj", "v_proj", "down"]), seed=3)
    model.base_path = base_dir
    engine = engine_of(model)
    for i in range(2):
        step(engine, i)
    model.save_pretrained(final)
    ours = forward(model)
    # the folder: the merged model, and the peft adapter folder beside it
    merged = ReaLModel.from_pretrained(final)
    torch.testing.assert_close(forward(merged), ours, rtol=1e-5, atol=1e-5)
    adapter = os.path.join(final, ADAPTER_DIR)
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    with_adapters = peft.PeftModel.from_pretrained(hf_base, adapter)
    assert sorted(with_adapters.peft_config["default"].target_modules) == ["down_proj", "q_proj", "v_proj"]
    ids = make_batch([9]).data["packed_input_ids"]
    with torch.no_grad():
        got = with_adapters(input_ids=ids[None]).logits[0]
    torch.testing.assert_close(got, ours, rtol=1e-5, atol=1e-5)


def test_merged_state_dict_is_the_adapted_model():
    model = adapted()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.2)
    plain = base_model(seed=11)
    plain.load_state_dict(merged_state_dict(model.state_dict(), model.lora))
    torch.testing.assert_close(forward(plain), forward(model), rtol=1e-5, atol=1e-5)


def test_a_critic_trains_its_head_and_keeps_it_beside_its_adapters(tmp_path):
    model = adapted(is_critic=True)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {"head.weight", "head.bias"} <= trainable
    model.save_pretrained(str(tmp_path / "critic"))
    assert os.path.isfile(tmp_path / "critic" / ADAPTER_DIR / "value_head.safetensors")
    back = ReaLModel.from_pretrained(str(tmp_path / "critic"), is_critic=True)
    torch.testing.assert_close(forward(back), forward(model), rtol=1e-5, atol=1e-5)


def test_resume_of_adapters_and_their_optimizer_is_exact(tmp_path):
    straight = engine_of(adapted())
    for i in range(4):
        step(straight, i)
    first = engine_of(adapted())
    for i in range(2):
        step(first, i)
    first.save(str(tmp_path / "ckpt"))
    assert "adapters.safetensors" in os.listdir(tmp_path / "ckpt")  # what trains, not the base
    assert "model.safetensors" not in os.listdir(tmp_path / "ckpt")
    model = adapted()
    with torch.no_grad():  # other adapters: they must come from the checkpoint
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.normal_()
    resumed = engine_of(model)
    resumed.load(str(tmp_path / "ckpt"))
    for i in range(2, 4):
        step(resumed, i)
    for (n, a), (_, b) in zip(straight.module.named_parameters(), resumed.module.named_parameters()):
        assert torch.equal(a, b), n
    with pytest.raises(CheckpointError, match="trained on other base weights"):
        engine_of(adapted(seed=5)).load(str(tmp_path / "ckpt"))


def test_options_are_checked_by_name():
    assert LoRAConfig(rank=8, target_modules=["q_proj", "o"]).modules() == ["q", "o"]
    with pytest.raises(ValueError, match=r"lora.target_modules: \['attn'\]"):
        LoRAConfig(rank=8, target_modules=["attn"])
    with pytest.raises(ValueError, match="lora.rank must be >= 0"):
        LoRAConfig(rank=-1)
    with pytest.raises(ValueError, match="lora.dropout"):
        LoRAConfig(rank=2, dropout=1.0)


def test_layouts_that_cannot_hold_adapters_are_refused_before_any_worker(tmp_path):
    register_everything()
    tp = build_config(
        "ppo", [f"fileroot={tmp_path}", "actor.lora.rank=8", 'allocation_mode="actor:d1m2p1,*:d1m1p1"']
    )
    with pytest.raises(ValueError, match=r"model 'actor' trains LoRA adapters \(actor.lora.rank=8\).*d1m2p1"):
        tp.initial_setup()


def test_a_lora_actor_is_its_own_reference_unless_told_otherwise(tmp_path):
    register_everything()
    exp = build_config("ppo", [f"fileroot={tmp_path}", "actor.lora.rank=8"]).initial_setup()
    ref_inf = next(m for m in exp.mfcs if m.name == "ref_inf")
    assert "ref" not in exp.models and ref_inf.role == "actor" and ref_inf.base_weights
    apart = build_config("ppo", [f"fileroot={tmp_path}", "actor.lora.rank=8", "ref_from_actor_base=false"])
    exp = apart.initial_setup()
    assert "ref" in exp.models and next(m for m in exp.mfcs if m.name == "ref_inf").role == "ref"


def test_the_memory_plan_holds_optimizer_state_for_adapters_only(tmp_path):
    from realrl.api.core.model_size import model_configs
    from realrl.api.quickstart.memory_plan import plan_memory
    from realrl.experiments.common import task_model_config

    register_everything()
    plans = {}
    for rank in (0, 8):
        cfg = build_config("grpo", [f"fileroot={tmp_path}", f"actor.lora.rank={rank}"])
        exp = cfg.initial_setup()
        plans[rank] = plan_memory(exp, model_configs(exp, task_model_config(cfg))).roles["actor"]
    model_cfg = ReaLModelConfig(**task_model_config(cfg))
    adapters = adapter_param_count(model_cfg, LoRAConfig(rank=8))
    assert plans[8].optimizer == 8 * adapters and plans[0].optimizer == 8 * plans[0].params
    assert plans[0].weights == 4 * plans[0].params  # fp32 master weights
    assert plans[8].weights == 2 * plans[8].params + 4 * adapters  # the base in bf16, adapters fp32


def test_gpt2_keeps_the_merged_model_and_says_why_there_is_no_adapter_folder(tmp_path):
    """gpt2 stores q, k and v fused and its projections transposed (Conv1D): peft's layers there
    are not ours, so the folder holds the merged model only, and the log says so."""
    torch.manual_seed(0)
    hf = transformers.GPT2Config(
        n_embd=32,
        n_layer=2,
        n_head=4,
        vocab_size=17,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    transformers.AutoModelForCausalLM.from_config(hf).save_pretrained(tmp_path / "base")
    model = ReaLModel.from_pretrained(str(tmp_path / "base"))
    add_adapters(model, LoRAConfig(rank=RANK, target_modules=["o", "up"]), seed=1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.2)
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    log = logging.getLogger("realrl.hf_io")
    log.addHandler(handler)
    try:
        model.save_pretrained(str(tmp_path / "final"))
    finally:
        log.removeHandler(handler)
    assert ADAPTER_DIR not in os.listdir(tmp_path / "final")
    assert any("the merged model only" in line and "fused or transposed" in line for line in lines), lines
    merged = ReaLModel.from_pretrained(str(tmp_path / "final"))
    torch.testing.assert_close(forward(merged), forward(model), rtol=1e-5, atol=1e-5)


def test_in_bf16_the_base_is_stored_in_bf16_and_the_adapters_train_in_fp32():
    from realrl.impl.model.backend.config import EngineConfig

    model = adapted()
    engine = TrainEngine(model, OptimizerConfig(lr=1e-2), EngineConfig(dtype="bf16"), total_train_steps=4)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert all(d == torch.float32 for n, d in dtypes.items() if "lora_" in n or n.endswith("ln.weight"))
    assert dtypes["embed.wte.weight"] == dtypes["layers.0.attn.q.base_layer.weight"] == torch.bfloat16
    before = base_params(model)
    for i in range(2):
        step(engine, i)
    assert all(torch.equal(before[k], v) for k, v in base_params(model).items())
    assert torch.isfinite(forward(model)).all()
