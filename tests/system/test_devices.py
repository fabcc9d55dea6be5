"""One device per worker: which GPU each model worker gets, and which backends connect them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from realrl.api.core.devices import (
    GLOO,
    GLOO_AND_NCCL,
    DeviceAssignmentError,
    dist_backend,
    local_devices,
    ray_gpus_per_worker,
)


def test_each_local_worker_gets_its_own_gpu_and_nccl():
    placed = local_devices("cuda", n_workers=4, n_gpus=8, colocate=False)
    assert placed == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert dist_backend(placed) == GLOO_AND_NCCL


def test_fewer_gpus_than_workers_is_an_error_naming_both_counts():
    with pytest.raises(
        DeviceAssignmentError, match=r"use 3 model workers but 1 GPU\(s\) are visible.*colocate=true"
    ):
        local_devices("cuda", n_workers=3, n_gpus=1, colocate=False)


def test_colocated_workers_share_gpus_round_robin_over_gloo():
    placed = local_devices("cuda", n_workers=3, n_gpus=2, colocate=True)
    assert placed == ["cuda:0", "cuda:1", "cuda:0"]
    assert dist_backend(placed) == GLOO  # NCCL refuses two ranks on one GPU


def test_a_named_gpu_is_shared_and_cpu_stays_cpu():
    assert local_devices("cuda:1", n_workers=2, n_gpus=2, colocate=False) == ["cuda:1", "cuda:1"]
    assert dist_backend(["cuda:1", "cuda:1"]) == GLOO
    assert local_devices("cpu", n_workers=2, n_gpus=0, colocate=False) == ["cpu", "cpu"]
    assert dist_backend(["cpu", "cpu"]) == GLOO
    with pytest.raises(DeviceAssignmentError, match="no CUDA device is visible"):
        local_devices("cuda", n_workers=1, n_gpus=0, colocate=False)
    with pytest.raises(DeviceAssignmentError, match="has 2 GPU"):
        local_devices("cuda:2", n_workers=1, n_gpus=2, colocate=False)


def test_ray_actors_ask_for_one_gpu_or_a_share():
    assert ray_gpus_per_worker("cpu", 4, 0, False) == 0.0
    assert ray_gpus_per_worker("cuda", 4, 8, False) == 1.0
    assert ray_gpus_per_worker("cuda", 4, 2, True) == 0.5
    with pytest.raises(DeviceAssignmentError, match=r"4 model workers but the Ray cluster has 2 GPU"):
        ray_gpus_per_worker("cuda", 4, 2, False)
    with pytest.raises(DeviceAssignmentError, match="has no GPUs"):
        ray_gpus_per_worker("cuda", 1, 0, False)


@pytest.mark.parametrize("n_gpus", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n_workers", [2, 3, 5, 7, 9, 17])
def test_colocated_ray_shares_can_all_be_placed(n_workers, n_gpus):
    """Ray places a fractional actor on one GPU: every worker must find room with shares packed
    GPU by GPU (3 workers on 2 GPUs at 2/3 each would leave one unplaced)."""
    if n_workers <= n_gpus:
        return
    share = ray_gpus_per_worker("cuda", n_workers, float(n_gpus), True)
    units = round(share * 10_000)  # Ray's fixed-point resource units
    assert units / 10_000 == share
    assert (10_000 // units) * n_gpus >= n_workers  # first-fit packing places every actor
    assert share > 1 / -(-n_workers // n_gpus) - 1e-4  # and the largest such share: 1/k, rounded down


def test_worker_configs_carry_each_workers_device_and_backend(tmp_path):
    from system_graphs import mock_config

    from realrl.api.core.system_api import NameResolveConfig

    cfg = mock_config(tmp_path, "t")
    placed = local_devices("cuda", cfg.n_model_workers, n_gpus=2, colocate=False)
    configs = cfg.model_worker_configs(
        NameResolveConfig("nfs", str(tmp_path)), devices=placed, dist_backend=dist_backend(placed)
    )
    assert [c.device for c in configs] == ["cuda:0", "cuda:1"]
    assert {c.dist_backend for c in configs} == {GLOO_AND_NCCL}


@pytest.mark.gpu
def test_two_workers_sharing_one_gpu_train_data_parallel(tmp_path):
    """On a one-GPU machine: d2 with colocate=true puts both workers on cuda:0 (gloo between them)."""
    import json
    import os

    from realrl.apps.configs import build_config
    from realrl.apps.run import run_quickstart

    cfg = build_config(
        "sft",
        [
            f"fileroot={tmp_path}",
            "device=cuda",
            "allocation_mode=d2",
            "colocate=true",
            "exp_ctrl.total_train_steps=2",
            "dataset.train_bs_n_seqs=8",
        ],
    )
    run_quickstart("sft", cfg)
    with open(os.path.join(cfg.run_dir, "stats.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["trainDefault/loss"] > 0 for r in records)


def test_sharded_layouts_are_refused_on_shared_gpus():
    """NCCL refuses two ranks on one GPU and gloo cannot gather CUDA tensors: tensor parallelism
    and FSDP on shared GPUs are named before any worker starts; data parallelism is fine."""
    from realrl.api.core.devices import check_shared_gpus

    shared = local_devices("cuda", n_workers=2, n_gpus=1, colocate=True)
    with pytest.raises(
        DeviceAssignmentError, match=r"actor in d1m2p1: tensor parallelism, pipeline stages and FSDP"
    ):
        check_shared_gpus(shared, dist_backend(shared), ["actor in d1m2p1"])
    check_shared_gpus(shared, dist_backend(shared), [])  # d2 replicas share the GPU
    own = local_devices("cuda", n_workers=2, n_gpus=2, colocate=False)
    check_shared_gpus(own, dist_backend(own), ["actor in d1m2p1"])
    check_shared_gpus(["cpu", "cpu"], GLOO, ["actor in d1m2p1"])


def test_the_runner_names_every_sharded_layout():
    from system_graphs import mock_config

    from realrl.api.core.config import ModelBackendAbstraction
    from realrl.api.core.layout import Layout
    from realrl.apps.feasibility import sharded_layouts

    pair = {"actor": [0, 1], "critic": [0, 1], "reward": [0]}
    cfg = mock_config("/tmp", "t", layouts={"actor": Layout(dp=1, tp=2)}, allocations=pair)
    assert sharded_layouts(cfg) == ["actor in d1m2p1"]
    cfg = mock_config("/tmp", "t", layouts={"actor": Layout(pp=2)}, allocations=pair)
    assert sharded_layouts(cfg) == ["actor in d1m1p2"]
    cfg = mock_config("/tmp", "t", allocations=pair)
    assert sharded_layouts(cfg) == []  # d2 replicas
    fsdp = dataclasses.replace(
        cfg.models["actor"], backend=ModelBackendAbstraction("train", {"engine": {"fsdp": True}})
    )
    cfg = dataclasses.replace(cfg, models={**cfg.models, "actor": fsdp})
    assert sharded_layouts(cfg) == ["actor in d2m1p1"]


def test_control_reductions_go_through_host_memory_even_beside_nccl():
    """Python numbers are reduced over gloo (a CPU tensor) whatever the group's GPU backend."""
    from unittest import mock

    import torch.distributed as dist

    from realrl.impl.model.backend import dp

    seen = []
    with (
        mock.patch.object(dist, "is_initialized", return_value=True),
        mock.patch.object(dist, "get_world_size", return_value=2),
        mock.patch.object(dist, "get_backend", return_value=GLOO_AND_NCCL),
        mock.patch.object(dist, "all_reduce", side_effect=lambda t, **_: seen.append(t.device.type)),
    ):
        dp.all_reduce_sum(3.0, group=object())
        dp.all_reduce_max(3, group=object())
    assert seen == ["cpu", "cpu"]


def test_nccl_is_bound_to_the_worker_s_gpu_at_start_up_only_with_nccl():
    from realrl.system.model_worker_setup import nccl_device

    assert nccl_device("cuda:3", GLOO_AND_NCCL) == torch.device("cuda", 3)
    assert nccl_device("cuda:0", GLOO) is None  # GPUs shared over gloo
    assert nccl_device("cpu", GLOO) is None and nccl_device("cpu:0", GLOO) is None


def test_a_role_without_weights_in_a_tensor_parallel_layout_is_named_before_any_phase_runs(tmp_path):
    from realrl.apps.configs import build_config
    from realrl.apps.errors import UserError
    from realrl.apps.run import plan_phases

    # only a layout that names the role is its own: one for every role leaves it replicated
    cfg = build_config("grpo", [f"fileroot={tmp_path}", 'allocation_mode="reward:d1m2p1,*:d1m1p1"'])
    with pytest.raises(UserError, match=r"model 'reward' has no weights to split, but its layout is d1m2p1"):
        plan_phases("grpo", cfg)
