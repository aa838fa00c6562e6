"""The SSD tier from Python, against real processes: chunks evicted from a small CPU pool
are spilled to the node's SSD, `probe` says they are on SSD, `prefetch` starts their
restores and returns, and a load then reads them byte for byte; `pin_on_ssd` says where
their bytes lie in the node's files, for a reader that reads them itself (GPUDirect
Storage). Polls with deadlines."""

from __future__ import annotations

import time

import numpy as np
from conftest import MIB, register

import kvtier

CHUNK = 256 * 1024
# Longest a wait may take before the test calls it hung; nothing waits for it to pass.
HANG_GUARD_S = 60.0


def spilled_cluster(exe) -> kvtier.LocalCluster:
    """A node whose 1 MiB CPU pool spills to a 32 MiB SSD store."""
    return kvtier.LocalCluster(
        exe, nodes=1, cpu_pool_bytes=1 * MIB, ssd_bytes=32 * MIB, ssd_admit_after_accesses=1
    )


def store_until_on_ssd(
    client: kvtier.Client, namespace: kvtier.Namespace
) -> tuple[dict[bytes, bytes], list[bytes]]:
    """Stores 12 chunks (more than the CPU pool holds) until at least two are on SSD: every
    chunk's bytes by key, and the keys only the SSD holds."""
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
            return data, on_ssd
        assert time.monotonic() < deadline, f"nothing on SSD: {probes}"
        time.sleep(0.02)


def crc32c(data: bytes) -> int:
    """crc32c (Castagnoli, reflected 0x82F63B78), bit by bit over a table: the checksum an
    `SsdPin` gives."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def test_crc32c_matches_the_standard_check_value():
    assert crc32c(b"123456789") == 0xE3069283


def test_probe_on_ssd_then_prefetch_then_load_byte_exact(exe):
    with spilled_cluster(exe) as cluster:
        client = kvtier.Client.connect(cluster.socket(0))
        namespace = register(client)
        data, on_ssd = store_until_on_ssd(client, namespace)
        [probe] = client.probe(namespace, on_ssd[:1])
        assert (probe.state, probe.medium, probe.length) == ("on_ssd", "ssd", CHUNK)

        wanted = on_ssd[:2]
        assert client.prefetch(namespace, wanted) == 2
        targets = [bytearray(CHUNK) for _ in wanted]
        assert client.load_into(namespace, wanted, targets) == [True, True]
        for key, target in zip(wanted, targets):
            assert bytes(target) == data[key]


def test_pin_on_ssd_says_where_the_bytes_lie_and_unpins_once(exe):
    with spilled_cluster(exe) as cluster:
        client = kvtier.Client.connect(cluster.socket(0))
        namespace = register(client)
        data, on_ssd = store_until_on_ssd(client, namespace)
        wanted = on_ssd[:2]
        pins = client.pin_on_ssd(namespace, [*wanted, b"never-stored"])
        assert len(pins) == 3
        assert pins[2] is None, "a key never stored has no pin"
        for key, pin in zip(wanted, pins):
            assert isinstance(pin, kvtier.SsdPin), pin
            assert pin.offset % 4096 == 0, "the bytes start block-aligned"
            assert pin.length == CHUNK and pin.lasts_ms > 0
            # Read in place, as a GPUDirect Storage reader would.
            with open(pin.path, "rb") as file:
                file.seek(pin.offset)
                read = file.read(pin.length)
            assert read == data[key], f"wrong bytes in place for {key!r}"
            assert crc32c(read) == pin.crc32c
        ids = [pin.pin for pin in pins[:2]]
        assert client.unpin_on_ssd(ids) == 2
        assert client.unpin_on_ssd(ids) == 0, "a pin ends once"
