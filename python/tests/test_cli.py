"""The `kvtier` command that `pip install ./python` puts in the environment: the script
runs the same command line as the binary, and the clusters it starts run it again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import MIB, register

import kvtier

SCRIPT = Path(sys.executable).parent / "kvtier"


def test_the_installed_script_is_the_kvtier_command():
    assert SCRIPT.is_file(), f"pip install ./python installs no {SCRIPT}"
    version = subprocess.run(
        [SCRIPT, "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert version.stdout.startswith("kvtier "), version.stdout
    wrong = subprocess.run(
        [SCRIPT, "no-such-command"], check=False, capture_output=True, text=True, timeout=60
    )
    assert wrong.returncode != 0
    assert "no-such-command" in wrong.stderr


def test_find_executable_finds_the_script_without_kvtier_bin(monkeypatch):
    monkeypatch.delenv("KVTIER_BIN", raising=False)
    monkeypatch.setenv("PATH", os.defpath)
    assert kvtier.find_executable() == SCRIPT


def test_a_cluster_of_the_script_serves_a_round_trip():
    # Every process of the cluster is this package's script, started again by itself.
    with kvtier.LocalCluster(SCRIPT, nodes=1, cpu_pool_bytes=16 * MIB) as cluster:
        client = kvtier.Client.connect(cluster.socket(0))
        namespace = register(client)
        assert client.store(namespace, b"key", b"through the script") == "stored"
        target = bytearray(18)
        assert client.load_into(namespace, [b"key"], [target]) == [True]
        assert bytes(target) == b"through the script"
