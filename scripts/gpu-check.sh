#!/usr/bin/env bash
# The vLLM integration on a GPU: what the CPU-only tests (python/tests/test_vllm.py) cannot
# show, because there vLLM's GPU<->CPU copy worker is stood in for. On a host with an NVIDIA
# GPU and vLLM 0.33.0 it runs the real engine (a tiny Llama with random weights, so no
# download) with OffloadingConnector + TieringOffloadingSpec + KvtierTier against a local
# kvtier cluster of two nodes sharing a CXL pool, and checks:
#   1. greedy outputs with kvtier equal those of the same engine without offloading;
#   2. a prompt evicted from vLLM's CPU tier comes back from kvtier (kvtier acquires grow, and
#      vLLM's external prefix-cache hits do) with the same output;
#   3. a second engine on the second node hits what the first one stored.
# Prints one JSON object and exits non-zero when a check fails.
# Needs the package index for scripts/python-env (or KVTIER_VENV pointing at a made one).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${KVTIER_VENV:-$(scripts/python-env | tail -n 1)}"
cargo build --release --locked --bin kvtier
export KVTIER_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/kvtier"
(
    cd python
    VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="${KVTIER_PYTHON_TARGET:-$PWD/target}" \
        "$venv/bin/maturin" develop --release --quiet
)
exec "$venv/bin/python" - <<'PYTHON'
import gc, json, os, sys, tempfile, urllib.request
import kvtier
from vllm import LLM, SamplingParams

BLOCK = 16
model = tempfile.mkdtemp(prefix="kvtier-gpu-model-")
with open(os.path.join(model, "config.json"), "w") as f:
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
               "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8,
               "num_key_value_heads": 4, "num_hidden_layers": 4, "vocab_size": 4096,
               "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
               "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}, f)
# Bytes of one block: K and V, 4 layers, 4 KV heads of 64, bfloat16.
chunk = 2 * 4 * 4 * 64 * 2 * BLOCK
prompts = {name: [100 + (seed * 7919 + i * 31) % 3900 for i in range(8 * BLOCK)]
           for seed, name in enumerate(["shared", "filler1", "filler2", "filler3"])}
greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

def engine(socket=None):
    extra = {}
    if socket is not None:
        extra["kv_transfer_config"] = {
            "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "TieringOffloadingSpec",
                # One prompt's worth: each filler evicts what came before.
                "cpu_bytes_to_use": 8 * chunk,
                "secondary_tiers": [{"type": "KvtierTier", "module_path": "kvtier.vllm",
                                     "socket": socket, "revision": "gpu-check"}]}}
    return LLM(model=model, load_format="dummy", seed=0, skip_tokenizer_init=True,
               enforce_eager=True, gpu_memory_utilization=0.25, enable_prefix_caching=False,
               max_model_len=1024, block_size=BLOCK, **extra)

def run(llm, name):
    [out] = llm.generate([{"prompt_token_ids": prompts[name]}], greedy, use_tqdm=False)
    return list(out.outputs[0].token_ids)

def acquires(cluster):
    address = dict(cluster.metrics_addresses())["directory"]
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith("kvtier_requests_total{") and 'op="acquire"' in l)

def close(llm):
    del llm
    gc.collect()

report = {}
baseline = engine()
expected = run(baseline, "shared")
close(baseline)
with kvtier.LocalCluster(os.environ["KVTIER_BIN"], nodes=2, cpu_pool_bytes=256 << 20,
                         cxl_pool_bytes=512 << 20, write_order=["cxl", "cpu"]) as cluster:
    first = engine(str(cluster.socket(0)))
    report["first_matches_baseline"] = run(first, "shared") == expected
    for name in ("filler1", "filler2", "filler3"):
        run(first, name)
    before = acquires(cluster)
    report["after_eviction_matches"] = run(first, "shared") == expected
    report["kvtier_acquires_on_repeat"] = acquires(cluster) - before
    close(first)
    second = engine(str(cluster.socket(1)))
    before = acquires(cluster)
    report["second_node_matches"] = run(second, "shared") == expected
    report["kvtier_acquires_on_second_node"] = acquires(cluster) - before
    close(second)
ok = all(report[k] for k in ("first_matches_baseline", "after_eviction_matches",
                             "second_node_matches")) \
    and report["kvtier_acquires_on_repeat"] > 0 and report["kvtier_acquires_on_second_node"] > 0
report["ok"] = ok
print(json.dumps(report))
sys.exit(0 if ok else 1)
PYTHON
