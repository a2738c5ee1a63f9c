//! RMSNorm ([`super`] has the table of forward and backward formulas).

use super::*;

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
