"""kvtier as a secondary tier under vLLM's CPU offload tier.

vLLM (0.33) configuration, with no code change to vLLM::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 8589934592,
        "secondary_tiers": [{"type": "KvtierTier", "module_path": "kvtier.vllm",
                             "socket": "/run/kvtier/node.sock", "revision": "main"}]}}'

vLLM's CPU tier stays the gateway to the GPU; this tier copies chunks between the CPU tier's
slots (`primary_kv_view`) and kvtier's shared-memory pools on kvtier's own threads, so every
method returns at once (vLLM calls them from its scheduler). A chunk's key is vLLM's offload
key (block hash and group), inside a kvtier namespace built from the model, its revision, the
KV dtype and the KV geometry (the node adds the tenant's salt where its rules set one): two
vLLM instances of the same model on two hosts of one kvtier cluster share what either stored.
`lookup` answers RETRY while a probe, a store of the key, or someone else's write of it is in
flight, and never a HIT it has not seen confirmed by the node.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.base import (
    JobResult,
    SecondaryTierManager,
    TransferJob,
)

from . import Client, KvtierError, NodeUnreachable

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

logger = logging.getLogger(__name__)

#: Lookup verdicts remembered at most (oldest forgotten first); a forgotten key is probed again.
VERDICTS_MAX = 65536
#: Seconds a HIT or MISS verdict is trusted before the node is asked again: kvtier evicts,
#: and other engines store, meanwhile.
VERDICT_TTL_S = 1.0
#: Seconds between reconnection attempts after the node went away.
RECONNECT_INTERVAL_S = 2.0
#: Keys sent in one probe job (a longer batch is split).
PROBE_BATCH_MAX = 1024

_HIT, _MISS, _PROBING = "hit", "miss", "probing"


def namespace_fields(
    offloading_spec: OffloadingSpec,
    chunk_bytes: int,
    revision: str,
    kv_heads: int | None = None,
    head_dim: int | None = None,
) -> dict[str, Any]:
    """The kvtier namespace of a vLLM instance's offloaded chunks, from its offloading config.

    Model name, `revision` (vLLM's offloading config does not carry it: pass the weights'
    commit or tag), KV dtype, layers, tokens per block and per chunk, and the parallel layout
    all take part; `kv_heads` and `head_dim` default to one flattened head whose width makes
    up the chunk's bytes, so chunks of different sizes never share a namespace.
    """
    config = offloading_spec.config
    layers = sum(len(group.layer_names) for group in config.groups) or 1
    block_tokens = config.groups[0].tokens_per_block if config.groups else 1
    chunk_tokens = block_tokens * max(1, config.cache.blocks_per_chunk)
    if kv_heads is None:
        kv_heads = 1
    if head_dim is None:
        head_dim = max(1, chunk_bytes // (chunk_tokens * layers * kv_heads))
    dtype = str(config.model.dtype).removeprefix("torch.")
    return {
        "model": config.model.name,
        "revision": revision,
        "kv_dtype": dtype,
        "layers": layers,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "block_tokens": block_tokens,
        "chunk_tokens": chunk_tokens,
        "tensor_parallel": config.parallel.tp_size,
        "pipeline_parallel": config.parallel.pp_size,
    }


class KvtierTier(SecondaryTierManager):
    """A vLLM secondary tier backed by a kvtier node (see the module documentation).

    Tier configuration (beside `type` and `module_path`):
      socket: the node's Unix socket (default: the `KVTIER_SOCKET` environment variable).
      revision: the model weights' revision (default "main").
      kv_heads, head_dim: the KV geometry, if you want it exact in the namespace.
      locality: "LOCAL" or "REMOTE" (default: unset).
    """

    medium: ClassVar[Medium] = Medium.CPU

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        socket: str | None = None,
        revision: str = "main",
        kv_heads: int | None = None,
        head_dim: int | None = None,
        locality: str | None = None,
        backpressure_detector: BackpressureDetector | None = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality(locality) if locality is not None else None
        # One flat byte view of vLLM's CPU tier (a 2-D memoryview has no row views before
        # Python 3.12); chunk c is bytes [c * block_size_bytes, (c + 1) * block_size_bytes).
        self._slots = primary_kv_view.cast("B")
        socket = socket or os.environ.get("KVTIER_SOCKET")
        if not socket:
            raise ValueError(
                "KvtierTier needs the node's socket: set 'socket' in the tier configuration "
                "or KVTIER_SOCKET"
            )
        self._socket = socket
        #: The kvtier namespace this instance's chunks live in (see `namespace_fields`).
        self.namespace_fields = namespace_fields(
            offloading_spec, self.block_size_bytes, revision, kv_heads, head_dim
        )
        self._client: Client | None = None
        # Lost connections, each kept until its jobs' completions (errors) were polled.
        self._retired: list[Client] = []
        self._namespace = None
        self._next_connect = 0.0
        self._connect()
        # Key -> (verdict, when): _HIT, _MISS, _PROBING or the probe job in flight; bounded
        # by VERDICTS_MAX. A HIT or MISS older than VERDICT_TTL_S is asked again.
        self._verdicts: OrderedDict[OffloadKey, tuple[Any, float]] = OrderedDict()
        # Keys waiting for the next probe job (sent at the end of the scheduler step).
        self._to_probe: list[OffloadKey] = []
        # Keys with a store of ours in flight -> how many.
        self._storing: dict[OffloadKey, int] = {}
        # (connection, kvtier job) -> what it is: ("probe", keys), ("prefetch",) or (kind, vLLM job, keys,
        # start, bytes). Job ids count per connection, and a connection (a Client, named by
        # its id()) stays referenced while any of its jobs is here. Bounded: a connection
        # refuses jobs past kvtier.JOBS_INFLIGHT_MAX unpolled ones (Busy).
        self._jobs: dict[tuple[int, int], tuple[Any, ...]] = {}
        self._finished: list[JobResult] = []

    # -- connection ---------------------------------------------------------------------

    def _connect(self) -> bool:
        """Connects (again) to the node; at most once per RECONNECT_INTERVAL_S."""
        if self._client is not None:
            return True
        now = time.monotonic()
        if now < self._next_connect:
            return False
        self._next_connect = now + RECONNECT_INTERVAL_S
        try:
            client = Client.connect(self._socket)
            self._namespace = client.register_namespace(**self.namespace_fields)
        except KvtierError as error:
            logger.warning("kvtier node at %s unavailable: %s", self._socket, error)
            return False
        self._client = client
        logger.info(
            "kvtier tier connected to %s (%s)", self._socket, self.namespace_fields["model"]
        )
        return True

    def _lost(self, error: Exception, client: Client | None = None) -> None:
        """Forgets the current connection when `error` says it broke (`client`: the
        connection the error came from, None for the current one); jobs still on it
        complete with their errors."""
        if client is not None and client is not self._client:
            return
        if isinstance(error, NodeUnreachable) and self._client is not None:
            logger.warning("kvtier node at %s lost: %s", self._socket, error)
            self._retired.append(self._client)
            self._client = None

    # -- completions ----------------------------------------------------------------------

    def _drain(self, timeout: float = 0.0) -> None:
        """Takes every finished kvtier job (of this and of a lost connection)."""
        for client in [self._client, *self._retired]:
            if client is None:
                continue
            for kv_job, result in client.poll(timeout):
                self._complete((id(client), kv_job), result, client)
            timeout = 0.0
        self._retired = [client for client in self._retired if client.inflight]

    def _complete(self, kv_job: tuple[int, int], result: Any, client: Client | None) -> None:
        job = self._jobs.pop(kv_job, None)
        if job is None:
            return
        if isinstance(result, Exception):
            self._lost(result, client)
        if job[0] == "prefetch":
            # The restores run on the node; lookups probe again until they are hits.
            return
        if job[0] == "probe":
            keys = job[1]
            probes = result if isinstance(result, list) else [None] * len(keys)
            on_ssd = []
            for key, probe in zip(keys, probes):
                if self._verdicts.get(key, (None, 0.0))[0] != kv_job:
                    continue
                if probe is not None and probe.state == "hit":
                    self._verdicts[key] = (_HIT, time.monotonic())
                elif probe is not None and probe.state == "miss":
                    self._verdicts[key] = (_MISS, time.monotonic())
                else:
                    # Being written elsewhere, only on the node's SSD (restored below), or
                    # the probe failed: ask again next step (RETRY meanwhile, never a HIT).
                    del self._verdicts[key]
                    if probe is not None and probe.state == "on_ssd":
                        on_ssd.append(key)
            if on_ssd and client is not None:
                self._prefetch(client, on_ssd)
            return
        kind, vllm_job, keys, started, size = job
        elapsed = time.monotonic() - started
        if kind == "store":
            for key in keys:
                left = self._storing.get(key, 1) - 1
                if left:
                    self._storing[key] = left
                else:
                    self._storing.pop(key, None)
                # The verdict may predate the store: probe again when asked.
                self._verdicts.pop(key, None)
            statuses = result if isinstance(result, list) else [result] * len(keys)
            failed = [status for status in statuses if isinstance(status, Exception)]
            for error in failed[:1]:
                logger.warning("kvtier store failed: %s", error)
                self._lost(error, client)
            self._finished.append(
                JobResult(
                    job_id=vllm_job,
                    success=not failed,
                    transfer_time=elapsed,
                    transfer_bytes=size,
                )
            )
            return
        hits = result if isinstance(result, list) else [False] * len(keys)
        if isinstance(result, Exception):
            logger.warning("kvtier load failed: %s", result)
        loaded = [key for key, hit in zip(keys, hits) if hit]
        for key, hit in zip(keys, hits):
            if not hit:
                self._remember(key, _MISS)
        success = len(loaded) == len(keys)
        self._finished.append(
            JobResult(
                job_id=vllm_job,
                success=success,
                successful_keys=None if success else tuple(loaded) or None,
                transfer_time=elapsed,
                transfer_bytes=len(loaded) * self.block_size_bytes,
            )
        )

    def _remember(self, key: OffloadKey, verdict: str | int) -> None:
        self._verdicts[key] = (verdict, time.monotonic())
        self._verdicts.move_to_end(key)
        while len(self._verdicts) > VERDICTS_MAX:
            self._verdicts.popitem(last=False)

    def _buffers(self, job: TransferJob) -> list[memoryview]:
        """The CPU tier's slots of a job's chunks."""
        size = self.block_size_bytes
        return [self._slots[int(chunk) * size : (int(chunk) + 1) * size] for chunk in job.chunk_ids]

    def _fail(self, vllm_job: int, error: Exception) -> None:
        logger.warning("kvtier job not submitted: %s", error)
        self._lost(error)
        self._finished.append(JobResult(job_id=vllm_job, success=False))

    # -- SecondaryTierManager ------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._drain()
        if key in self._storing:
            return LookupResult.RETRY
        verdict, decided = self._verdicts.get(key, (None, 0.0))
        if verdict in (_HIT, _MISS) and time.monotonic() - decided > VERDICT_TTL_S:
            # Another engine may have stored it, or kvtier evicted it, since: ask again.
            del self._verdicts[key]
            verdict = None
        if verdict == _HIT:
            return LookupResult.HIT
        if verdict == _MISS:
            return LookupResult.MISS
        if verdict is None:
            if self._client is None and not self._connect():
                return LookupResult.MISS
            self._remember(key, _PROBING)
            self._to_probe.append(key)
        return LookupResult.RETRY

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._drain()
        batch, self._to_probe = self._to_probe, []
        for start in range(0, len(batch), PROBE_BATCH_MAX):
            keys = batch[start : start + PROBE_BATCH_MAX]
            try:
                if self._client is None:
                    raise NodeUnreachable("not connected")
                kv_job = (id(self._client), self._client.submit_probe(self._namespace, keys))
            except KvtierError as error:
                self._lost(error)
                for key in keys:
                    self._verdicts.pop(key, None)
                continue
            self._jobs[kv_job] = ("probe", keys)
            for key in keys:
                if self._verdicts.get(key, (None, 0.0))[0] == _PROBING:
                    self._verdicts[key] = (kv_job, time.monotonic())

    def _prefetch(self, client: Client, keys: list[OffloadKey]) -> None:
        """Starts restoring `keys` from the node's SSD into memory, without blocking."""
        try:
            kv_job = (id(client), client.submit_prefetch(self._namespace, keys))
        except KvtierError as error:
            self._lost(error, client)
            return
        self._jobs[kv_job] = ("prefetch",)

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        buffers = self._buffers(job_metadata)
        try:
            if self._client is None and not self._connect():
                raise NodeUnreachable("not connected")
            assert self._client is not None
            kv_job = (
                id(self._client),
                self._client.submit_store_many(self._namespace, keys, buffers),
            )
        except KvtierError as error:
            self._fail(job_metadata.job_id, error)
            return
        for key in keys:
            self._storing[key] = self._storing.get(key, 0) + 1
        self._jobs[kv_job] = (
            "store",
            job_metadata.job_id,
            keys,
            time.monotonic(),
            len(keys) * self.block_size_bytes,
        )

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        buffers = self._buffers(job_metadata)
        try:
            if self._client is None:
                raise NodeUnreachable("not connected")
            kv_job = (
                id(self._client),
                self._client.submit_load_into(self._namespace, keys, buffers),
            )
        except KvtierError as error:
            for key in keys:
                self._verdicts.pop(key, None)
            self._fail(job_metadata.job_id, error)
            return
        self._jobs[kv_job] = ("load", job_metadata.job_id, keys, time.monotonic(), 0)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        self._drain()
        finished, self._finished = self._finished, []
        return finished

    def has_pending_work(self) -> bool:
        return bool(self._jobs) or bool(self._to_probe)

    def drain_jobs(self) -> None:
        """Blocks until every submitted store and load finished (probes may stay)."""
        while any(job[0] != "probe" for job in self._jobs.values()):
            before = len(self._jobs)
            self._drain(timeout=1.0)
            if len(self._jobs) == before and self._client is None and not self._retired:
                # The connection is gone and took its jobs' completions with it.
                for kv_job in [k for k, job in self._jobs.items() if job[0] != "probe"]:
                    self._complete(kv_job, NodeUnreachable("connection lost"), None)

    def shutdown(self) -> None:
        self.drain_jobs()
        self._client = None
        self._retired = []
        self._slots.release()
