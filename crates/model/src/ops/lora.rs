//! A frozen projection with its LoRA adapter ([`super`] has the table of forward and backward formulas).

use super::*;

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
