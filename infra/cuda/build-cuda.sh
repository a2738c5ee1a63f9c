#!/usr/bin/env bash
# Runs a command with NVIDIA's CUDA 13.0 toolkit taken from PyPI, so that candle's `cuda`
# backend builds on a machine with no CUDA installed. The target is the GPU check's card
# (H100/H200: compute capability 9.0, driver 580 or newer).
#
#   infra/cuda/build-cuda.sh cargo build --release -p pathfinder --features cuda
#   infra/cuda/build-cuda.sh          # only prepare the toolkit
#
# 1. Fetches the toolkit's wheels with pip, each pinned to a version and to the SHA-256 of its
#    Linux wheel (x86_64 or aarch64; `--require-hashes` refuses anything else), and unpacks
#    them as zip files (nothing is pip-installed) under $CUDA_PREFIX/site. $CUDA_PREFIX defaults
#    to .cuda at the repository's root, which git ignores. About 650 MiB of wheels, 1.2 GB
#    unpacked, once; a change to the pins below fetches again.
# 2. Gives the libraries the unversioned names the linker asks for (the wheels ship only
#    libNAME.so.N).
# 3. Builds a stub libcuda.so with soname libcuda.so.1, for linking only: the driver library is
#    in no wheel. Its symbols are the driver API functions that cudarc (candle's CUDA binding, at
#    the version Cargo.lock pins) declares; `cargo fetch` brings cudarc's source if it is not in
#    the cargo cache yet. The real libcuda.so.1 comes with the GPU machine's driver.
# 4. Sets CUDA_HOME, CUDA_PATH and CUDA_ROOT, puts nvcc on PATH and the libraries and the stub on
#    LIBRARY_PATH, sets CUDA_COMPUTE_CAP (90 unless already set), and runs the command.
#
# The first build takes 7-15 minutes on 2 cores (candle-kernels compiles its CUDA sources for
# the compute capability). A binary built this way needs, where it runs, the driver and
# libcudart.so.13, libcublas.so.13, libcublasLt.so.13 and libcurand.so.10 on LD_LIBRARY_PATH:
# bench/gpu-check.sh finds them among the GPU machine's PyTorch wheels; elsewhere carry
# $CUDA_PREFIX/site/nvidia/cu13/lib along or use an installed CUDA 13.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
prefix=${CUDA_PREFIX:-$root/.cuda}
site=$prefix/site
cu=$site/nvidia/cu13

# name==version, then the SHA-256 of its manylinux x86_64 wheel and of its aarch64 wheel (PyPI).
pins='
nvidia-cuda-nvcc==13.0.88 --hash=sha256:56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03 --hash=sha256:c7ff28f86a24effdc6c034fa15230c549a273e4771b10a7fec14996f8cf3307f
nvidia-nvvm==13.0.88 --hash=sha256:c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0 --hash=sha256:c4376a291d72d22a315d9d2f69bdae8f8cd83a627f75bad395cee49a0fe65dc1
nvidia-cuda-crt==13.0.88 --hash=sha256:2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4 --hash=sha256:ee2ea2a97073e02ee62bb27841f437332be2c248e3eac013df07997ada39c003
nvidia-cuda-cccl==13.0.85 --hash=sha256:e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649 --hash=sha256:6f0203e29fed809ee2b7fe9b1344df66ecab990c37d6a2e0e189b26d6c97ed7c
nvidia-cuda-runtime==13.0.96 --hash=sha256:7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548 --hash=sha256:ef9bcbe90493a2b9d810e43d249adb3d02e98dd30200d86607d8d02687c43f55
nvidia-cuda-nvrtc==13.0.88 --hash=sha256:ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575 --hash=sha256:d27f20a0ca67a4bb34268a5e951033496c5b74870b868bacd046b1b8e0c3267b
nvidia-curand==10.4.0.35 --hash=sha256:1aee33a5da6e1db083fe2b90082def8915f30f3248d5896bcec36a579d941bfc --hash=sha256:133df5a7509c3e292aaa2b477afd0194f06ce4ea24d714d616ff36439cee349a
nvidia-cublas==13.0.2.14 --hash=sha256:0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c --hash=sha256:17165c296de689662b96e0ef4f21dfbff3092ff00d0e3e59470f5acb08c0f87d
'

say() { echo "build-cuda: $*" >&2; }
die() { say "$*"; exit 1; }

# 1. The toolkit, fetched again whenever the pins change.
stamp=$prefix/pins.sha256
want=$(printf '%s' "$pins" | sha256sum | cut -d' ' -f1)
if [ ! -x "$cu/bin/nvcc" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "fetching the CUDA 13.0 toolkit wheels (hash-checked) into $prefix"
    rm -rf "$site" "$prefix/wheels"
    mkdir -p "$prefix/wheels" "$site"
    printf '%s' "$pins" >"$prefix/wheels/requirements.txt"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
        --dest "$prefix/wheels" -r "$prefix/wheels/requirements.txt"
    for wheel in "$prefix"/wheels/*.whl; do
        python3 -m zipfile -e "$wheel" "$site"
    done
    rm -rf "$prefix/wheels"
    [ -f "$cu/bin/nvcc" ] || die "the wheels did not unpack to $cu/bin/nvcc"
    # zip files keep no permission bits: make the tools executable.
    find "$cu/bin" "$cu/nvvm/bin" -type f -exec chmod u+x {} + 2>/dev/null || true
    echo "$want" >"$stamp"
fi

# 2. Unversioned names for the linker.
for lib in cudart nvrtc curand cublas cublasLt; do
    versioned=$(find "$cu/lib" -maxdepth 1 -name "lib$lib.so.*" | sort | head -n 1) || true
    [ -n "$versioned" ] || die "no lib$lib.so.N in $cu/lib"
    ln -sf "$(basename "$versioned")" "$cu/lib/lib$lib.so"
done

# 3. The link-time stand-in for the driver.
stub=$cu/lib/stubs/libcuda.so
if [ ! -f "$stub" ]; then
    command -v gcc >/dev/null || die "gcc is needed to build the libcuda stub"
    version=$(awk '$0 == "name = \"cudarc\"" { getline; gsub(/"/, "", $3); print $3; exit }' "$root/Cargo.lock")
    [ -n "$version" ] || die "cudarc is not in $root/Cargo.lock"
    registry=${CARGO_HOME:-$HOME/.cargo}/registry/src
    find_sys() {
        find "$registry" -maxdepth 5 -path "*/cudarc-$version/src/driver/sys" -type d 2>/dev/null |
            head -n 1 || true
    }
    sys=$(find_sys)
    if [ -z "$sys" ]; then
        say "fetching cudarc $version's source (cargo fetch)"
        cargo fetch --locked --manifest-path "$root/Cargo.toml" >/dev/null
        sys=$(find_sys)
    fi
    [ -n "$sys" ] || die "cudarc $version's source is not under $registry"
    mkdir -p "$(dirname "$stub")"
    grep -rhoE '\bfn cu[A-Z][A-Za-z0-9_]*' "$sys" | awk '{ print "void " $2 "(void) {}" }' |
        sort -u >"$cu/lib/stubs/libcuda.c"
    [ -s "$cu/lib/stubs/libcuda.c" ] || die "no driver functions found in $sys"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub" "$cu/lib/stubs/libcuda.c"
fi

# 4. The environment candle's build scripts read.
export CUDA_HOME=$cu CUDA_PATH=$cu CUDA_ROOT=$cu
export PATH=$cu/bin:$cu/nvvm/bin:$PATH
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
export LIBRARY_PATH=$cu/lib:$cu/lib/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}
if [ $# -eq 0 ]; then
    say "CUDA 13.0 toolkit ready at $cu (compute capability $CUDA_COMPUTE_CAP); give a command to run with it"
    exit 0
fi
exec "$@"
