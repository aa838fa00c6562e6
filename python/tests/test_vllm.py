"""kvtier under the real vLLM package: the tier built by vLLM's own factory from the
configuration in the README, and vLLM's real Scheduler with the OffloadingConnector and the
TieringOffloadingSpec on a CPU device storing, evicting, and finding chunks again in kvtier.

Only the GPU<->CPU copy worker is absent here: `Worker` below stands in for it, copying
each chunk's known content between a pretend GPU and vLLM's CPU tier and reporting the jobs
done as vLLM's worker would. Everything between vLLM's CPU tier and kvtier is real.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import MIB

import kvtier

pytest.importorskip(
    "vllm", reason="vllm is not installed: scripts/python-env installs vllm==0.33.0"
)
torch = pytest.importorskip("torch", reason="torch (installed with vllm) is missing")

from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.kv_offload.base import (
    LookupResult,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvtier.vllm import KvtierTier

BLOCK_TOKENS = 16
LAYERS = 2
KV_HEADS = 2
HEAD_DIM = 16
#: Bytes of one block (= one offloaded chunk): K and V, float16.
CHUNK_BYTES = 2 * BLOCK_TOKENS * KV_HEADS * HEAD_DIM * 2 * LAYERS
#: Chunks vLLM's CPU tier holds: one prompt's worth, so a second prompt evicts the first.
CPU_CHUNKS = 4
PROMPT_TOKENS = CPU_CHUNKS * BLOCK_TOKENS
EOS = 2
#: Longest a scheduler loop may run before the test calls it hung (a hang guard).
HANG_GUARD_S = 60.0


def kv_transfer_config(socket: str) -> dict:
    """The --kv-transfer-config of the README, for this test's node and CPU tier size."""
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": CPU_CHUNKS * CHUNK_BYTES,
            "secondary_tiers": [
                {
                    "type": "KvtierTier",
                    "module_path": "kvtier.vllm",
                    "socket": socket,
                    "revision": "test-revision",
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny Llama configuration (no weights: the scheduler never runs the model)."""
    folder = tmp_path_factory.mktemp("model")
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": KV_HEADS * HEAD_DIM * 2,
                "intermediate_size": 128,
                "num_attention_heads": KV_HEADS * 2,
                "num_key_value_heads": KV_HEADS,
                "num_hidden_layers": LAYERS,
                "vocab_size": 1000,
                "max_position_embeddings": 2048,
                "rms_norm_eps": 1e-5,
                "torch_dtype": "float16",
                "bos_token_id": 1,
                "eos_token_id": EOS,
            }
        )
    )
    return folder


def make_scheduler(model_dir: Path, socket: str) -> Scheduler:
    """vLLM's real Scheduler with the OffloadingConnector, the TieringOffloadingSpec and the
    kvtier tier, on a CPU device."""
    config = VllmConfig(
        model_config=ModelConfig(
            model=str(model_dir), dtype="float16", seed=0, skip_tokenizer_init=True
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=4,
            max_num_batched_tokens=512,
            max_model_len=1024,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(
            block_size=BLOCK_TOKENS,
            gpu_memory_utilization=0.9,
            cache_dtype="auto",
            enable_prefix_caching=False,
        ),
        kv_transfer_config=KVTransferConfig(**kv_transfer_config(socket)),
        device_config=DeviceConfig("cpu"),
    )
    config.cache_config.kv_cache_layout = "LBNHC"
    gpu_blocks = 64
    config.cache_config.num_gpu_blocks = gpu_blocks
    kv_cache_config = KVCacheConfig(
        num_blocks=gpu_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                [f"layer{index}" for index in range(LAYERS)],
                FullAttentionSpec(
                    block_size=BLOCK_TOKENS,
                    num_kv_heads=KV_HEADS,
                    head_size=HEAD_DIM,
                    dtype=torch.float16,
                ),
            )
        ],
    )
    init_none_hash(sha256)
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK_TOKENS,
        log_stats=True,
    )


def content(tokens: list[int], block: int) -> bytes:
    """The KV bytes of block `block` of a prompt: a function of the tokens up to its end."""
    digest = hashlib.sha256(repr(tokens[: (block + 1) * BLOCK_TOKENS]).encode()).digest()
    return (digest * (CHUNK_BYTES // len(digest) + 1))[:CHUNK_BYTES]


class Worker:
    """Stands in for vLLM's GPU<->CPU copy worker: stores copy a block's known content into
    the CPU tier's slot, loads copy a CPU slot into the pretend GPU and check the bytes."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        manager = scheduler.connector.connector_scheduler.manager
        self.manager = manager
        self.cpu = manager.primary_tier.get_kv_memoryview().cast("B")
        self.tokens: dict[str, list[int]] = {}
        self.requests: dict[str, Request] = {}
        self.stored_chunks = 0
        self.loaded_blocks: list[tuple[str, int, bool]] = []

    def slot(self, chunk) -> memoryview:
        return self.cpu[int(chunk) * CHUNK_BYTES : (int(chunk) + 1) * CHUNK_BYTES]

    def block_index(self, request_id: str, block_id: int) -> int:
        blocks = self.scheduler.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks[
            request_id
        ]
        return [block.block_id for block in blocks].index(int(block_id))

    def step(self) -> None:
        output = self.scheduler.schedule()
        meta = output.kv_connector_metadata
        done = OffloadingWorkerMetadata()
        for job_id, job in meta.store_jobs.items():
            for gpu_block, cpu_chunk in zip(job.src_spec.block_ids, job.dst_spec.block_ids):
                index = self.block_index(job.req_id, gpu_block)
                self.slot(cpu_chunk)[:] = content(self.tokens[job.req_id], index)
                self.stored_chunks += 1
            done.mark_completed(job_id)
        finished_recving = set()
        for job_id, job in meta.load_jobs.items():
            if not job.sync:
                # As vLLM's worker: an asynchronous load resumes its request.
                finished_recving.add(job.req_id)
            for cpu_chunk, gpu_block in zip(job.src_spec.block_ids, job.dst_spec.block_ids):
                index = self.block_index(job.req_id, gpu_block)
                expected = content(self.tokens[job.req_id], index)
                self.loaded_blocks.append(
                    (job.req_id, index, bytes(self.slot(cpu_chunk)) == expected)
                )
            done.mark_completed(job_id)
        running = list(self.scheduler.running)
        self.scheduler.update_from_output(
            output,
            ModelRunnerOutput(
                req_ids=[request.request_id for request in running],
                req_id_to_index={
                    request.request_id: index for index, request in enumerate(running)
                },
                sampled_token_ids=[[7] for _ in running],
                logprobs=None,
                prompt_logprobs_dict={},
                pooler_output=None,
                kv_connector_output=KVConnectorOutput(
                    finished_recving=finished_recving, kv_connector_worker_meta=done
                ),
            ),
        )

    def run(self, request_id: str, tokens: list[int]) -> None:
        """Runs one request to its end, and the steps after it until vLLM's offloading (and
        kvtier's jobs) have nothing pending."""
        sampling = SamplingParams(max_tokens=2)
        sampling.update_from_generation_config({}, EOS)
        self.tokens[request_id] = tokens
        request = Request(
            request_id=request_id,
            prompt_token_ids=tokens,
            sampling_params=sampling,
            pooling_params=None,
            block_hasher=get_request_block_hasher(BLOCK_TOKENS, sha256),
        )
        self.requests[request_id] = request
        self.scheduler.add_request(request)
        deadline = time.monotonic() + HANG_GUARD_S
        while self.scheduler.requests or self.scheduler.connector.has_pending_push_work():
            assert time.monotonic() < deadline, f"request {request_id} never finished"
            self.step()

    def keys(self, request_id: str) -> list[bytes]:
        """vLLM's offload keys of the request's full blocks (one block per chunk)."""
        hashes = self.requests[request_id].block_hashes[: PROMPT_TOKENS // BLOCK_TOKENS]
        return [make_offload_key(block_hash, 0) for block_hash in hashes]

    def loaded(self, request_id: str) -> list[tuple[int, bool]]:
        return [(index, same) for req, index, same in self.loaded_blocks if req == request_id]


def acquires(cluster: kvtier.LocalCluster) -> float:
    """The objects the nodes' clients acquired so far (each kvtier load acquires), whether
    a node answered them itself or asked the directory."""
    total = 0.0
    for name, address in cluster.metrics_addresses():
        if name == "directory":
            continue
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith("kvtier_lookups_total{") and 'result="hit"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def prompt(seed: int) -> list[int]:
    return [100 + (seed * 7919 + index * 31) % 800 for index in range(PROMPT_TOKENS)]


@pytest.fixture
def node(exe):
    with kvtier.LocalCluster(exe, nodes=1, cpu_pool_bytes=32 * MIB) as cluster:
        yield cluster


def test_the_tier_is_built_by_vllms_factory_from_the_configuration(model_dir, node):
    scheduler = make_scheduler(model_dir, str(node.socket(0)))
    manager = scheduler.connector.connector_scheduler.manager
    [tier] = manager.secondary_tiers
    assert isinstance(tier, KvtierTier)
    assert tier.block_size_bytes == CHUNK_BYTES
    assert tier.namespace_fields["model"] == str(model_dir)
    assert tier.namespace_fields["layers"] == LAYERS
    assert tier.namespace_fields["kv_dtype"] == "float16"
    scheduler.shutdown()


def test_stored_chunks_are_evicted_from_the_cpu_tier_and_found_again_in_kvtier(model_dir, node):
    scheduler = make_scheduler(model_dir, str(node.socket(0)))
    worker = Worker(scheduler)
    first, filler = prompt(1), prompt(2)

    worker.run("first", first)
    assert worker.stored_chunks == CPU_CHUNKS
    # Every chunk went down to kvtier: another client of the node finds them all.
    client = kvtier.Client.connect(node.socket(0))
    namespace = client.register_namespace(**worker.manager.secondary_tiers[0].namespace_fields)
    probes = client.probe(namespace, worker.keys("first"))
    assert [probe.state for probe in probes] == ["hit"] * CPU_CHUNKS
    assert {probe.length for probe in probes} == {CHUNK_BYTES}

    # A different prompt fills vLLM's CPU tier and evicts the first one's chunks.
    worker.run("filler", filler)
    assert worker.stored_chunks == 2 * CPU_CHUNKS

    # The first prompt again: vLLM's CPU tier misses, kvtier hits (promotion, then a load).
    before = acquires(node)
    worker.run("again", list(first))
    assert acquires(node) > before, "kvtier served no load"
    loaded = worker.loaded("again")
    assert loaded, "no block of the repeated prompt was loaded"
    assert all(same for _, same in loaded), f"loaded bytes differ: {loaded}"
    # The whole prompt but its last block (vLLM recomputes the last token's block).
    assert sorted(index for index, _ in loaded) == list(range(len(loaded)))
    assert len(loaded) >= CPU_CHUNKS - 1
    scheduler.shutdown()


def test_two_schedulers_on_two_nodes_share(model_dir, exe):
    with kvtier.LocalCluster(
        exe,
        nodes=2,
        cpu_pool_bytes=16 * MIB,
        cxl_pool_bytes=64 * MIB,
        write_order=["cxl", "cpu"],
    ) as cluster:
        first = Worker(make_scheduler(model_dir, str(cluster.socket(0))))
        second = Worker(make_scheduler(model_dir, str(cluster.socket(1))))
        shared = prompt(3)
        first.run("on-first", shared)
        assert first.stored_chunks == CPU_CHUNKS
        # The second instance never saw the prompt: its CPU tier is empty, kvtier has it.
        before = acquires(cluster)
        second.run("on-second", list(shared))
        assert acquires(cluster) > before, "kvtier served no load"
        loaded = second.loaded("on-second")
        assert len(loaded) >= CPU_CHUNKS - 1, loaded
        assert all(same for _, same in loaded), f"loaded bytes differ: {loaded}"
        first.scheduler.shutdown()
        second.scheduler.shutdown()


def finished(tier: KvtierTier, job_id: int):
    """Polls the tier until vLLM's job `job_id` finished (a hang guard bounds it)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        for result in tier.get_finished_jobs():
            if result.job_id == job_id:
                return result
        assert time.monotonic() < deadline, f"job {job_id} never finished"
        time.sleep(0.001)


def settle(tier: KvtierTier, key: bytes, context) -> LookupResult:
    """Asks as vLLM's scheduler does, step after step, until the answer is not RETRY."""
    deadline = time.monotonic() + HANG_GUARD_S
    while (answer := tier.lookup(key, context)) is LookupResult.RETRY:
        assert time.monotonic() < deadline, "lookup answered RETRY for good"
        tier.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
        time.sleep(0.001)
    return answer


def test_the_tier_answers_retry_while_in_flight_and_never_a_false_hit(model_dir, node):
    scheduler = make_scheduler(model_dir, str(node.socket(0)))
    [tier] = scheduler.connector.connector_scheduler.manager.secondary_tiers
    slots = tier._slots
    context = ReqContext(req_id="direct")
    key = make_offload_key(hashlib.sha256(b"direct").digest(), 0)

    # Unknown: RETRY while the probe is in flight, then MISS.
    assert tier.lookup(key, context) is LookupResult.RETRY
    assert settle(tier, key, context) is LookupResult.MISS

    # A store in flight: RETRY (not the stale MISS), then HIT once the node confirms it.
    slots[0:CHUNK_BYTES] = content([1, 2, 3], 0)
    tier.submit_store(
        TransferJob(
            job_id=1, keys=[key], chunk_ids=np.array([0]), is_promotion=False, req_context=context
        )
    )
    assert tier.lookup(key, context) is LookupResult.RETRY
    assert finished(tier, 1).success
    assert settle(tier, key, context) is LookupResult.HIT

    # A promotion copies the chunk into another slot of vLLM's CPU tier.
    tier.submit_load(
        TransferJob(
            job_id=2, keys=[key], chunk_ids=np.array([3]), is_promotion=True, req_context=context
        )
    )
    assert finished(tier, 2).success
    assert bytes(slots[3 * CHUNK_BYTES : 4 * CHUNK_BYTES]) == content([1, 2, 3], 0)

    # A load of a key kvtier lacks fails and turns its verdict into MISS.
    absent = make_offload_key(hashlib.sha256(b"absent").digest(), 0)
    tier.submit_load(
        TransferJob(
            job_id=3, keys=[absent], chunk_ids=np.array([2]), is_promotion=True, req_context=context
        )
    )
    assert not finished(tier, 3).success
    assert tier.lookup(absent, context) is LookupResult.MISS
    tier.drain_jobs()
    scheduler.shutdown()


def test_the_tier_survives_a_killed_node_and_reconnects(model_dir, node):
    scheduler = make_scheduler(model_dir, str(node.socket(0)))
    [tier] = scheduler.connector.connector_scheduler.manager.secondary_tiers
    context = ReqContext(req_id="restart")
    tier._slots[0:CHUNK_BYTES] = content([4, 5, 6], 0)
    jobs = iter(range(1, 1_000_000))

    def store(name: bytes) -> bool:
        job = next(jobs)
        key = make_offload_key(hashlib.sha256(name).digest(), 0)
        tier.submit_store(
            TransferJob(
                job_id=job,
                keys=[key],
                chunk_ids=np.array([0]),
                is_promotion=False,
                req_context=context,
            )
        )
        return finished(tier, job).success

    assert store(b"before")
    node.kill_node(0)
    # The store fails (vLLM just keeps the chunk in its CPU tier); nothing raises into vLLM.
    assert not store(b"during")
    node.restart_node(0)
    # The tier connects again by itself (at most every RECONNECT_INTERVAL_S).
    deadline = time.monotonic() + HANG_GUARD_S
    while not store(b"after"):
        assert time.monotonic() < deadline, "the tier never reconnected"
        time.sleep(0.05)
    after = make_offload_key(hashlib.sha256(b"after").digest(), 0)
    assert settle(tier, after, context) is LookupResult.HIT
    scheduler.shutdown()
