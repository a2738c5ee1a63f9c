#!/usr/bin/env bash
# Runs a sharded corpus generation on Kubernetes: applies the Indexed Job of shards, waits for
# every index to complete, then applies the merge and waits for it. Needs kubectl pointed at
# the cluster and the pathfinder-corpora claim (ReadWriteMany) in the namespace.
#
#   bash infra/kubernetes/corpus.sh [NAMESPACE]
set -euo pipefail
cd "$(dirname "$0")"
ns=(--namespace "${1:-default}")

kubectl "${ns[@]}" apply -f corpus-shards.yaml
kubectl "${ns[@]}" wait --for=condition=complete --timeout=48h job/pathfinder-corpus-shards
kubectl "${ns[@]}" apply -f corpus-merge.yaml
kubectl "${ns[@]}" wait --for=condition=complete --timeout=6h job/pathfinder-corpus-merge
kubectl "${ns[@]}" logs job/pathfinder-corpus-merge | tail -n 3
