//! Token log-probabilities through the frozen LM head, without a vocabulary-wide tensor ([`super`] has the table of forward and backward formulas).

use super::*;

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
