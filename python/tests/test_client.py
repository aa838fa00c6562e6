"""The Python client against a real node: byte-exact round trips, leased views, skips,
a killed node, and the non-blocking form."""

from __future__ import annotations

import gc
import os
import time

import numpy as np
import pytest
from conftest import MIB, register

import kvtier


def payload(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_round_trip_from_bytes_into_bytearray_memoryview_and_numpy(client, namespace):
    data = payload(256 * 1024, 1)
    assert client.store(namespace, b"key-1", data) == "stored"
    assert client.store(namespace, b"key-1", data) == "already_present"
    [probe] = client.probe(namespace, [b"key-1"])
    assert (probe.state, probe.medium, probe.length) == ("hit", "cpu", len(data))

    into_bytearray = bytearray(len(data))
    into_numpy = np.zeros(len(data), dtype=np.uint8)
    backing = bytearray(len(data))
    into_memoryview = memoryview(backing)
    hits = client.load_into(
        namespace, [b"key-1"] * 3, [into_bytearray, into_numpy, into_memoryview]
    )
    assert hits == [True, True, True]
    assert bytes(into_bytearray) == data
    assert into_numpy.tobytes() == data
    assert bytes(backing) == data


def test_store_from_numpy_and_store_many(client, namespace):
    arrays = [np.random.default_rng(seed).random(4096, dtype=np.float32) for seed in range(4)]
    keys = [f"many-{index}".encode() for index in range(4)]
    assert client.store_many(namespace, keys, arrays) == ["stored"] * 4
    targets = [np.empty_like(array) for array in arrays]
    assert client.load_into(namespace, keys, targets) == [True] * 4
    for array, target in zip(arrays, targets):
        assert np.array_equal(array, target)


def test_a_miss_is_false_and_none(client, namespace):
    assert client.load_into(namespace, [b"absent"], [bytearray(16)]) == [False]
    [probe] = client.probe(namespace, [b"absent"])
    assert probe.state == "miss" and probe.medium is None
    with client.load(namespace, [b"absent"]) as views:
        assert views[0] is None


def test_locate_says_which_node_holds_how_much_of_a_prefix(client, namespace):
    keys = [f"prefix-{index}".encode() for index in range(3)]
    assert client.store_many(namespace, keys, [bytes(4096)] * 3) == ["stored"] * 3
    [run] = client.locate(namespace, [*keys, b"absent", keys[0]])
    assert (run.node, run.chunks, run.cpu, run.cxl, run.ssd) == ("node-a", 3, 3, 0, 0)
    assert client.locate(namespace, [b"absent", *keys]) == []


def test_torch_cpu_tensors_round_trip(client, namespace):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    source = torch.randn(64, 128, dtype=torch.bfloat16)
    assert client.store(namespace, b"tensor", source) == "stored"
    target = torch.zeros_like(source)
    assert client.load_into(namespace, [b"tensor"], [target]) == [True]
    assert torch.equal(source, target)
    assert kvtier.as_buffer(source).nbytes == source.numel() * source.element_size()


def test_views_are_released_on_exit_and_on_collection(client, namespace):
    data = payload(64 * 1024, 2)
    client.store(namespace, b"viewed", data)
    with client.load(namespace, [b"viewed"]) as views:
        view = views[0]
        assert view.readonly
        assert view.tobytes() == data
        assert views.valid() == [True]
    with pytest.raises(ValueError):
        view.tobytes()

    loaded = client.load(namespace, [b"viewed"])
    view = loaded[0]
    assert view.tobytes() == data
    del loaded
    gc.collect()
    with pytest.raises(ValueError):
        view.tobytes()

    # An array over a view keeps it exported: its lease (and the mapping) stay held, so the
    # array still reads the object, never unmapped memory.
    with client.load(namespace, [b"viewed"]) as views:
        array = np.frombuffer(views[0], dtype=np.uint8)
    del views
    gc.collect()
    assert array.tobytes() == data


def test_derived_views_keep_their_lease_and_mapping_past_release_and_the_client(cluster, namespace):
    # Slices, casts and arrays of a leased view are not exports of the view itself: each
    # must keep the lease and the pool mapping alive through its own reference, after the
    # views were released and after the client is gone (never a read of unmapped memory).
    client = kvtier.Client.connect(cluster.socket(0))
    namespace = register(client)
    data = payload(256 * 1024, 5)
    client.store(namespace, b"derived", data)
    loaded = client.load(namespace, [b"derived"])
    view = loaded[0]
    sliced = view[: 64 * 1024]
    cast = view.cast("B", (256, 1024))
    wrapped = memoryview(view)
    array = np.frombuffer(view[1024:], dtype=np.uint8)
    loaded.release()
    del view, loaded, client
    gc.collect()
    assert sliced.tobytes() == data[: 64 * 1024]
    assert cast[255, 1023] == data[-1]
    assert wrapped.tobytes() == data
    assert array.tobytes() == data[1024:]
    with pytest.raises(TypeError):
        sliced[0] = 1  # read-only


def test_loads_into_overlapping_targets_are_refused(client, namespace):
    client.store_many(namespace, [b"a", b"b"], [b"x" * 64, b"y" * 64])
    target = bytearray(128)
    with pytest.raises(ValueError, match="overlap"):
        client.load_into(namespace, [b"a", b"b"], [target, target])
    whole = np.zeros(128, dtype=np.uint8)
    with pytest.raises(ValueError, match="overlap"):
        client.load_into(namespace, [b"a", b"b"], [whole[:64], whole[32:96]])
    with pytest.raises(ValueError, match="overlap"):
        client.submit_load_into(namespace, [b"a", b"b"], [target, target])
    assert client.load_into(namespace, [b"a", b"b"], [whole[:64], whole[64:]]) == [True, True]
    assert whole.tobytes() == b"x" * 64 + b"y" * 64


def test_refused_buffers(client, namespace):
    client.store(namespace, b"k", b"abcd")
    with pytest.raises(BufferError):
        client.load_into(namespace, [b"k"], [b"read-only"])
    strided = np.zeros((8, 8), dtype=np.uint8)[:, ::2]
    # numpy refuses a C-contiguous export of a strided view.
    with pytest.raises((BufferError, ValueError)):
        client.store(namespace, b"k2", strided)
    with pytest.raises(ValueError):
        client.load_into(namespace, [b"k"], [])


def test_a_full_pool_gives_a_skip_not_an_error(client, namespace):
    # Larger than the node's 32 MiB pool: no pool can take it.
    assert client.store(namespace, b"huge", bytes(40 * MIB)) == "skipped"
    # What is cached stays a hit.
    client.store(namespace, b"small", b"x" * 4096)
    assert client.load_into(namespace, [b"small"], [bytearray(4096)]) == [True]


def test_store_many_batches_and_skips_only_what_does_not_fit(client, namespace):
    # More keys than one store batch carries: split, every one stored and read back.
    small = [np.full(4096, index % 251, dtype=np.uint8) for index in range(70)]
    small_keys = [f"small/{index}".encode() for index in range(70)]
    assert client.store_many(namespace, small_keys, small) == ["stored"] * 70
    targets = [np.zeros(4096, dtype=np.uint8) for _ in small]
    assert client.load_into(namespace, small_keys, targets) == [True] * 70
    assert all(np.array_equal(s, t) for s, t in zip(small, targets))
    # 12 x 4 MiB in one call into the 32 MiB pool: those past its room are skipped, not
    # errors, and those stored read back exactly.
    large = [np.full(4 * MIB, index, dtype=np.uint8) for index in range(12)]
    large_keys = [f"large/{index}".encode() for index in range(12)]
    statuses = client.store_many(namespace, large_keys, large)
    assert set(statuses) == {"stored", "skipped"}, statuses
    targets = [np.zeros(4 * MIB, dtype=np.uint8) for _ in large]
    hits = client.load_into(namespace, large_keys, targets)
    assert hits == [status == "stored" for status in statuses]
    for source, target, hit in zip(large, targets, hits):
        assert not hit or np.array_equal(source, target)


def test_pipelined_batches_of_mixed_sizes_round_trip_blocking_and_submitted(client, namespace):
    # Many small keys (several count-bounded batches, more than the window) around buffers
    # larger than a batch's byte bound (each alone in its batch), in one call each way.
    # (Well under the 32 MiB pool's eviction watermark: nothing is evicted meanwhile.)
    sizes = [4096] * 150 + [9 * MIB, 1 * MIB, 4096, 2 * MIB]
    sources = [
        np.frombuffer(payload(size, seed), dtype=np.uint8) for seed, size in enumerate(sizes)
    ]
    keys = [f"mixed/{index}".encode() for index in range(len(sizes))]
    assert client.store_many(namespace, keys, sources) == ["stored"] * len(sizes)
    targets = [np.zeros(size, dtype=np.uint8) for size in sizes]
    assert client.load_into(namespace, keys, targets) == [True] * len(sizes)
    assert all(np.array_equal(s, t) for s, t in zip(sources, targets))
    # The same through the non-blocking form (the batches run on kvtier's threads).
    again = [np.zeros(size, dtype=np.uint8) for size in sizes]
    job = client.submit_load_into(namespace, keys, again)
    assert client.poll(timeout=30.0) == [(job, [True] * len(sizes))]
    assert all(np.array_equal(s, t) for s, t in zip(sources, again))
    # (Again well under the watermark: the submitted store takes the small ones.)
    more = [f"submitted/{index}".encode() for index in range(150)]
    job = client.submit_store_many(namespace, more, sources[:150])
    assert client.poll(timeout=30.0) == [(job, ["stored"] * 150)]


def test_a_batch_over_the_directory_bound_raises_batch_too_large(client, namespace):
    # The directory takes at most 4096 items a request (its default batch_items_max).
    keys = [f"probe/{index}".encode() for index in range(4097)]
    with pytest.raises(
        kvtier.BatchTooLarge, match="4097 items is over the limit of 4096"
    ) as raised:
        client.probe(namespace, keys)
    assert isinstance(raised.value, kvtier.Refused)
    assert raised.value.reason == "batch_too_large"
    # load_into splits any number of keys instead: misses, not a refusal.
    assert client.load_into(namespace, keys, [bytearray(1) for _ in keys]) == [False] * len(keys)


def test_a_killed_node_raises_and_a_reconnect_works(cluster, client, namespace):
    client.store(namespace, b"before", b"y" * 4096)
    cluster.kill_node(0)
    with pytest.raises(kvtier.NodeUnreachable) as raised:
        client.store(namespace, b"after", b"z" * 4096)
    assert raised.value.reason == "unreachable"
    assert isinstance(raised.value, kvtier.KvtierError)

    cluster.restart_node(0)
    again = kvtier.Client.connect(cluster.socket(0))
    namespace = register(again)
    assert again.store(namespace, b"after", b"z" * 4096) == "stored"
    target = bytearray(4096)
    assert again.load_into(namespace, [b"after"], [target]) == [True]
    assert bytes(target) == b"z" * 4096


def test_connecting_to_no_node_raises_node_unreachable(tmp_path):
    with pytest.raises(kvtier.NodeUnreachable):
        kvtier.Client.connect(os.fspath(tmp_path / "absent.sock"))


def poll_all(client: kvtier.Client, jobs: set[int], deadline_s: float = 30.0) -> dict:
    """Polls until every job completed; fails past the deadline (a hang guard)."""
    results = {}
    deadline = time.monotonic() + deadline_s
    while jobs - results.keys():
        assert time.monotonic() < deadline, f"jobs {jobs - results.keys()} never completed"
        for job, result in client.poll(timeout=1.0):
            results[job] = result
    return results


def test_submit_and_poll(client, namespace):
    data = [payload(128 * 1024, seed) for seed in range(8)]
    keys = [f"job-{index}".encode() for index in range(8)]
    jobs = {client.submit_store(namespace, key, value) for key, value in zip(keys, data)}
    jobs.add(client.submit_store_many(namespace, [b"pair-0", b"pair-1"], [b"a" * 64, b"b" * 64]))
    assert client.inflight == len(jobs)
    results = poll_all(client, jobs)
    assert sorted(map(str, results.values())) == sorted(["stored"] * 8 + ["['stored', 'stored']"])
    assert client.inflight == 0

    targets = [bytearray(len(value)) for value in data]
    probe_job = client.submit_probe(namespace, keys)
    load_job = client.submit_load_into(namespace, keys, targets)
    results = poll_all(client, {probe_job, load_job})
    assert results[load_job] == [True] * 8
    assert [probe.state for probe in results[probe_job]] == ["hit"] * 8
    assert [bytes(target) for target in targets] == data


def test_submitting_past_the_bound_raises_busy(client, namespace):
    jobs = set()
    for _ in range(kvtier.JOBS_INFLIGHT_MAX):
        jobs.add(client.submit_store(namespace, b"same", b"q" * 4096))
    with pytest.raises(kvtier.Busy):
        client.submit_store(namespace, b"same", b"q" * 4096)
    poll_all(client, jobs)
    assert client.inflight == 0
    job = client.submit_store(namespace, b"same", b"q" * 4096)
    assert poll_all(client, {job})[job] == "already_present"


def test_prefix_digest_chains():
    first = kvtier.prefix_digest([1, 2, 3])
    assert len(first) == 16
    assert kvtier.prefix_digest([1, 2, 3]) == first
    second = kvtier.prefix_digest([4, 5], parent=first)
    assert second != kvtier.prefix_digest([4, 5])
