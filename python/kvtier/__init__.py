"""kvtier: a distributed KV-cache tier for LLM inference, from Python.

Connect to the local kvtier node, register the namespace of your model's KV state, then
store and load buffers by key. Copies go straight between your buffers (bytearray,
memoryview, numpy arrays, CPU torch tensors) and the node's shared-memory pools, with the
GIL released::

    import kvtier
    client = kvtier.Client.connect("/tmp/kvtier-.../node-0.sock")
    ns = client.register_namespace(model="m", revision="r", kv_dtype="bfloat16",
                                   layers=32, kv_heads=8, head_dim=128, block_tokens=16)
    client.store(ns, key, buffer)                # "stored" ... or "skipped" (no room)
    hits = client.load_into(ns, [key], [out])    # [True]
    with client.load(ns, [key]) as views:        # leased read-only memoryviews
        ...

A skipped store is a status, not an error; failures raise `KvtierError` subclasses.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from ._kvtier import (
    JOBS_INFLIGHT_MAX,
    BatchTooLarge,
    Busy,
    Client,
    KvtierError,
    LeaseExpired,
    Loaded,
    LocalCluster,
    Namespace,
    NodeRun,
    NodeUnreachable,
    PoolError,
    Probe,
    Refused,
    SsdPin,
    prefix_digest,
)

__all__ = [
    "JOBS_INFLIGHT_MAX",
    "BatchTooLarge",
    "Busy",
    "Client",
    "KvtierError",
    "LeaseExpired",
    "Loaded",
    "LocalCluster",
    "Namespace",
    "NodeRun",
    "NodeUnreachable",
    "PoolError",
    "Probe",
    "Refused",
    "SsdPin",
    "as_buffer",
    "find_executable",
    "prefix_digest",
]


def find_executable() -> Path:
    """The `kvtier` executable: `$KVTIER_BIN`, else `kvtier` on the PATH, else the `kvtier`
    script this package installed beside the running interpreter (an environment used
    without being activated).

    Raises FileNotFoundError naming them when none is there.
    """
    named = os.environ.get("KVTIER_BIN")
    if named:
        path = Path(named)
        if not path.is_file():
            raise FileNotFoundError(f"KVTIER_BIN={named} is not a file")
        return path
    found = shutil.which("kvtier")
    if found is None:
        beside = Path(sys.executable).parent / "kvtier"
        if beside.is_file() and os.access(beside, os.X_OK):
            return beside
        raise FileNotFoundError(
            "no kvtier executable: set KVTIER_BIN or put kvtier on the PATH "
            "(cargo build --release builds target/release/kvtier)"
        )
    return Path(found)


def as_buffer(value):
    """A buffer kvtier can copy into or out of without another copy.

    A CPU torch tensor becomes a flat uint8 numpy view of its memory (it must be
    contiguous); anything else (bytes, bytearray, memoryview, numpy arrays) is returned as it
    is. torch is imported only when a tensor is given.
    """
    module = type(value).__module__
    if module.startswith("torch"):
        if value.device.type != "cpu":
            raise ValueError(f"a {value.device.type} tensor: kvtier copies CPU memory only")
        if not value.is_contiguous():
            raise ValueError("the tensor is not contiguous: kvtier copies contiguous memory")
        import torch

        return value.reshape(-1).view(torch.uint8).numpy()
    return value
