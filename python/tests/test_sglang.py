"""kvtier under the real SGLang package: the storage backend built by SGLang's own
`StorageBackendFactory` from the configuration in kvtier.sglang's documentation, over SGLang's
own host pools (`MHATokenToKVPoolHost` in both layouts, `MLATokenToKVPoolHost`) built on CPU
from CPU "device" buffers. Nothing stands in for an SGLang class: the host pools, the
storage configuration and the factory are SGLang's; only the GPU behind the host pool is
absent (its buffers are CPU tensors, which SGLang's host pools accept).
"""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest
from conftest import MIB

import kvtier

torch = pytest.importorskip("torch", reason="torch (installed with vllm) is missing")
pytest.importorskip(
    "sglang.srt.mem_cache.storage.backend_factory",
    reason="sglang is not installed: scripts/python-env installs sglang==0.5.23",
)

from sglang.srt.mem_cache.device_pool_info import MLABufferInfo
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from kvtier.bench import sglang_host_pool
from kvtier.sglang import KvtierStorage

LAYERS = 2
HEADS = 2
HEAD_DIM = 64
PAGE_TOKENS = 16
DEVICE_TOKENS = 256
KV_LORA_RANK = 64
ROPE_DIM = 16
#: Longest a reconnect may take before the test calls it hung (a hang guard).
HANG_GUARD_S = 60.0


def mha_pool(layout: str) -> MHATokenToKVPoolHost:
    return sglang_host_pool(
        layers=LAYERS,
        page_tokens=PAGE_TOKENS,
        heads=HEADS,
        head_dim=HEAD_DIM,
        pages=DEVICE_TOKENS // PAGE_TOKENS,
        layout=layout,
    )


def mla_pool(layout: str) -> MLATokenToKVPoolHost:
    width = KV_LORA_RANK + ROPE_DIM
    buffers = tuple(
        torch.zeros(DEVICE_TOKENS, 1, width, dtype=torch.bfloat16) for _ in range(LAYERS)
    )
    info = MLABufferInfo(
        buffers=buffers,
        data_ptrs=torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64),
        layer_indices=tuple(range(LAYERS)),
        device_layer_num=LAYERS,
        page_size=PAGE_TOKENS,
        kv_lora_rank=KV_LORA_RANK,
        qk_rope_head_dim=ROPE_DIM,
        kv_cache_dim=width,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    return MLATokenToKVPoolHost(
        info,
        2.0,
        0,
        PAGE_TOKENS,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=DEVICE_TOKENS,
        start_layer=0,
        end_layer=LAYERS - 1,
        target_layer_num=LAYERS,
    )


def backend(
    socket, pool, *, tp_rank: int = 0, tp_size: int = 1, mla: bool = False, v1: bool = True
) -> KvtierStorage:
    """The backend as SGLang's cache controller makes it: the factory, then the host pool."""
    config = HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=False,
        is_page_first_layout=pool.layout.startswith("page_first"),
        model_name="test/sglang-model",
        extra_config={
            "backend_name": "kvtier",
            "module_path": "kvtier.sglang",
            "class_name": "KvtierStorage",
            "interface_v1": 1 if v1 else 0,
            "socket": str(socket),
            "revision": "r1",
        },
    )
    storage = StorageBackendFactory.create_backend("dynamic", config, pool)
    assert isinstance(storage, KvtierStorage)
    storage.register_mem_pool_host(pool)
    return storage


def indices(pages: list[int]) -> torch.Tensor:
    """The host indices of whole pages, as SGLang passes them."""
    return torch.cat([torch.arange(p * PAGE_TOKENS, (p + 1) * PAGE_TOKENS) for p in pages])


def page_parts(pool, page: int) -> list[np.ndarray]:
    """Writable views of one host page's parts (as the pool lays them out)."""
    ptrs, sizes = pool.get_page_buffer_meta(indices([page]))
    return [
        np.frombuffer((ctypes.c_ubyte * size).from_address(ptr), dtype=np.uint8)
        for ptr, size in zip(ptrs, sizes)
    ]


def fill(pool, page: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    for part in page_parts(pool, page):
        part[:] = rng.integers(0, 256, part.size, dtype=np.uint8)
    return page_bytes(pool, page)


def page_bytes(pool, page: int) -> bytes:
    return b"".join(part.tobytes() for part in page_parts(pool, page))


def keys(name: str, count: int) -> list[str]:
    return [f"{name}-{index:04x}" for index in range(count)]


@pytest.fixture
def node(exe):
    with kvtier.LocalCluster(exe, nodes=1, cpu_pool_bytes=32 * MIB) as cluster:
        yield cluster


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_pages_round_trip_byte_exact_through_sglangs_factory_and_host_pool(node, layout):
    pool = mha_pool(layout)
    storage = backend(node.socket(0), pool)
    names = keys(layout, 4)
    written = [fill(pool, 1 + index, seed=index) for index in range(4)]
    assert storage.batch_set_v1(names, indices([1, 2, 3, 4])) == [True] * 4
    assert storage.batch_exists(names) == 4
    # Into other pages of the pool: every part lands where the pool says it lives.
    assert storage.batch_get_v1(names, indices([9, 10, 11, 12])) == [True] * 4
    assert [page_bytes(pool, page) for page in (9, 10, 11, 12)] == written
    # A second instance of the same model and layout (another pool) finds them too.
    other = mha_pool(layout)
    assert backend(node.socket(0), other).batch_get_v1(names, indices([5, 6, 7, 8])) == [True] * 4
    assert [page_bytes(other, page) for page in (5, 6, 7, 8)] == written


def test_batch_exists_answers_the_longest_cached_run_and_a_page_needs_all_its_parts(node):
    pool = mha_pool("page_first")
    storage = backend(node.socket(0), pool)
    names = keys("run", 5)
    for index in range(5):
        fill(pool, 1 + index, seed=10 + index)
    assert storage.batch_set_v1(names[:2], indices([1, 2])) == [True, True]
    assert storage.batch_set_v1(names[3:], indices([4, 5])) == [True, True]
    assert storage.batch_exists(names) == 2
    assert storage.batch_exists(names[3:]) == 2
    assert storage.batch_exists(keys("never", 3)) == 0
    assert storage.exists(names[0]) and not storage.exists(names[2])
    # Another tensor-parallel rank of an MHA model holds other heads: not a hit there.
    rank_one = backend(node.socket(0), mha_pool("page_first"), tp_rank=1, tp_size=2)
    assert rank_one.batch_exists(names) == 0
    # A page with only one of its two parts (K stored under its key by hand) is a miss.
    client = kvtier.Client.connect(node.socket(0))
    namespace = client.register_namespace(**storage._fields)
    [k_key, _v_key] = storage._object_keys([names[2]])
    assert client.store(namespace, k_key, page_parts(pool, 3)[0]) == "stored"
    assert storage.batch_exists(names) == 2
    # A get of the half page misses rather than load half of it.
    assert storage.batch_get_v1([names[2]], indices([20])) == [False]


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_mla_only_the_writer_rank_stores_and_every_rank_loads_the_same_pages(node, layout):
    writer_pool, reader_pool = mla_pool(layout), mla_pool(layout)
    writer = backend(node.socket(0), writer_pool, tp_rank=0, tp_size=2, mla=True)
    reader = backend(node.socket(0), reader_pool, tp_rank=1, tp_size=2, mla=True)
    names = keys(f"mla-{layout}", 3)
    written = [fill(reader_pool, 1 + index, seed=20 + index) for index in range(3)]
    # Rank 1 does not write (its latent cache is rank 0's): it reports success, stores nothing.
    assert reader.batch_set_v1(names, indices([1, 2, 3])) == [True] * 3
    assert reader.batch_exists(names) == 0
    for index in range(3):
        assert fill(writer_pool, 1 + index, seed=20 + index) == written[index]
    assert writer.batch_set_v1(names, indices([1, 2, 3])) == [True] * 3
    assert reader.batch_exists(names) == 3
    assert reader.batch_get_v1(names, indices([7, 8, 9])) == [True] * 3
    assert [page_bytes(reader_pool, page) for page in (7, 8, 9)] == written


def test_the_flat_page_interface_round_trips_when_interface_v1_is_off(node):
    pool = mha_pool("page_first")
    storage = backend(node.socket(0), pool, v1=False)
    names = keys("flat", 3)
    for index in range(3):
        fill(pool, 1 + index, seed=30 + index)
    pages = [pool.get_data_page(page * PAGE_TOKENS) for page in (1, 2, 3)]
    assert storage.batch_set(names, pages)
    assert storage.batch_exists(names) == 3
    targets = [pool.get_dummy_flat_data_page() for _ in names]
    loaded = storage.batch_get(names, targets)
    assert all(got is not None for got in loaded)
    # Bytes, not values: random bytes make NaNs of bfloat16, which never compare equal.
    assert all(
        torch.equal(got.view(torch.int16), want.view(torch.int16))
        for got, want in zip(loaded, pages)
    )
    assert storage.batch_get(keys("absent", 1), [pool.get_dummy_flat_data_page()]) == [None]


def test_a_killed_node_gives_misses_not_exceptions_and_the_backend_reconnects(node):
    pool = mha_pool("page_first")
    storage = backend(node.socket(0), pool)
    names = keys("restart", 2)
    fill(pool, 1, seed=40)
    fill(pool, 2, seed=41)
    assert storage.batch_set_v1(names[:1], indices([1])) == [True]
    node.kill_node(0)
    assert storage.batch_exists(names) == 0
    assert storage.batch_get_v1(names[:1], indices([5])) == [False]
    assert storage.batch_set_v1(names[1:], indices([2])) == [False]
    node.restart_node(0)
    # The backend connects again by itself (at most every RECONNECT_INTERVAL_S).
    deadline = time.monotonic() + HANG_GUARD_S
    while storage.batch_set_v1(names[1:], indices([2])) != [True]:
        assert time.monotonic() < deadline, "the backend never reconnected"
        time.sleep(0.05)
    assert storage.batch_exists(names[1:]) == 1


def test_two_instances_on_two_nodes_share_through_the_cxl_pool(exe):
    with kvtier.LocalCluster(
        exe,
        nodes=2,
        cpu_pool_bytes=16 * MIB,
        cxl_pool_bytes=64 * MIB,
        write_order=["cxl", "cpu"],
    ) as cluster:
        first_pool, second_pool = mha_pool("page_first"), mha_pool("page_first")
        first = backend(cluster.socket(0), first_pool)
        second = backend(cluster.socket(1), second_pool)
        names = keys("shared", 4)
        written = [fill(first_pool, 1 + index, seed=50 + index) for index in range(4)]
        assert first.batch_set_v1(names, indices([1, 2, 3, 4])) == [True] * 4
        # The second instance never saw these pages: kvtier has them, on its node.
        assert second.batch_exists(names) == 4
        assert second.batch_get_v1(names, indices([5, 6, 7, 8])) == [True] * 4
        assert [page_bytes(second_pool, page) for page in (5, 6, 7, 8)] == written
