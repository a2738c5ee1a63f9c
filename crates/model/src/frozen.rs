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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::max_abs_diff;
    use candle_core::{DType, Device, Var};

    fn diff(a: &Tensor, b: &Tensor) -> f32 {
        max_abs_diff(a, b).unwrap()
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
