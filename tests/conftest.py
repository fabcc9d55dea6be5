import os

# Inductor compiles in this process rather than in a pool of subprocesses it would start in
# every process that compiles (each test rank): on a 2-core machine the pool costs seconds, and
# its parallel compiles buy nothing (read when Inductor's config is first imported)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import realrl.impl.builtin  # noqa: E402, F401  (every implementation registered, as in a model worker)


def pytest_collection_modifyitems(config, items):
    """GPU tests skip without a device; under pytest-xdist every test on the shared Ray cluster
    runs in one worker (``--dist loadgroup``), so a parallel run still starts one cluster."""
    skip_gpu = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if skip_gpu is not None and "gpu" in item.keywords:
            item.add_marker(skip_gpu)
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for every test of the session (starting one takes ~8 s)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def toy_fileroot(tmp_path_factory):
    """One fileroot for the toy task's end-to-end runs of the whole session: its SFT and reward
    phases run once, and every later run reuses their checkpoints."""
    return str(tmp_path_factory.mktemp("toy-runs"))


@pytest.fixture(scope="session")
def arith_fileroot(tmp_path_factory):
    """The same for the arithmetic task's runs."""
    return str(tmp_path_factory.mktemp("arith-runs"))


@pytest.fixture
def one_rank_group():
    """A single-rank gloo group (an in-memory store, no network), destroyed after the test."""
    if dist.is_initialized():
        raise RuntimeError("a default process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
