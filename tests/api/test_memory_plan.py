"""The memory plan's arithmetic, by hand, on a tiny model; and the ``realrl.apps.plan`` command."""

import dataclasses
import os
import subprocess
import sys

import pytest

from realrl.api.core.config import (
    DatasetAbstraction,
    ModelAbstraction,
    ModelBackendAbstraction,
    ModelInterfaceAbstraction,
)
from realrl.api.core.dfg import MFCDef
from realrl.api.core.layout import Layout, Placement
from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.core.model_size import model_config, model_configs, param_counts
from realrl.api.core.system_api import ExperimentConfig, ModelSpec
from realrl.api.quickstart.memory_plan import check_fits, format_plan, plan_memory

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# hidden 8, 4 q heads / 2 kv heads of dim 2, gated MLP 16, vocab 32, 2 layers, RMS norms, no biases
TINY = dict(n_layers=2, n_q_heads=4, n_kv_heads=2, hidden_dim=8, intermediate_dim=16, vocab_size=32)
# one layer: 2 norms 2*8 + q,k,v 8*(8+4+4) + o 8*8 + gate,up,down 3*8*16 = 16 + 128 + 64 + 384
LAYER = 592
PARAMS = 2 * LAYER + 32 * 8 + 8 + 32 * 8  # layers + embedding + final norm + LM head = 1704
# tp=2: q,k,v 8*(4+2+2) + o 4*8 + mlp 3*8*8, norms whole; embedding and head split (32 % 2 == 0)
PARAMS_TP2 = 2 * (16 + 64 + 32 + 192) + 16 * 8 + 8 + 16 * 8  # 872
N_SEQS, N, PROMPT, NEW = 4, 2, 5, 3


def spec(engine="train", dtype="bf16", fsdp=False, critic=False, offload=False, cfg=TINY) -> ModelSpec:
    model = ModelAbstraction("real_model", {"config": dict(cfg), "is_critic": critic})
    args = {"engine": {"dtype": dtype, "fsdp": fsdp}, "offload": offload}
    if engine == "train":
        args["optimizer"] = {}
    return ModelSpec(model, ModelBackendAbstraction(engine, args))


def exp(models: dict, layouts: dict, allocations: dict | None = None, **extra) -> ExperimentConfig:
    """actor generates and trains; every other role runs one inference call."""
    iface = ModelInterfaceAbstraction(
        "x", {"ppo": {"gen": {"n": N, "max_new_tokens": NEW}, "ppo_n_minibatches": 1}}
    )

    def call(name, role, kind, inputs, outputs=()):
        return MFCDef(name, role, kind, iface, N_SEQS, inputs, outputs)

    mfcs = [call("actor_gen", "actor", "generate", ("packed_prompts",), ("packed_input_ids",))]
    mfcs += [
        call(f"{r}_inf", r, "inference", ("packed_input_ids",), (f"{r}_out",)) for r in models if r != "actor"
    ]
    mfcs.append(call("actor_train", "actor", "train_step", ("packed_input_ids",)))
    layouts = {r: Layout.parse(text) for r, text in layouts.items()}
    allocations = allocations or {r: list(range(lay.world_size)) for r, lay in layouts.items()}
    data = DatasetAbstraction("prompt", {"dataset_path": "x.jsonl", "max_prompt_len": PROMPT})
    return ExperimentConfig("plan", "test", mfcs, models, allocations, [data], layouts=layouts, **extra)


def plan(models, layouts, allocations=None, **extra):
    e = exp(models, layouts, allocations, **extra)
    return plan_memory(e, model_configs(e))


def test_param_counts_by_hand():
    cfg = ReaLModelConfig(**TINY)
    assert param_counts(cfg, 1) == (PARAMS, LAYER)
    assert param_counts(cfg, 2) == (PARAMS_TP2, 304)
    critic = ReaLModelConfig(**TINY, is_critic=True)  # the head is hidden + 1 (weight and bias)
    assert param_counts(critic, 1)[0] == PARAMS - 32 * 8 + 9
    assert param_counts(ReaLModelConfig(**TINY, tied_embedding=True), 1)[0] == PARAMS - 32 * 8
    with pytest.raises(ValueError, match=r"m4 does not divide the model.s 2 key/value heads"):
        param_counts(cfg, 4)


@pytest.mark.parametrize(
    "layout, fsdp, params",
    [
        ("d1m1p1", False, PARAMS),
        ("d1m2p1", False, PARAMS_TP2),
        ("d2m1p1", False, PARAMS),  # plain data parallelism replicates everything
        ("d2m1p1", True, PARAMS // 2),  # FSDP shards over dp
        ("d1m1p1", True, PARAMS),  # ... and has nothing to shard over with dp=1
    ],
)
def test_train_state_per_device(layout, fsdp, params):
    actor = plan({"actor": spec(fsdp=fsdp)}, {"actor": layout}).roles["actor"]
    assert actor.params == params
    # fp32 master weights whatever the compute dtype, fp32 grads, AdamW: two fp32 tensors
    assert (actor.weights, actor.grads, actor.optimizer) == (4 * params, 4 * params, 8 * params)
    assert actor.resident == 12 * params


@pytest.mark.parametrize("dtype, b", [("bf16", 2), ("fp16", 2), ("auto", 2), ("fp32", 4)])
def test_fsdp_gathers_one_block_and_the_root_unit_and_everything_to_generate(dtype, b):
    """A train engine's fp32 shards are gathered in its dtype (FSDP2's MixedPrecisionPolicy):
    2 bytes a parameter for bf16/fp16, 4 for fp32."""
    sharded = plan({"actor": spec(dtype=dtype, fsdp=True)}, {"actor": "d2m1p1"}).roles["actor"]
    plain = plan({"actor": spec(dtype=dtype, fsdp=False)}, {"actor": "d2m1p1"}).roles["actor"]
    root = 32 * 8 + 8 + 32 * 8  # embedding, final norm, head
    # train: one block + the root unit gathered; gradients sharded (852 instead of 1704 params);
    # unsharded, autocast keeps a b-byte copy of the fp32 weights, which the b-byte gather replaces
    autocast_copy = b * PARAMS if b < 4 else 0
    assert (
        sharded.calls["actor_train"] - plain.calls["actor_train"]
        == b * (LAYER + root) + 4 * (852 - PARAMS) - autocast_copy
    )
    # generate: every unit gathered (``parallel/fsdp.py::gathered``)
    assert sharded.calls["actor_gen"] - plain.calls["actor_gen"] == b * PARAMS == sharded.fsdp_gather
    assert plain.fsdp_gather == 0


@pytest.mark.parametrize(
    "layout, kv",
    [
        # 2 (k, v) x 2 layers x 2 kv heads x dim 2 x 2 bytes (bf16) x 4*2 sequences x (5 + 3) tokens
        ("d1m1p1", 2 * 2 * 2 * 2 * 2 * 8 * 8),
        ("d1m2p1", 2 * 2 * 1 * 2 * 2 * 8 * 8),  # tp halves the kv heads
        ("d2m1p1", 2 * 2 * 2 * 2 * 2 * 4 * 8),  # dp halves the sequences
    ],
)
def test_kv_cache(layout, kv):
    assert plan({"actor": spec()}, {"actor": layout}).roles["actor"].kv_cache == kv


def test_inference_weights_in_engine_dtype_and_activation_estimate():
    models = {"actor": spec(), "ref": spec("inference"), "reward": spec("inference", "fp32", critic=True)}
    p = plan(models, {r: "d1m1p1" for r in models})
    assert (p.roles["ref"].weights, p.roles["ref"].grads, p.roles["ref"].optimizer) == (2 * PARAMS, 0, 0)
    assert p.roles["reward"].weights == 4 * (PARAMS - 32 * 8 + 9)
    # ref_inf: 8 sequences x 8 tokens; per token 8*8 (fp32 residual at both norms) + 2 bytes x
    # (2*8 norm out + 2*(8+4+4) qkv + 2*8 attention + 4*16 gated MLP) per layer, 8*32 fp32 logits
    assert p.roles["ref"].calls == {"ref_inf": 64 * (64 + 2 * (16 + 32 + 16 + 64) + 8 * 32)}


def test_pipeline_stages_get_a_row_each_on_their_own_workers():
    """p2 of the 2-layer model: one block per stage, the embedding on the first, the norm and head
    on the last, each stage's bytes on its own workers."""
    p = plan({"actor": spec()}, {"actor": "d1m1p2"}, {"actor": [1, 0]})
    first, last = p.roles["actor/s0"], p.roles["actor/s1"]
    assert (first.workers, last.workers) == ((1,), (0,))
    assert first.params == LAYER + 32 * 8 and last.params == LAYER + 8 + 32 * 8
    assert first.params + last.params == PARAMS
    # one layer's KV cache each: 2 (k, v) x 2 kv heads x dim 2 x 2 bytes x 8 sequences x 8 tokens
    assert first.kv_cache == last.kv_cache == 2 * 2 * 2 * 2 * 8 * 8
    assert {w.worker: w.roles for w in p.workers} == {0: ("actor/s1",), 1: ("actor/s0",)}
    one = plan({"actor": spec()}, {"actor": "d1m1p1"}).roles["actor"]
    assert first.peak < one.peak and last.peak < one.peak


def test_a_run_on_gpus_is_refused_before_any_worker_starts_when_the_plan_does_not_fit():
    """``run_experiment`` checks the plan against the smallest visible GPU's memory."""
    from realrl.apps.feasibility import check_feasible

    e = exp({"actor": spec()}, {"actor": "d1m1p2"})
    check_feasible(e)  # CPU workers: not checked
    check_feasible(e, 10**9)
    with pytest.raises(ValueError, match=r"the memory plan does not fit: worker \d needs .* GiB .*actor/s\d"):
        check_feasible(e, 10_000)


def test_colocated_roles_sum_and_offloaded_count_once():
    big = dict(TINY, hidden_dim=256, intermediate_dim=1024)  # frozen models whose weights dominate a call
    models = {
        "actor": spec(),
        "ref": spec("inference", offload=True, cfg=big),
        "reward": spec("inference", critic=True, offload=True, cfg=big),
        "critic": spec("inference", critic=True),
    }
    p = plan(models, {r: "d1m1p1" for r in models})
    (w,) = p.workers
    assert w.roles == ("actor", "critic", "ref", "reward")
    actor, critic, ref, reward = (p.roles[r] for r in w.roles)
    assert w.resident == 12 * PARAMS + critic.weights  # non-offloaded roles sum: actor's fp32 state, critic's
    assert ref.resident == reward.resident == 0  # offloaded: in host memory between calls
    assert ref.calls == {"ref_inf": ref.weights + ref.activations}  # ... and on the device for their call
    calls = {f"{m.role}/{c}": b for m in (actor, critic, ref, reward) for c, b in m.calls.items()}
    assert max(calls, key=calls.get) == w.peak_call == "ref/ref_inf"
    assert w.peak == w.resident + ref.weights + ref.activations  # the largest offloaded one, once
    assert w.peak < w.resident + ref.weights + reward.weights
    # roles on different workers do not add up
    apart = plan(
        models, {r: "d1m1p1" for r in models}, {"actor": [0], "critic": [1], "ref": [0], "reward": [1]}
    )
    assert [x.resident for x in apart.workers] == [12 * PARAMS, critic.weights]
    assert [x.peak_call for x in apart.workers] == ["ref/ref_inf", "reward/reward_inf"]


@pytest.mark.parametrize("keep", [False, True])
def test_a_call_in_another_layout_runs_on_a_copy(keep):
    """actor_train split over workers 0-1 (home: fp32 state), actor_gen as two whole bf16 replicas
    on the same workers: the copy's weights exist during generation, or always when kept."""
    gen = Placement(Layout(2, 1, 1), (0, 1))
    actor = dataclasses.replace(spec(), keep_gen_copy=keep)
    p = plan({"actor": actor}, {"actor": "d1m2p1"}, mfc_placements={"actor_gen": gen})
    home, copy = p.roles["actor"], p.roles["actor@d2m1p1@0,1"]
    assert home.params == PARAMS_TP2 and list(home.calls) == ["actor_train"]
    assert (copy.params, copy.weights, copy.grads, copy.optimizer) == (PARAMS, 2 * PARAMS, 0, 0)
    assert copy.kv_cache == 2 * 2 * 2 * 2 * 2 * 4 * 8  # whole kv heads, half the sequences
    assert copy.resident == (2 * PARAMS if keep else 0)
    assert copy.calls["actor_gen"] - (0 if keep else copy.weights) == copy.kv_cache + copy.activations
    for w in p.workers:
        assert w.roles == ("actor", "actor@d2m1p1@0,1")
        assert w.resident == 12 * PARAMS_TP2 + copy.resident


def test_check_fits_names_the_worker_roles_layouts_and_bytes():
    p = plan({"actor": spec(), "ref": spec("inference")}, {"actor": "d1m2p1", "ref": "d2m1p1"})
    peak = p.workers[0].peak
    check_fits(p, peak)
    with pytest.raises(ValueError) as err:
        check_fits(p, peak - 1)
    msg = str(err.value)
    assert msg.startswith(f"worker 0 needs {peak / 1024**3:.2f} GiB ({peak} bytes)")
    assert "actor d1m2p1" in msg and "ref d2m1p1" in msg and f"({peak - 1} bytes)" in msg
    assert "OVER" in format_plan(p, peak - 1) and "OVER" not in format_plan(p, peak)


def test_offloading_a_trained_model_is_refused():
    with pytest.raises(ValueError, match="'actor' is trained and offloaded"):
        plan({"actor": spec(offload=True)}, {"actor": "d1m1p1"})


@pytest.mark.parametrize("name, params", [("llama-2-7b", 6_738_415_616), ("llama-2-70b", 68_976_648_192)])
def test_llama_2_config_folders(name, params):
    """The example folders hold the public configs: the published parameter counts come out."""
    s = ModelSpec(ModelAbstraction("real_model", {"path": os.path.join(REPO, "examples", "configs", name)}))
    assert param_counts(model_config(s), 1)[0] == params


def run_plan(tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=REPO)
    cmd = [sys.executable, "-m", "realrl.apps.plan", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_command_refuses_with_one_line_and_exit_2(tmp_path):
    out = run_plan(tmp_path, "ppo", "device_memory_gb=0.00001")  # the toy task; 10 kB per device
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: worker 0 needs "), out.stderr
    assert "actor d1m1p1" in lines[0] and "bytes" in lines[0] and "Traceback" not in out.stderr
    assert "actor_gen" in out.stdout or "actor" in out.stdout  # the plan is printed first
    assert os.listdir(tmp_path) == []  # the toy task's files are not written


def test_command_checks_workers_against_n_devices(tmp_path):
    out = run_plan(tmp_path, "ppo", "allocation_mode=d1m2p1", "n_devices=1")
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "error: the layouts (actor_gen:d1m2p1@0,1, rew_inf:d1m2p1@0,1, ref_inf:d1m2p1@0,1, "
        "critic_inf:d1m2p1@0,1, compute_adv:d1m1p1@0, actor_train:d1m2p1@0,1, critic_train:d1m2p1@0,1) "
        "need 2 workers > n_devices=1"
    )


WIDE = dict(TINY, hidden_dim=256, intermediate_dim=1024)  # weights outweigh a tiny batch's activations


@pytest.mark.parametrize(
    "home, fsdp, gen, arch",
    [
        ("d2m2p1", True, Placement(Layout(1, 2, 1), (0, 1)), TINY),  # colocated: keeps its own slices
        ("d2m2p1", False, Placement(Layout(1, 2, 1), (4, 5)), TINY),  # on workers of their own
        ("d1m2p2", False, Placement(Layout(2, 1, 2), (3, 2, 1, 0)), TINY),  # stages to stages
        ("d1m1p1", False, Placement(Layout(4, 1, 1), (1, 2, 3, 4)), WIDE),  # one home, 4 replicas
    ],
)
def test_a_copy_fill_holds_the_reallocation_plans_send_and_receive_buffers(home, fsdp, gen, arch):
    """Each worker's staging is what ReaL's plan (``plan_realloc``, on the same shapes in the copy's
    bf16) has it send plus receive, and its peak counts it with the copy's weights."""
    import torch

    from realrl.impl.model.comm.realloc import model_param_specs, side_for
    from realrl.impl.model.comm.realloc_plan import plan_realloc

    p = plan({"actor": spec(fsdp=fsdp, cfg=arch)}, {"actor": home}, mfc_placements={"actor_gen": gen})
    layout = Layout.parse(home)
    cfg, home_placement = ReaLModelConfig(**arch), Placement(layout, tuple(range(layout.world_size)))
    moves = plan_realloc(
        model_param_specs(cfg, torch.bfloat16), side_for(cfg, home_placement, fsdp), side_for(cfg, gen)
    )
    copy = f"actor@{gen}"
    for w in p.workers:
        assert w.staging == moves.bytes_sent(w.worker) + moves.bytes_received(w.worker)
        here = [m for m in p.roles.values() if w.worker in m.workers]
        calls = [b for m in here for b in m.calls.values()]
        weights = sum(m.weights for m in here if m.role.startswith(copy))  # the copy exists while filled
        assert w.peak == w.resident + w.nccl + max(calls + [w.staging + weights])
    assert sum(w.staging for w in p.workers) == 2 * moves.total_bytes > 0  # each byte sent and received
    if gen.workers == (4, 5):  # a copy on workers of their own receives its half of the model in bf16
        assert p.workers[4].staging == p.workers[5].staging == 2 * PARAMS_TP2
    if gen.workers == (1, 2, 3, 4):  # the home sends the whole model in bf16 to each replica ...
        assert p.workers[0].staging == 4 * 2 * p.roles["actor"].params
        assert p.workers[0].peak_call == f"{copy}/realloc"  # ... more than its train call holds
    assert "realloc" in format_plan(p)


def test_communicator_rows_count_the_groups_the_meshes_create(monkeypatch):
    """d2m2p1: the default group, then the model group, a dp line and a tp line per worker, as
    ``build_contexts`` creates them; NCCL's buffers of each by its size."""
    from realrl.api.core.comm_memory import NCCL_BUFFSIZE, NCCL_CHANNELS
    from realrl.impl.model.parallel import mesh

    created: list[list[int]] = []
    monkeypatch.setattr(mesh.dist, "new_group", lambda ranks, **_: created.append(list(ranks)))
    e = exp({"actor": spec()}, {"actor": "d2m2p1"})
    mesh.build_contexts(e.mesh_placements(), me=-1, device_type="cpu")  # a worker in none: groups only
    p = plan_memory(e, model_configs(e))
    ring = NCCL_BUFFSIZE * NCCL_CHANNELS  # per peer: a pair has one, a ring of more two
    for w in p.workers:
        sizes = [4] + [len(g) for g in created if w.worker in g]
        assert sorted(sizes) == [2, 2, 4, 4] and w.communicators == len(sizes)
        assert w.nccl == 2 * ring + 2 * (2 * ring) == 6 * 8 * 1024**2
        assert w.peak == w.resident + w.nccl + max(b for m in p.roles.values() for b in m.calls.values())
    shared = plan({"actor": spec()}, {"actor": "d2m2p1"}, colocate=True)  # workers share GPUs: gloo
    assert all(w.nccl == 0 and w.communicators == 4 for w in shared.workers)
