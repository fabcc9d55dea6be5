import pytest


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
