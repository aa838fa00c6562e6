"""Fixtures: real kvtier processes (a directory and nodes from the `kvtier` executable)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import kvtier

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def kvtier_exe() -> Path:
    """`$KVTIER_BIN`, else a built `kvtier` of this repository (release before debug)."""
    if os.environ.get("KVTIER_BIN"):
        return kvtier.find_executable()
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    for profile in ("release", "debug"):
        candidate = target / profile / "kvtier"
        if candidate.is_file():
            return candidate
    return kvtier.find_executable()


@pytest.fixture(scope="session")
def exe() -> Path:
    return kvtier_exe()


@pytest.fixture
def cluster(exe):
    """One directory and one node with a 32 MiB CPU pool."""
    with kvtier.LocalCluster(exe, nodes=1, cpu_pool_bytes=32 * MIB) as running:
        yield running


@pytest.fixture
def client(cluster):
    return kvtier.Client.connect(cluster.socket(0))


@pytest.fixture
def namespace(client):
    return register(client)


def register(client: kvtier.Client, model: str = "test/model") -> kvtier.Namespace:
    return client.register_namespace(
        model=model,
        revision="r1",
        kv_dtype="bfloat16",
        layers=2,
        kv_heads=2,
        head_dim=64,
        block_tokens=16,
    )
