"""`python -m kvtier.bench [--json] [--socket PATH]`: store and load from Python, against the
limit measured in the same run, a copy between the same buffers in this process.

For each size (256 KiB and 4 MiB) it stores distinct objects from a set of numpy buffers
(`store_many`, 32 per call at 256 KiB and 8 at 4 MiB: a prefix of 8 MiB or 32 MiB, as an
engine stores and loads one), loads them back into another set (`load_into`, as many per
call), and
copies the first set into the second with numpy: the same bytes, the same memory, timed in
turns. The ratios are kvtier's GB/s over the copy's. kvtier copies with the routine its
start-up measurement found faster on this machine (`copy_routines`: the C library's memcpy
or a streaming copy with non-temporal stores), so `stream_copy_gbps` is kvtier's streaming
copy between the same buffers, and `store_best_ratio` and `load_best_ratio` are taken against
the faster of the two copies. Beside these limits, `shm_copy_gbps` is the same copy into (and
out of, for loads) a memory file mapped `MAP_SHARED` like the node's pool, and `pool_pages`
says which pages back the pool: what the kernel's `shmem_enabled` allows (which decides for
memory files such as the pool) and the shared memory the kernel backed with huge pages
during the run. `call_overhead_us` is the mean time of a 4 KiB `load_into` beyond a
4 KiB copy: what one call costs (the round trips to the node, the lease, the GIL hand-off);
`call_p50_us`, `call_p99_us` and `call_max_us` are the calls' own distribution.
Without `--socket` it starts its own node (a local cluster of `kvtier` processes, from
`$KVTIER_BIN` or the PATH) and stops it after.
"""

from __future__ import annotations

import argparse
import functools
import json
import mmap
import os
import time
from contextlib import ExitStack
from pathlib import Path

try:
    import numpy as np
except ImportError as missing:  # numpy is the benchmark's only dependency beyond kvtier.
    raise SystemExit("python -m kvtier.bench needs numpy: pip install numpy") from missing

from . import Client, LocalCluster, find_executable
from ._kvtier import copy_routines, copy_streaming

KIB = 1 << 10
MIB = 1 << 20
#: The sizes measured.
SIZES = (256 * KIB, 4 * MIB)
#: Bytes moved per size and pass: well past the last-level cache, well inside the pool.
BYTES_PER_PASS = 64 * MIB
#: Passes per measurement; the best is kept (the least disturbed by other processes).
PASSES = 7
#: Objects per `store_many` and `load_into` call, by size (pipelined: one round trip for
#: many): a prefix of 8 MiB at 256 KiB, 32 MiB at 4 MiB.
BATCH = {256 * KIB: 32, 4 * MIB: 8}
#: Calls timed for the call overhead.
OVERHEAD_CALLS = 2000
#: The CPU pool of the node the benchmark starts.
POOL_BYTES = 1536 * MIB


def _timed(run) -> float:
    """Seconds `run()` took."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _best(run, passes: int = PASSES) -> float:
    """The shortest of `passes` timed runs of `run()`, in seconds."""
    return min(_timed(run) for _ in range(passes))


def shared_mapping(size: int) -> mmap.mmap:
    """`size` bytes of a memory file mapped `MAP_SHARED` and touched, as the node maps its
    pool (the descriptor is closed at once; the mapping keeps the file)."""
    fd = os.memfd_create("kvtier-bench", os.MFD_CLOEXEC)
    try:
        os.posix_fallocate(fd, 0, size)
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE)
    np.frombuffer(mapping, dtype=np.uint8).fill(0)
    return mapping


def pool_pages() -> dict:
    """The pages that can back a pool here: the kernel's `shmem_enabled` choice (which
    decides for memory files such as the pool) and the bytes of shared memory on huge pages
    now."""
    setting = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
    try:
        text = setting.read_text()
        chosen = text[text.index("[") + 1 : text.index("]")]
    except (OSError, ValueError):
        chosen = "unknown"
    huge = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("ShmemHugePages:"):
                huge = int(line.split()[1]) * KIB
    except (OSError, ValueError, IndexError):
        huge = 0
    return {"shmem_enabled": chosen, "shmem_huge_bytes": huge}


def measure(client: Client, size: int, round_: int) -> dict:
    """Store, load and copy GB/s for objects of `size` bytes, `BATCH` objects per call. The
    three are timed in turns, pass after pass, and each keeps its best pass: a machine busy
    with other work slows all three alike."""
    namespace = client.register_namespace(
        model=f"kvtier/bench-{size}",
        revision=str(round_),
        kv_dtype="bfloat16",
        layers=1,
        kv_heads=1,
        head_dim=size // 2,
        block_tokens=1,
    )
    batch = BATCH.get(size, 8)
    count = max(batch, BYTES_PER_PASS // size // batch * batch)
    rng = np.random.default_rng(size)
    sources = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(count)]
    targets = [np.zeros(size, dtype=np.uint8) for _ in range(count)]
    batches = range(0, count, batch)
    total = count * size

    def copy() -> None:
        for source, target in zip(sources, targets):
            np.copyto(target, source)

    def stream_copy() -> None:
        for source, target in zip(sources, targets):
            copy_streaming(source, target)

    mapping = shared_mapping(total)
    shared = np.frombuffer(mapping, dtype=np.uint8)
    slots = [shared[index * size : (index + 1) * size] for index in range(count)]

    def shm_copy() -> None:
        for source, slot, target in zip(sources, slots, targets):
            np.copyto(slot, source)
            np.copyto(target, slot)

    def store(pass_: int) -> None:
        # Distinct keys each pass, so every store writes (no "already_present").
        for start in batches:
            keys = [f"{pass_}/{number}".encode() for number in range(start, start + batch)]
            statuses = client.store_many(namespace, keys, sources[start : start + batch])
            if any(status != "stored" for status in statuses):
                raise RuntimeError(f"stores returned {statuses}: is the pool large enough?")

    def load() -> None:
        for start in batches:
            keys = [f"0/{number}".encode() for number in range(start, start + batch)]
            if not all(client.load_into(namespace, keys, targets[start : start + batch])):
                raise RuntimeError("a stored object missed")

    copy_s = store_s = load_s = shm_copy_s = stream_copy_s = float("inf")
    for pass_ in range(PASSES):
        copy_s = min(copy_s, _timed(copy))
        stream_copy_s = min(stream_copy_s, _timed(stream_copy))
        # Into the mapping and back out: two copies, so half the time is one.
        shm_copy_s = min(shm_copy_s, _timed(shm_copy) / 2)
        store_s = min(store_s, _timed(functools.partial(store, pass_)))
        for target in targets:
            target.fill(0)
        load_s = min(load_s, _timed(load))
        if not all(np.array_equal(s, t) for s, t in zip(sources, targets)):
            raise RuntimeError("loaded bytes differ from the stored ones")
    # The views go first: a mapping with views over it cannot close.
    slots.clear()
    del shared
    mapping.close()
    copy_gbps, store_gbps, load_gbps, shm_copy_gbps, stream_copy_gbps = (
        total / seconds / 1e9 for seconds in (copy_s, store_s, load_s, shm_copy_s, stream_copy_s)
    )
    best_copy_gbps = max(copy_gbps, stream_copy_gbps)
    return {
        "size": size,
        "batch": batch,
        "store_gbps": round(store_gbps, 3),
        "load_gbps": round(load_gbps, 3),
        "copy_gbps": round(copy_gbps, 3),
        "store_ratio": round(store_gbps / copy_gbps, 3),
        "load_ratio": round(load_gbps / copy_gbps, 3),
        "shm_copy_gbps": round(shm_copy_gbps, 3),
        "stream_copy_gbps": round(stream_copy_gbps, 3),
        "store_best_ratio": round(store_gbps / best_copy_gbps, 3),
        "load_best_ratio": round(load_gbps / best_copy_gbps, 3),
    }


def call_latency(client: Client) -> dict:
    """One 4 KiB `load_into` call, timed call by call: p50, p99 and max in microseconds, and
    the mean beyond a 4 KiB copy (`call_overhead_us`)."""
    namespace = client.register_namespace(
        model="kvtier/bench-overhead",
        revision="1",
        kv_dtype="bfloat16",
        layers=1,
        kv_heads=1,
        head_dim=2048,
        block_tokens=1,
    )
    source = np.ones(4 * KIB, dtype=np.uint8)
    target = np.zeros(4 * KIB, dtype=np.uint8)
    client.store(namespace, b"overhead", source)
    keys, targets = [b"overhead"], [target]
    calls = []
    for _ in range(OVERHEAD_CALLS):
        start = time.perf_counter()
        client.load_into(namespace, keys, targets)
        calls.append(time.perf_counter() - start)

    def copy() -> None:
        for _ in range(OVERHEAD_CALLS):
            np.copyto(target, source)

    copy_s = _best(copy) / OVERHEAD_CALLS
    calls.sort()
    micros = [seconds * 1e6 for seconds in calls]
    return {
        "call_overhead_us": round(max(0.0, (sum(calls) / len(calls) - copy_s) * 1e6), 2),
        "call_p50_us": round(micros[len(micros) // 2], 2),
        "call_p99_us": round(micros[len(micros) * 99 // 100], 2),
        "call_max_us": round(micros[-1], 2),
    }


#: The SGLang row: pages per `batch_set_v1`/`batch_get_v1` call, and the host pool's
#: geometry (page_first, bfloat16): 8 layers x 16 tokens x 8 heads x 64 wide, K and V, is
#: 256 KiB a page in two 128 KiB parts.
SGLANG_PAGES = 64
SGLANG_GEOMETRY = {"layers": 8, "page_tokens": 16, "heads": 8, "head_dim": 64}


def sglang_host_pool(
    layers: int, page_tokens: int, heads: int, head_dim: int, pages: int, layout: str
):
    """SGLang's own MHA host pool (`MHATokenToKVPoolHost`, bfloat16) over CPU "device"
    buffers, holding at least `pages` pages: what SGLang's HiCache copies to and from, built
    without a GPU."""
    import torch
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    tokens = pages * page_tokens

    def layer() -> torch.Tensor:
        return torch.zeros(tokens, heads, head_dim, dtype=torch.bfloat16)

    k = tuple(layer() for _ in range(layers))
    v = tuple(layer() for _ in range(layers))
    info = MHABufferInfo(
        buffers=KVBuffers(
            k=k,
            v=v,
            k_data_ptrs=torch.tensor([t.data_ptr() for t in k], dtype=torch.uint64),
            v_data_ptrs=torch.tensor([t.data_ptr() for t in v], dtype=torch.uint64),
            layout=KVBufferLayout.NHD,
        ),
        page_size=page_tokens,
        head_num=heads,
        head_dim=head_dim,
        v_head_dim=head_dim,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    return MHATokenToKVPoolHost(
        info,
        host_to_device_ratio=1.0,
        host_size=0,
        page_size=page_tokens,
        layout=layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=tokens,
        start_layer=0,
        end_layer=layers - 1,
    )


def sglang_row(socket: str) -> dict | None:
    """SGLang's zero-copy calls through `kvtier.sglang.KvtierStorage` (built by SGLang's
    factory over SGLang's host pool): `batch_set_v1` and `batch_get_v1` of `SGLANG_PAGES`
    pages of 256 KiB, against a numpy copy of the same pages' parts between the same pool
    pages, timed in turns, best pass of each. None where sglang is not installed."""
    try:
        import torch
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
        from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
    except ImportError:
        return None
    pages = SGLANG_PAGES
    pool = sglang_host_pool(**SGLANG_GEOMETRY, pages=2 * pages + 2, layout="page_first")
    config = HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name="kvtier/bench-sglang",
        extra_config={
            "backend_name": "kvtier",
            "module_path": "kvtier.sglang",
            "class_name": "KvtierStorage",
            "interface_v1": 1,
            "socket": socket,
            "revision": str(time.time_ns()),
        },
    )
    storage = StorageBackendFactory.create_backend("dynamic", config, pool)
    storage.register_mem_pool_host(pool)
    page_tokens = pool.page_size

    def page_indices(first: int) -> torch.Tensor:
        return torch.arange(first * page_tokens, (first + pages) * page_tokens)

    sources, targets = page_indices(1), page_indices(1 + pages)
    flat = pool.kv_buffer.view(torch.uint8).numpy().reshape(-1)
    base = pool.kv_buffer.data_ptr()

    def parts(host_indices: torch.Tensor) -> list[np.ndarray]:
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        return [flat[ptr - base : ptr - base + size] for ptr, size in zip(ptrs, sizes)]

    source_parts, target_parts = parts(sources), parts(targets)
    rng = np.random.default_rng(pages)
    for part in source_parts:
        part[:] = rng.integers(0, 256, part.size, dtype=np.uint8)
    total = sum(part.size for part in source_parts)
    keys = [f"bench-page-{index}" for index in range(pages)]

    def copy() -> None:
        for source, target in zip(source_parts, target_parts):
            np.copyto(target, source)

    def store(pass_: int) -> None:
        if not all(storage.batch_set_v1([f"{pass_}/{key}" for key in keys], sources)):
            raise RuntimeError("a page was not stored: is the pool large enough?")

    def load() -> None:
        if not all(storage.batch_get_v1([f"0/{key}" for key in keys], targets)):
            raise RuntimeError("a stored page missed")

    copy_s = store_s = load_s = float("inf")
    for pass_ in range(PASSES):
        copy_s = min(copy_s, _timed(copy))
        store_s = min(store_s, _timed(functools.partial(store, pass_)))
        for part in target_parts:
            part.fill(0)
        load_s = min(load_s, _timed(load))
        if not all(np.array_equal(s, t) for s, t in zip(source_parts, target_parts)):
            raise RuntimeError("loaded pages differ from the stored ones")
    set_gbps, get_gbps, copy_gbps = (total / seconds / 1e9 for seconds in (store_s, load_s, copy_s))
    return {
        "pages": pages,
        "page_bytes": total // pages,
        "batch_set_v1_gbps": round(set_gbps, 3),
        "batch_get_v1_gbps": round(get_gbps, 3),
        "copy_gbps": round(copy_gbps, 3),
        "batch_set_v1_ratio": round(set_gbps / copy_gbps, 3),
        "batch_get_v1_ratio": round(get_gbps / copy_gbps, 3),
    }


def run(socket: str | None) -> dict:
    """The report, against the node at `socket` or one started for it."""
    with ExitStack() as stack:
        if socket is None:
            cluster = stack.enter_context(
                LocalCluster(find_executable(), nodes=1, cpu_pool_bytes=POOL_BYTES)
            )
            socket = str(cluster.socket(0))
        client = Client.connect(socket)
        round_ = time.time_ns()
        sizes = [measure(client, size, round_) for size in SIZES]
        return {
            "benchmark": "python",
            "sizes": sizes,
            "sglang": sglang_row(socket),
            **call_latency(client),
            "copy_routines": copy_routines(),
            "pool_pages": pool_pages(),
        }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kvtier.bench", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--socket", help="a running node's socket (default: start one)")
    args = parser.parse_args()
    report = run(args.socket)
    if args.json:
        print(json.dumps(report))
        return
    for row in report["sizes"]:
        print(
            f"{row['size'] // KIB:>6} KiB  store {row['store_gbps']:.2f} GB/s "
            f"({row['store_ratio']:.2f} of copy)  load {row['load_gbps']:.2f} GB/s "
            f"({row['load_ratio']:.2f} of copy)  copy {row['copy_gbps']:.2f} GB/s  "
            f"(through shared memory {row['shm_copy_gbps']:.2f} GB/s; streaming "
            f"{row['stream_copy_gbps']:.2f} GB/s, against the faster copy store "
            f"{row['store_best_ratio']:.2f} load {row['load_best_ratio']:.2f})"
        )
    sglang = report["sglang"]
    if sglang is None:
        print("sglang: not installed (scripts/python-env installs it)")
    else:
        print(
            f"sglang  {sglang['pages']} pages of {sglang['page_bytes'] // KIB} KiB: batch_set_v1 "
            f"{sglang['batch_set_v1_gbps']:.2f} GB/s ({sglang['batch_set_v1_ratio']:.2f} of copy)  "
            f"batch_get_v1 {sglang['batch_get_v1_gbps']:.2f} GB/s "
            f"({sglang['batch_get_v1_ratio']:.2f} of copy)  copy {sglang['copy_gbps']:.2f} GB/s"
        )
    print(
        f"call overhead at 4 KiB: {report['call_overhead_us']:.1f} us "
        f"(p50 {report['call_p50_us']:.1f}, p99 {report['call_p99_us']:.1f}, "
        f"max {report['call_max_us']:.1f} us per call)"
    )
    routines = report["copy_routines"]
    print(f"copy routines: store {routines['store']}, load {routines['load']}")
    pages = report["pool_pages"]
    print(
        f"pool pages: shmem_enabled {pages['shmem_enabled']}, "
        f"{pages['shmem_huge_bytes'] // MIB} MiB of shared memory on huge pages"
    )


if __name__ == "__main__":
    main()
