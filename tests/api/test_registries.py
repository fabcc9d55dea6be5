import pytest
import torch

from realrl.api.core import data_api, hf_family, model_api
from realrl.api.core.config import (
    DatasetAbstraction,
    ModelAbstraction,
    ModelFamily,
    ModelInterfaceAbstraction,
    ModelName,
    ModelShardID,
)
from realrl.base.registry import UnknownNameError


class CountingDataset(torch.utils.data.Dataset):
    def __init__(self, util, n: int):
        self.util, self.n = util, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return data_api.SequenceSample.from_default([i], [2], {"packed_input_ids": torch.tensor([i, i])})


class EchoInterface(model_api.ModelInterface):
    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def inference(self, model, data, mb_spec=None):
        return data


def test_dataset_registry_round_trip():
    data_api.register_dataset("test_counting", CountingDataset)
    ds = data_api.make_dataset(
        DatasetAbstraction("test_counting", {"n": 3}),
        seed=1,
        dp_rank=1,
        world_size=2,
        tokenizer_or_tokenizer_name=None,
    )
    assert len(ds) == 3 and ds.util.dp_rank == 1 and ds.util.seed == 1
    assert ds[2].data["packed_input_ids"].tolist() == [2, 2]
    assert "test_counting" in data_api.registered_datasets()
    with pytest.raises(ValueError, match="already registered"):
        data_api.register_dataset("test_counting", CountingDataset)
    with pytest.raises(UnknownNameError, match="test_counting"):
        data_api.make_dataset("no_such_dataset", 1, 0, 1, None)
    with pytest.raises(TypeError, match="'test_counting' rejected its arguments"):
        data_api.make_dataset(DatasetAbstraction("test_counting", {"m": 3}), 1, 0, 1, None)
    with pytest.raises(ValueError, match="dp_rank"):
        data_api.DatasetUtility(seed=0, dp_rank=2, world_size=2, tokenizer=None)


def test_interface_registry_and_unsupported_calls():
    model_api.register_interface("test_echo", EchoInterface)
    iface = model_api.make_interface(ModelInterfaceAbstraction("test_echo", {"scale": 2.0}))
    assert isinstance(iface, EchoInterface) and iface.scale == 2.0
    with pytest.raises(model_api.InterfaceMethodUnsupported, match="EchoInterface does not offer train_step"):
        iface.train_step(None, None)
    with pytest.raises(UnknownNameError, match="registered: .*test_echo"):
        model_api.make_interface("missing_interface")
    with pytest.raises(ValueError, match="already registered"):
        model_api.register_interface("test_echo", EchoInterface)


def test_backend_model_and_reward_registries():
    class NullBackend:
        def __init__(self, *, parallel=None):  # the contract: every backend takes ``parallel``
            self.parallel = parallel

        def initialize(self, model, ft_spec):
            return model

    model_api.register_backend("test_null_backend", NullBackend)
    assert isinstance(model_api.make_backend("test_null_backend"), NullBackend)
    model_api.register_model(
        "test_model",
        lambda name, device, size=1: model_api.Model(name, torch.nn.Linear(size, 1), None, device),
    )
    m = model_api.make_model(ModelAbstraction("test_model", {"size": 3}), "critic@1")
    assert m.name == ModelName("critic", 1) and m.module.in_features == 3
    model_api.register_reward_fn(
        "test_len", lambda prompts, completions, **kw: [float(len(c)) for c in completions]
    )
    assert model_api.get_reward_fn("test_len")(["p"], ["abc"]) == [3.0]
    with pytest.raises(ValueError, match="callable"):
        model_api.register_reward_fn("bad", 3)
    with pytest.raises(UnknownNameError, match="reward function"):
        model_api.get_reward_fn("nope")


def test_hf_family_registry():
    fam = hf_family.register_hf_family("test_family", ("test_arch",), *(lambda *a: None for _ in range(7)))
    assert hf_family.hf_family_for_model_type("test_arch") is fam
    with pytest.raises(LookupError, match="no HF family handles model_type 'nope'"):
        hf_family.hf_family_for_model_type("nope")
    with pytest.raises(ValueError, match="already registered"):
        hf_family.register_hf_family("test_family", "x", *(lambda *a: None for _ in range(7)))


def test_names_and_configs():
    assert ModelName.parse("actor@2") == ModelName("actor", 2)
    assert ModelName.parse("ref") == ModelName("ref", 0)
    assert str(ModelName("actor", 1)) == "actor@1"
    with pytest.raises(ValueError):
        ModelName("")
    shard = ModelShardID(ModelName("actor"), dp_rank=1, dp_size=2)
    assert str(shard) == "actor@0:d1t0p0"
    with pytest.raises(ValueError, match="dp_rank 2 out of range"):
        ModelShardID(ModelName("actor"), dp_rank=2, dp_size=2)
    assert str(ModelFamily("llama", 7, True)) == "llama-7-critic"
    with pytest.raises(ValueError):
        DatasetAbstraction("")
    with pytest.raises(ValueError, match="top_p"):
        model_api.GenerationHyperparameters(top_p=0)
    with pytest.raises(ValueError, match="min_new_tokens"):
        model_api.GenerationHyperparameters(min_new_tokens=5, max_new_tokens=2)
    with pytest.raises(ValueError, match="n_q_heads"):
        model_api.ReaLModelConfig(
            n_layers=1, n_q_heads=4, n_kv_heads=3, hidden_dim=8, intermediate_dim=8, vocab_size=8
        )
    spec = model_api.FinetuneSpec(total_train_epochs=2, dataset_size=10, train_batch_size=4)
    assert spec.steps_per_epoch == 3 and spec.total_train_steps == 6


def test_generation_output_prompt_mask():
    out = model_api.GenerationOutput(
        sequences=torch.arange(7),
        seqlens=[4, 3],
        prompt_lens=[2, 1],
        logprobs=torch.zeros(5),
        no_eos=torch.tensor([False, True]),
    )
    assert out.prompt_mask().tolist() == [True, True, False, False, True, False, False]
