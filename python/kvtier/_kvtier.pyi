"""Type stubs of the compiled extension `kvtier._kvtier`."""

from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import Any, Literal, TypeAlias

from typing_extensions import Buffer as _Buffer
from typing_extensions import Self

StoreStatus: TypeAlias = Literal["stored", "already_present", "pending", "skipped"]

JOBS_INFLIGHT_MAX: int

class KvtierError(Exception):
    """Base of every kvtier error; `reason` names the typed cause."""

    reason: str

class NodeUnreachable(KvtierError):
    """The node could not be reached or the connection broke: connect again."""

class Refused(KvtierError):
    """The node or the directory refused; `reason`: directory, tenant, client, node, ..."""

class BatchTooLarge(Refused):
    """A request carried more items than the node or the directory takes in one (reason
    `batch_too_large`); the message names the limit."""

class PoolError(KvtierError):
    """A pool the node named could not be mapped or verified."""

class LeaseExpired(KvtierError):
    """A view's lease ended; load again."""

class Busy(KvtierError):
    """Too many requests or jobs in flight; poll completions and retry."""

class Namespace:
    """A registered namespace (model, revision, dtype, geometry)."""

    @property
    def id(self) -> bytes: ...

class Probe:
    """What a probe found for one key."""

    state: Literal["hit", "pending", "miss", "on_ssd"]
    medium: Literal["cpu", "cxl", "ssd"] | None
    length: int | None

class NodeRun:
    """One node's run in a `locate` answer: leading keys it can load without a transfer."""

    node: str
    chunks: int
    cpu: int
    cxl: int
    ssd: int

class SsdPin:
    """Where one object's bytes lie on the node's SSD, pinned in place (GPUDirect Storage)."""

    pin: int
    path: str
    offset: int
    length: int
    crc32c: int
    lasts_ms: int

class Loaded:
    """Leased read-only memoryviews over pool memory; released on exit, release() or GC."""

    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> bool: ...
    def release(self) -> None: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> memoryview | None: ...
    def valid(self) -> list[bool]: ...

class Client:
    """A connection to the local kvtier node with its pools mapped."""

    @staticmethod
    def connect(socket_path: str | PathLike[str]) -> Client: ...
    @property
    def node(self) -> tuple[int, int]: ...
    def register_namespace(
        self,
        model: str,
        revision: str,
        kv_dtype: str,
        layers: int,
        kv_heads: int,
        head_dim: int,
        block_tokens: int,
        chunk_tokens: int | None = None,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        adapter: str | None = None,
        quantization: str | None = None,
        format_version: int = 1,
    ) -> Namespace: ...
    def store(self, namespace: Namespace, key: bytes, buffer: _Buffer | Any) -> StoreStatus: ...
    def store_many(
        self, namespace: Namespace, keys: Sequence[bytes], buffers: Sequence[_Buffer | Any]
    ) -> list[StoreStatus]: ...
    def probe(self, namespace: Namespace, keys: Sequence[bytes]) -> list[Probe]: ...
    def locate(self, namespace: Namespace, keys: Sequence[bytes]) -> list[NodeRun]: ...
    def prefetch(self, namespace: Namespace, keys: Sequence[bytes]) -> int: ...
    def load_into(
        self, namespace: Namespace, keys: Sequence[bytes], buffers: Sequence[_Buffer | Any]
    ) -> list[bool]: ...
    def load(self, namespace: Namespace, keys: Sequence[bytes]) -> Loaded: ...
    def pin_on_ssd(self, namespace: Namespace, keys: Sequence[bytes]) -> list[SsdPin | None]: ...
    def unpin_on_ssd(self, pins: Sequence[int]) -> int: ...
    def submit_store(self, namespace: Namespace, key: bytes, buffer: _Buffer | Any) -> int: ...
    def submit_store_many(
        self, namespace: Namespace, keys: Sequence[bytes], buffers: Sequence[_Buffer | Any]
    ) -> int: ...
    def submit_probe(self, namespace: Namespace, keys: Sequence[bytes]) -> int: ...
    def submit_prefetch(self, namespace: Namespace, keys: Sequence[bytes]) -> int: ...
    def submit_load_into(
        self, namespace: Namespace, keys: Sequence[bytes], buffers: Sequence[_Buffer | Any]
    ) -> int: ...
    def poll(
        self, timeout: float = 0.0, max: int | None = None
    ) -> list[
        tuple[
            int,
            StoreStatus | list[StoreStatus | KvtierError] | list[bool] | list[Probe] | KvtierError,
        ]
    ]: ...
    @property
    def inflight(self) -> int: ...

class LocalCluster:
    """A kvtier cluster of real processes on loopback, for tests and benchmarks."""

    def __init__(
        self,
        exe: str | PathLike[str],
        nodes: int = 1,
        cpu_pool_bytes: int = ...,
        cxl_pool_bytes: int = 0,
        cxl_extent_bytes: int = ...,
        page_bytes: int = ...,
        write_order: Sequence[str] | None = None,
        ssd_bytes: int = 0,
        ssd_admit_after_accesses: int = 2,
    ) -> None: ...
    def socket(self, index: int) -> Path: ...
    def metrics_addresses(self) -> list[tuple[str, str]]: ...
    @property
    def root(self) -> Path: ...
    def kill_node(self, index: int) -> None: ...
    def restart_node(self, index: int) -> None: ...
    def shutdown(self) -> list[str]: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> bool: ...

def prefix_digest(tokens: Sequence[int], parent: bytes | None = None) -> bytes: ...
def copy_streaming(source: _Buffer, target: _Buffer) -> None:
    """Copies `source` into the start of `target` (writable, at least as long, not
    overlapping it) with kvtier's streaming routine (non-temporal stores): the
    streaming-copy limit of `python -m kvtier.bench`."""

def copy_routines() -> dict[str, str]:
    """The copy routines this process uses, `{"store": name, "load": name}` (`memcpy` or
    `streaming`), chosen by a short measurement on the first call."""

def run_cli(argv: list[str]) -> int:
    """Runs the `kvtier` command line `argv` (the program's name first) in this process, as
    the `kvtier` binary does; its exit status."""
