//! Training primitives for policy-gradient fine-tuning: per-token log-probabilities, entropy,
//! value-head outputs, gradient accumulation with global-norm clipping, and AdamW over the
//! adapter's parameters only.

use crate::error::{ModelError, Result};
use crate::model::Model;
use candle_core::{DType, Tensor, Var, D};

/// Differentiable log-softmax over the last axis, computed in f32 (f64 stays f64), with the
/// fused kernel of [`crate::ops`] where it runs.
pub fn log_softmax(logits: &Tensor) -> Result<Tensor> {
    log_softmax_with(logits, true)
}

fn log_softmax_with(logits: &Tensor, fused: bool) -> Result<Tensor> {
    let x = if logits.dtype() == DType::F64 {
        logits.clone()
    } else {
        logits.to_dtype(DType::F32)?
    };
    if fused && crate::ops::available(x.device(), x.dtype()) {
        return Ok(crate::ops::log_softmax(&x)?);
    }
    // The max is only a numerical shift; detaching it leaves the gradient exact.
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(shifted.broadcast_sub(&lse)?)
}

/// `log p(targets[b, t])` under `logits[b, t]`: `(batch, seq, vocab)` × `(batch, seq)` →
/// `(batch, seq)`.
pub fn gather_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    gather_last(&log_softmax(logits)?, targets)
}

/// Entropy of each next-token distribution: `(batch, seq, vocab)` → `(batch, seq)`.
pub fn entropy(logits: &Tensor) -> Result<Tensor> {
    entropy_of(&log_softmax(logits)?)
}

/// `lp[b, t, targets[b, t]]`.
fn gather_last(lp: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let idx = targets.to_dtype(DType::U32)?.unsqueeze(D::Minus1)?;
    Ok(lp
        .gather(&idx.contiguous()?, D::Minus1)?
        .squeeze(D::Minus1)?)
}

/// `−Σ p log p` over the last axis, from log-probabilities.
fn entropy_of(lp: &Tensor) -> Result<Tensor> {
    Ok((lp.exp()? * lp)?.sum(D::Minus1)?.neg()?)
}

/// Mean of `x` over positions where `mask` is 1 (a scalar); errors if the mask is all zero.
pub fn masked_mean(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let mask = mask.to_dtype(x.dtype())?;
    let count = mask.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    if count == 0.0 {
        return Err(ModelError::InvalidArgument(
            "masked_mean over an all-zero mask".into(),
        ));
    }
    Ok(((x * mask)?.sum_all()? / count)?)
}

/// What one training forward pass yields, aligned with `input_ids`.
#[derive(Debug, Clone)]
pub struct PolicyOutput {
    /// `(batch, seq, vocab)` in the model's dtype; `None` when only the targets'
    /// log-probabilities were needed and the fused kernels computed them without logits.
    pub logits: Option<Tensor>,
    /// `(batch, seq, hidden)`, after the final norm.
    pub last_hidden: Tensor,
    /// `(batch, seq)` f32: at position `t`, `log p(input_ids[t] | input_ids[..t])`; 0 where
    /// undefined (position 0, padding, or a token whose predecessor is padding).
    pub logprobs: Tensor,
    /// `(batch, seq)` f32: entropy of the distribution that predicted position `t`, masked like
    /// `logprobs`; computed only when asked for (it costs several vocabulary-sized tensors).
    pub entropy: Option<Tensor>,
    /// `(batch, seq)` f32: 1 where `logprobs` is defined.
    pub valid: Tensor,
    /// `(batch, seq)` f32 value estimate after each token, when the adapter has a value head.
    pub values: Option<Tensor>,
}

impl Model {
    /// [`log_softmax`] with the kernels [`Model::set_fused_training_kernels`] chose.
    fn log_softmax(&self, logits: &Tensor) -> Result<Tensor> {
        log_softmax_with(logits, self.fused_training)
    }

    /// Per-token log-probabilities of `input_ids` under the active adapter (see
    /// [`PolicyOutput::logprobs`] for the alignment). Differentiable.
    pub fn token_logprobs(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        Ok(self
            .policy_forward(input_ids, attention_mask, self.active.as_deref(), false)?
            .logprobs)
    }

    /// One differentiable pass giving log-probabilities, values and (with `with_entropy`)
    /// entropies. `adapter` picks the policy (`None` = the frozen base, i.e. the reference
    /// policy).
    pub fn policy_forward(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        adapter: Option<&str>,
        with_entropy: bool,
    ) -> Result<PolicyOutput> {
        let last_hidden = self.hidden_train_with(input_ids, attention_mask, adapter)?;
        let (b, t) = input_ids.dims2()?;
        // Without entropy, only the targets' log-probabilities are needed: where the fused
        // kernels run they come from the hidden states directly, and no logits are made.
        let direct = !with_entropy && self.fused_training_kernels();
        let logits = if direct {
            None
        } else {
            let hidden = last_hidden.reshape((b * t, self.config.hidden_size))?;
            Some(
                self.logits(&hidden)?
                    .reshape((b, t, self.config.vocab_size))?,
            )
        };
        let out_dtype = if self.dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let mask = attention_mask.to_dtype(out_dtype)?;
        let zeros = Tensor::zeros((b, 1), out_dtype, &self.device)?;
        let (logprobs, ent, valid) = if t > 1 {
            let targets = input_ids.narrow(1, 1, t - 1)?;
            let valid = (mask.narrow(1, 1, t - 1)? * mask.narrow(1, 0, t - 1)?)?;
            let (lp, all) = match &logits {
                None => {
                    let h = self.config.hidden_size;
                    let rows = last_hidden.narrow(1, 0, t - 1)?.reshape((b * (t - 1), h))?;
                    let ids: Vec<u32> = targets.to_dtype(DType::U32)?.flatten_all()?.to_vec1()?;
                    let lp = crate::ops::token_logprobs(&rows, self.lm_head_weight(), &ids)?;
                    (lp.reshape((b, t - 1))?.to_dtype(out_dtype)?, None)
                }
                Some(logits) => {
                    // One log-softmax over the vocabulary serves the log-probs and the entropy.
                    let all = self.log_softmax(&logits.narrow(1, 0, t - 1)?)?;
                    (gather_last(&all, &targets)?, Some(all))
                }
            };
            let ent = if with_entropy {
                let all = all.expect("entropy is asked for, so the logits were made");
                let ent = (entropy_of(&all)? * &valid)?;
                Some(Tensor::cat(&[&zeros, &ent], 1)?)
            } else {
                None
            };
            (
                Tensor::cat(&[&zeros, &(lp * &valid)?], 1)?,
                ent,
                Tensor::cat(&[&zeros, &valid], 1)?,
            )
        } else {
            (zeros.clone(), with_entropy.then(|| zeros.clone()), zeros)
        };
        let values = match adapter.map(|n| self.adapter_or_err(n)).transpose()? {
            Some(a) => match a.value_head() {
                Some(vh) => {
                    let h = last_hidden.to_dtype(out_dtype)?;
                    let w = vh.weight.as_tensor().to_dtype(out_dtype)?;
                    let bias = vh.bias.as_tensor().to_dtype(out_dtype)?;
                    Some(
                        h.broadcast_matmul(&w.t()?)?
                            .squeeze(D::Minus1)?
                            .broadcast_add(&bias)?,
                    )
                }
                None => None,
            },
            None => None,
        };
        Ok(PolicyOutput {
            logits,
            last_hidden,
            logprobs,
            entropy: ent,
            valid,
            values,
        })
    }
}

/// Gradients of a fixed parameter list, summed over micro-batches.
pub struct Gradients {
    vars: Vec<Var>,
    sums: Vec<Option<Tensor>>,
    micro_batches: usize,
}

impl Gradients {
    /// An empty accumulator for `vars` (e.g. [`Model::trainable_vars`]).
    pub fn new(vars: Vec<Var>) -> Self {
        let n = vars.len();
        Gradients {
            vars,
            sums: vec![None; n],
            micro_batches: 0,
        }
    }

    /// Back-propagates `loss` (a scalar) and adds the parameters' gradients. For an average over
    /// `n` micro-batches, pass `loss / n` each time.
    pub fn accumulate(&mut self, loss: &Tensor) -> Result<()> {
        if loss.elem_count() != 1 {
            return Err(ModelError::InvalidArgument(format!(
                "loss must be a scalar, got shape {:?}",
                loss.dims()
            )));
        }
        let store = loss.backward()?;
        for (var, sum) in self.vars.iter().zip(self.sums.iter_mut()) {
            if let Some(g) = store.get(var.as_tensor()) {
                let g = g.detach();
                *sum = Some(match sum.take() {
                    Some(s) => (s + g)?,
                    None => g,
                });
            }
        }
        self.micro_batches += 1;
        Ok(())
    }

    /// How many losses were accumulated since the last reset.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// The accumulated gradient of parameter `i` (in the order given to [`Gradients::new`]).
    pub fn get(&self, i: usize) -> Option<&Tensor> {
        self.sums[i].as_ref()
    }

    /// Indices of parameters that received no gradient: a sign the loss does not depend on them
    /// (or that an operation on the path records no gradient).
    pub fn missing(&self) -> Vec<usize> {
        self.sums
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_none())
            .map(|(i, _)| i)
            .collect()
    }

    /// L2 norm of all accumulated gradients together.
    pub fn global_norm(&self) -> Result<f64> {
        let mut total = 0f64;
        for g in self.sums.iter().flatten() {
            total += g
                .to_dtype(DType::F64)?
                .sqr()?
                .sum_all()?
                .to_scalar::<f64>()?;
        }
        Ok(total.sqrt())
    }

    /// Scales all gradients so their global norm is at most `max_norm`; returns the norm before
    /// clipping.
    pub fn clip_global_norm(&mut self, max_norm: f64) -> Result<f64> {
        let norm = self.global_norm()?;
        if norm > max_norm && norm > 0.0 {
            let factor = max_norm / (norm + 1e-6);
            for g in self.sums.iter_mut().flatten() {
                *g = (&*g * factor)?;
            }
        }
        Ok(norm)
    }

    /// Replaces every gradient by `reduce` of it, for data-parallel training: the gradients are
    /// laid out flat in parameter order (a parameter without one as zeros), followed by one
    /// presence flag per parameter, and `reduce` must sum that buffer over the ranks in place.
    /// Afterwards a parameter has a gradient when any rank gave it one. The buffer's layout
    /// depends only on the parameter list, so every rank's has the same length.
    pub fn reduce_flat(&mut self, reduce: impl FnOnce(&mut [f32]) -> Result<()>) -> Result<()> {
        let sizes: Vec<usize> = self
            .vars
            .iter()
            .map(|v| v.as_tensor().elem_count())
            .collect();
        let total: usize = sizes.iter().sum();
        let mut flat = Vec::with_capacity(total + sizes.len());
        for (sum, &n) in self.sums.iter().zip(&sizes) {
            match sum {
                Some(g) => flat.extend(g.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?),
                None => flat.resize(flat.len() + n, 0.0),
            }
        }
        flat.extend(self.sums.iter().map(|s| f32::from(u8::from(s.is_some()))));
        reduce(&mut flat)?;
        let mut at = 0;
        for (i, &n) in sizes.iter().enumerate() {
            let present = flat[total + i] > 0.0;
            let var = self.vars[i].as_tensor();
            self.sums[i] = if present {
                Some(
                    Tensor::from_slice(&flat[at..at + n], var.shape(), var.device())?
                        .to_dtype(var.dtype())?,
                )
            } else {
                None
            };
            at += n;
        }
        Ok(())
    }

    /// Clears the sums for the next optimizer step.
    pub fn reset(&mut self) {
        self.sums.iter_mut().for_each(|s| *s = None);
        self.micro_batches = 0;
    }
}

/// AdamW hyper-parameters (decoupled weight decay, as in PyTorch's `AdamW`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-4,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// AdamW over an explicit parameter list (the adapter's LoRA factors and value head), so the
/// frozen base can never be touched.
pub struct AdamW {
    vars: Vec<Var>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    step: u64,
    pub config: AdamWConfig,
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepReport {
    pub updated: usize,
    /// Parameters with no gradient this step (left unchanged).
    pub skipped: usize,
}

impl AdamW {
    pub fn new(vars: Vec<Var>, config: AdamWConfig) -> Result<Self> {
        let m = vars
            .iter()
            .map(|v| v.as_tensor().zeros_like())
            .collect::<candle_core::Result<Vec<_>>>()?;
        let v = m.clone();
        Ok(AdamW {
            vars,
            m,
            v,
            step: 0,
            config,
        })
    }

    /// Applies one update from `grads`, which must have been built over the same parameter
    /// list. Errors if no parameter has a gradient (a step that would silently do nothing).
    pub fn step(&mut self, grads: &Gradients) -> Result<StepReport> {
        if grads.vars.len() != self.vars.len()
            || grads
                .vars
                .iter()
                .zip(&self.vars)
                .any(|(a, b)| a.as_tensor().id() != b.as_tensor().id())
        {
            return Err(ModelError::InvalidArgument(
                "gradients were accumulated over a different parameter list".into(),
            ));
        }
        if grads.sums.iter().all(Option::is_none) {
            return Err(ModelError::InvalidArgument(
                "no parameter received a gradient; the loss does not depend on the adapter".into(),
            ));
        }
        self.step += 1;
        let c = self.config;
        let t = self.step as i32;
        let bc1 = 1.0 - c.beta1.powi(t);
        let bc2 = 1.0 - c.beta2.powi(t);
        let mut report = StepReport {
            updated: 0,
            skipped: 0,
        };
        for i in 0..self.vars.len() {
            let Some(g) = &grads.sums[i] else {
                report.skipped += 1;
                continue;
            };
            let var = &self.vars[i];
            let g = g.to_dtype(var.dtype())?;
            self.m[i] = ((&self.m[i] * c.beta1)? + (&g * (1.0 - c.beta1))?)?;
            self.v[i] = ((&self.v[i] * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
            let m_hat = (&self.m[i] / bc1)?;
            let v_hat = (&self.v[i] / bc2)?;
            let update = (m_hat / (v_hat.sqrt()? + c.eps)?)?;
            let decayed = (var.as_tensor() * (1.0 - c.lr * c.weight_decay))?;
            var.set(&(decayed - (update * c.lr)?)?)?;
            report.updated += 1;
        }
        Ok(report)
    }

    /// Number of steps taken.
    pub fn steps(&self) -> u64 {
        self.step
    }
}

/// What a checkpoint needs to continue an [`AdamW`] exactly: its step count and both moments.
#[derive(Debug, Clone)]
pub struct AdamWState {
    pub step: u64,
    pub m: Vec<Tensor>,
    pub v: Vec<Tensor>,
}

impl AdamW {
    /// A copy of the step count and moments, in parameter order.
    pub fn state(&self) -> AdamWState {
        AdamWState {
            step: self.step,
            m: self.m.clone(),
            v: self.v.clone(),
        }
    }

    /// Continues from a saved state; every moment must match its parameter's shape.
    pub fn restore(&mut self, state: AdamWState) -> Result<()> {
        if state.m.len() != self.vars.len() || state.v.len() != self.vars.len() {
            return Err(ModelError::InvalidArgument(format!(
                "optimizer state holds {} / {} moments for {} parameters",
                state.m.len(),
                state.v.len(),
                self.vars.len()
            )));
        }
        for (i, var) in self.vars.iter().enumerate() {
            for (name, t) in [("m", &state.m[i]), ("v", &state.v[i])] {
                if t.dims() != var.dims() {
                    return Err(ModelError::InvalidArgument(format!(
                        "optimizer state `{name}` of parameter {i} has shape {:?}, the parameter {:?}",
                        t.dims(),
                        var.dims()
                    )));
                }
            }
        }
        self.step = state.step;
        self.m = state.m;
        self.v = state.v;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn log_softmax_and_entropy_match_closed_form() {
        let logits = Tensor::new(&[[[0f32, 0.0, 0.0, 0.0]]], &Device::Cpu).unwrap();
        let lp = log_softmax(&logits).unwrap().flatten_all().unwrap();
        for v in lp.to_vec1::<f32>().unwrap() {
            assert!((v - (0.25f32).ln()).abs() < 1e-6);
        }
        let h = entropy(&logits)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert!((h[0] - 4f32.ln()).abs() < 1e-6);
        let targets = Tensor::new(&[[2u32]], &Device::Cpu).unwrap();
        let g = gather_logprobs(&logits, &targets).unwrap();
        assert_eq!(g.dims(), &[1, 1]);
    }

    #[test]
    fn a_flat_reduction_sums_gradients_and_keeps_any_ranks_parameters() {
        let a = Var::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu).unwrap();
        let b = Var::new(&[5f32], &Device::Cpu).unwrap();
        // This rank's loss touches `a` only; the other rank's (simulated) touched `b` only.
        let mut grads = Gradients::new(vec![a.clone(), b.clone()]);
        grads
            .accumulate(&(a.as_tensor() * 2.0).unwrap().sum_all().unwrap())
            .unwrap();
        let other = [0f32, 0.0, 0.0, 0.0, 7.0, 0.0, 1.0];
        grads
            .reduce_flat(|flat| {
                assert_eq!(flat, &[2.0, 2.0, 2.0, 2.0, 0.0, 1.0, 0.0]);
                flat.iter_mut().zip(other).for_each(|(x, o)| *x += o);
                Ok(())
            })
            .unwrap();
        let ga = grads.get(0).unwrap();
        assert_eq!(ga.dims(), &[2, 2]);
        assert_eq!(
            ga.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            [2.0; 4]
        );
        assert_eq!(grads.get(1).unwrap().to_vec1::<f32>().unwrap(), [7.0]);
        assert!(grads.missing().is_empty());
    }

    #[test]
    fn adamw_first_step_moves_by_lr_against_gradient_sign() {
        let w = Var::new(&[1f32, -1.0], &Device::Cpu).unwrap();
        let mut grads = Gradients::new(vec![w.clone()]);
        let loss = (w.as_tensor() * Tensor::new(&[2f32, -3.0], &Device::Cpu).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        grads.accumulate(&loss).unwrap();
        let norm = grads.clip_global_norm(1.0).unwrap();
        assert!((norm - 13f64.sqrt()).abs() < 1e-5);
        assert!((grads.global_norm().unwrap() - 1.0).abs() < 1e-4);
        let mut opt = AdamW::new(
            vec![w.clone()],
            AdamWConfig {
                lr: 0.1,
                ..Default::default()
            },
        )
        .unwrap();
        let report = opt.step(&grads).unwrap();
        assert_eq!(report.updated, 1);
        let after = w.as_tensor().to_vec1::<f32>().unwrap();
        assert!(
            (after[0] - 0.9).abs() < 1e-4 && (after[1] + 0.9).abs() < 1e-4,
            "{after:?}"
        );
        grads.reset();
        assert!(
            opt.step(&grads).is_err(),
            "a step with no gradients must fail"
        );
    }
}
