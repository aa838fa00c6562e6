"""kvtier as SGLang's hierarchical-cache storage tier (HiCache L3).

SGLang (0.5.23) loads it by configuration, with no code change to SGLang::

    python -m sglang.launch_server --model-path ... --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KvtierStorage", "interface_v1": 1,
        "socket": "/run/kvtier/node.sock", "revision": "main"}'

`interface_v1` makes SGLang call the zero-copy forms (`batch_get_v1`, `batch_set_v1`): kvtier
copies between the pages of SGLang's host pool and its own shared-memory pools on kvtier's
threads, with the GIL released, one pipelined call per batch. Each page is stored as the
parts the host pool lays it out in (`get_page_buffer_meta`: K and V of every layer at once in
the `page_first` layouts, one K and one V per layer in `layer_first`), each part one kvtier
object keyed by the page's hash, the part, the layout and (for MHA models) the tensor-parallel
rank. A page is a hit only when all its parts are. The namespace comes from the model, its
revision, the KV dtype, the host pool's geometry and the parallel layout (the node adds the
tenant's salt where its rules set one): two SGLang instances of one model on two hosts of one
kvtier cluster share what either stored, through the CXL pool where they map one.

MLA models keep one latent cache that every tensor-parallel rank holds whole: only the
writer rank (`HiCacheStorageConfig.is_storage_writer`, rank 0 without decode context
parallelism) stores it, and every rank loads the same objects.

A node that is down or restarting gives misses and failed writes, never exceptions; the
backend connects again at most every `RECONNECT_INTERVAL_S`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from . import Client, KvtierError, Namespace, NodeUnreachable

if TYPE_CHECKING:
    from sglang.srt.mem_cache.pool_host import HostKVCache

logger = logging.getLogger(__name__)

#: Seconds between reconnection attempts after the node went away.
RECONNECT_INTERVAL_S = 2.0
#: Keys per node call: SGLang batches at most 128 pages (`STORAGE_BATCH_SIZE`), a page has
#: at most two parts per layer; a larger call is split.
KEYS_PER_CALL_MAX = 4096
#: What a store answers that leaves the object in kvtier (or about to be: "pending" is
#: another writer's store of the same bytes under way).
_STORED = ("stored", "already_present", "pending")


def _is_mla(config: HiCacheStorageConfig, pool: Any) -> bool:
    return bool(config.is_mla_model) or type(pool).__name__.startswith("MLA")


def namespace_fields(config: HiCacheStorageConfig, pool: Any, revision: str) -> dict[str, Any]:
    """The kvtier namespace of an SGLang instance's host pages, from its storage
    configuration and host pool: model, `revision` (SGLang does not know the weights'
    revision: pass their commit or tag), KV dtype, layers, heads and width, tokens per page,
    and the parallel layout."""
    itemsize = pool.dtype.itemsize
    layers = max(1, int(pool.layer_num))
    if _is_mla(config, pool):
        kv_heads = 1
        head_dim = max(1, int(pool.size_per_token) // (layers * itemsize))
    else:
        kv_heads = max(1, int(getattr(pool, "head_num", 1)))
        head_dim = int(getattr(pool, "head_dim", 0)) or max(
            1, int(pool.size_per_token) // (2 * layers * kv_heads * itemsize)
        )
    return {
        "model": config.model_name or "unknown",
        "revision": revision,
        "kv_dtype": str(pool.dtype).removeprefix("torch."),
        "layers": layers,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "block_tokens": int(pool.page_size),
        "chunk_tokens": int(pool.page_size),
        "tensor_parallel": max(1, int(config.tp_size)),
        "pipeline_parallel": max(1, int(config.pp_size)),
    }


class KvtierStorage(HiCacheStorage):
    """A `HiCacheStorage` backed by the local kvtier node (see the module documentation).

    Extra configuration (beside `backend_name`, `module_path`, `class_name`, `interface_v1`):
      socket: the node's Unix socket (default: the `KVTIER_SOCKET` environment variable).
      revision: the model weights' revision (default "main").
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict | None = None) -> None:
        extra = storage_config.extra_config or {}
        socket = extra.get("socket") or os.environ.get("KVTIER_SOCKET")
        if not socket:
            raise ValueError(
                "KvtierStorage needs the node's socket: set 'socket' in "
                "--hicache-storage-backend-extra-config or KVTIER_SOCKET"
            )
        self._socket = str(socket)
        self._revision = str(extra.get("revision", "main"))
        #: SGLang calls the zero-copy forms with `interface_v1`, the flat-page forms without;
        #: `batch_exists` answers for the objects the chosen forms write.
        self._zero_copy = bool(extra.get("interface_v1", 0))
        self.config = storage_config
        self.mem_pool_host: HostKVCache | None = None
        self._fields: dict[str, Any] | None = None
        self._suffix = b""
        self._parts = 1
        self._writer = True
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._namespace: Namespace | None = None
        self._next_connect = 0.0

    # -- setup ------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: HostKVCache) -> None:
        """Takes the host pool whose pages this backend copies, and with it the namespace."""
        super().register_mem_pool_host(mem_pool_host)
        config = self.config
        mla = _is_mla(config, mem_pool_host)
        self._fields = namespace_fields(config, mem_pool_host, self._revision)
        # Parts of one page, as the pool lays it out.
        ptrs, _ = mem_pool_host.get_page_buffer_meta(torch.arange(mem_pool_host.page_size))
        self._parts = max(1, len(ptrs))
        self._writer = bool(getattr(config, "is_storage_writer", not mla or config.tp_rank == 0))
        rank = "mla" if mla else f"tp{config.tp_rank}"
        extra_rank = f"dp{config.dp_rank}" if getattr(config, "dp_rank", 0) and not mla else ""
        dcp = f"dcp{config.dcp_rank}" if getattr(config, "dcp_size", 1) > 1 else ""
        self._suffix = (
            f"|sglang|{mem_pool_host.layout}|{rank}{extra_rank}{dcp}|pp{config.pp_rank}|".encode()
        )
        self._connect()

    def _connect(self) -> Client | None:
        """The client, connected (again) at most once per RECONNECT_INTERVAL_S."""
        with self._lock:
            if self._client is not None:
                return self._client
            if self._fields is None:
                return None
            now = time.monotonic()
            if now < self._next_connect:
                return None
            self._next_connect = now + RECONNECT_INTERVAL_S
            try:
                client = Client.connect(self._socket)
                self._namespace = client.register_namespace(**self._fields)
            except KvtierError as error:
                logger.warning("kvtier node at %s unavailable: %s", self._socket, error)
                return None
            self._client = client
            return client

    def _lost(self, client: Client, error: KvtierError) -> None:
        logger.warning("kvtier call failed: %s", error)
        if isinstance(error, NodeUnreachable):
            with self._lock:
                if self._client is client:
                    self._client = None

    # -- keys and buffers -------------------------------------------------------------

    def _object_keys(self, keys: list[str]) -> list[bytes]:
        """Every part's object key of every page, page by page."""
        suffix = self._suffix
        return [
            key.encode() + suffix + str(part).encode()
            for key in keys
            for part in range(self._parts)
        ]

    def _existence_keys(self, keys: list[str]) -> tuple[list[bytes], int]:
        """The object keys `batch_exists` probes, and how many there are per page."""
        if self._zero_copy:
            return self._object_keys(keys), self._parts
        return [self._flat_key(key) for key in keys], 1

    def _page_buffers(self, host_indices: torch.Tensor, pages: int) -> list[Any] | None:
        """Writable views of the host pool's memory, one per part of every page."""
        pool = self.mem_pool_host
        if pool is None:
            return None
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        if len(ptrs) != pages * self._parts:
            logger.error(
                "host pool gave %d buffers for %d pages of %d parts", len(ptrs), pages, self._parts
            )
            return None
        return [(ctypes.c_ubyte * size).from_address(ptr) for ptr, size in zip(ptrs, sizes)]

    def _pages_done(
        self, part_results: list[bool], pages: int, parts: int | None = None
    ) -> list[bool]:
        parts = self._parts if parts is None else parts
        return [all(part_results[page * parts : (page + 1) * parts]) for page in range(pages)]

    # -- the zero-copy interface (interface_v1) ---------------------------------------

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Stores the host pages at `host_indices` under `keys`: for each page, whether kvtier
        holds (or is receiving) all its parts. A rank that does not write (MLA, not the
        writer) reports success: the writer stores the same bytes."""
        if not keys:
            return []
        if not self._writer:
            return [True] * len(keys)
        return self._copy_pages(keys, host_indices, store=True)

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Loads the pages of `keys` into the host pages at `host_indices`: for each page,
        whether all its parts were copied (SGLang uses the leading run)."""
        if not keys:
            return []
        return self._copy_pages(keys, host_indices, store=False)

    def _copy_pages(self, keys: list[str], host_indices: torch.Tensor, store: bool) -> list[bool]:
        """Stores (or loads) every part of every page, `KEYS_PER_CALL_MAX` parts a call: for
        each page, whether all its parts went (or came); a failed call fails what is left."""
        buffers = self._page_buffers(host_indices, len(keys))
        client = self._connect()
        if buffers is None or client is None or self._namespace is None:
            return [False] * len(keys)
        object_keys = self._object_keys(keys)
        results: list[bool] = []
        try:
            for start in range(0, len(object_keys), KEYS_PER_CALL_MAX):
                batch_keys = object_keys[start : start + KEYS_PER_CALL_MAX]
                batch_buffers = buffers[start : start + KEYS_PER_CALL_MAX]
                if store:
                    statuses = client.store_many(self._namespace, batch_keys, batch_buffers)
                    results.extend(status in _STORED for status in statuses)
                else:
                    results.extend(client.load_into(self._namespace, batch_keys, batch_buffers))
        except KvtierError as error:
            self._lost(client, error)
            results.extend([False] * (len(object_keys) - len(results)))
        return self._pages_done(results, len(keys))

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """How many pages from the start of `keys` kvtier holds whole (every part a hit where
        this node can read it), in one probe per `KEYS_PER_CALL_MAX` keys."""
        if not keys:
            return 0
        client = self._connect()
        if client is None or self._namespace is None:
            return 0
        object_keys, parts = self._existence_keys(keys)
        hits: list[bool] = []
        try:
            for start in range(0, len(object_keys), KEYS_PER_CALL_MAX):
                probes = client.probe(
                    self._namespace, object_keys[start : start + KEYS_PER_CALL_MAX]
                )
                hits.extend(probe.state == "hit" for probe in probes)
                if not all(hits):
                    break
        except KvtierError as error:
            self._lost(client, error)
        missing = [False] * (len(object_keys) - len(hits))
        pages = self._pages_done(hits + missing, len(keys), parts)
        return pages.index(False) if False in pages else len(pages)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- the generic interface (flat pages, copied by SGLang) -------------------------

    def _flat_key(self, key: str) -> bytes:
        return key.encode() + self._suffix + b"flat"

    def batch_set(
        self,
        keys: list[str],
        values: Any | None = None,
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        """Stores flat data pages (tensors) under `keys`: whether every one was stored."""
        if not keys:
            return True
        if not self._writer:
            return True
        client = self._connect()
        if client is None or self._namespace is None or values is None:
            return False
        flat_keys = [self._flat_key(key) for key in keys]
        try:
            statuses = client.store_many(self._namespace, flat_keys, list(values))
        except KvtierError as error:
            self._lost(client, error)
            return False
        return all(status in _STORED for status in statuses)

    def set(
        self,
        key: str,
        value: Any | None = None,
        target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        return self.batch_set([key], [value])

    def batch_get(
        self,
        keys: list[str],
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> list[torch.Tensor | None]:
        """Loads flat data pages into `target_locations` (tensors of the page's size): each
        target, or None for a miss."""
        if not keys or target_locations is None:
            return [None] * len(keys)
        client = self._connect()
        if client is None or self._namespace is None:
            return [None] * len(keys)
        targets = list(target_locations)
        try:
            found = client.load_into(
                self._namespace, [self._flat_key(key) for key in keys], targets
            )
        except KvtierError as error:
            self._lost(client, error)
            return [None] * len(keys)
        return [target if hit else None for target, hit in zip(targets, found)]

    def get(
        self,
        key: str,
        target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> torch.Tensor | None:
        if target_location is None:
            return None
        return self.batch_get([key], [target_location])[0]

    def clear(self) -> None:
        """Nothing to clear here: kvtier's pools are the cluster's, evicted by its own policy."""

    def close(self) -> None:
        """Drops the connection to the node."""
        with self._lock:
            self._client = None
