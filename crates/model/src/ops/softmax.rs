//! Masked softmax over the last axis ([`super`] has the table of forward and backward formulas).

use super::*;

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
