//! PPO on a LoRA adapter, one place where an update happens.
//!
//! For each episode (a [`Sample`]: the tokens of one role's conversation, which of them the
//! policy generated, and the episode's reward), with `old` the policy that sampled it and `ref`
//! the base model with adapters off:
//!
//! ```text
//! per generated token t:   r_t = −β_KL · (log π_old(a_t) − log π_ref(a_t))   (+ R on the last token)
//! GAE:                     δ_t = r_t + γ·V(t+1) − V(t),   A_t = δ_t + γλ·A_{t+1},   ret_t = A_t + V(t)
//! group baseline instead:  A_t = (R − mean_g R) / std_batch(R − mean_g R), g the episode's
//!                          group (the investigations of one trace, or the whole batch), and the
//!                          KL term moves into the loss as k3 = exp(ref − new) − (ref − new) − 1
//! ratio_t = exp(log π_new(a_t) − log π_old(a_t))
//! loss = mean_t [ −min(ratio·A, clip(ratio, 1−ε, 1+ε)·A) + c_v·½(V − ret)² − c_H·H_t ]
//! ```
//!
//! Log-probabilities are those of the distribution the token was sampled from: where a grammar
//! constrained the token, the model's distribution renormalised over the allowed set. Only
//! generated tokens count; prompts and tool outputs are context. The clipped term's gradient
//! is taken through an explicit mask (zero where the clipped branch is the minimum), which is
//! exactly the gradient of the `min`.

use std::collections::BTreeMap;

use model::{AdamW, DType, Gradients, Model, Tensor};
use policy::Conversation;
use serde::{Deserialize, Serialize};

use crate::config::{Baseline, PpoConfig};
use crate::{Result, RlError};
use collective::Collective;

/// Which role an episode trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Injector,
    Detector,
    /// A higher-order example: the Detector finds where its own failed investigation went
    /// wrong (trained with the Detector's adapter).
    Review,
}

/// One episode of one role, ready to train on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub role: Role,
    pub conversation: Conversation,
    pub reward: f64,
    /// The group whose mean and spread the `group` baseline measures this sample's reward
    /// against: samples of the same prompt (investigations of one trace), or a whole batch.
    #[serde(default)]
    pub group: u64,
}

/// The generated tokens of a conversation scored under one adapter.
pub struct Scored {
    /// `(n,)` f32 (f64 for f64 models): log-probability of each generated token.
    pub logprobs: Tensor,
    /// `(n,)` f32: the critic's value of the state before each generated token.
    pub values: Option<Tensor>,
    /// `(n,)` f32: entropy of each (renormalised) next-token distribution.
    pub entropy: Option<Tensor>,
}

/// Scores the generated tokens of `c` under `adapter` (`None`: the base model). Differentiable
/// with respect to the adapter.
pub fn score(
    model: &Model,
    adapter: Option<&str>,
    c: &Conversation,
    with_values: bool,
    with_entropy: bool,
) -> Result<Scored> {
    let device = model.device();
    let positions: Vec<usize> = (0..c.tokens.len()).filter(|&i| c.generated[i]).collect();
    if positions.is_empty() || positions[0] == 0 {
        return Err(crate::RlError::Sample(
            "a sample needs generated tokens after a prompt".into(),
        ));
    }
    let t = c.tokens.len();
    let ids = Tensor::from_slice(&c.tokens, (1, t), device)?;
    let mask = Tensor::ones((1, t), DType::U32, device)?;
    let hidden = model.hidden_train_with(&ids, &mask, adapter)?.squeeze(0)?;
    // Scores in f32 (f64 models stay f64, for finite-difference checks).
    let dtype = if model.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    // The distribution over token p is the one predicted at position p − 1.
    let prev: Vec<u32> = positions.iter().map(|&p| (p - 1) as u32).collect();
    let n = prev.len();
    let prev = Tensor::from_vec(prev, n, device)?;
    // Only the scored rows go through the LM head.
    let rows = hidden.index_select(&prev, 0)?;
    let logits = model.logits(&rows)?.to_dtype(dtype)?;
    let vocab = logits.dim(1)?;
    let logits = match allowed_mask(c, &positions, vocab) {
        Some(m) => {
            logits.broadcast_add(&Tensor::from_vec(m, (n, vocab), device)?.to_dtype(dtype)?)?
        }
        None => logits,
    };
    let targets: Vec<u32> = positions.iter().map(|&p| c.tokens[p]).collect();
    let targets = Tensor::from_vec(targets, (1, n), device)?;
    let logprobs = model::gather_logprobs(&logits.unsqueeze(0)?, &targets)?.squeeze(0)?;
    let entropy = if with_entropy {
        Some(model::entropy(&logits)?)
    } else {
        None
    };
    let values = match (with_values, adapter) {
        (true, Some(name)) => {
            let head = model
                .adapter(name)
                .and_then(|a| a.value_head())
                .ok_or_else(|| {
                    crate::RlError::Sample(format!("adapter `{name}` has no value head"))
                })?;
            let h = rows.to_dtype(dtype)?;
            let w = head.weight.as_tensor().to_dtype(dtype)?;
            let b = head.bias.as_tensor().to_dtype(dtype)?;
            Some(h.matmul(&w.t()?)?.squeeze(1)?.broadcast_add(&b)?)
        }
        _ => None,
    };
    Ok(Scored {
        logprobs,
        values,
        entropy,
    })
}

/// An additive `(n, vocab)` mask that leaves only each constrained position's allowed tokens
/// (`None` when no position was constrained).
fn allowed_mask(c: &Conversation, positions: &[usize], vocab: usize) -> Option<Vec<f32>> {
    if positions.iter().all(|&p| c.allowed[p].is_none()) {
        return None;
    }
    let mut m = vec![0f32; positions.len() * vocab];
    for (row, &p) in positions.iter().enumerate() {
        if let Some(allowed) = &c.allowed[p] {
            let slice = &mut m[row * vocab..(row + 1) * vocab];
            // Finite, so the entropy's p·log p stays 0 (not NaN) outside the set.
            slice.fill(-1e9);
            for &tok in allowed {
                if (tok as usize) < vocab {
                    slice[tok as usize] = 0.0;
                }
            }
        }
    }
    Some(m)
}

/// What one update did, averaged over the generated tokens of the batch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PpoStats {
    pub samples: usize,
    pub tokens: usize,
    pub policy_loss: f64,
    pub value_loss: f64,
    /// Mean k3 estimate of KL(π_old ‖ π_ref) on the sampled tokens.
    pub kl: f64,
    pub clip_fraction: f64,
    pub entropy: f64,
    pub grad_norm: f64,
    pub mean_reward: f64,
}

/// Per-episode quantities fixed before the update.
struct Prepared {
    old: Vec<f32>,
    advantages: Vec<f32>,
    returns: Vec<f32>,
    reference: Vec<f32>,
}

fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.detach().to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

/// Generalised advantage estimation over one episode's generated tokens; the episode ends
/// after the last one (its next value is 0).
pub fn gae(rewards: &[f32], values: &[f32], gamma: f64, lambda: f64) -> (Vec<f32>, Vec<f32>) {
    let n = rewards.len();
    let mut adv = vec![0f32; n];
    let mut next_value = 0f64;
    let mut running = 0f64;
    for t in (0..n).rev() {
        let delta = rewards[t] as f64 + gamma * next_value - values[t] as f64;
        running = delta + gamma * lambda * running;
        adv[t] = running as f32;
        next_value = values[t] as f64;
    }
    let ret = adv.iter().zip(values).map(|(a, v)| a + v).collect();
    (adv, ret)
}

/// The `group` baseline's advantage of each `(reward, group)`: the reward less its group's
/// mean, scaled by the spread of those differences over the whole batch,
/// `(R − mean_g) / std(R − mean)`. A group whose rewards are all equal (or a group of one)
/// teaches nothing and gets zero; a batch where every group is such gets zeros throughout.
/// The scale is the batch's, not each group's, so that a small difference within one group
/// (one call fewer, say) is not blown up to the size of a right answer within another. The
/// token policy's samples and the decision head's samples both take their advantages here.
pub fn group_advantages(rewards: &[(f64, u64)]) -> Vec<f32> {
    let mut groups: BTreeMap<u64, (f64, usize)> = BTreeMap::new();
    for (reward, group) in rewards {
        let g = groups.entry(*group).or_default();
        g.0 += reward;
        g.1 += 1;
    }
    let centred: Vec<f64> = rewards
        .iter()
        .map(|(reward, group)| {
            let (sum, n) = groups[group];
            reward - sum / n as f64
        })
        .collect();
    let std = (centred.iter().map(|c| c * c).sum::<f64>() / centred.len().max(1) as f64).sqrt();
    if std < 1e-12 {
        return vec![0.0; rewards.len()];
    }
    centred.iter().map(|c| (c / std) as f32).collect()
}

/// Σ_t k3 estimate of KL(π ‖ π_ref) over the tokens whose log-probabilities are `policy` and
/// `reference`: with d = ref − policy, exp(d) − d − 1 (non-negative, zero when they agree).
fn k3_sum(policy: &[f32], reference: &[f32]) -> f64 {
    policy
        .iter()
        .zip(reference)
        .map(|(p, r)| {
            let d = (*r - *p) as f64;
            d.exp() - d - 1.0
        })
        .sum()
}

/// Normalises to zero mean and unit variance (across the batch).
fn whiten(all: &mut [Vec<f32>], ranks: &dyn Collective) -> Result<()> {
    // Two passes, each summed over the ranks: the mean, then the spread about it.
    let mut sums = [
        all.iter().flatten().map(|&x| x as f64).sum::<f64>(),
        all.iter().map(|v| v.len() as f64).sum::<f64>(),
    ];
    ranks.sum_f64(&mut sums).map_err(collective_err)?;
    let [sum, n] = sums;
    if n < 2.0 {
        return Ok(());
    }
    let mean = sum / n;
    let mut sq = [all
        .iter()
        .flatten()
        .map(|&x| (x as f64 - mean).powi(2))
        .sum::<f64>()];
    ranks.sum_f64(&mut sq).map_err(collective_err)?;
    let std = (sq[0] / n).sqrt().max(1e-8);
    for v in all.iter_mut().flatten() {
        *v = ((*v as f64 - mean) / std) as f32;
    }
    Ok(())
}

fn collective_err(e: collective::CollectiveError) -> RlError {
    RlError::Environment(e.to_string())
}

/// Sums the gradients over the ranks (data-parallel training; the identity for one process).
fn reduce(grads: &mut Gradients, ranks: &dyn Collective) -> Result<()> {
    if ranks.world() == 1 {
        return Ok(());
    }
    grads.reduce_flat(|flat| {
        ranks
            .sum_f32(flat)
            .map_err(|e| model::ModelError::InvalidArgument(e.to_string()))
    })?;
    Ok(())
}

/// One PPO update of `adapter` on `samples` (all trained with that adapter).
pub fn update(
    model: &mut Model,
    adapter: &str,
    optimizer: &mut AdamW,
    samples: &[Sample],
    cfg: &PpoConfig,
    entropy_coef: f64,
    ranks: &dyn Collective,
) -> Result<PpoStats> {
    if samples.is_empty() {
        return Ok(PpoStats::default());
    }
    model.set_training(false);
    let use_critic = cfg.baseline == Baseline::Gae;
    // Every rank holds the whole batch and scores its own share of it (`ranks.owns`); the
    // batch-wide quantities (token count, KL, whitening, losses) and the gradients are summed
    // over the ranks, so each rank takes the step one process would take on the whole batch.
    let mine: Vec<&Sample> = samples
        .iter()
        .enumerate()
        .filter(|(i, _)| ranks.owns(*i))
        .map(|(_, s)| s)
        .collect();

    // 1. Fixed quantities: old and reference log-probabilities, values, advantages.
    let mut prepared = Vec::with_capacity(mine.len());
    let mut kl_sum = 0f64;
    for s in &mine {
        let old = score(model, Some(adapter), &s.conversation, use_critic, false)?;
        let reference = score(model, None, &s.conversation, false, false)?;
        let old_lp = to_vec(&old.logprobs)?;
        let ref_lp = to_vec(&reference.logprobs)?;
        kl_sum += k3_sum(&old_lp, &ref_lp);
        let (advantages, returns) = if use_critic {
            let values = to_vec(old.values.as_ref().expect("asked for values"))?;
            let mut rewards: Vec<f32> = old_lp
                .iter()
                .zip(&ref_lp)
                .map(|(o, r)| (-cfg.kl_coef * (*o - *r) as f64) as f32)
                .collect();
            *rewards.last_mut().expect("non-empty") += s.reward as f32;
            gae(&rewards, &values, cfg.gamma, cfg.lambda)
        } else {
            (vec![s.reward as f32; old_lp.len()], vec![0.0; old_lp.len()])
        };
        prepared.push(Prepared {
            old: old_lp,
            advantages,
            returns,
            reference: ref_lp,
        });
    }
    let scored: Vec<(f64, u64)> = samples.iter().map(|s| (s.reward, s.group)).collect();
    let group = group_advantages(&scored);
    if use_critic {
        let mut adv: Vec<Vec<f32>> = prepared.iter().map(|p| p.advantages.clone()).collect();
        whiten(&mut adv, ranks)?;
        for (p, a) in prepared.iter_mut().zip(adv) {
            p.advantages = a;
        }
    } else {
        // Group-relative: every token of an episode gets its episode's reward centred within
        // its group and scaled by the batch's spread.
        let mine_group = group.iter().enumerate().filter(|(i, _)| ranks.owns(*i));
        for (p, (_, a)) in prepared.iter_mut().zip(mine_group) {
            p.advantages.iter_mut().for_each(|x| *x = *a);
        }
    }
    let mut batch = [
        prepared.iter().map(|p| p.old.len()).sum::<usize>() as f64,
        kl_sum,
    ];
    ranks.sum_f64(&mut batch).map_err(collective_err)?;
    let [total_tokens, kl_sum] = batch;
    let total_tokens = total_tokens as usize;
    let device = model.device().clone();
    let vars = model.trainable_vars(adapter)?;
    let mut stats = PpoStats {
        samples: samples.len(),
        tokens: total_tokens,
        kl: kl_sum / total_tokens as f64,
        mean_reward: samples.iter().map(|s| s.reward).sum::<f64>() / samples.len() as f64,
        ..PpoStats::default()
    };

    // A batch without advantage teaches nothing: with the group baseline the KL term alone
    // would pull the policy back towards the reference, so no step is taken at all.
    if !use_critic && group.iter().all(|a| *a == 0.0) {
        return Ok(stats);
    }

    // 2. Epochs of the clipped objective, one episode at a time (gradients accumulate).
    for _ in 0..cfg.epochs {
        let mut grads = Gradients::new(vars.clone());
        let (mut pg_sum, mut vf_sum, mut ent_sum, mut clipped) = (0f64, 0f64, 0f64, 0usize);
        for (s, p) in mine.iter().zip(&prepared) {
            let new = score(
                model,
                Some(adapter),
                &s.conversation,
                use_critic,
                entropy_coef > 0.0,
            )?;
            let n = p.old.len();
            let t = |v: &[f32]| Tensor::from_slice(v, n, &device);
            let old = t(&p.old)?;
            let adv = t(&p.advantages)?;
            let ratio = (&new.logprobs - &old)?.exp()?;
            let ratio_host = to_vec(&ratio)?;
            // Active where the unclipped branch is the minimum (its gradient flows).
            let mut active = vec![0f32; n];
            for i in 0..n {
                let (r, a) = (ratio_host[i] as f64, p.advantages[i] as f64);
                let clipped_r = r.clamp(1.0 - cfg.clip, 1.0 + cfg.clip);
                pg_sum += -(r * a).min(clipped_r * a);
                if (r * a) <= (clipped_r * a) {
                    active[i] = 1.0;
                }
                if (r - 1.0).abs() > cfg.clip {
                    clipped += 1;
                }
            }
            let mut loss = (&ratio * &adv)?.mul(&t(&active)?)?.sum_all()?.neg()?;
            if let Some(values) = &new.values {
                let err = (values - t(&p.returns)?)?;
                let vf = (err.sqr()?.sum_all()? * 0.5)?;
                vf_sum += vf.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                loss = (loss + (vf * cfg.vf_coef)?)?;
            }
            if let Some(h) = &new.entropy {
                let h_sum = h.sum_all()?;
                ent_sum += h_sum.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                loss = (loss - (h_sum * entropy_coef)?)?;
            }
            if !use_critic && cfg.kl_coef > 0.0 {
                // k3 estimator of KL(π_new ‖ π_ref), an unbiased, non-negative penalty.
                let d = (t(&p.reference)? - &new.logprobs)?;
                let k3 = ((d.exp()? - &d)? - 1.0)?.sum_all()?;
                loss = (loss + (k3 * cfg.kl_coef)?)?;
            }
            grads.accumulate(&(loss / total_tokens as f64)?)?;
        }
        reduce(&mut grads, ranks)?;
        let mut sums = [pg_sum, vf_sum, ent_sum, clipped as f64];
        ranks.sum_f64(&mut sums).map_err(collective_err)?;
        let [pg_sum, vf_sum, ent_sum, clipped] = sums;
        stats.grad_norm = grads.clip_global_norm(cfg.max_grad_norm)?;
        optimizer.step(&grads)?;
        let nt = total_tokens as f64;
        stats.policy_loss = pg_sum / nt;
        stats.value_loss = vf_sum / nt;
        stats.entropy = ent_sum / nt;
        stats.clip_fraction = clipped / nt;
    }
    Ok(stats)
}

/// What one warm-start update measured, before its step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SftStats {
    /// Mean negative log-likelihood per generated token.
    pub nll: f64,
    /// KL to the base model (adapters off) per generated token, the k3 estimate on the
    /// demonstrations' tokens: how far the warm start has moved the policy so far. `None` when
    /// not measured (it costs a forward pass of every demonstration with the adapter off).
    pub kl: Option<f64>,
}

/// How one warm-start update runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SftStep {
    /// The gradients' global norm is clipped to this.
    pub max_grad_norm: f64,
    /// The weight of a token the grammar left a choice of several (see [`sft_step`]).
    pub decision_weight: f64,
    /// Measure the KL to the base model before the step (a forward pass with the adapter off).
    pub measure_kl: bool,
}

/// Supervised warm start: one AdamW step of the weighted negative log-likelihood of the
/// generated tokens of `batch` (teacher forcing on demonstrations). A token the grammar
/// constrained (a reply's head, the answer's type and component) weighs `decision_weight`, a
/// free one (the text of a call, the evidence) 1:
///
///   loss = −Σ w_t · log π(x_t | x_<t) / Σ w_t
///
/// The decisions are a few tokens of a demonstration's hundreds, so at weight 1 the loss is
/// nearly all about copying the expert's SQL. Returns the plain mean NLL and, with
/// `measure_kl`, the KL to the base before the step.
pub fn sft_step(
    model: &mut Model,
    adapter: &str,
    optimizer: &mut AdamW,
    batch: &[Conversation],
    how: SftStep,
    ranks: &dyn Collective,
) -> Result<SftStats> {
    let SftStep {
        max_grad_norm,
        decision_weight,
        measure_kl,
    } = how;
    let vars = model.trainable_vars(adapter)?;
    let mut grads = Gradients::new(vars);
    let weights: Vec<Vec<f32>> = batch
        .iter()
        .map(|c| decision_weights(c, decision_weight))
        .collect();
    let total: usize = batch.iter().map(Conversation::generated_count).sum();
    let total_weight: f64 = weights.iter().flatten().map(|&w| f64::from(w)).sum();
    let mut stats = SftStats {
        nll: 0.0,
        kl: measure_kl.then_some(0.0),
    };
    // Each rank back-propagates its share of the batch; the sums and gradients are summed.
    let mine = batch
        .iter()
        .zip(&weights)
        .enumerate()
        .filter(|(i, _)| ranks.owns(*i))
        .map(|(_, cw)| cw);
    for (c, w) in mine {
        let reference = if measure_kl {
            model.set_training(false);
            Some(to_vec(&score(model, None, c, false, false)?.logprobs)?)
        } else {
            None
        };
        model.set_training(true);
        let s = score(model, Some(adapter), c, false, false)?;
        let logprobs = to_vec(&s.logprobs)?;
        if let (Some(kl), Some(reference)) = (&mut stats.kl, &reference) {
            *kl += k3_sum(&logprobs, reference) / total as f64;
        }
        stats.nll -= logprobs.iter().map(|&x| f64::from(x)).sum::<f64>() / total as f64;
        let w =
            Tensor::from_slice(w, w.len(), s.logprobs.device())?.to_dtype(s.logprobs.dtype())?;
        let loss = ((&s.logprobs * &w)?.sum_all()?.neg()? / total_weight)?;
        grads.accumulate(&loss)?;
    }
    reduce(&mut grads, ranks)?;
    let mut sums = [stats.nll, stats.kl.unwrap_or(0.0)];
    ranks.sum_f64(&mut sums).map_err(collective_err)?;
    stats.nll = sums[0];
    stats.kl = stats.kl.map(|_| sums[1]);
    grads.clip_global_norm(max_grad_norm)?;
    optimizer.step(&grads)?;
    model.set_training(false);
    Ok(stats)
}

/// The weight of each generated token of `c` in the warm start's loss, in order: `decision`
/// where the grammar left the token a choice of several, 1 elsewhere (a forced token has
/// log-probability 0 under its one-token set and teaches nothing either way).
fn decision_weights(c: &Conversation, decision: f64) -> Vec<f32> {
    c.generated
        .iter()
        .zip(&c.allowed)
        .filter(|(g, _)| **g)
        .map(|(_, a)| match a {
            Some(set) if set.len() > 1 => decision as f32,
            _ => 1.0,
        })
        .collect()
}

/// Mean negative log-likelihood of the generated tokens of `batch` (no update).
pub fn nll(model: &Model, adapter: Option<&str>, batch: &[Conversation]) -> Result<f64> {
    let total: usize = batch.iter().map(Conversation::generated_count).sum();
    let mut sum = 0f64;
    for c in batch {
        let s = score(model, adapter, c, false, false)?;
        sum -= s
            .logprobs
            .detach()
            .sum_all()?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()?;
    }
    Ok(sum / total.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gae_with_lambda_one_is_reward_to_go_minus_value() {
        let rewards = [0.0, 0.0, 1.0];
        let values = [0.2, 0.4, 0.5];
        let (adv, ret) = gae(&rewards, &values, 1.0, 1.0);
        for (i, a) in adv.iter().enumerate() {
            assert!((a - (1.0 - values[i])).abs() < 1e-6, "{adv:?}");
        }
        assert!(ret.iter().all(|r| (r - 1.0).abs() < 1e-6));
        // λ = 0: one-step TD errors.
        let (adv, _) = gae(&rewards, &values, 1.0, 0.0);
        assert!((adv[0] - (0.4 - 0.2)).abs() < 1e-6);
        assert!((adv[2] - (1.0 - 0.5)).abs() < 1e-6);
    }

    #[test]
    fn group_advantages_compare_samples_within_their_group_only() {
        let sample = |group, reward| (reward, group);
        let a = group_advantages(&[
            sample(0, 1.0),
            sample(0, 0.0),
            sample(1, 5.0),
            sample(1, 5.0),
            sample(2, 3.0),
        ]);
        // Centred within group 0 (±0.5) and scaled by the batch's spread, √(0.5 / 5).
        let scaled = 0.5 / (0.5f64 / 5.0).sqrt();
        assert!((a[0] as f64 - scaled).abs() < 1e-5, "{a:?}");
        assert!((a[1] as f64 + scaled).abs() < 1e-5, "{a:?}");
        // A trace every investigation scored alike, and a group of one, teach nothing.
        assert_eq!(&a[2..], &[0.0, 0.0, 0.0]);
        // One group is the plain batch baseline: zero mean, unit variance.
        let b = group_advantages(&[sample(0, 2.0), sample(0, 0.0), sample(0, 1.0)]);
        let var = b.iter().map(|x| x * x).sum::<f32>() / 3.0;
        assert!(
            b.iter().sum::<f32>().abs() < 1e-6 && (var - 1.0).abs() < 1e-5,
            "{b:?}"
        );
        // Nothing to compare anywhere: zeros, not a division by nothing.
        assert_eq!(
            group_advantages(&[sample(0, 1.0), sample(1, 2.0)]),
            [0.0, 0.0]
        );
    }

    #[test]
    fn whitening_centres_and_scales() {
        let mut v = vec![vec![1.0, 2.0], vec![3.0]];
        whiten(&mut v, &collective::Single).unwrap();
        let flat: Vec<f32> = v.into_iter().flatten().collect();
        let mean: f32 = flat.iter().sum::<f32>() / 3.0;
        assert!(mean.abs() < 1e-6);
        assert!((flat[2] - 1.2247449).abs() < 1e-4, "{flat:?}");
    }
}
