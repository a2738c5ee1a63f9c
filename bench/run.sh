#!/usr/bin/env bash
# Runs the Rust bench and the PyTorch reference back to back on the same weights and thread
# count, then prints the BENCHMARKS.md table with ratios (Rust / PyTorch; >1 = Rust faster).
#   bench/run.sh [extra args passed to both, e.g. --threads 2 --repeats 3]
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
cargo bench -p model --bench throughput -- "$@" > "$out/rust.json"
python3 bench/pytorch_reference.py "$@" > "$out/torch.json"
python3 bench/table.py "$out/rust.json" "$out/torch.json"
