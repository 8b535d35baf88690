"""Fixtures for the Slurm tests: one real local cluster per test session (see local_cluster.py)."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from local_cluster import ClusterUnavailable, LocalSlurmCluster  # noqa: E402


@pytest.fixture(scope="session")
def slurm_cluster():
    """A started two-node cluster (node1, node2); skips the test with the reason if it cannot start."""
    cluster = LocalSlurmCluster()
    try:
        cluster.start()
    except ClusterUnavailable as exc:
        pytest.skip(f"local Slurm cluster unavailable: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
