#!/usr/bin/env bash
# Submits a sharded corpus generation to Slurm: an array of N shard tasks (corpus.sbatch),
# then the merge (corpus-merge.sbatch), which starts only when every shard has succeeded.
# Run it from the repository root; the arguments after N go to `corpus generate`.
#
#   SHARDS_DIR=/shared/c0.shards OUT=/shared/c0 bash infra/slurm/corpus.sh 8 --tasks 12 --seed 0
#
# Prints the two job ids. If a shard fails, the merge is cancelled (--kill-on-invalid-dep):
# run the same command again; shards already complete are read back, not redone.
set -euo pipefail
cd "$(dirname "$0")/../.."

n=${1:?usage: corpus.sh N [corpus generate flags…]}
shift
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "corpus.sh: N must be a positive count, got $n" >&2; exit 2; }
: "${SHARDS_DIR:=runs/corpus.shards}"
: "${OUT:=runs/corpus}"
export SHARDS_DIR OUT

array=$(sbatch --parsable --array="1-$n" infra/slurm/corpus.sbatch "$@")
array=${array%%;*}
merge=$(sbatch --parsable --dependency="afterok:$array" --kill-on-invalid-dep=yes \
    --export="ALL,SHARDS=$n" infra/slurm/corpus-merge.sbatch)
echo "shards: job $array (array 1-$n into $SHARDS_DIR); merge: job ${merge%%;*} into $OUT"
