#!/usr/bin/env bash
# Runs every benchmark in release mode and prints their JSON reports, one per line.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked
kvtier=target/release/kvtier
"$kvtier" bench directory --in-process --json
"$kvtier" bench directory --json
"$kvtier" bench data --json
"$kvtier" bench cxl --json
"$kvtier" bench replicate --json
"$kvtier" sim --seeds 200 --steps 20000 --json
for capacity in 1000 3000 10000 30000; do
    "$kvtier" replay --capacity "$capacity" --json
done
"$kvtier" replay --tiers dram=1000,cxl=3000,ssd=30000 --json
# The trace against a running cluster (about a minute), beside its in-process replay.
"$kvtier" replay --capacity 1000 --live --json
