#!/usr/bin/env python3
"""One line saying where a benchmark ran: CPU model, cores and threads, caches, the SIMD the
kernels can use, and what the model's kernels choose on it."""
import os
import re
import subprocess


def cpuinfo(key):
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def lscpu(key):
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown"
    m = re.search(rf"^{re.escape(key)}:\s*(.+)$", text, re.M)
    return m.group(1).strip() if m else "unknown"


flags = set(cpuinfo("flags").split())
simd = [f for f in ("avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "avx2", "fma") if f in flags]
gemm = "AVX-512 (gemm x86-v4)" if "avx512f" in flags else ("AVX2+FMA" if {"avx2", "fma"} <= flags else "scalar")
skinny = "AVX2+FMA" if {"avx2", "fma"} <= flags else "portable"
print(
    f"machine: {cpuinfo('model name')}; {os.cpu_count()} logical CPUs "
    f"({lscpu('Thread(s) per core')} thread(s) per core); L2 {lscpu('L2 cache')}, L3 {lscpu('L3 cache')}; "
    f"hypervisor {lscpu('Hypervisor vendor')}; SIMD {' '.join(simd) or 'none'}; "
    f"kernels: GEMM {gemm}, few-row products {skinny}\n"
)
