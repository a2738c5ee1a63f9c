#!/usr/bin/env bash
# The GPU check: the model's CUDA tests against the CPU, the throughput bench against PyTorch on
# the same GPU in the same run (f32 and bf16), a short LoRA fit whose loss must fall, and
# `pathfinder train` itself on the GPU (one step of rl/data-parallel-smoke.toml: live agents,
# investigations and a PPO update of both adapters). It writes the files BENCHMARKS.md takes its
# figures from.
#
#   bench/gpu-check.sh pack                       here: build the CUDA binaries, fill .gpu/ (ignored)
#   bench/gpu-check.sh stage                      there: keep .gpu/weights/part-1 in /tmp
#   bench/gpu-check.sh run OUT [cuda|cpu] [PHASE]   on the GPU machine (cuda), or here (cpu)
#
# PHASE is `all` (the default), `tests` (the CUDA tests alone: they need no weights), `bench`
# (the benchmarks and the fit) or `train` (`pathfinder train`, one step; needs python3 for the
# agents). With the device tool the check takes two calls, because the
# GGUF does not fit in one and a call keeps nothing the previous one carried into the tree:
# the first carries .gpu/weights/part-1 and runs `stage`, which copies it out of the tree; the
# second, at once (the machine stays warm for 30 s), carries .gpu/bin, .gpu/wheels,
# .gpu/weights/part-2 and .gpu/weights/SHA256 and runs `run OUT` (about 4 minutes on an H200).
#
# `pack` needs infra/cuda/build-cuda.sh (the CUDA 13.0 toolkit from PyPI, hash-pinned; it fetches
# it on first use) and the SmolLM2 GGUF in the model cache
# (`pathfinder model fetch smollm2-135m`). It leaves in .gpu/:
#   bin/cuda-tests.xz, bin/throughput.xz   crates/model/tests/cuda.rs and the throughput bench
#   bin/pathfinder.xz                       the CLI built with --features cuda
#   weights/part-1, weights/part-2          the GGUF, split: it is larger than one device call
#                                           carries (64 MiB); part-1 is its first 58 MiB
#   weights/SHA256                          its checksum, verified after joining the parts
#   wheels/                                 gguf, which transformers' GGUF loader needs
#
# `run OUT cpu` goes through the same steps on this machine's CPU with cargo's builds and a small
# batch (the model's CPU gradient tests stand in for the CUDA ones), so the script is tested
# end to end where no GPU is lent. Every step runs even when an earlier one fails; the exit
# status is that of the first failure.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf
cache=${PATHFINDER_CACHE:-$HOME/.cache/pathfinder}
gguf=$cache/models/smollm2-135m/$gguf_name

stage_dir=/tmp/gpu-check-stage

die() { echo "gpu-check: $*" >&2; exit 2; }

# The first part of the weights, out of the tree, where the next device call still finds it.
stage() {
    [ -f .gpu/weights/part-1 ] || die "no .gpu/weights/part-1 here: carry it"
    mkdir -p "$stage_dir" && cp .gpu/weights/part-1 "$stage_dir/" && ls -l "$stage_dir"
}

# with_gpu_peak FILE COMMAND...: runs COMMAND while sampling the GPU's memory in use every
# 0.2 s, and writes the peak (MiB, the whole card as nvidia-smi reports it) to FILE.
with_gpu_peak() {
    local peak_file=$1
    shift
    : >"$peak_file"
    (
        m=0
        while :; do
            u=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1)
            [ -n "$u" ] && [ "$u" -gt "$m" ] && m=$u && echo "$m" >"$peak_file"
            sleep 0.2
        done
    ) &
    local poller=$! rc
    "$@"
    rc=$?
    kill "$poller" 2>/dev/null
    wait "$poller" 2>/dev/null
    return "$rc"
}

# Adds "gpu_peak_mib" to a bench JSON result in place.
add_peak() {
    python3 - "$1" "$2" <<'PY'
import json, sys
path, peak = sys.argv[1], sys.argv[2]
try:
    result = json.load(open(path))
except (OSError, ValueError):
    sys.exit(0)  # the step failed; its log says why
result["gpu_peak_mib"] = int(peak) if peak.strip() else None
json.dump(result, open(path, "w"))
PY
}

pack() {
    set -e
    [ -f "$gguf" ] || die "no $gguf: run \`pathfinder model fetch smollm2-135m\` first"
    local build=$root/infra/cuda/build-cuda.sh
    [ -x "$build" ] || die "no $build (the CUDA toolkit wrapper)"
    export CARGO_TARGET_DIR=$root/target/cuda
    "$build" cargo bench -p model --features cuda --bench throughput --no-run
    "$build" cargo test --release -p model --features cuda --test cuda --no-run
    "$build" cargo build --release -p pathfinder --features cuda
    rm -rf .gpu && mkdir -p .gpu/bin .gpu/weights .gpu/wheels
    # The newest of each binary cargo built (cargo names them with a hash).
    local bench tests
    bench=$(ls -t target/cuda/release/deps/throughput-* | grep -v '\.d$' | head -n 1)
    tests=$(ls -t target/cuda/release/deps/cuda-* | grep -v '\.d$' | head -n 1)
    strip -o .gpu/bin/throughput "$bench" && xz -T0 -6 .gpu/bin/throughput
    strip -o .gpu/bin/cuda-tests "$tests" && xz -T0 -6 .gpu/bin/cuda-tests
    strip -o .gpu/bin/pathfinder target/cuda/release/pathfinder && xz -T0 -6 .gpu/bin/pathfinder
    # part-1 travels alone; part-2 with the binaries and the wheel.
    local first=$((58 << 20))
    head -c "$first" "$gguf" >.gpu/weights/part-1
    tail -c +"$((first + 1))" "$gguf" >.gpu/weights/part-2
    sha256sum "$gguf" | cut -d' ' -f1 >.gpu/weights/SHA256
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 -d .gpu/wheels gguf==0.19.0
    du -sh .gpu/bin/* .gpu/weights/* .gpu/wheels/*
    echo "packed .gpu/ (see this script's head for the two device calls)"
}

# Directories holding the driver (libcuda.so.1) and the CUDA 13 runtime libraries candle
# links, looked for where the driver and PyTorch's wheels put them.
cuda_library_path() {
    local places=(/usr/local/nvidia /usr/local/cuda /usr/lib/x86_64-linux-gnu)
    read -r -a sites < <(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
    places+=("${sites[@]}")
    local dirs=() lib found
    for lib in libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10; do
        found=$(find "${places[@]}" -name "$lib" 2>/dev/null | head -n 1)
        if [ -n "$found" ]; then dirs+=("$(dirname "$found")"); else echo "gpu-check: $lib not found" >&2; fi
    done
    printf '%s\n' "${dirs[@]}" | awk '!seen[$0]++' | paste -sd:
}

run() {
    local out=$1 device=${2:-cuda} phase=${3:-all} status=0
    case $phase in all | tests | bench | train) ;; *) die "PHASE is all, tests, bench or train, not $phase" ;; esac
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    local log=$out/log
    step() { # step NAME COMMAND...: runs, logs, remembers the first failure
        local name=$1
        shift
        echo "== $name" | tee -a "$log"
        local t0=$SECONDS
        "$@" 2>&1 | tee -a "$log"
        local rc=${PIPESTATUS[0]}
        echo "== $name: exit $rc in $((SECONDS - t0)) s" | tee -a "$log"
        [ "$rc" -ne 0 ] && [ "$status" -eq 0 ] && status=$rc
        return 0
    }
    : >"$log"
    local bench tests common=()
    if [ "$device" = cuda ]; then
        step "machine" sh -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"'
        LD_LIBRARY_PATH=$(cuda_library_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export LD_LIBRARY_PATH
        echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" | tee -a "$log"
        if [ -d .gpu/wheels ] && ! python3 -c 'import gguf' 2>/dev/null; then
            python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/gpu-check-site .gpu/wheels/*.whl
            export PYTHONPATH=/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}
        fi
        if [ "$phase" != tests ] && [ ! -f "$gguf" ]; then
            mkdir -p "$(dirname "$gguf")"
            local first=.gpu/weights/part-1
            [ -f "$first" ] || first=$stage_dir/part-1
            cat "$first" .gpu/weights/part-2 >"$gguf.partial" || die "the weight parts are not both here (stage part-1 first)"
            [ "$(sha256sum "$gguf.partial" | cut -d' ' -f1)" = "$(cat .gpu/weights/SHA256)" ] ||
                die "the joined GGUF does not match .gpu/weights/SHA256"
            mv "$gguf.partial" "$gguf"
        fi
        mkdir -p /tmp/gpu-check-bin
        for b in throughput cuda-tests pathfinder; do
            [ -f ".gpu/bin/$b.xz" ] || continue
            python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
                ".gpu/bin/$b.xz" "/tmp/gpu-check-bin/$b" && chmod +x "/tmp/gpu-check-bin/$b"
        done
        cli=/tmp/gpu-check-bin/pathfinder
        bench=/tmp/gpu-check-bin/throughput
        tests=(/tmp/gpu-check-bin/cuda-tests --test-threads 1)
        common=(--device cuda --threads "$(nproc)" --repeats 5 --decode 64 --decode-batches 1,8,32
            --batch 8 --seq 512 --micro-batch 8 --check-cpu --fit-steps 30)
    else
        step "machine" sh -c 'nproc; free -g | head -n 2'
        cargo bench -p model --bench throughput --no-run --message-format=json 2>/dev/null |
            python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "throughput" and m.get("executable"): print(m["executable"])' >"$out/.bench-path"
        bench=$(tail -n 1 "$out/.bench-path")
        rm -f "$out/.bench-path"
        [ -x "$bench" ] || die "the throughput bench did not build"
        tests=(cargo test --release -p model --test lora --test ops)
        cargo build --release -p pathfinder 2>&1 | tail -n 1
        cli=target/release/pathfinder
        common=(--device cpu --threads "$(nproc)" --repeats 2 --prefill 128 --decode 8 --decode-batches 1,4
            --batch 2 --seq 64 --micro-batch 2 --fit-steps 6)
    fi
    case $phase in all | tests) step "model tests ($device against the CPU)" "${tests[@]}" ;; esac
    local dtypes=(f32)
    [ "$device" = cuda ] && dtypes=(f32 bf16)
    case $phase in tests | train) dtypes=() ;; esac
    for dt in ${dtypes[@]+"${dtypes[@]}"}; do
        local gpu=()
        [ "$device" = cuda ] && gpu=(with_gpu_peak "$out/.peak")
        step "pathfinder-model $dt" ${gpu[@]+"${gpu[@]}"} sh -c '"$@" >"'"$out/rust-$dt.json"'"' _ "$bench" --gguf "$gguf" "${common[@]}" --dtype "$dt"
        [ "$device" = cuda ] && add_peak "$out/rust-$dt.json" "$(cat "$out/.peak")"
        local torch_args=()
        for a in "${common[@]}"; do
            case $a in --check-cpu) ;; *) torch_args+=("$a") ;; esac
        done
        # The reference takes no fit or micro-batch flags of its own; it ignores those.
        step "pytorch $dt" ${gpu[@]+"${gpu[@]}"} sh -c 'python3 bench/pytorch_reference.py "$@" >"'"$out/torch-$dt.json"'"' _ \
            --gguf "$gguf" "${torch_args[@]}" --dtype "$dt"
        [ "$device" = cuda ] && add_peak "$out/torch-$dt.json" "$(cat "$out/.peak")"
    done
    rm -f "$out/.peak"
    if [ "$phase" = all ] || [ "$phase" = train ]; then
        # One step of self-play on this device: the agents run on the CPU, the model where
        # the build puts it (the log's first lines say which).
        rm -rf "$out/runs"
        local gpu=()
        [ "$device" = cuda ] && gpu=(with_gpu_peak "$out/.peak")
        step "pathfinder train (1 step)" ${gpu[@]+"${gpu[@]}"} env PATHFINDER_LOG=info "$cli" train --root . \
            --config rl/data-parallel-smoke.toml --runs-dir "$out/runs" --run check --max-steps 1
        [ -f "$out/.peak" ] && echo "train: GPU memory peak $(cat "$out/.peak") MiB" | tee -a "$log"
        rm -f "$out/.peak"
        cp "$out/runs/check/metrics.jsonl" "$out/train-metrics.jsonl" 2>/dev/null
        rm -rf "$out/runs"
    fi
    {
        echo "# GPU check ($device), $(date -u +%Y-%m-%dT%H:%MZ)"
        echo
        for dt in ${dtypes[@]+"${dtypes[@]}"}; do
            echo "## $dt"
            echo
            python3 bench/table.py "$out/rust-$dt.json" "$out/torch-$dt.json" || echo "(no table: a side failed)"
            echo
        done
        if grep -qE '^test |test result' "$log"; then
            echo "## model tests"
            echo
            grep -E '^test |test result' "$log" | sed 's/^/    /'
            echo
        fi
        if [ -f "$out/train-metrics.jsonl" ]; then
            echo "## pathfinder train"
            echo
            grep -E 'GPU memory peak|pathfinder train \(1 step\): exit' "$log" | sed 's/^/    /'
            sed 's/^/    /' "$out/train-metrics.jsonl"
            echo
        fi
        echo "exit status of the first failing step: $status"
    } >"$out/summary.md"
    cat "$out/summary.md"
    return "$status"
}

case ${1:-} in
    pack) pack ;;
    stage) stage ;;
    run) [ $# -ge 2 ] || die "usage: bench/gpu-check.sh run OUT [cuda|cpu] [all|tests|bench|train]"; run "$2" "${3:-cuda}" "${4:-all}" ;;
    *) die "usage: bench/gpu-check.sh pack | stage | run OUT [cuda|cpu] [all|tests|bench|train]" ;;
esac
