//! RoPE, half-split ("rotate half") form, on (batch, seq, heads, head_dim), and written straight into the attention layout ([`super`] has the table of forward and backward formulas).

use super::*;

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
