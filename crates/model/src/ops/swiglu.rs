//! SwiGLU ([`super`] has the table of forward and backward formulas).

use super::*;

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
