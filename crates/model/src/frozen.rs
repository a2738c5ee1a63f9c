//! `y = x·Wᵀ` for a frozen weight `W`, differentiable in `x` only.
//!
//! candle's matmul backward computes both operands' gradients whenever the product is on a
//! path to a trained variable. For a LoRA update that means every frozen projection (and the
//! 49,152 × 576 LM head) pays a second GEMM, `xᵀ·∂y`, whose result is thrown away: a third of
//! the projections' work in a training step. Here the weight lives inside the op, not among its
//! arguments, so backward has nothing to compute for it and does one GEMM, `∂x = ∂y·W`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Storage, Tensor};

/// The op behind [`frozen_matmul`]; holds `W` of shape `(out, in)`.
struct FrozenMatmul {
    weight: Tensor,
}

impl FrozenMatmul {
    /// `x·Wᵀ` on one backend's storage: `x` is `(m, in)` under `layout`, `w` is `W`'s storage.
    fn product<S: BackendStorage>(
        &self,
        x: &S,
        layout: &Layout,
        w: &S,
        w_layout: &Layout,
    ) -> candle_core::Result<(S, Shape)> {
        let (out, inp) = self.weight.dims2()?;
        let (m, k) = layout.shape().dims2()?;
        if k != inp {
            candle_core::bail!(
                "frozen matmul: input has {k} features, the weight expects {inp} (weight {out}x{inp})"
            );
        }
        // `W` viewed as `(in, out)`: the same transposed layout `x.matmul(&w.t())` passes.
        let wt = w_layout.transpose(0, 1)?;
        Ok((
            x.matmul(w, (1, m, out, k), layout, &wt)?,
            Shape::from((m, out)),
        ))
    }
}

impl CustomOp1 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (w, w_layout) = self.weight.storage_and_layout();
        let Storage::Cpu(w) = &*w else {
            candle_core::bail!("frozen matmul: input on the CPU, weight elsewhere");
        };
        self.product(storage, layout, w, w_layout)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (w, w_layout) = self.weight.storage_and_layout();
        let Storage::Cuda(w) = &*w else {
            candle_core::bail!("frozen matmul: input on a CUDA device, weight elsewhere");
        };
        self.product(storage, layout, w, w_layout)
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        // ∂x = ∂y·W: (m, out) × (out, in).
        Ok(Some(grad_res.matmul(&self.weight)?))
    }
}

/// `x·Wᵀ` with `W` of shape `(out, in)` treated as a constant: the same values as
/// `x.matmul(&w.t())`, and a backward pass that computes only `x`'s gradient. `x` may have any
/// number of leading axes.
pub(crate) fn frozen_matmul(x: &Tensor, weight: &Tensor) -> candle_core::Result<Tensor> {
    if !x.track_op() {
        // Nothing will be differentiated: the plain product (and its fast paths) will do.
        // candle's CUDA matmul refuses a row-strided input (the last position of each row of
        // a batch, say), which the CPU's GEMM takes as it is.
        let x = if x.device().is_cpu() || x.is_contiguous() {
            x.clone()
        } else {
            x.contiguous()?
        };
        return match x.rank() {
            2 => x.matmul(&weight.t()?),
            _ => x.broadcast_matmul(&weight.t()?),
        };
    }
    let dims = x.dims();
    let Some((&k, lead)) = dims.split_last() else {
        candle_core::bail!("frozen matmul: a scalar input");
    };
    let m: usize = lead.iter().product();
    let x2 = x.reshape((m, k))?;
    // The op owns its weight; a contiguous copy keeps its layout the one the kernels expect.
    let weight = weight.detach().contiguous()?;
    let (out, _) = weight.dims2()?;
    let y = x2.apply_op1(FrozenMatmul { weight })?;
    let mut shape = lead.to_vec();
    shape.push(out);
    y.reshape(shape)
}

/// `x·Wᵀ` for the inference path, which records no gradient: products of a few rows on the
/// CPU (decoding) take [`skinny`], the rest [`frozen_matmul`]. The training path keeps to the
/// GEMM, so that a pass with and without an adapter rounds the same way.
pub(crate) fn inference_matmul(x: &Tensor, weight: &Tensor) -> candle_core::Result<Tensor> {
    match skinny::product(x, weight)? {
        Some(y) => Ok(y),
        None => frozen_matmul(x, weight),
    }
}

/// `x·Wᵀ` for a few rows of `x` on the CPU (decoding: one row per conversation), reading each
/// row of `W` once for all of them.
///
/// With the GEMM's AVX-512 kernels compiled in (see this crate's Cargo.toml) a training step
/// ran 1.36x faster, but decoding — products of one to eight rows — 20–45% slower than with
/// its AVX2 kernels (BENCHMARKS.md). Decoding is bound by reading the weights, so a dot
/// product per (row, column) that streams each row of `W` once beats both there.
mod skinny {
    use candle_core::{DType, Tensor};
    use rayon::prelude::*;

    /// Products of at most this many rows take this path.
    pub(super) const MAX_ROWS: usize = 16;
    /// Output columns per parallel task.
    const COLUMNS: usize = 64;

    /// `Some(x·Wᵀ)` when this path applies (CPU, f32, at most [`MAX_ROWS`] rows), else `None`.
    pub(super) fn product(x: &Tensor, weight: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let dims = x.dims();
        let Some((&k, lead)) = dims.split_last() else {
            return Ok(None);
        };
        let m: usize = lead.iter().product();
        if !x.device().is_cpu()
            || x.dtype() != DType::F32
            || weight.dtype() != DType::F32
            || m == 0
            || m > MAX_ROWS
        {
            return Ok(None);
        }
        let (n, wk) = weight.dims2()?;
        if wk != k {
            candle_core::bail!("frozen matmul: input has {k} features, the weight expects {wk}");
        }
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        let w = weight.contiguous()?;
        let (storage, layout) = w.storage_and_layout();
        let candle_core::Storage::Cpu(cpu) = &*storage else {
            return Ok(None);
        };
        let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg("frozen matmul: weight not contiguous".into())
        })?;
        let ws = &cpu.as_slice::<f32>()?[start..end];
        let yt = columns_then_rows(&xs, ws, m, n, k);
        // yt is (n, m); the result is (m, n).
        let mut y = vec![0f32; m * n];
        for (j, col) in yt.chunks_exact(m).enumerate() {
            for (i, &v) in col.iter().enumerate() {
                y[i * n + j] = v;
            }
        }
        let mut shape = lead.to_vec();
        shape.push(n);
        Ok(Some(Tensor::from_vec(y, shape, x.device())?))
    }

    /// `(x·Wᵀ)ᵀ` as `(n, m)`: each task takes [`COLUMNS`] rows of `W` and dots each with every
    /// row of `x`.
    ///
    /// Called from a thread outside rayon's pool (decoding), the caller computes its own share
    /// of the rows while the pool computes the rest, instead of handing everything over and
    /// sleeping until a worker wakes it: the wake-up is hidden behind the caller's work, and
    /// one more thread streams the weights. On the 2-core KVM machines a token's bare products
    /// ran 1.3x faster (`benches/decode_bound.rs`) and decoding 1.03–1.16x (BENCHMARKS.md,
    /// issue 59). The caller runs nothing
    /// but its own share (a thread outside the pool never steals the pool's jobs while it
    /// waits), so no other work can enter it.
    fn columns_then_rows(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        let mut yt = vec![0f32; n * m];
        let threads = rayon::current_num_threads();
        if rayon::current_thread_index().is_some() || threads < 2 || n < 2 * COLUMNS {
            blocks(x, w, &mut yt, m, k, 0);
            return yt;
        }
        // At most half the rows (rounded up to a task), since n >= 2 * COLUMNS and threads >= 2.
        let own = (n / threads).div_ceil(COLUMNS) * COLUMNS;
        let (mine, rest) = yt.split_at_mut(own * m);
        rayon::in_place_scope(|s| {
            s.spawn(|_| blocks(x, w, rest, m, k, own));
            block_dispatch(x, &w[..own * k], mine, m, k);
        });
        yt
    }

    /// The rows of `(x·Wᵀ)ᵀ` from row `first` of `W` on, into `yt`, [`COLUMNS`] rows a task.
    fn blocks(x: &[f32], w: &[f32], yt: &mut [f32], m: usize, k: usize, first: usize) {
        yt.par_chunks_mut(m * COLUMNS)
            .enumerate()
            .for_each(|(c, block)| {
                let start = first + c * COLUMNS;
                let w = &w[start * k..(start + block.len() / m) * k];
                block_dispatch(x, w, block, m, k)
            });
    }

    fn block_dispatch(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize) {
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the processor has both features, checked just above.
            unsafe { block_avx2(x, w, out, m, k) };
            return;
        }
        block(x, w, out, m, k)
    }

    /// [`block`] with AVX2 and FMA (8 lanes), chosen at run time: rows of `x` four at a time
    /// against each row of `W` (see [`four_rows_avx2`]), the rest as in [`block`].
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block_avx2(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize) {
        let whole = m / 4 * 4;
        for (wj, outs) in w.chunks_exact(k).zip(out.chunks_exact_mut(m)) {
            for (xs, os) in x[..whole * k]
                .chunks_exact(4 * k)
                .zip(outs[..whole].chunks_exact_mut(4))
            {
                // SAFETY: AVX2 and FMA are enabled on this function; `xs` holds four rows of
                // `k` and `wj` one.
                let dots = unsafe { four_rows_avx2(xs, wj, k) };
                os.copy_from_slice(&dots);
            }
            for (xi, o) in x[whole * k..].chunks_exact(k).zip(outs[whole..].iter_mut()) {
                *o = dot(xi, wj);
            }
        }
    }

    /// Four dot products of one row of `W` with four rows of `x`, 16 features a step: each
    /// load of `W` serves four rows, and eight independent accumulators keep both FMA units
    /// busy. The plain [`dot`] per (row, column) has two vector accumulators, so at eight rows
    /// decoding waited on the adds' latency rather than on the weights (BENCHMARKS.md).
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn four_rows_avx2(xs: &[f32], wj: &[f32], k: usize) -> [f32; 4] {
        #[cfg(target_arch = "x86")]
        use std::arch::x86::*;
        #[cfg(target_arch = "x86_64")]
        use std::arch::x86_64::*;
        assert!(xs.len() == 4 * k && wj.len() == k);
        let wide = k / 16 * 16;
        let mut acc = [_mm256_setzero_ps(); 8];
        let (wp, xp) = (wj.as_ptr(), xs.as_ptr());
        let mut p = 0;
        while p < wide {
            // SAFETY: p + 16 <= wide <= k, so every load below reads inside `wj` and inside
            // row r of `xs` (which starts at r·k).
            unsafe {
                let wa = _mm256_loadu_ps(wp.add(p));
                let wb = _mm256_loadu_ps(wp.add(p + 8));
                for r in 0..4 {
                    let row = xp.add(r * k + p);
                    acc[2 * r] = _mm256_fmadd_ps(_mm256_loadu_ps(row), wa, acc[2 * r]);
                    acc[2 * r + 1] =
                        _mm256_fmadd_ps(_mm256_loadu_ps(row.add(8)), wb, acc[2 * r + 1]);
                }
            }
            p += 16;
        }
        let mut dots = [0f32; 4];
        for (r, d) in dots.iter_mut().enumerate() {
            let mut lanes = [0f32; 8];
            // SAFETY: `lanes` holds eight f32.
            unsafe {
                _mm256_storeu_ps(
                    lanes.as_mut_ptr(),
                    _mm256_add_ps(acc[2 * r], acc[2 * r + 1]),
                )
            };
            let row = &xs[r * k..(r + 1) * k];
            let tail: f32 = row[wide..]
                .iter()
                .zip(&wj[wide..])
                .map(|(a, b)| a * b)
                .sum();
            *d = lanes.iter().sum::<f32>() + tail;
        }
        dots
    }

    #[inline(always)]
    fn block(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize) {
        for (wj, outs) in w.chunks_exact(k).zip(out.chunks_exact_mut(m)) {
            for (xi, o) in x.chunks_exact(k).zip(outs.iter_mut()) {
                *o = dot(xi, wj);
            }
        }
    }

    /// A dot product with 16 independent partial sums, so the compiler keeps them in vector
    /// registers (a single running sum would be a serial chain of adds).
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0f32; 16];
        let mut ca = a.chunks_exact(16);
        let mut cb = b.chunks_exact(16);
        for (x, y) in (&mut ca).zip(&mut cb) {
            for l in 0..16 {
                acc[l] += x[l] * y[l];
            }
        }
        let tail: f32 = ca
            .remainder()
            .iter()
            .zip(cb.remainder())
            .map(|(x, y)| x * y)
            .sum();
        acc.iter().sum::<f32>() + tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::max_abs_diff;
    use candle_core::{DType, Device, Var};

    fn diff(a: &Tensor, b: &Tensor) -> f32 {
        max_abs_diff(a, b).unwrap()
    }

    #[test]
    fn a_few_rows_on_the_cpu_match_the_plain_product() {
        let dev = Device::Cpu;
        // 70 columns: one full task of 64 and a short one, all on the pool; 333 columns: the
        // calling thread's share (192) and the pool's (two full tasks and a short one); 150
        // features: nine 16-wide chunks of partial sums and a tail. Called from the test's
        // thread (outside the pool) and from a thread of the pool.
        for columns in [70, 333] {
            let w = Tensor::randn(0f32, 1.0, (columns, 150), &dev).unwrap();
            for rows in [1, 3, 4, 7, skinny::MAX_ROWS] {
                let x = Tensor::randn(0f32, 1.0, (1, rows, 150), &dev).unwrap();
                let plain = x.broadcast_matmul(&w.t().unwrap()).unwrap();
                let outside = inference_matmul(&x, &w).unwrap();
                let inside = rayon::scope(|_| inference_matmul(&x, &w).unwrap());
                for ours in [outside, inside] {
                    assert_eq!(ours.dims(), &[1, rows, columns]);
                    assert!(
                        diff(&ours, &plain) < 1e-4,
                        "{rows} rows, {columns} columns: {}",
                        diff(&ours, &plain)
                    );
                }
            }
        }
        let w = Tensor::randn(0f32, 1.0, (70, 150), &dev).unwrap();
        // More rows than the path takes go to the GEMM; a row-strided input is read as it is.
        let x = Tensor::randn(0f32, 1.0, (skinny::MAX_ROWS + 1, 150), &dev).unwrap();
        assert!(skinny::product(&x, &w).unwrap().is_none());
        let wide = Tensor::randn(0f32, 1.0, (4, 300), &dev).unwrap();
        let strided = wide.narrow(1, 0, 150).unwrap();
        let ours = inference_matmul(&strided, &w).unwrap();
        let plain = strided
            .contiguous()
            .unwrap()
            .matmul(&w.t().unwrap())
            .unwrap();
        assert!(diff(&ours, &plain) < 1e-4);
    }

    #[test]
    fn matches_the_plain_product_forward_and_backward() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (5, 7), &dev).unwrap();
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (2, 3, 7), &dev).unwrap()).unwrap();
        let probe = Tensor::randn(0f32, 1.0, (2, 3, 5), &dev).unwrap();

        let plain = x.as_tensor().broadcast_matmul(&w.t().unwrap()).unwrap();
        let frozen = frozen_matmul(x.as_tensor(), &w).unwrap();
        assert_eq!(frozen.dims(), &[2, 3, 5]);
        assert!(diff(&plain, &frozen) < 1e-5);

        let g_plain = (plain * &probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g_frozen = (frozen * &probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let (a, b) = (
            g_plain.get(x.as_tensor()).unwrap(),
            g_frozen.get(x.as_tensor()).unwrap(),
        );
        assert!(
            diff(a, b) < 1e-5,
            "input gradients differ by {}",
            diff(a, b)
        );
        // The weight is a constant: no gradient is computed for it.
        assert!(g_frozen.get(&w).is_none());
    }

    #[test]
    fn untracked_inputs_take_the_plain_product() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (4, 6), &dev).unwrap();
        let x = Tensor::randn(0f32, 1.0, (3, 6), &dev).unwrap();
        let y = frozen_matmul(&x, &w).unwrap();
        assert!(diff(&y, &x.matmul(&w.t().unwrap()).unwrap()) < 1e-6);
    }

    #[test]
    fn a_feature_count_mismatch_is_an_error() {
        let dev = Device::Cpu;
        let w = Tensor::zeros((4, 6), DType::F32, &dev).unwrap();
        let x = Var::zeros((3, 5), DType::F32, &dev).unwrap();
        let err = frozen_matmul(x.as_tensor(), &w).unwrap_err().to_string();
        assert!(err.contains("5 features"), "{err}");
    }
}
