"""The SSD tier from Python, against real processes: chunks evicted from a small CPU pool
are spilled to the node's SSD, `probe` says they are on SSD, `prefetch` starts their
restores and returns, and a load then reads them byte for byte. Polls with deadlines."""

from __future__ import annotations

import time

import numpy as np
from conftest import MIB, register

import kvtier

CHUNK = 256 * 1024
# Longest a wait may take before the test calls it hung; nothing waits for it to pass.
HANG_GUARD_S = 60.0


def test_probe_on_ssd_then_prefetch_then_load_byte_exact(exe):
    with kvtier.LocalCluster(
        exe, nodes=1, cpu_pool_bytes=1 * MIB, ssd_bytes=32 * MIB, ssd_admit_after_accesses=1
    ) as cluster:
        client = kvtier.Client.connect(cluster.socket(0))
        namespace = register(client)
        rng = np.random.default_rng(7)
        data = {f"ssd-{index}".encode(): rng.bytes(CHUNK) for index in range(12)}
        for key, payload in data.items():
            # A full pool skips the store until the directory's next eviction round.
            deadline = time.monotonic() + HANG_GUARD_S
            while client.store(namespace, key, payload) != "stored":
                assert time.monotonic() < deadline, f"{key!r} was never stored"
                time.sleep(0.02)
        keys = list(data)
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            probes = client.probe(namespace, keys)
            on_ssd = [key for key, probe in zip(keys, probes) if probe.state == "on_ssd"]
            if len(on_ssd) >= 2:
                break
            assert time.monotonic() < deadline, f"nothing on SSD: {probes}"
            time.sleep(0.02)
        [probe] = client.probe(namespace, on_ssd[:1])
        assert (probe.state, probe.medium, probe.length) == ("on_ssd", "ssd", CHUNK)

        wanted = on_ssd[:2]
        assert client.prefetch(namespace, wanted) == 2
        targets = [bytearray(CHUNK) for _ in wanted]
        assert client.load_into(namespace, wanted, targets) == [True, True]
        for key, target in zip(wanted, targets):
            assert bytes(target) == data[key]
