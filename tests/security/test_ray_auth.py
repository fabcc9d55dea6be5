"""A Ray run: the cluster realrl starts (and the one the tests share) checks Ray's token."""

from __future__ import annotations

from realrl.system.launcher import ray_token_auth


def test_the_local_ray_cluster_checks_its_token(ray_cluster):
    """Ray 2.59 and newer start a local cluster with token authentication unless told not to
    (``RAY_AUTH_MODE=disabled``); realrl's Ray runs in the suite run on such a cluster."""
    assert ray_token_auth() is True
