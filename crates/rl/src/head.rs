//! The Detector's whole-choice decision in training (`[detector] decision = "head"`): the
//! warm start fits the decision head on the language model's features of the train split's
//! probe batteries, and PPO updates the head's type distribution on live investigations mixed
//! with replayed train traces.
//!
//! PPO on a softmax head, for samples i with features x̂ᵢ (standardised), chosen class aᵢ,
//! log-probability ℓᵢ under the policy that sampled it and advantage Aᵢ:
//!
//! ```text
//! π = softmax(W·x̂ + b)          rᵢ = π(aᵢ) / exp(ℓᵢ)
//! L = mean_i [ −min(rᵢ·Aᵢ, clip(rᵢ, 1−ε, 1+ε)·Aᵢ) ] + β · mean_i KL(π(·|xᵢ) ‖ π_ref(·|xᵢ))
//! ∂(−rA)/∂z = −A·r·(onehot(a) − π)   (zero where the clipped branch is the minimum)
//! ∂KL/∂z_k   = π_k · (log π_k − log π_ref,k − KL)
//! ```
//!
//! π_ref is the warm-started head, not the base model: PPO should add to what the warm start
//! learned, not be pulled back to a policy that knew nothing. The KL is exact (a sum over the
//! classes), not a sampled estimate. A batch whose advantages are all zero takes no step at all:
//! the KL term alone would only pull the policy back, teaching nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

use detect::probes::ProbeResult;
use eval::store_eval::Labelled;
use linear::{FitLog, FitOptions, Softmax};
use policy::decision::{self, DecisionHead, HeadReads};
use policy::frame::Frame;
use policy::SharedModel;
use serde::{Deserialize, Serialize};

use crate::config::{FoldsBy, FrameBy, HeadConfig, ReviewOptimizer, ReviewWeighting};
use crate::ppo::group_advantages;
use crate::{Result, RlError};

/// The decision head's input for every battery, read as `reads` says
/// ([`policy::decision::head_input`]): the language model's features (see
/// [`policy::decision::features`]; no model pass when `reads.states` is false) and the
/// digests' terms.
pub fn features(
    reader: &decision::FeatureReader,
    shared: &SharedModel,
    batteries: &[Vec<ProbeResult>],
    reads: &HeadReads,
    mut progress: impl FnMut(usize),
) -> Result<Vec<Vec<f32>>> {
    let mut pm = shared.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::with_capacity(batteries.len());
    for (i, b) in batteries.iter().enumerate() {
        let x = reader.features_for(&mut pm, b, reads)?;
        out.push(decision::head_input(x, b, reads));
        progress(i + 1);
    }
    Ok(out)
}

/// The terms a head fitted on `train` (whose batteries are `batteries`) may read with `[head]
/// term_frameworks = min_frameworks`: those printed by the train traces of at least that many
/// frameworks ([`linear::shared_terms`]; a trace's framework as [`framework_of`] says). None
/// (every term) below 2.
pub fn term_filter(
    train: &[Labelled],
    batteries: &[Vec<ProbeResult>],
    min_frameworks: usize,
) -> Option<BTreeSet<String>> {
    if min_frameworks < 2 {
        return None;
    }
    let docs: Vec<Vec<String>> = batteries.iter().map(|b| battery_terms(b)).collect();
    let groups: Vec<&str> = train.iter().map(framework_of).collect();
    Some(linear::shared_terms(&docs, &groups, min_frameworks))
}

fn battery_terms(battery: &[ProbeResult]) -> Vec<String> {
    linear::terms(&detect::probes::battery_lines(battery))
}

/// How a head configured by `config` reads a trace when fitted on `train` (whose batteries
/// are `batteries`): the term filter of `term_frameworks` and the exact vocabulary of
/// `vocabulary_min_df`, both drawn from the train split alone.
pub fn reads(config: &HeadConfig, train: &[Labelled], batteries: &[Vec<ProbeResult>]) -> HeadReads {
    let term_filter = term_filter(train, batteries, config.term_frameworks);
    let vocabulary = (config.vocabulary_min_df > 0).then(|| {
        let docs: Vec<Vec<String>> = batteries
            .iter()
            .map(|b| {
                let mut d = battery_terms(b);
                if let Some(keep) = &term_filter {
                    d.retain(|t| keep.contains(t));
                }
                d
            })
            .collect();
        linear::Vocabulary::fit(&docs, config.vocabulary_min_df)
    });
    HeadReads {
        term_filter,
        vocabulary,
        ..base_reads(config)
    }
}

/// How a head configured by `config` reads a trace before any train split decides its terms:
/// what [`reads`] gives when `config` neither filters the terms nor counts them by a
/// vocabulary ([`HeadConfig::reads_train_terms`]).
pub fn base_reads(config: &HeadConfig) -> HeadReads {
    HeadReads {
        states: config.states,
        ..HeadReads::hashed(config.terms, None)
    }
}

/// Fits a decision head on the train split's inputs (read as `reads` says), logging the
/// type decision's fit on train and (when given) validation as it goes.
pub fn fit(
    train: &[Labelled],
    train_x: &[Vec<f32>],
    val: Option<(&[Labelled], &[Vec<f32>])>,
    reads: HeadReads,
    options: &FitOptions,
    log: impl FnMut(&FitLog),
) -> Result<DecisionHead> {
    let eval::classifier::Classes {
        types,
        y,
        components,
        yc,
    } = eval::classifier::Classes::of(train);
    // Validation traces of a type the train split lacks cannot be named; they are left out of
    // the validation figures of the fit (they still count as misses in the evaluation).
    let (vx, vy): (Vec<Vec<f32>>, Vec<usize>) = val
        .map(|(v, x)| {
            v.iter()
                .zip(x)
                .filter_map(|(t, x)| {
                    types
                        .iter()
                        .position(|c| c == t.truth.id())
                        .map(|k| (x.clone(), k))
                })
                .unzip()
        })
        .unwrap_or_default();
    let fit_err = |e: linear::LinearError| RlError::Sample(format!("decision head: {e}"));
    let type_model = Softmax::fit(
        train_x,
        &y,
        types.len(),
        options,
        (!vx.is_empty()).then_some((vx.as_slice(), vy.as_slice())),
        log,
    )
    .map_err(fit_err)?;
    let component_model =
        Softmax::fit(train_x, &yc, components.len(), options, None, |_| {}).map_err(fit_err)?;
    Ok(DecisionHead {
        types,
        type_model,
        components,
        component_model,
        reads,
        healthy_mean: healthy_mean(train, train_x),
        calibration: None,
        frames: Default::default(),
        frame: None,
    })
}

/// The framework a train trace counts under for framing (its label's agent).
pub fn framework_of(t: &Labelled) -> &str {
    t.agent.as_deref().unwrap_or("(no framework)")
}

/// The frame of each framework of `train` (`x[i]` is trace i's head input): the median of
/// its traces' inputs ([`policy::frame::Frame`]).
pub fn frames(train: &[Labelled], x: &[Vec<f32>]) -> Result<BTreeMap<String, Frame>> {
    let mut by: BTreeMap<&str, Vec<&[f32]>> = BTreeMap::new();
    for (t, x) in train.iter().zip(x) {
        by.entry(framework_of(t)).or_default().push(x);
    }
    by.into_iter()
        .map(|(name, rows)| {
            Frame::median_of(&format!("{name}'s train traces"), &rows)
                .map(|f| (name.to_owned(), f))
                .map_err(|e| RlError::Sample(format!("framing the head's input: {e}")))
        })
        .collect()
}

/// A fit's frames by framework and its inputs as read through them.
pub type FramedInputs = (BTreeMap<String, Frame>, Vec<Vec<f32>>);

/// The frames a fit under `by` reads `train` through (none for [`FrameBy::None`]) and the
/// inputs `x` as it reads them: each trace's minus its framework's frame.
pub fn framed_fit(by: FrameBy, train: &[Labelled], x: &[Vec<f32>]) -> Result<FramedInputs> {
    match by {
        FrameBy::None => Ok((BTreeMap::new(), x.to_vec())),
        FrameBy::Framework => {
            let frames = frames(train, x)?;
            let framed = framed_inputs(train, x, &frames);
            Ok((frames, framed))
        }
    }
}

/// Each trace's input minus its framework's frame (from [`frames`]; a framework without one
/// is read through the median of them all, [`policy::frame::for_framework`]); as they are when
/// there are no frames.
pub fn framed_inputs(
    traces: &[Labelled],
    x: &[Vec<f32>],
    frames: &BTreeMap<String, Frame>,
) -> Vec<Vec<f32>> {
    let mut chosen: HashMap<&str, Option<Frame>> = HashMap::new();
    traces
        .iter()
        .zip(x)
        .map(|(t, x)| {
            let name = framework_of(t);
            let frame = chosen
                .entry(name)
                .or_insert_with(|| policy::frame::for_framework(frames, Some(name)));
            match frame {
                Some(f) => f.apply(x),
                None => x.clone(),
            }
        })
        .collect()
}

/// A head read in the frame of each trace's framework ([`DecisionHead::frame_for`]): one copy
/// per framework, made on first use. A head fitted on raw inputs is shared as it is.
pub struct FramedHeads {
    head: Arc<DecisionHead>,
    by_framework: HashMap<Option<String>, Arc<DecisionHead>>,
}

impl FramedHeads {
    pub fn new(head: Arc<DecisionHead>) -> FramedHeads {
        FramedHeads {
            head,
            by_framework: HashMap::new(),
        }
    }

    /// The head reading traces of `framework`.
    pub fn for_framework(&mut self, framework: Option<&str>) -> Result<Arc<DecisionHead>> {
        if !self.head.is_framed() {
            return Ok(Arc::clone(&self.head));
        }
        if let Some(h) = self.by_framework.get(&framework.map(str::to_owned)) {
            return Ok(Arc::clone(h));
        }
        let mut h = DecisionHead::clone(&self.head);
        h.set_frame(self.head.frame_for(framework))?;
        let h = Arc::new(h);
        self.by_framework
            .insert(framework.map(str::to_owned), Arc::clone(&h));
        Ok(h)
    }
}

/// The mean input of the healthy traces of `train` (empty when it has none).
pub fn healthy_mean(train: &[Labelled], x: &[Vec<f32>]) -> Vec<f32> {
    let healthy: Vec<&Vec<f32>> = train
        .iter()
        .zip(x)
        .filter(|(t, _)| t.truth.id() == taxonomy::NONE)
        .map(|(_, x)| x)
        .collect();
    let Some(first) = healthy.first() else {
        return Vec::new();
    };
    let mut mean = vec![0f32; first.len()];
    for v in &healthy {
        for (m, a) in mean.iter_mut().zip(v.iter()) {
            *m += a / healthy.len() as f32;
        }
    }
    mean
}

/// One train trace as a head fitted without it reads it (cross-validation).
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfFold {
    /// The trace's labelled type (`none` for a healthy trace).
    pub truth: String,
    /// The fold's head's log-probabilities over `classes` (the types of the traces it fitted).
    pub log_probs: Vec<f32>,
    /// Shared by every trace of the fold.
    pub classes: Arc<[String]>,
}

impl OutOfFold {
    /// The type named when `shift` is added to `none`'s score (the first class on ties).
    pub fn named(&self, shift: f32) -> &str {
        let scores: Vec<f32> = self
            .log_probs
            .iter()
            .zip(self.classes.iter())
            .map(|(l, c)| if c == decision::NONE { l + shift } else { *l })
            .collect();
        &self.classes[linear::argmax(&scores)]
    }

    /// How far `none`'s score falls short of the best other class's (≤ 0: `none` is named;
    /// infinite when the fold's head has no `none` class).
    fn none_margin(&self) -> f32 {
        let Some(k) = self.classes.iter().position(|c| c == decision::NONE) else {
            return f32::INFINITY;
        };
        let best = self
            .log_probs
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != k)
            .map(|(_, l)| *l)
            .fold(f32::NEG_INFINITY, f32::max);
        best - self.log_probs[k]
    }
}

/// Cross-validation over the train split, each trace read by a type softmax fitted on the
/// other folds: trace i falls in fold i mod `folds` ([`FoldsBy::Trace`]), or each framework's
/// traces make one fold ([`FoldsBy::Framework`], when the split holds two or more frameworks;
/// otherwise by trace). No held-out trace is read.
pub fn out_of_fold(
    train: &[Labelled],
    x: &[Vec<f32>],
    folds: usize,
    by: FoldsBy,
    options: &FitOptions,
) -> Result<Vec<OutOfFold>> {
    let truths: Vec<&str> = train.iter().map(|t| t.truth.id()).collect();
    let frameworks: Vec<Option<&str>> = train.iter().map(|t| t.agent.as_deref()).collect();
    let fold_of = fold_assignment(&frameworks, folds, by);
    out_of_fold_of(&truths, x, &fold_of, options)
}

/// Each example's fold: by [`FoldsBy::Framework`], one fold per distinct framework in
/// `frameworks` (first use order; an example without one gets a fold of its own index mod
/// `folds` among the rest), when there are two or more; otherwise example i is in fold
/// i mod `folds` (at least 2).
pub fn fold_assignment(frameworks: &[Option<&str>], folds: usize, by: FoldsBy) -> Vec<usize> {
    let folds = folds.max(2);
    let mut seen: Vec<&str> = Vec::new();
    for f in frameworks.iter().flatten() {
        if !seen.contains(f) {
            seen.push(f);
        }
    }
    if by == FoldsBy::Trace || seen.len() < 2 {
        return (0..frameworks.len()).map(|i| i % folds).collect();
    }
    frameworks
        .iter()
        .enumerate()
        .map(|(i, f)| match f {
            Some(f) => seen.iter().position(|s| s == f).unwrap_or_default(),
            None => seen.len() + i % folds,
        })
        .collect()
}

/// [`out_of_fold`] over examples given by their type ids (`truths[i]` is example i's) and
/// their folds (`fold_of[i]`, e.g. from [`fold_assignment`]).
pub fn out_of_fold_of(
    truths: &[&str],
    x: &[Vec<f32>],
    fold_of: &[usize],
    options: &FitOptions,
) -> Result<Vec<OutOfFold>> {
    let mut out: Vec<Option<OutOfFold>> = vec![None; truths.len()];
    let mut folds: Vec<usize> = fold_of.to_vec();
    folds.sort_unstable();
    folds.dedup();
    for fold in folds {
        let (fit_on, named): (Vec<usize>, Vec<usize>) =
            (0..truths.len()).partition(|&i| fold_of[i] != fold);
        if fit_on.is_empty() || named.is_empty() {
            continue;
        }
        let mut types: Vec<String> = Vec::new();
        let y: Vec<usize> = fit_on
            .iter()
            .map(|&i| linear::class_index(&mut types, truths[i]))
            .collect();
        let sx: Vec<Vec<f32>> = fit_on.iter().map(|&i| x[i].clone()).collect();
        let model = Softmax::fit(&sx, &y, types.len(), options, None, |_| {})
            .map_err(|e| RlError::Sample(format!("cross-validated head: {e}")))?;
        let types: Arc<[String]> = types.into();
        for &i in &named {
            out[i] = Some(OutOfFold {
                truth: truths[i].to_owned(),
                log_probs: model.log_probs(&x[i]),
                classes: Arc::clone(&types),
            });
        }
    }
    Ok(out.into_iter().flatten().collect())
}

/// How often a head misnames each type on traces it was not fitted to, from
/// [`out_of_fold`]'s readings: type → (misnamed, traces). Healthy traces count under `none`.
pub fn cross_validated_errors(read: &[OutOfFold]) -> BTreeMap<String, (usize, usize)> {
    let mut out: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for r in read {
        let entry = out.entry(r.truth.clone()).or_default();
        entry.0 += usize::from(r.named(0.0) != r.truth);
        entry.1 += 1;
    }
    out
}

/// The decision's operating point: how much `none`'s score is raised (see
/// [`policy::decision::DecisionHead::set_none_shift`]) and what that does on the train
/// split's out-of-fold readings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct NoneShift {
    pub shift: f32,
    /// The share of healthy traces answered `none` that was asked for.
    pub target: f64,
    pub healthy: usize,
    pub healthy_none_before: usize,
    pub healthy_none_after: usize,
    pub deficient: usize,
    pub deficient_named_before: usize,
    pub deficient_named_after: usize,
}

/// The smallest shift of `none`'s score (zero or more) under which at least `target` of the
/// healthy traces among `read` are answered `none`: the ⌈target·H⌉-th smallest of their
/// margins (best other class's log-probability minus `none`'s), just passed. A fraction set
/// on train traces the heads did not fit, so it carries to traces no head has seen; what it
/// costs is counted on the deficient traces of the same readings.
pub fn none_shift(read: &[OutOfFold], target: f64) -> NoneShift {
    let healthy: Vec<&OutOfFold> = read.iter().filter(|r| r.truth == decision::NONE).collect();
    let mut margins: Vec<f32> = healthy.iter().map(|r| r.none_margin()).collect();
    margins.sort_by(f32::total_cmp);
    let need =
        ((target.clamp(0.0, 1.0) * healthy.len() as f64 - 1e-9).ceil() as usize).min(margins.len());
    let shift = match need.checked_sub(1).map(|i| margins[i]) {
        Some(m) if m.is_finite() && m >= 0.0 => m + 1e-3,
        _ => 0.0,
    };
    let deficient: Vec<&OutOfFold> = read.iter().filter(|r| r.truth != decision::NONE).collect();
    let right = |set: &[&OutOfFold], s: f32| set.iter().filter(|r| r.named(s) == r.truth).count();
    NoneShift {
        shift,
        target,
        healthy: healthy.len(),
        healthy_none_before: right(&healthy, 0.0),
        healthy_none_after: right(&healthy, shift),
        deficient: deficient.len(),
        deficient_named_before: right(&deficient, 0.0),
        deficient_named_after: right(&deficient, shift),
    }
}

/// The type an episode plants under `focus = "confusion"`: among `offered` (types with an
/// option), one drawn with probability ∝ its error rate in `errors` plus `floor` (a type
/// with no train trace counts as never misnamed), by the uniform number `u` ∈ [0, 1).
pub fn focus_type<'a>(
    offered: &[&'a str],
    errors: &BTreeMap<String, (usize, usize)>,
    floor: f64,
    u: f64,
) -> Option<&'a str> {
    let weight = |t: &str| {
        floor
            + errors
                .get(t)
                .filter(|(_, n)| *n > 0)
                .map_or(0.0, |(e, n)| *e as f64 / *n as f64)
    };
    let total: f64 = offered.iter().map(|t| weight(t)).sum();
    if offered.is_empty() || total <= 0.0 {
        return None;
    }
    let mut left = u.clamp(0.0, 1.0) * total;
    for t in offered {
        left -= weight(t);
        if left < 0.0 {
            return Some(t);
        }
    }
    offered.last().copied()
}

/// The weight of planting one template under `focus = "coverage"`: its type's error rate in
/// `errors` plus `floor`, divided by one plus the traces of the template already learned from
/// (`learned`: the train split's and this run's earlier episodes'). A type the head has no
/// class for (absent from `errors`) weighs nothing.
pub fn coverage_weight(
    errors: &BTreeMap<String, (usize, usize)>,
    deficiency: &str,
    floor: f64,
    learned: usize,
) -> f64 {
    errors
        .get(deficiency)
        .filter(|(_, n)| *n > 0)
        .map_or(0.0, |(e, n)| {
            (floor + *e as f64 / *n as f64) / (1.0 + learned as f64)
        })
}

/// An index drawn with probability proportional to `weights` by the uniform number `u` ∈
/// [0, 1); `None` when no weight is positive.
pub fn draw(weights: &[f64], u: f64) -> Option<usize> {
    let total: f64 = weights.iter().filter(|w| **w > 0.0).sum();
    if total <= 0.0 {
        return None;
    }
    let mut left = u.clamp(0.0, 1.0) * total;
    let mut last = None;
    for (i, w) in weights.iter().enumerate() {
        if *w <= 0.0 {
            continue;
        }
        last = Some(i);
        left -= w;
        if left < 0.0 {
            return Some(i);
        }
    }
    last
}

/// One sampled decision, ready for PPO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeadSample {
    pub features: Vec<f32>,
    /// The chosen type's class index.
    pub action: usize,
    /// Its log-probability under the head that sampled it.
    pub old_log_prob: f32,
    pub reward: f64,
    /// Samples of one trace form a group (the `group` baseline compares them).
    pub group: u64,
}

/// What a head update did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeadStats {
    pub samples: usize,
    pub mean_reward: f64,
    pub policy_loss: f64,
    /// Mean KL(π ‖ π_ref) over the batch's features, before the update.
    pub kl: f64,
    pub clip_fraction: f64,
    pub entropy: f64,
    /// No sample had a non-zero advantage, so no step was taken.
    pub skipped: bool,
}

/// How a head update runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadPpo {
    pub lr: f64,
    pub epochs: usize,
    pub clip: f64,
    pub kl_coef: f64,
}

/// One sample's share of a softmax policy's PPO loss, and its gradient by the logits.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClippedTerm {
    /// −min(ρA, clip(ρ, 1 ± ε)A), ρ = π(a) / π_old(a).
    pub loss: f64,
    /// KL(π ‖ π_ref) over the choices, exact.
    pub kl: f64,
    /// The clipped side was the smaller (no gradient through the surrogate).
    pub clipped: bool,
    pub entropy: f64,
    /// ∂(loss + β·KL)/∂logit_i: −Aρ(1[i = a] − p_i) while unclipped, plus
    /// β·p_i·(log p_i − log p_ref,i − KL).
    pub logit_grad: Vec<f64>,
}

/// The clipped surrogate and KL anchor of one sampled choice `action` under log-probabilities
/// `lp` (the policy's now; `ref_lp` the reference's), shared by every softmax head PPO trains.
pub(crate) fn clipped_term(
    lp: &[f32],
    action: usize,
    old_log_prob: f32,
    advantage: f64,
    ref_lp: &[f32],
    cfg: &HeadPpo,
) -> ClippedTerm {
    let p: Vec<f64> = lp.iter().map(|l| (*l as f64).exp()).collect();
    let ratio = ((lp[action] - old_log_prob) as f64).exp();
    let unclipped = ratio * advantage;
    let clipped_v = ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip) * advantage;
    let active = unclipped <= clipped_v;
    let kl: f64 = p
        .iter()
        .zip(lp.iter().zip(ref_lp))
        .map(|(pi, (l, r))| pi * (*l - *r) as f64)
        .sum();
    let entropy = -p.iter().zip(lp).map(|(pi, l)| pi * *l as f64).sum::<f64>();
    let logit_grad = p
        .iter()
        .enumerate()
        .map(|(i, pi)| {
            let surrogate = if active {
                -advantage * ratio * (f64::from(u8::from(i == action)) - pi)
            } else {
                0.0
            };
            surrogate + cfg.kl_coef * pi * ((lp[i] - ref_lp[i]) as f64 - kl)
        })
        .collect();
    ClippedTerm {
        loss: -unclipped.min(clipped_v),
        kl,
        clipped: !active,
        entropy,
        logit_grad,
    }
}

/// One PPO update of `head`'s type distribution on `samples`, anchored at `reference` (see the
/// module's doc comment for the math). Advantages are group-relative, scaled by the batch.
pub fn update(
    head: &mut Softmax,
    reference: &Softmax,
    samples: &[HeadSample],
    cfg: &HeadPpo,
) -> HeadStats {
    let n = samples.len();
    if n == 0 {
        return HeadStats {
            skipped: true,
            ..HeadStats::default()
        };
    }
    let rewards: Vec<(f64, u64)> = samples.iter().map(|s| (s.reward, s.group)).collect();
    let advantages = group_advantages(&rewards);
    let k = head.classes;
    let d = head.dim;
    let z: Vec<Vec<f32>> = samples
        .iter()
        .map(|s| head.standardised(&s.features))
        .collect();
    let ref_lp: Vec<Vec<f32>> = samples
        .iter()
        .map(|s| reference.log_probs(&s.features))
        .collect();
    let mut stats = HeadStats {
        samples: n,
        mean_reward: rewards.iter().map(|r| r.0).sum::<f64>() / n as f64,
        ..HeadStats::default()
    };
    if advantages.iter().all(|a| *a == 0.0) {
        stats.skipped = true;
        return stats;
    }
    for epoch in 0..cfg.epochs {
        let mut gw = vec![0f32; k * d];
        let mut gb = vec![0f32; k];
        let (mut loss, mut kl_sum, mut clipped, mut ent) = (0f64, 0f64, 0usize, 0f64);
        for ((s, zi), (a, rl)) in samples.iter().zip(&z).zip(advantages.iter().zip(&ref_lp)) {
            let mut lp = head.logits_z(zi);
            linear::log_softmax(&mut lp);
            let term = clipped_term(&lp, s.action, s.old_log_prob, *a as f64, rl, cfg);
            loss += term.loss;
            kl_sum += term.kl;
            clipped += usize::from(term.clipped);
            ent += term.entropy;
            // ∂/∂z of this sample's loss, averaged over the batch.
            for (c, g) in term.logit_grad.iter().enumerate() {
                let g = (g / n as f64) as f32;
                gb[c] += g;
                gw[c * d..(c + 1) * d]
                    .iter_mut()
                    .zip(zi)
                    .for_each(|(w, x)| *w += g * x);
            }
        }
        if epoch == 0 {
            stats.kl = kl_sum / n as f64;
            stats.policy_loss = loss / n as f64;
            stats.clip_fraction = clipped as f64 / n as f64;
            stats.entropy = ent / n as f64;
        }
        let lr = cfg.lr as f32;
        head.weight
            .iter_mut()
            .zip(&gw)
            .for_each(|(w, g)| *w -= lr * g);
        head.bias
            .iter_mut()
            .zip(&gb)
            .for_each(|(b, g)| *b -= lr * g);
    }
    stats
}

/// A higher-order example of the whole-choice Detector (§5.5): a live trace whose greedy
/// answer named the wrong type, kept with its features and the type it should have named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub features: Vec<f32>,
    /// The framework (agent) whose run it is, for cross-validation by framework.
    #[serde(default)]
    pub agent: Option<String>,
    /// The true type's class index in the head.
    pub class: usize,
    /// The class it answered.
    pub answered: usize,
}

/// How a review update runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Review {
    pub lr: f64,
    pub epochs: usize,
    pub l2: f64,
    pub weighting: ReviewWeighting,
    pub optimizer: ReviewOptimizer,
}

/// What a review update did: the failures' and the anchor's top-1 accuracy and mean NLL
/// before and after it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ReviewStats {
    pub failures: usize,
    pub failures_top1_before: f64,
    pub failures_top1_after: f64,
    pub failures_nll_after: f64,
    pub anchor_top1_before: f64,
    pub anchor_top1_after: f64,
}

/// The review of the Detector's own failures, for the whole-choice decision: where a token
/// investigation is asked where its reasoning went wrong, a decision has one place to go
/// wrong — the choice — so each failure becomes the example "this trace, which you named
/// `answered`, is `class`". Plain gradient steps on
///
/// ```text
/// L = mean_{i∈F} −log π(yᵢ|xᵢ) + mean_{j∈A} −log π(yⱼ|xⱼ) + l2/2 · ‖W‖²
/// ∂L/∂z_k = (π_k − onehot(y)_k) / |F|   for a failure (and / |A| for an anchor example)
/// ```
///
/// with F the failures and A the anchor (the train split, with its labels): the two means
/// weigh the failures as much as everything the warm start fitted, and the anchor keeps
/// that fit while the head takes in what it missed. With [`ReviewWeighting::Example`] the loss
/// is one mean over F ∪ A instead (each gradient divided by |F| + |A|): a live example weighs
/// what a train trace weighs, so the live stream grows the train set rather than outweighing
/// it (with 10–20 misses, the two means give each miss the weight of 15–30 train traces).
/// The fit is of W·z + b alone ([`Softmax::fitted_logits_z`]): the operating point's fixed
/// shift of `none` is not a label frequency, and a cross-entropy fit would wear it away.
pub fn review(
    head: &mut Softmax,
    failures: &[Failure],
    anchor: &[(&[f32], usize)],
    cfg: &Review,
) -> ReviewStats {
    let zf: Vec<(Vec<f32>, usize)> = failures
        .iter()
        .map(|f| (head.standardised(&f.features), f.class))
        .collect();
    let za: Vec<(Vec<f32>, usize)> = anchor
        .iter()
        .map(|(x, y)| (head.standardised(x), *y))
        .collect();
    let top1 = |head: &Softmax, set: &[(Vec<f32>, usize)]| -> (f64, f64) {
        let lps: Vec<Vec<f32>> = set
            .iter()
            .map(|(z, _)| {
                let mut lp = head.fitted_logits_z(z);
                linear::log_softmax(&mut lp);
                lp
            })
            .collect();
        let y: Vec<usize> = set.iter().map(|(_, y)| *y).collect();
        let (nll, t1, _) = linear::score(&lps, &y);
        (t1, nll)
    };
    let mut stats = ReviewStats {
        failures: failures.len(),
        failures_top1_before: top1(head, &zf).0,
        anchor_top1_before: top1(head, &za).0,
        ..ReviewStats::default()
    };
    if failures.is_empty() {
        stats.failures_top1_after = stats.failures_top1_before;
        stats.anchor_top1_after = stats.anchor_top1_before;
        return stats;
    }
    let (k, d) = (head.classes, head.dim);
    let mut adam = (cfg.optimizer == ReviewOptimizer::Adam)
        .then(|| (linear::Adam::new(k * d), linear::Adam::new(k)));
    for _ in 0..cfg.epochs {
        let mut gw = vec![0f32; k * d];
        let mut gb = vec![0f32; k];
        let (wf, wa) = match cfg.weighting {
            ReviewWeighting::Set => (1.0 / zf.len() as f32, 1.0 / za.len().max(1) as f32),
            ReviewWeighting::Example => {
                let w = 1.0 / (zf.len() + za.len()) as f32;
                (w, w)
            }
        };
        for (set, weight) in [(&zf, wf), (&za, wa)] {
            for (z, y) in set.iter() {
                let mut lp = head.fitted_logits_z(z);
                linear::log_softmax(&mut lp);
                for c in 0..k {
                    let g = (lp[c].exp() - f32::from(c == *y)) * weight;
                    gb[c] += g;
                    gw[c * d..(c + 1) * d]
                        .iter_mut()
                        .zip(z)
                        .for_each(|(w, x)| *w += g * x);
                }
            }
        }
        let (lr, l2) = (cfg.lr as f32, cfg.l2 as f32);
        gw.iter_mut()
            .zip(&head.weight)
            .for_each(|(g, w)| *g += l2 * w);
        match &mut adam {
            None => {
                head.weight
                    .iter_mut()
                    .zip(&gw)
                    .for_each(|(w, g)| *w -= lr * g);
                head.bias
                    .iter_mut()
                    .zip(&gb)
                    .for_each(|(b, g)| *b -= lr * g);
            }
            Some((w_moments, b_moments)) => {
                w_moments.step(&mut head.weight, &gw, lr);
                b_moments.step(&mut head.bias, &gb, lr);
            }
        }
    }
    let (t1, nll) = top1(head, &zf);
    stats.failures_top1_after = t1;
    stats.failures_nll_after = nll;
    stats.anchor_top1_after = top1(head, &za).0;
    stats
}

/// A feature reader over the shared model (the system prompt computed once), keeping its
/// features in `cache` when given (a directory shared by a run's evaluations and by runs).
pub fn reader(
    shared: &SharedModel,
    adapter: &str,
    system: &str,
    cache: Option<&Path>,
) -> Result<Arc<decision::FeatureReader>> {
    let mut pm = shared.lock().unwrap_or_else(|p| p.into_inner());
    let reader = decision::FeatureReader::new(&mut pm, Some(adapter), system)?;
    Ok(Arc::new(match cache {
        Some(dir) => reader.with_cache(&pm, dir.to_owned())?,
        None => reader,
    }))
}

/// The decision head as a `detect::Policy` for held-out evaluation (greedy).
pub fn evaluation_policy(
    shared: &SharedModel,
    head: &Arc<DecisionHead>,
    reader: &Arc<decision::FeatureReader>,
) -> Box<dyn detect::Policy> {
    decision::policy(
        Arc::clone(shared),
        Arc::clone(head),
        Arc::clone(reader),
        0.0,
        0.0,
        None,
    )
}

/// Where a live investigation leaves its features and decision.
pub type Sink = Arc<Mutex<Option<decision::Investigated>>>;

/// Reads a checkpoint's decision head for `adapter` and its reference, if it has them.
pub fn load(dir: &Path, adapter: &str) -> Result<Option<(DecisionHead, DecisionHead)>> {
    let sub = dir.join(adapter);
    let (head, reference) = (
        sub.join(decision::HEAD_FILE),
        sub.join(decision::REFERENCE_HEAD_FILE),
    );
    if !head.is_file() {
        return Ok(None);
    }
    Ok(Some((
        DecisionHead::load(&head)?,
        DecisionHead::load(&reference)?,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(ty: &str) -> Labelled {
        Labelled {
            trace_id: String::new(),
            truth: eval::metrics::Truth::deficiency(ty),
            agent: None,
        }
    }

    #[test]
    fn the_term_filter_keeps_the_terms_of_several_frameworks_and_the_head_carries_it() {
        let battery = |digest: &str| {
            vec![ProbeResult {
                probe: "errors",
                digest: digest.into(),
            }]
        };
        let mut train = Vec::new();
        let mut batteries = Vec::new();
        for (framework, ty, digest) in [
            ("a", "P1", "error timeout on tool fetch_page"),
            ("a", "none", "no errors"),
            ("b", "P1", "error timeout on tool run_query"),
            ("b", "none", "no errors"),
        ] {
            let mut t = labelled(ty);
            t.agent = Some(framework.into());
            train.push(t);
            batteries.push(battery(digest));
        }
        assert_eq!(term_filter(&train, &batteries, 1), None);
        let keep = term_filter(&train, &batteries, 2).unwrap();
        // What both frameworks print stays; each one's tool name is its own and goes.
        for t in ["error", "timeout", "error timeout", "no errors"] {
            assert!(keep.contains(t), "{t} missing from {keep:?}");
        }
        for t in ["fetch_page", "run_query", "tool fetch_page"] {
            assert!(!keep.contains(t), "{t} kept");
        }
        // The head fitted with the filter keeps it, and reads a trace through it: a third
        // framework's tool name does not move its input.
        let options = FitOptions {
            log_every: 0,
            ..FitOptions::default()
        };
        for config in [
            HeadConfig {
                terms: 16,
                term_frameworks: 2,
                ..HeadConfig::default()
            },
            // The same filter under an exact vocabulary, the terms read alone.
            HeadConfig {
                vocabulary_min_df: 1,
                states: false,
                term_frameworks: 2,
                ..HeadConfig::default()
            },
        ] {
            let reads = reads(&config, &train, &batteries);
            assert_eq!(reads.term_filter.as_ref(), Some(&keep));
            if let Some(v) = &reads.vocabulary {
                // The vocabulary holds only the terms the filter keeps.
                assert_eq!(v.len(), keep.len());
            }
            let x: Vec<Vec<f32>> = batteries
                .iter()
                .map(|b| decision::head_input(vec![0.5], b, &reads))
                .collect();
            let width = usize::from(config.states) + reads.term_width();
            assert!(x.iter().all(|x| x.len() == width));
            let head = fit(&train, &x, None, reads, &options, |_| {}).unwrap();
            assert_eq!(
                head.input(vec![0.5], &battery("error timeout on tool send_mail")),
                head.input(vec![0.5], &battery("error timeout on tool read_file"))
            );
            let back: DecisionHead =
                serde_json::from_str(&serde_json::to_string(&head).unwrap()).unwrap();
            assert_eq!(back.reads, head.reads);
            assert_eq!(
                back.input(vec![0.5], &battery("error timeout on tool x")),
                head.input(vec![0.5], &battery("error timeout on tool x"))
            );
        }
    }

    #[test]
    fn a_framed_head_answers_the_same_for_a_framework_shifted_as_a_whole() {
        // Two frameworks that print the same runs, one with every input moved by an offset
        // (a framework's own structure: lines all its runs show). Fitted on framed inputs,
        // the head reads a trace of either under its framework's frame the same way.
        let offset = [3.0f32, -2.0, 0.5];
        let base = [
            ("P1", [1.0f32, 0.0, 0.0]),
            ("P1", [1.2, 0.1, 0.0]),
            ("C3", [0.0, 1.0, 0.0]),
            ("C3", [0.1, 1.1, 0.1]),
            ("none", [0.0, 0.0, 0.0]),
            ("none", [0.1, 0.0, 0.1]),
            ("none", [0.0, 0.1, 0.0]),
        ];
        let mut train = Vec::new();
        let mut x = Vec::new();
        for (framework, shift) in [("a", [0.0f32; 3]), ("b", offset)] {
            for (ty, v) in &base {
                let mut t = labelled(ty);
                t.agent = Some(framework.into());
                train.push(t);
                x.push(
                    v.iter()
                        .zip(&shift)
                        .map(|(a, s)| a + s)
                        .collect::<Vec<f32>>(),
                );
            }
        }
        let frames = frames(&train, &x).unwrap();
        assert_eq!(frames.len(), 2);
        let framed = framed_inputs(&train, &x, &frames);
        let options = FitOptions {
            log_every: 0,
            ..FitOptions::default()
        };
        let mut head = fit(
            &train,
            &framed,
            None,
            HeadReads::default(),
            &options,
            |_| {},
        )
        .unwrap();
        head.frames = frames.clone();
        let probe = [1.1f32, 0.05, 0.0];
        let shifted: Vec<f32> = probe.iter().zip(&offset).map(|(a, s)| a + s).collect();
        let mut in_a = head.clone();
        in_a.set_frame(Some(frames["a"].clone())).unwrap();
        let mut in_b = head.clone();
        in_b.set_frame(Some(frames["b"].clone())).unwrap();
        let (ca, cb) = (
            in_a.decide(&probe, 0.0, 0.0),
            in_b.decide(&shifted, 0.0, 0.0),
        );
        assert_eq!(head.types[ca.type_index], "P1");
        assert_eq!(ca.type_index, cb.type_index);
        for (p, q) in ca.type_log_probs.iter().zip(&cb.type_log_probs) {
            assert!((p - q).abs() < 1e-4, "{p} against {q}");
        }
        // Unframed, the shifted trace reads as something else.
        assert_ne!(
            head.decide(&shifted, 0.0, 0.0).type_log_probs,
            cb.type_log_probs
        );
        // A frame of another width is refused.
        let wrong = policy::frame::Frame::median_of("w", &[&[0.0f32][..]]).unwrap();
        assert!(in_a.set_frame(Some(wrong)).is_err());
    }

    #[test]
    fn folds_by_framework_put_each_framework_in_a_fold_of_its_own() {
        let f = [
            Some("ag2"),
            Some("swe"),
            Some("ag2"),
            None,
            Some("swe"),
            None,
        ];
        assert_eq!(
            fold_assignment(&f, 5, FoldsBy::Framework),
            // Traces of no known framework: after the frameworks' folds, by trace (i mod 5).
            vec![0, 1, 0, 2 + 3, 1, 2]
        );
        assert_eq!(
            fold_assignment(&f, 5, FoldsBy::Trace),
            vec![0, 1, 2, 3, 4, 0]
        );
        // One framework: by trace, whatever was asked.
        let one = [Some("swe"); 4];
        assert_eq!(
            fold_assignment(&one, 2, FoldsBy::Framework),
            vec![0, 1, 0, 1]
        );
    }

    #[test]
    fn cross_validation_finds_the_types_a_head_confuses() {
        // A and B share their features (no head can tell them apart); C stands alone.
        let mut train = Vec::new();
        let mut x = Vec::new();
        for i in 0..30 {
            let (ty, f) = match i % 3 {
                0 => ("A", [1.0f32, 0.0]),
                1 => ("B", [1.0, 0.0]),
                _ => ("C", [0.0, 1.0]),
            };
            train.push(labelled(ty));
            x.push(f.to_vec());
        }
        let options = FitOptions {
            max_epochs: 200,
            ..FitOptions::default()
        };
        let read = out_of_fold(&train, &x, 5, FoldsBy::Trace, &options).unwrap();
        assert_eq!(read.len(), train.len());
        let errors = cross_validated_errors(&read);
        assert_eq!(errors["C"], (0, 10));
        let (ea, na) = errors["A"];
        let (eb, nb) = errors["B"];
        assert_eq!((na, nb), (10, 10));
        // Every A or B trace is named A or B; about half of them wrongly.
        assert!(ea + eb >= 6, "A {ea}, B {eb}");
    }

    #[test]
    fn the_none_shift_is_the_smallest_that_meets_the_target() {
        // Healthy traces whose best other class beats `none` by 0.5, 1.0, 2.0 and 4.0 nats,
        // one already named `none`, and two deficient traces named right by 1.5 and 3.0.
        let read = |truth: &str, lp: [f32; 3]| OutOfFold {
            truth: truth.into(),
            log_probs: lp.to_vec(),
            classes: ["P1", "none", "C8"].map(String::from).into(),
        };
        let reads = vec![
            read("none", [-1.0, -1.5, -3.0]),
            read("none", [-1.0, -2.0, -3.0]),
            read("none", [-3.0, -3.0, -1.0]),
            read("none", [-1.0, -5.0, -3.0]),
            read("none", [-3.0, -1.0, -3.0]),
            read("P1", [-0.5, -2.0, -3.0]),
            read("C8", [-3.0, -4.0, -1.0]),
        ];
        // 60% of five healthy traces is three: `none` already wins one, and the shift must
        // pass the second-smallest margin (1.0).
        let s = none_shift(&reads, 0.6);
        assert!((s.shift - 1.001).abs() < 1e-4, "{s:?}");
        assert_eq!(
            (s.healthy, s.healthy_none_before, s.healthy_none_after),
            (5, 1, 3)
        );
        // It costs the deficient trace whose margin over `none` is 1.5 nothing; at 80%
        // (margin 2.0) the P1 trace, 1.5 ahead, goes to `none`.
        assert_eq!(
            (
                s.deficient,
                s.deficient_named_before,
                s.deficient_named_after
            ),
            (2, 2, 2)
        );
        let s = none_shift(&reads, 0.8);
        assert!((s.shift - 2.001).abs() < 1e-4);
        assert_eq!((s.healthy_none_after, s.deficient_named_after), (4, 1));
        // A target met already, or none at all, shifts nothing.
        assert_eq!(none_shift(&reads, 0.2).shift, 0.0);
        assert_eq!(none_shift(&reads, 0.0).shift, 0.0);
        assert_eq!(none_shift(&reads[5..], 0.9).healthy, 0);
    }

    #[test]
    fn the_focus_draws_types_in_proportion_to_their_errors() {
        let errors: BTreeMap<String, (usize, usize)> =
            [("A".to_owned(), (9, 10)), ("B".to_owned(), (0, 10))].into();
        let offered = ["A", "B", "C"];
        // Weights: A 0.9 + 0.1 = 1.0, B 0.1, C (no train trace) 0.1; total 1.2.
        let draws: Vec<&str> = (0..1200)
            .map(|k| focus_type(&offered, &errors, 0.1, (k as f64 + 0.5) / 1200.0).unwrap())
            .collect();
        let count = |t: &str| draws.iter().filter(|d| **d == t).count();
        assert_eq!((count("A"), count("B"), count("C")), (1000, 100, 100));
        assert_eq!(focus_type(&[], &errors, 0.1, 0.5), None);
    }

    fn head(classes: usize, dim: usize) -> Softmax {
        Softmax {
            classes,
            dim,
            weight: vec![0.0; classes * dim],
            bias: vec![0.0; classes],
            mean: vec![0.0; dim],
            inv_std: vec![1.0; dim],
            prior: Vec::new(),
        }
    }

    #[test]
    fn rewarded_choices_gain_probability_and_a_batch_without_advantage_takes_no_step() {
        let reference = head(3, 2);
        let mut h = reference.clone();
        let x = vec![1.0f32, -0.5];
        let lp = h.log_probs(&x);
        // Three samples of one trace: class 1 rewarded, classes 0 and 2 not.
        let samples: Vec<HeadSample> = [0usize, 1, 2]
            .iter()
            .map(|&a| HeadSample {
                features: x.clone(),
                action: a,
                old_log_prob: lp[a],
                reward: f64::from(u8::from(a == 1)),
                group: 7,
            })
            .collect();
        let cfg = HeadPpo {
            lr: 0.5,
            epochs: 4,
            clip: 0.2,
            kl_coef: 0.01,
        };
        let stats = update(&mut h, &reference, &samples, &cfg);
        assert!(!stats.skipped);
        assert_eq!(stats.kl, 0.0, "the first epoch starts at the reference");
        let p = h.probs(&x);
        assert!(p[1] > 1.0 / 3.0 + 0.05, "{p:?}");
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        // Equal rewards: no advantage, no step, weights untouched.
        let before = h.clone();
        let flat: Vec<HeadSample> = samples
            .iter()
            .map(|s| HeadSample {
                reward: 1.0,
                ..s.clone()
            })
            .collect();
        let stats = update(&mut h, &reference, &flat, &cfg);
        assert!(stats.skipped);
        assert_eq!(h, before);
    }

    #[test]
    fn the_kl_gradient_matches_finite_differences() {
        // Pure KL (no advantage term): compare the analytic step with a numeric derivative.
        let mut reference = head(3, 1);
        reference.bias = vec![0.3, -0.2, 0.1];
        let mut h = head(3, 1);
        h.bias = vec![-0.4, 0.5, 0.0];
        let x = vec![0.0f32];
        let kl = |m: &Softmax| -> f64 {
            let lp = m.log_probs(&x);
            let lr = reference.log_probs(&x);
            lp.iter()
                .zip(&lr)
                .map(|(a, b)| (a.exp() * (a - b)) as f64)
                .sum()
        };
        // One sample of a group of two with equal reward would be skipped; use advantage via
        // two groups of one (each centred to zero) and then add the KL step by hand instead:
        // the analytic gradient for the bias is π_k (log π_k − log π_ref,k − KL).
        let lp = h.log_probs(&x);
        let lr = reference.log_probs(&x);
        let total = kl(&h);
        for c in 0..3 {
            let analytic = lp[c].exp() as f64 * ((lp[c] - lr[c]) as f64 - total);
            let mut up = h.clone();
            up.bias[c] += 1e-3;
            let mut down = h.clone();
            down.bias[c] -= 1e-3;
            let numeric = (kl(&up) - kl(&down)) / 2e-3;
            assert!(
                (analytic - numeric).abs() < 1e-3,
                "{c}: {analytic} vs {numeric}"
            );
        }
    }

    #[test]
    fn a_review_names_its_failures_and_keeps_the_anchor() {
        // Two well-separated classes the head knows (anchor), and a third region of feature
        // space it names as class 0 although its traces are class 2.
        let mut h = head(3, 2);
        h.weight = vec![2.0, 0.0, -2.0, 0.0, 0.0, 0.0];
        let anchor_x = [vec![1.0f32, 0.0], vec![-1.0, 0.0]];
        let anchor: Vec<(&[f32], usize)> = vec![(&anchor_x[0], 0), (&anchor_x[1], 1)];
        let failures = vec![Failure {
            features: vec![1.0, 3.0],
            agent: None,
            class: 2,
            answered: 0,
        }];
        assert_eq!(h.predict(&failures[0].features), 0);
        let cfg = Review {
            lr: 0.5,
            epochs: 30,
            l2: 0.0,
            weighting: ReviewWeighting::Set,
            optimizer: ReviewOptimizer::Gradient,
        };
        let stats = review(&mut h, &failures, &anchor, &cfg);
        assert_eq!(stats.failures, 1);
        assert_eq!(stats.failures_top1_before, 0.0);
        assert_eq!(stats.failures_top1_after, 1.0, "{stats:?}");
        assert_eq!(stats.anchor_top1_before, 1.0);
        assert_eq!(stats.anchor_top1_after, 1.0, "{stats:?}");
        assert_eq!(h.predict(&failures[0].features), 2);
        // Nothing to review: the head is left as it is.
        let before = h.clone();
        let stats = review(&mut h, &[], &anchor, &cfg);
        assert_eq!(stats.failures, 0);
        assert_eq!(h, before);
    }

    #[test]
    fn coverage_weighs_a_type_by_its_errors_over_what_was_learned_from() {
        let errors: BTreeMap<String, (usize, usize)> =
            [("P5".to_string(), (3, 4)), ("C8".to_string(), (0, 4))].into();
        assert!((coverage_weight(&errors, "P5", 0.1, 0) - 0.85).abs() < 1e-12);
        assert!((coverage_weight(&errors, "P5", 0.1, 3) - 0.2125).abs() < 1e-12);
        assert!((coverage_weight(&errors, "C8", 0.1, 1) - 0.05).abs() < 1e-12);
        // A type the head has no class for is never planted.
        assert_eq!(coverage_weight(&errors, "P9", 0.1, 0), 0.0);
    }

    #[test]
    fn draws_follow_the_weights_and_never_pick_a_zero() {
        let weights = [0.0, 1.0, 3.0, 0.0];
        let mut counts = [0usize; 4];
        for i in 0..1000 {
            counts[draw(&weights, (i as f64 + 0.5) / 1000.0).unwrap()] += 1;
        }
        assert_eq!(counts, [0, 250, 750, 0]);
        assert_eq!(draw(&[0.0, 0.0], 0.3), None);
        assert_eq!(draw(&[], 0.3), None);
        // u at the top of its range still lands on a positive weight.
        assert_eq!(draw(&weights, 0.999_999_999), Some(2));
    }

    #[test]
    fn an_adam_review_takes_in_what_small_gradient_steps_do_not() {
        // The scenario above on features a tenth the size (and weights ten times larger, so
        // the same logits): plain gradient steps shrink with the features and leave the failure
        // misnamed in 30 epochs, while Adam's steps are scaled per parameter, so the same
        // budget names it, and the anchor stays named.
        let base = {
            let mut h = head(3, 2);
            h.weight = vec![20.0, 0.0, -20.0, 0.0, 0.0, 0.0];
            h
        };
        let anchor_x = [vec![0.1f32, 0.0], vec![-0.1, 0.0]];
        let anchor: Vec<(&[f32], usize)> = vec![(&anchor_x[0], 0), (&anchor_x[1], 1)];
        let failures = vec![Failure {
            features: vec![0.1, 0.3],
            agent: None,
            class: 2,
            answered: 0,
        }];
        let after = |optimizer| {
            let mut h = base.clone();
            let cfg = Review {
                lr: 0.2,
                epochs: 30,
                l2: 0.0,
                weighting: ReviewWeighting::Example,
                optimizer,
            };
            (review(&mut h, &failures, &anchor, &cfg), h)
        };
        let (gd, _) = after(ReviewOptimizer::Gradient);
        assert_eq!(gd.failures_top1_after, 0.0, "{gd:?}");
        let (adam, h) = after(ReviewOptimizer::Adam);
        assert_eq!(adam.failures_top1_after, 1.0, "{adam:?}");
        assert_eq!(adam.anchor_top1_after, 1.0, "{adam:?}");
        assert_eq!(h.predict(&failures[0].features), 2);
        assert!(adam.failures_nll_after < gd.failures_nll_after);
    }

    #[test]
    fn the_review_gradient_matches_finite_differences_for_both_weightings() {
        let mut h = head(3, 2);
        h.weight = vec![0.3, -0.1, 0.2, 0.4, -0.5, 0.1];
        h.bias = vec![0.1, -0.2, 0.05];
        // One failure and two anchor traces, so the two weightings differ.
        let (a0, a1) = (vec![0.5f32, -1.0], vec![-0.3f32, 0.7]);
        let failures = vec![Failure {
            features: vec![1.0, 2.0],
            agent: None,
            class: 2,
            answered: 0,
        }];
        let nll = |m: &Softmax, x: &[f32], y: usize| -(m.log_probs(x)[y] as f64);
        for weighting in [ReviewWeighting::Set, ReviewWeighting::Example] {
            let loss = |m: &Softmax| -> f64 {
                let f = nll(m, &failures[0].features, 2);
                let a = nll(m, &a0, 1) + nll(m, &a1, 0);
                match weighting {
                    ReviewWeighting::Set => f + a / 2.0,
                    ReviewWeighting::Example => (f + a) / 3.0,
                }
            };
            // One step of size lr moves each parameter by −lr·∂L/∂θ (l2 = 0).
            let lr = 1e-3;
            let mut stepped = h.clone();
            review(
                &mut stepped,
                &failures,
                &[(&a0, 1), (&a1, 0)],
                &Review {
                    lr,
                    epochs: 1,
                    l2: 0.0,
                    weighting,
                    optimizer: ReviewOptimizer::Gradient,
                },
            );
            for i in 0..h.weight.len() {
                let (mut up, mut down) = (h.clone(), h.clone());
                up.weight[i] += 1e-3;
                down.weight[i] -= 1e-3;
                let numeric = (loss(&up) - loss(&down)) / 2e-3;
                let analytic = (h.weight[i] - stepped.weight[i]) as f64 / lr;
                assert!(
                    (analytic - numeric).abs() < 2e-2,
                    "{weighting:?} w{i}: {analytic} vs {numeric}"
                );
            }
        }
    }
}
