#!/usr/bin/env bash
# Runs the Rust bench and the PyTorch reference on the same weights and thread count,
# interleaved (Rust, PyTorch, Rust, PyTorch, ... for --rounds rounds, default 3) so that drift
# on a shared machine hits both sides, then prints where it ran and the BENCHMARKS.md table:
# the median of the rounds with their range, and ratios (>1 = Rust faster).
#   bench/run.sh [--rounds N] [extra args passed to both, e.g. --threads 2 --repeats 3]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3
args=()
while (($#)); do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
out=$(mktemp -d)
cargo bench -p model --bench throughput --no-run 2>/dev/null
for round in $(seq "$rounds"); do
    echo "round $round of $rounds: pathfinder" >&2
    cargo bench -p model --bench throughput -- "${args[@]}" > "$out/rust-$round.json"
    echo "round $round of $rounds: PyTorch" >&2
    python3 bench/pytorch_reference.py "${args[@]}" > "$out/torch-$round.json"
done
python3 bench/machine.py
python3 bench/table.py --rust "$out"/rust-*.json --torch "$out"/torch-*.json
