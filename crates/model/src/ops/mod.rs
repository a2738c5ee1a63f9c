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

/// `log Σ exp(x)` of one row, shifted by its maximum.
fn log_sum_exp<T: Float + std::iter::Sum>(row: &[T]) -> T {
    let max = row.iter().fold(T::neg_infinity(), |m, &v| m.max(v));
    max + row.iter().map(|&v| (v - max).exp()).sum::<T>().ln()
}

/// Makes a tensor contiguous only when it is not (a view costs nothing to pass through).
fn dense(t: &Tensor) -> Result<Tensor> {
    if t.is_contiguous() {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

mod log_softmax;
mod lora;
mod rms_norm;
mod rope;
mod softmax;
mod swiglu;
mod token_logprobs;

pub use log_softmax::log_softmax;
pub use lora::lora_linear;
pub use rms_norm::rms_norm;
pub use rope::{rope, rope_to_heads};
pub use softmax::masked_softmax;
pub use swiglu::swiglu;
pub use token_logprobs::token_logprobs;
