//! Fused, differentiable CPU kernels for the training path, each with its own backward.
//!
//! candle's fused kernels (softmax, RMSNorm, RoPE) record no gradient, so the training path
//! used to spell them out as compositions: a masked attention softmax was an add, a max, a
//! subtraction, an exp, a sum and a division, each a fresh `(batch, heads, t, t)` tensor, and
//! backward allocated as many again. Each op here makes one output in one pass over its rows
//! and computes its gradient in one more:
//!
//! | op | forward | backward |
//! |---|---|---|
//! | [`masked_softmax`] | `y = softmax(s + m)` | `∂s = y ⊙ (g − Σ g⊙y)` |
//! | [`log_softmax`] | `y = x − log Σ eˣ` | `∂x = g − eʸ Σ g` |
//! | [`rms_norm`] | `y = w ⊙ x·r`, `r = (mean x² + ε)^-½` | `∂x = r·gw − x·r³·mean(gw⊙x)`, `gw = g⊙w` |
//! | [`rope`] | rotate each half-pair by `(cos θ, sin θ)` | rotate `g` back by `(cos θ, −sin θ)` |
//! | [`rope_to_heads`] | the same, written `(b, heads, t, d)`, times `c` | `g` rotated back, `(b, t, heads, d)`, times `c` |
//! | [`token_logprobs`] | `y = log softmax(h·Eᵀ)[target]`, logits in row chunks | `∂h = (g·(onehot − p))·E`, logits made again |
//! | [`swiglu`] | `y = silu(a) ⊙ b` | `∂a = g⊙b⊙σ(a)(1 + a(1 − σ(a)))`, `∂b = g⊙silu(a)` |
//! | [`lora_linear`] | `y = x·Wᵀ + b + s·(x·Aᵀ)·Bᵀ` | `∂x = g·W + s·(g·B)·A`, `∂A = s·(g·B)ᵀ·x`, `∂B = s·gᵀ·(x·Aᵀ)` |
//!
//! [`lora_linear`] matters most: candle's backward gives every node of the graph a zeroed gradient
//! buffer and adds into it, so the five nodes of a composed LoRA projection (frozen product,
//! two small products, scale, sum) cost five activation-sized buffers and as many passes in
//! each direction; fused, it is one node with one input gradient.
//!
//! The additive mask of [`masked_softmax`], the norm's weight, RoPE's tables, the LM head of
//! [`token_logprobs`] and the frozen weight and bias of [`lora_linear`] are constants of a LoRA
//! update (frozen or computed from positions), so they get no gradient, in the manner of
//! [`crate::frozen`]. Only f32 and f64 on the CPU are implemented ([`available`]); the model
//! falls back to the compositions elsewhere (bf16, CUDA). `tests/ops.rs` checks every op and its
//! gradient against the composition it replaces and against finite differences.

use candle_core::backend::BackendStorage;
use candle_core::Storage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Device, Layout, Shape};
use candle_core::{Result, Tensor};
use num_traits::Float;
use rayon::prelude::*;

/// Whether these kernels run for tensors of `dtype` on `device`.
pub fn available(device: &Device, dtype: DType) -> bool {
    device.is_cpu() && matches!(dtype, DType::F32 | DType::F64)
}

/// The contiguous slice of `data` that `layout` describes, or an error naming `what`.
fn contiguous<'a, T>(data: &'a [T], layout: &Layout, op: &str, what: &str) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("{op}: {what} must be contiguous"),
    }
}

/// Length of the last axis, refusing a 0-d tensor.
fn last_dim(layout: &Layout, op: &str) -> Result<usize> {
    match layout.dims().last() {
        Some(&n) if n > 0 => Ok(n),
        _ => candle_core::bail!("{op}: needs a non-empty last axis, got {:?}", layout.dims()),
    }
}

/// Runs `$body` with `$T` bound to the element type of `$storage` (f32 or f64), binding each
/// listed storage to its slice.
macro_rules! with_float {
    ($op:expr, $first:expr, |$T:ident; $($s:ident),+| $body:expr) => {
        match $first {
            CpuStorage::F32(_) => {
                // Some kernels name the type, others let inference find it.
                #[allow(dead_code)]
                type $T = f32;
                $(let CpuStorage::F32($s) = $s else {
                    candle_core::bail!("{}: arguments of different dtypes", $op)
                };)+
                $body
            }
            CpuStorage::F64(_) => {
                #[allow(dead_code)]
                type $T = f64;
                $(let CpuStorage::F64($s) = $s else {
                    candle_core::bail!("{}: arguments of different dtypes", $op)
                };)+
                $body
            }
            other => candle_core::bail!("{}: only f32 and f64, got {:?}", $op, candle_core::backend::BackendStorage::dtype(other)),
        }
    };
}

/// A new buffer as long as `inputs[0]`, filled one row of `n` at a time, rows in parallel:
/// `f(row index, output row, the inputs' rows)`.
fn map_rows<T, const K: usize>(
    n: usize,
    inputs: [&[T]; K],
    f: impl Fn(usize, &mut [T], [&[T]; K]) + Sync,
) -> Vec<T>
where
    T: Copy + Default + Send + Sync,
{
    let mut out = vec![T::default(); inputs[0].len()];
    out.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        f(i, row, inputs.map(|x| &x[i * n..(i + 1) * n]));
    });
    out
}

/// A kernel's result as candle's storage, shaped like `layout`.
fn stored<T: candle_core::WithDType>(out: Vec<T>, layout: &Layout) -> Result<(CpuStorage, Shape)> {
    Ok((
        candle_core::WithDType::to_cpu_storage_owned(out),
        layout.shape().clone(),
    ))
}

/// Makes a tensor contiguous only when it is not (a view costs nothing to pass through).
fn dense(t: &Tensor) -> Result<Tensor> {
    if t.is_contiguous() {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

// ---------------------------------------------------------------------------------------------
// Masked softmax over the last axis

/// `softmax(scores + mask)` over the last axis, differentiable in `scores`.
///
/// `scores` is `(batch, heads, queries, keys)`; `mask` is `(batch, 1, queries, keys)`, added to
/// every head (0 where a key may be attended, a large negative number where not). Scores may
/// also come as `(batch, kv_heads, group · queries, keys)` — grouped-query attention with the
/// heads that share a key folded into the rows, the same memory — since a row's query is its
/// index modulo `queries` either way.
pub fn masked_softmax(scores: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (b, _, rows, k) = scores.dims4()?;
    let (mb, one, q, mk) = mask.dims4()?;
    if mb != b || one != 1 || mk != k || q == 0 || rows % q != 0 {
        candle_core::bail!(
            "masked softmax: mask {:?} does not fit scores {:?}",
            mask.dims(),
            scores.dims()
        );
    }
    dense(scores)?.apply_op2(&dense(&mask.to_dtype(scores.dtype())?)?, MaskedSoftmax)
}

struct MaskedSoftmax;

impl CustomOp2 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "masked-softmax"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (_, heads, rows, k) = l1.shape().dims4()?;
        let (_, _, q, _) = l2.shape().dims4()?;
        with_float!(op, s1, |T; s1, s2| {
            let scores = contiguous(s1, l1, op, "scores")?;
            let mask = contiguous(s2, l2, op, "mask")?;
            let out = map_rows(k, [scores], |row, y, [s]| {
                // The mask has one row per (batch, query).
                let (batch, query) = (row / (heads * rows), row % q);
                let m = &mask[(batch * q + query) * k..][..k];
                let mut max = T::neg_infinity();
                for ((y, &s), &m) in y.iter_mut().zip(s).zip(m) {
                    *y = s + m;
                    max = max.max(*y);
                }
                let mut sum = 0 as T;
                for y in y.iter_mut() {
                    *y = (*y - max).exp();
                    sum += *y;
                }
                let inv = 1 as T / sum;
                y.iter_mut().for_each(|y| *y *= inv);
            });
            stored(out, l1)
        })
    }

    fn bwd(
        &self,
        _scores: &Tensor,
        _mask: &Tensor,
        probs: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = dense(grad)?.apply_op2_no_bwd(probs, &SoftmaxBackward)?;
        Ok((Some(grad), None))
    }
}

/// `∂x = y ⊙ (g − Σ g⊙y)` per row, from the upstream gradient `g` (first argument) and the
/// softmax's output `y` (second).
struct SoftmaxBackward;

impl CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "softmax-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let n = last_dim(l1, op)?;
        with_float!(op, s1, |T; s1, s2| {
            let g = contiguous(s1, l1, op, "gradient")?;
            let y = contiguous(s2, l2, op, "output")?;
            let out = map_rows(n, [g, y], |_, dx, [g, y]| {
                let dot: T = g.iter().zip(y).map(|(&g, &y)| g * y).sum();
                for ((dx, &g), &y) in dx.iter_mut().zip(g).zip(y) {
                    *dx = y * (g - dot);
                }
            });
            stored(out, l1)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Log-softmax over the last axis

/// `x − log Σ exp(x)` over the last axis, differentiable in `x`.
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    dense(x)?.apply_op1(LogSoftmax)
}

struct LogSoftmax;

impl CustomOp1 for LogSoftmax {
    fn name(&self) -> &'static str {
        "log-softmax"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let n = last_dim(l1, op)?;
        with_float!(op, s1, |T; s1| {
            let x = contiguous(s1, l1, op, "input")?;
            let out = map_rows(n, [x], |_, y, [x]| {
                let shift = log_sum_exp(x);
                for (y, &x) in y.iter_mut().zip(x) {
                    *y = x - shift;
                }
            });
            stored(out, l1)
        })
    }

    fn bwd(&self, _x: &Tensor, logp: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(
            dense(grad)?.apply_op2_no_bwd(logp, &LogSoftmaxBackward)?,
        ))
    }
}

/// `∂x = g − exp(y) Σ g` per row, from `g` (first argument) and the log-softmax `y` (second).
struct LogSoftmaxBackward;

impl CustomOp2 for LogSoftmaxBackward {
    fn name(&self) -> &'static str {
        "log-softmax-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let n = last_dim(l1, op)?;
        with_float!(op, s1, |T; s1, s2| {
            let g = contiguous(s1, l1, op, "gradient")?;
            let y = contiguous(s2, l2, op, "output")?;
            let out = map_rows(n, [g, y], |_, dx, [g, y]| {
                let total: T = g.iter().copied().sum();
                for ((dx, &g), &y) in dx.iter_mut().zip(g).zip(y) {
                    *dx = g - y.exp() * total;
                }
            });
            stored(out, l1)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

/// `w ⊙ x / sqrt(mean(x²) + eps)` over the last axis, differentiable in `x`; `weight` (the
/// norm's frozen scale, one value per feature) gets no gradient.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let n = x.dim(candle_core::D::Minus1)?;
    if weight.dims() != [n] {
        candle_core::bail!(
            "rms norm: weight {:?} does not fit {n} features",
            weight.dims()
        );
    }
    dense(x)?.apply_op2(&dense(&weight.to_dtype(x.dtype())?)?, RmsNorm { eps })
}

struct RmsNorm {
    eps: f64,
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let n = last_dim(l1, op)?;
        with_float!(op, s1, |T; s1, s2| {
            let x = contiguous(s1, l1, op, "input")?;
            let w = contiguous(s2, l2, op, "weight")?;
            let eps = self.eps as T;
            let out = map_rows(n, [x], |_, y, [x]| {
                let r = inv_rms(x, eps);
                for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
                    *y = x * r * w;
                }
            });
            stored(out, l1)
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dx = x.apply_op3_no_bwd(weight, &dense(grad)?, &RmsNormBackward { eps: self.eps })?;
        Ok((Some(dx), None))
    }
}

/// `1 / sqrt(mean(x²) + eps)` of one row.
fn inv_rms<T: Float + std::iter::Sum>(x: &[T], eps: T) -> T {
    let n = T::from(x.len()).expect("a row length is a float");
    let mean_sq = x.iter().map(|&v| v * v).sum::<T>() / n;
    (mean_sq + eps).sqrt().recip()
}

/// `∂x` of [`rms_norm`] from `x`, `w` and `g`.
struct RmsNormBackward {
    eps: f64,
}

impl CustomOp3 for RmsNormBackward {
    fn name(&self) -> &'static str {
        "rms-norm-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let n = last_dim(l1, op)?;
        with_float!(op, s1, |T; s1, s2, s3| {
            let x = contiguous(s1, l1, op, "input")?;
            let w = contiguous(s2, l2, op, "weight")?;
            let g = contiguous(s3, l3, op, "gradient")?;
            let eps = self.eps as T;
            let out = map_rows(n, [x, g], |_, dx, [x, g]| {
                let r = inv_rms(x, eps);
                // mean(g ⊙ w ⊙ x), the part of the gradient that flows through r.
                let proj: T = x.iter().zip(g).zip(w).map(|((&x, &g), &w)| g * w * x).sum::<T>()
                    / (n as T);
                let c = proj * r * r * r;
                for (((dx, &x), &g), &w) in dx.iter_mut().zip(x).zip(g).zip(w) {
                    *dx = r * g * w - x * c;
                }
            });
            stored(out, l1)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// RoPE, half-split ("rotate half") form, on (batch, seq, heads, head_dim)

/// Rotary position embedding in the half-split form Llama and Qwen2 use: for each head the pair
/// `(x[i], x[i + d/2])` is rotated by the angle whose `(cos, sin)` the tables hold.
///
/// `x` is `(batch, seq, heads, head_dim)` — the layout a projection's output reshapes to, so no
/// transpose is copied first — and `cos`, `sin` are `(batch, seq, head_dim / 2)`.
/// Differentiable in `x`; the tables get no gradient.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (b, t, _, d) = x.dims4()?;
    if d % 2 != 0 || cos.dims() != [b, t, d / 2] || sin.dims() != [b, t, d / 2] {
        candle_core::bail!(
            "rope: tables {:?} and {:?} do not fit input {:?}",
            cos.dims(),
            sin.dims(),
            x.dims()
        );
    }
    let cos = dense(&cos.to_dtype(x.dtype())?)?;
    let sin = dense(&sin.to_dtype(x.dtype())?)?;
    dense(x)?.apply_op3(&cos, &sin, Rope { inverse: false })
}

/// Rotates by `+θ` (forward) or `−θ` (`inverse`, the backward: the rotation's transpose).
struct Rope {
    inverse: bool,
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "rope-thd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (_, _, heads, d) = l1.shape().dims4()?;
        let half = d / 2;
        let sign = if self.inverse { -1.0 } else { 1.0 };
        with_float!(op, s1, |T; s1, s2, s3| {
            let x = contiguous(s1, l1, op, "input")?;
            let cos = contiguous(s2, l2, op, "cos")?;
            let sin = contiguous(s3, l3, op, "sin")?;
            let sign = sign as T;
            // One row per token: its heads share the token's angles.
            let out = map_rows(heads * d, [x], |token, y, [x]| {
                let c = &cos[token * half..][..half];
                let s = &sin[token * half..][..half];
                for (y, x) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
                    rotate(x, c, s, sign, 1.0, y);
                }
            });
            stored(out, l1)
        })
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let inverse = Rope {
            inverse: !self.inverse,
        };
        let dx = dense(grad)?.apply_op3_no_bwd(cos, sin, &inverse)?;
        Ok((Some(dx), None, None))
    }
}

/// `y = scale · R(sign · θ) · x` for one head in the half-split form: each pair
/// `(x[i], x[i + d/2])` rotated by the angle whose cosine and sine are `c[i]`, `s[i]`.
#[inline(always)]
fn rotate<T: Float>(x: &[T], c: &[T], s: &[T], sign: T, scale: T, y: &mut [T]) {
    let half = c.len();
    let (x1, x2) = x.split_at(half);
    let (y1, y2) = y.split_at_mut(half);
    for i in 0..half {
        let si = sign * s[i];
        y1[i] = scale * (x1[i] * c[i] - x2[i] * si);
        y2[i] = scale * (x2[i] * c[i] + x1[i] * si);
    }
}

/// RoPE of `x` `(batch, seq, heads, head_dim)` written straight into the attention layout,
/// times `scale`: the result is `(batch, groups, heads / groups · seq, head_dim)` — the memory of
/// `(batch, heads, seq, head_dim)` with the heads that share a key/value head folded into the
/// rows, as grouped-query attention reads queries (`groups` = key/value heads; for keys,
/// `groups` = `heads`). One node where rotate, transpose, copy, fold and scale were four, each
/// with its own gradient buffer. Differentiable in `x`; the tables get no gradient.
pub fn rope_to_heads(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    scale: f64,
    groups: usize,
) -> Result<Tensor> {
    let (b, t, h, d) = x.dims4()?;
    if d % 2 != 0 || cos.dims() != [b, t, d / 2] || sin.dims() != [b, t, d / 2] {
        candle_core::bail!(
            "rope to heads: tables {:?} and {:?} do not fit input {:?}",
            cos.dims(),
            sin.dims(),
            x.dims()
        );
    }
    if groups == 0 || h % groups != 0 {
        candle_core::bail!("rope to heads: {h} heads do not split into {groups} groups");
    }
    let cos = dense(&cos.to_dtype(x.dtype())?)?;
    let sin = dense(&sin.to_dtype(x.dtype())?)?;
    dense(x)?.apply_op3(&cos, &sin, RopeToHeads { scale, groups })
}

/// The forward of [`rope_to_heads`]: `(b, t, h, d)` → `(b, groups, h/groups · t, d)`.
struct RopeToHeads {
    scale: f64,
    groups: usize,
}

/// Its backward: the gradient in the attention layout back to `(b, t, h, d)`, rotated by `−θ`
/// and scaled (the forward's transpose).
struct RopeFromHeads {
    scale: f64,
}

impl CustomOp3 for RopeToHeads {
    fn name(&self) -> &'static str {
        "rope-to-heads"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (b, t, h, d) = l1.shape().dims4()?;
        let half = d / 2;
        with_float!(op, s1, |T; s1, s2, s3| {
            let x = contiguous(s1, l1, op, "input")?;
            let cos = contiguous(s2, l2, op, "cos")?;
            let sin = contiguous(s3, l3, op, "sin")?;
            let scale = self.scale as T;
            let mut out = vec![T::default(); x.len()];
            // One plane of `t × d` per (batch, head), planes in parallel.
            out.par_chunks_mut(t * d).enumerate().for_each(|(plane, y)| {
                let (bi, head) = (plane / h, plane % h);
                for (ti, y) in y.chunks_exact_mut(d).enumerate() {
                    let token = bi * t + ti;
                    let x = &x[(token * h + head) * d..][..d];
                    let (c, s) = (&cos[token * half..][..half], &sin[token * half..][..half]);
                    rotate(x, c, s, 1.0, scale, y);
                }
            });
            Ok((
                candle_core::WithDType::to_cpu_storage_owned(out),
                Shape::from((b, self.groups, h / self.groups * t, d)),
            ))
        })
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let back = RopeFromHeads { scale: self.scale };
        let dx = dense(grad)?.apply_op3_no_bwd(cos, sin, &back)?;
        Ok((Some(dx), None, None))
    }
}

impl CustomOp3 for RopeFromHeads {
    fn name(&self) -> &'static str {
        "rope-from-heads"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (b, groups, rows, d) = l1.shape().dims4()?;
        let (_, t, half) = l2.shape().dims3()?;
        let h = groups * rows / t;
        with_float!(op, s1, |T; s1, s2, s3| {
            let g = contiguous(s1, l1, op, "gradient")?;
            let cos = contiguous(s2, l2, op, "cos")?;
            let sin = contiguous(s3, l3, op, "sin")?;
            let scale = self.scale as T;
            let mut out = vec![T::default(); g.len()];
            // One row of `h × d` per token, rows in parallel.
            out.par_chunks_mut(h * d).enumerate().for_each(|(token, dx)| {
                let (bi, ti) = (token / t, token % t);
                let (c, s) = (&cos[token * half..][..half], &sin[token * half..][..half]);
                for (head, dx) in dx.chunks_exact_mut(d).enumerate() {
                    let g = &g[((bi * h + head) * t + ti) * d..][..d];
                    rotate(g, c, s, -1.0, scale, dx);
                }
            });
            Ok((
                candle_core::WithDType::to_cpu_storage_owned(out),
                Shape::from((b, t, h, d)),
            ))
        })
    }
}

// ---------------------------------------------------------------------------------------------
// A frozen projection with its LoRA adapter

/// `x·Wᵀ + bias + scale·(x·Aᵀ)·Bᵀ` for a frozen `weight` `W` `(out, in)` (and frozen `bias`)
/// with LoRA factors `a` `(rank, in)` and `b` `(out, rank)`; differentiable in `x`, `a` and `b`.
/// `x` may have any number of leading axes.
pub fn lora_linear(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    a: &Tensor,
    b: &Tensor,
    scale: f64,
) -> Result<Tensor> {
    let dims = x.dims();
    let Some((&k, lead)) = dims.split_last() else {
        candle_core::bail!("lora linear: a scalar input");
    };
    let (out, inp) = weight.dims2()?;
    let (rank, a_in) = a.dims2()?;
    if k != inp || a_in != inp || b.dims() != [out, rank] {
        candle_core::bail!(
            "lora linear: input {:?}, weight {:?}, A {:?} and B {:?} do not fit together",
            x.dims(),
            weight.dims(),
            a.dims(),
            b.dims()
        );
    }
    if let Some(bias) = bias {
        if bias.dims() != [out] {
            candle_core::bail!("lora linear: bias {:?} for {out} outputs", bias.dims());
        }
    }
    let m: usize = lead.iter().product();
    let op = LoraLinear {
        weight: dense(&weight.detach())?,
        bias: bias.map(|b| dense(&b.detach())).transpose()?,
        scale,
    };
    let y = dense(&x.reshape((m, k))?)?.apply_op3(&dense(a)?, &dense(b)?, op)?;
    let mut shape = lead.to_vec();
    shape.push(out);
    y.reshape(shape)
}

struct LoraLinear {
    weight: Tensor,
    bias: Option<Tensor>,
    scale: f64,
}

impl CustomOp3 for LoraLinear {
    fn name(&self) -> &'static str {
        "lora-linear"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_layout: &Layout,
        a: &CpuStorage,
        a_layout: &Layout,
        b: &CpuStorage,
        b_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (m, k) = x_layout.shape().dims2()?;
        let (rank, _) = a_layout.shape().dims2()?;
        let (out, _) = self.weight.dims2()?;
        let (w, w_layout) = self.weight.storage_and_layout();
        let Storage::Cpu(w) = &*w else {
            candle_core::bail!("{op}: input on the CPU, weight elsewhere");
        };
        // The three products, each with the right operand viewed transposed (no copy).
        let y = x.matmul(w, (1, m, out, k), x_layout, &w_layout.transpose(0, 1)?)?;
        let u = x.matmul(a, (1, m, rank, k), x_layout, &a_layout.transpose(0, 1)?)?;
        let u_layout = Layout::contiguous((m, rank));
        let delta = u.matmul(b, (1, m, out, rank), &u_layout, &b_layout.transpose(0, 1)?)?;
        let bias = self.bias.as_ref().map(|t| t.storage_and_layout());
        let y = match (y, &delta) {
            (CpuStorage::F32(mut y), CpuStorage::F32(d)) => {
                let bias = match &bias {
                    Some((s, l)) => match &**s {
                        Storage::Cpu(CpuStorage::F32(v)) => Some(contiguous(v, l, op, "bias")?),
                        _ => candle_core::bail!("{op}: the bias is not f32 on the CPU"),
                    },
                    None => None,
                };
                add_scaled(&mut y, d, self.scale as f32, bias, out);
                CpuStorage::F32(y)
            }
            (CpuStorage::F64(mut y), CpuStorage::F64(d)) => {
                let bias = match &bias {
                    Some((s, l)) => match &**s {
                        Storage::Cpu(CpuStorage::F64(v)) => Some(contiguous(v, l, op, "bias")?),
                        _ => candle_core::bail!("{op}: the bias is not f64 on the CPU"),
                    },
                    None => None,
                };
                add_scaled(&mut y, d, self.scale, bias, out);
                CpuStorage::F64(y)
            }
            (y, _) => candle_core::bail!("{op}: only f32 and f64, got {:?}", y.dtype()),
        };
        Ok((y, Shape::from((m, out))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let g = dense(grad)?;
        let gb = g.matmul(b)?; // (m, rank)
        let dx = (g.matmul(&self.weight)? + (gb.matmul(a)? * self.scale)?)?;
        let u = x.matmul(&a.t()?)?; // (m, rank), recomputed: cheaper than keeping it
        let da = (gb.t()?.matmul(x)? * self.scale)?;
        let db = (g.t()?.matmul(&u)? * self.scale)?;
        Ok((Some(dx), Some(da), Some(db)))
    }
}

/// `y += scale·delta (+ bias per row of width `out`)`, in parallel over rows.
fn add_scaled<T: Float + Send + Sync>(
    y: &mut [T],
    delta: &[T],
    scale: T,
    bias: Option<&[T]>,
    out: usize,
) {
    y.par_chunks_mut(out)
        .zip(delta.par_chunks(out))
        .for_each(|(y, d)| match bias {
            Some(bias) => {
                for ((y, &d), &b) in y.iter_mut().zip(d).zip(bias) {
                    *y = *y + scale * d + b;
                }
            }
            None => {
                for (y, &d) in y.iter_mut().zip(d) {
                    *y = *y + scale * d;
                }
            }
        });
}

// ---------------------------------------------------------------------------------------------
// Token log-probabilities through the frozen LM head, without a vocabulary-wide tensor

/// Rows of logits made at a time: `CHUNK × vocab` floats (25 MB for SmolLM2's 49,152 tokens).
const CHUNK: usize = 128;

/// `log softmax(hidden·headᵀ)[target]` for each row of `hidden` `(rows, h)`, with `head` the
/// frozen LM head `(vocab, h)`; differentiable in `hidden`. The logits are made `CHUNK` rows at
/// a time and made again in backward, so no `(rows, vocab)` tensor — nor its log-softmax, the
/// gather's scatter or their zeroed gradient buffers — is ever allocated.
pub fn token_logprobs(hidden: &Tensor, head: &Tensor, targets: &[u32]) -> Result<Tensor> {
    let (rows, h) = hidden.dims2()?;
    let (vocab, head_h) = head.dims2()?;
    if head_h != h || targets.len() != rows {
        candle_core::bail!(
            "token logprobs: hidden {:?}, head {:?} and {} targets do not fit together",
            hidden.dims(),
            head.dims(),
            targets.len()
        );
    }
    if let Some((i, t)) = targets
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        candle_core::bail!("token logprobs: target {i} = {t} is outside the vocabulary of {vocab}");
    }
    let op = TokenLogprobs {
        head: dense(&head.detach().to_dtype(hidden.dtype())?)?,
        targets: targets.to_vec(),
    };
    dense(hidden)?.apply_op1(op)
}

struct TokenLogprobs {
    head: Tensor,
    targets: Vec<u32>,
}

/// `log Σ exp(x)` of one row, shifted by its maximum.
fn log_sum_exp<T: Float + std::iter::Sum>(row: &[T]) -> T {
    let max = row.iter().fold(T::neg_infinity(), |m, &v| m.max(v));
    max + row.iter().map(|&v| (v - max).exp()).sum::<T>().ln()
}

impl TokenLogprobs {
    fn forward<T>(&self, hidden: &[T], h: usize) -> Result<Vec<T>>
    where
        T: candle_core::WithDType + Float + std::iter::Sum + Send + Sync,
    {
        let rows = hidden.len() / h;
        let head_t = self.head.t()?;
        let vocab = self.head.dim(0)?;
        let mut out = Vec::with_capacity(rows);
        for start in (0..rows).step_by(CHUNK) {
            let n = CHUNK.min(rows - start);
            let x = Tensor::from_slice(&hidden[start * h..(start + n) * h], (n, h), &Device::Cpu)?;
            let logits: Vec<T> = x.matmul(&head_t)?.flatten_all()?.to_vec1()?;
            let lse: Vec<T> = logits.par_chunks(vocab).map(log_sum_exp).collect();
            for ((row, lse), &t) in logits
                .chunks_exact(vocab)
                .zip(lse)
                .zip(&self.targets[start..])
            {
                out.push(row[t as usize] - lse);
            }
        }
        Ok(out)
    }

    fn backward<T>(&self, hidden: &Tensor, grad: &Tensor) -> Result<Tensor>
    where
        T: candle_core::WithDType + Float + std::iter::Sum + std::ops::AddAssign + Send + Sync,
    {
        let rows = hidden.dim(0)?;
        let head_t = self.head.t()?;
        let vocab = self.head.dim(0)?;
        let grad: Vec<T> = grad.to_vec1()?;
        let mut parts = Vec::with_capacity(rows.div_ceil(CHUNK));
        for start in (0..rows).step_by(CHUNK) {
            let n = CHUNK.min(rows - start);
            let x = hidden.narrow(0, start, n)?;
            let mut logits: Vec<T> = x.matmul(&head_t)?.flatten_all()?.to_vec1()?;
            // ∂logits = g · (onehot(target) − softmax(logits)), row by row, in place.
            logits
                .par_chunks_mut(vocab)
                .zip(
                    self.targets[start..start + n]
                        .par_iter()
                        .zip(&grad[start..start + n]),
                )
                .for_each(|(row, (&t, &g))| {
                    let lse = log_sum_exp(row);
                    row.iter_mut().for_each(|v| *v = -g * (*v - lse).exp());
                    row[t as usize] += g;
                });
            let dlogits = Tensor::from_vec(logits, (n, vocab), hidden.device())?;
            parts.push(dlogits.matmul(&self.head)?);
        }
        Tensor::cat(&parts, 0)
    }
}

impl CustomOp1 for TokenLogprobs {
    fn name(&self) -> &'static str {
        "token-logprobs"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (rows, h) = l1.shape().dims2()?;
        let out = match s1 {
            CpuStorage::F32(x) => {
                CpuStorage::F32(self.forward(contiguous(x, l1, op, "hidden")?, h)?)
            }
            CpuStorage::F64(x) => {
                CpuStorage::F64(self.forward(contiguous(x, l1, op, "hidden")?, h)?)
            }
            other => candle_core::bail!("{op}: only f32 and f64, got {:?}", other.dtype()),
        };
        Ok((out, Shape::from(rows)))
    }

    fn bwd(&self, hidden: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let hidden = hidden.detach();
        let grad = grad.detach();
        Ok(Some(match hidden.dtype() {
            DType::F32 => self.backward::<f32>(&hidden, &grad)?,
            DType::F64 => self.backward::<f64>(&hidden, &grad)?,
            other => candle_core::bail!("{}: only f32 and f64, got {other:?}", self.name()),
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

/// `silu(gate) ⊙ up`, the MLP's gated activation, differentiable in both.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.dims() != up.dims() {
        candle_core::bail!(
            "swiglu: gate {:?} and up {:?} differ",
            gate.dims(),
            up.dims()
        );
    }
    dense(gate)?.apply_op2(&dense(up)?, SwiGlu)
}

struct SwiGlu;

/// The logistic function.
fn sigmoid<T: Float>(x: T) -> T {
    (T::one() + (-x).exp()).recip()
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let n = last_dim(l1, op)?;
        with_float!(op, s1, |T; s1, s2| {
            let a = contiguous(s1, l1, op, "gate")?;
            let b = contiguous(s2, l2, op, "up")?;
            let out = map_rows(n, [a, b], |_, y, [a, b]| {
                for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
                    *y = a * sigmoid(a) * b;
                }
            });
            stored(out, l1)
        })
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = dense(grad)?;
        let d_gate = gate.apply_op3_no_bwd(up, &grad, &SwiGluBackward { wrt_gate: true })?;
        let d_up = gate.apply_op3_no_bwd(up, &grad, &SwiGluBackward { wrt_gate: false })?;
        Ok((Some(d_gate), Some(d_up)))
    }
}

/// One of [`swiglu`]'s two input gradients from `(gate, up, g)`.
struct SwiGluBackward {
    wrt_gate: bool,
}

impl CustomOp3 for SwiGluBackward {
    fn name(&self) -> &'static str {
        "swiglu-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let n = last_dim(l1, op)?;
        let wrt_gate = self.wrt_gate;
        with_float!(op, s1, |T; s1, s2, s3| {
            let a = contiguous(s1, l1, op, "gate")?;
            let b = contiguous(s2, l2, op, "up")?;
            let g = contiguous(s3, l3, op, "gradient")?;
            let out = map_rows(n, [a, b, g], |_, d, [a, b, g]| {
                for (((d, &a), &b), &g) in d.iter_mut().zip(a).zip(b).zip(g) {
                    let s = sigmoid(a);
                    *d = if wrt_gate {
                        g * b * s * (1 as T + a * (1 as T - s))
                    } else {
                        g * a * s
                    };
                }
            });
            stored(out, l1)
        })
    }
}
