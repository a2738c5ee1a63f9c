//! Log-softmax over the last axis ([`super`] has the table of forward and backward formulas).

use super::*;

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
