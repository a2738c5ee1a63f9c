//! How fast this machine can decode one row at all: the ceiling memory bandwidth puts on
//! SmolLM2-135M's decoding in f32, measured on the model's own weight shapes with no model
//! around them — so a decode figure from `benches/throughput.rs` (ours) or from PyTorch can be
//! read as a share of what the machine allows (BENCHMARKS.md, "Model: what bounds decoding").
//!
//! A token reads every weight once: 30 layers of q, k, v, o and the three MLP projections
//! (576 → 576, 192, 192, 576, 1536, 1536 and 1536 → 576) and the tied LM head (576 → 49,152),
//! 538 MB in f32, in 211 matrix–vector products. Printed:
//! - the machine: CPU model, L3 size, logical CPUs, the SIMD the products can use;
//! - plain read bandwidth (a sum over 1 GiB) on one thread;
//! - tokens/s of the 211 products one after another on one thread;
//! - the same products split over rayon's pool (`--threads`, default 2) from a thread outside
//!   the pool (what decoding does now: each product hands its job over and waits to be woken)
//!   and from a thread of the pool (the caller takes part and the pool is still awake).
//!
//! `cargo bench -p model --bench decode_bound [-- --threads 2 --repeats 10]`

use std::time::Instant;

use rayon::prelude::*;

/// (rows, columns) of each product of one SmolLM2-135M token, in order.
fn shapes() -> Vec<(usize, usize)> {
    let mut s = Vec::new();
    for _ in 0..30 {
        s.extend([
            (576, 576),
            (192, 576),
            (192, 576),
            (576, 576),
            (1536, 576),
            (1536, 576),
            (576, 1536),
        ]);
    }
    s.push((49_152, 576));
    s
}

/// One dot product per row of `w`, 16 partial sums (the shape of `frozen::skinny`'s one-row
/// path).
fn rows(x: &[f32], w: &[f32], out: &mut [f32], k: usize) {
    for (wj, o) in w.chunks_exact(k).zip(out.iter_mut()) {
        let mut acc = [0f32; 16];
        for (a, b) in x.chunks_exact(16).zip(wj.chunks_exact(16)) {
            for l in 0..16 {
                acc[l] += a[l] * b[l];
            }
        }
        *o = acc.iter().sum();
    }
}

fn cpu_line(key: &str) -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: usize| {
        argv.iter()
            .position(|a| a == name)
            .and_then(|i| argv.get(i + 1))
            .map(|v| v.parse().expect("a number"))
            .unwrap_or(default)
    };
    let threads = flag("--threads", 2);
    let repeats = flag("--repeats", 10);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .expect("rayon's global pool");
    let simd = [
        ("avx512f", is_x86_feature_detected!("avx512f")),
        ("avx2", is_x86_feature_detected!("avx2")),
        ("fma", is_x86_feature_detected!("fma")),
    ]
    .iter()
    .filter(|(_, on)| *on)
    .map(|(n, _)| *n)
    .collect::<Vec<_>>()
    .join(" ");
    println!(
        "machine: {} | L3 {} | {} logical CPUs | {simd} | pool of {threads} threads",
        cpu_line("model name"),
        cpu_line("cache size"),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );

    let big = vec![1f32; 256 << 20];
    let sum = |v: &[f32]| v.iter().fold(0f32, |a, b| a + b);
    std::hint::black_box(sum(&big));
    let t = Instant::now();
    std::hint::black_box(
        big.chunks(1 << 16)
            .map(|c| {
                let mut acc = [0f32; 16];
                for ch in c.chunks_exact(16) {
                    for l in 0..16 {
                        acc[l] += ch[l];
                    }
                }
                acc.iter().sum::<f32>()
            })
            .sum::<f32>(),
    );
    let read = (big.len() * 4) as f64 / t.elapsed().as_secs_f64() / 1e9;
    drop(big);
    println!("read bandwidth, one thread: {read:.1} GB/s");

    let shapes = shapes();
    let weights: Vec<Vec<f32>> = shapes
        .iter()
        .map(|&(n, k)| (0..n * k).map(|i| (i % 7) as f32 * 0.1).collect())
        .collect();
    let bytes: usize = shapes.iter().map(|&(n, k)| n * k * 4).sum();
    let x = vec![0.01f32; 1536];
    let mut outs: Vec<Vec<f32>> = shapes.iter().map(|&(n, _)| vec![0f32; n]).collect();
    let one_thread = |outs: &mut Vec<Vec<f32>>| {
        for (i, &(_, k)) in shapes.iter().enumerate() {
            rows(&x[..k], &weights[i], &mut outs[i], k);
        }
    };
    let split = |outs: &mut Vec<Vec<f32>>| {
        for (i, &(_, k)) in shapes.iter().enumerate() {
            outs[i].par_chunks_mut(64).enumerate().for_each(|(c, o)| {
                rows(
                    &x[..k],
                    &weights[i][c * 64 * k..(c * 64 + o.len()) * k],
                    o,
                    k,
                )
            });
        }
    };
    // The caller computes its share of the rows while the pool computes the rest: the pool's
    // wake-up is hidden behind the caller's own work.
    let shared = |outs: &mut Vec<Vec<f32>>| {
        let threads = rayon::current_num_threads().max(1);
        for (i, &(n, k)) in shapes.iter().enumerate() {
            let own = (n / threads).div_ceil(64) * 64;
            let (mine, rest) = outs[i].split_at_mut(own.min(n));
            let w = &weights[i];
            rayon::in_place_scope(|s| {
                s.spawn(|_| {
                    rest.par_chunks_mut(64).enumerate().for_each(|(c, o)| {
                        let start = own + c * 64;
                        rows(&x[..k], &w[start * k..(start + o.len()) * k], o, k)
                    })
                });
                rows(&x[..k], &w[..mine.len() * k], mine, k);
            });
        }
    };
    println!(
        "{} products, {:.0} MB of f32 weights a token; tokens/s (GB/s of weights read), best of {repeats}:",
        shapes.len(),
        bytes as f64 / 1e6
    );
    let mut time = |name: &str, f: &mut dyn FnMut(&mut Vec<Vec<f32>>)| {
        f(&mut outs);
        let best = (0..repeats)
            .map(|_| {
                let t = Instant::now();
                f(&mut outs);
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        println!(
            "  {name}: {:.1} tokens/s ({:.1} GB/s)",
            1.0 / best,
            bytes as f64 / best / 1e9
        );
    };
    time("one thread, one product after another", &mut |o| {
        one_thread(o)
    });
    time("split over the pool from a thread outside it", &mut |o| {
        split(o)
    });
    time(
        "the caller computes its share, the pool the rest",
        &mut |o| shared(o),
    );
    // `rayon::scope` runs its body on a thread of the pool.
    time("split over the pool from one of its threads", &mut |o| {
        rayon::scope(|_| split(o))
    });

    // Prefill and training are matrix–matrix products: candle's CPU matmul (the `gemm`
    // crate) on a prefill's shapes, for comparison with a BLAS on the same machine.
    use candle_core::{Device, Tensor};
    println!("candle matmul (gemm crate), f32, GFLOP/s, best of {repeats}:");
    for (m, k, n) in [(512, 576, 1536), (512, 1536, 576), (512, 576, 576)] {
        let a = Tensor::ones((m, k), candle_core::DType::F32, &Device::Cpu).expect("a");
        let b = Tensor::ones((k, n), candle_core::DType::F32, &Device::Cpu).expect("b");
        // As the model multiplies: by a weight stored (out, in), read transposed in place.
        let w = Tensor::ones((n, k), candle_core::DType::F32, &Device::Cpu).expect("w");
        let wt = w.t().expect("a transposed view");
        let gflops = |b: &Tensor| {
            let best = (0..repeats + 1)
                .map(|_| {
                    let t = Instant::now();
                    std::hint::black_box(a.matmul(b).expect("matmul"));
                    t.elapsed().as_secs_f64()
                })
                .skip(1)
                .fold(f64::INFINITY, f64::min);
            2.0 * (m * k * n) as f64 / best / 1e9
        };
        println!(
            "  {m}x{k} by {k}x{n}: {:.0}; by a {n}x{k} weight transposed in place: {:.0}",
            gflops(&b),
            gflops(&wt)
        );
    }
}
