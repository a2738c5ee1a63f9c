#!/usr/bin/env bash
# Builds the labelled Pydantic AI set (README.md beside this script) and imports it:
#
#   bench/external/pydantic-ai/make-set.sh OUT [--per-variant N] [--seed S]
#
# OUT/otlp/*.json (the runs' OTLP/JSON), OUT/labels.jsonl, OUT/references/*.json and
# OUT/references.jsonl (second healthy runs), OUT/manifest.json and OUT/store.sqlite.
# PATHFINDER names the binary (default: target/release/pathfinder).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 OUT [--per-variant N] [--seed S]" >&2; exit 2; }
out=$(realpath -m "$1"); shift
pathfinder=$(realpath "${PATHFINDER:-$repo/target/release/pathfinder}")
cache=${QA_AGENT_CACHE:-$HOME/.cache/pathfinder/qa-agent}

# 1. The wheels from PyPI, every one hash-checked: the only step that uses the network.
python3 -m pip download -q --no-deps --require-hashes -r "$here/requirements.lock" -d "$cache/wheels"
# 2. A virtual environment installed from them alone.
if [ ! -x "$cache/venv/bin/python" ]; then
    python3 -m venv "$cache/venv"
    "$cache/venv/bin/pip" install -q --no-index --find-links "$cache/wheels" \
        --require-hashes -r "$here/requirements.lock"
fi
# 3. The runs, in a network namespace with loopback only: the scripted model server and the
#    agent talk over 127.0.0.1, and nothing the framework tries (a tokeniser download, a
#    telemetry upload) can leave the machine.
unshare --net -- bash -c 'ip link set lo up && exec "$@"' runs \
    "$cache/venv/bin/python" "$here/make_set.py" --pathfinder "$pathfinder" --out "$out" "$@"
# 4. The traces into a store, as a user imports theirs.
"$pathfinder" traces import "$out"/otlp/*.json "$out"/references/*.json --db "$out/store.sqlite" --format otlp
echo "labelled set: $out/store.sqlite with $out/labels.jsonl"
