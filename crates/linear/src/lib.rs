//! `linear`: the simplest readers that can learn a decision from a vector.
//!
//! - [`Vocabulary`]: a TF-IDF bag of words (unigrams and within-line bigrams) fitted on
//!   training documents, so a text digest becomes a fixed-length vector.
//! - [`Softmax`]: multinomial logistic regression over standardised features, fitted by
//!   full-batch Adam on the cross-entropy plus an L2 penalty, logging its loss and top-1/top-5
//!   accuracy on the training and (optionally) validation sets as it goes.
//!
//! It is the reference every learned Detector is measured against (`pathfinder eval
//! --detector classifier`) and the decision head of the learned Detector (fitted on the
//! language model's features). Pure arithmetic: no I/O, no randomness beyond the order of
//! nothing (full-batch), so the same data gives the same model.
//!
//! Invariants: a fitted model's probabilities sum to one and its `predict` is their argmax;
//! depends on no other Pathfinder crate.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// What can go wrong fitting or applying a linear model.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LinearError {
    #[error("no training examples")]
    Empty,
    #[error("example {index} has {got} features, expected {want}")]
    Dimension {
        index: usize,
        got: usize,
        want: usize,
    },
    #[error("example {index} has class {class}, but there are {classes} classes")]
    Class {
        index: usize,
        class: usize,
        classes: usize,
    },
}

pub type Result<T> = std::result::Result<T, LinearError>;

/// A TF-IDF vocabulary: which terms count and how rare each is in the training documents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Vocabulary {
    terms: BTreeMap<String, usize>,
    idf: Vec<f32>,
}

/// The terms of a document: each line's tokens, and each pair of adjacent tokens on a line.
pub fn terms(lines: &[Vec<String>]) -> Vec<String> {
    let mut out = Vec::new();
    for line in lines {
        out.extend(line.iter().cloned());
        out.extend(line.windows(2).map(|w| format!("{} {}", w[0], w[1])));
    }
    out
}

/// The terms printed by the documents of at least `min_groups` distinct groups (`groups[i]`
/// is document i's group, e.g. the framework that produced it). A term only one framework's
/// traces print identifies that framework as far as the documents can tell (a tool name, a
/// span name, a path), and a reader fitted on it learns the framework, not the deficiency; the
/// terms several frameworks share are the ones a framework never seen can print too.
pub fn shared_terms(docs: &[Vec<String>], groups: &[&str], min_groups: usize) -> BTreeSet<String> {
    let mut seen: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (d, g) in docs.iter().zip(groups) {
        for t in d {
            seen.entry(t.as_str()).or_default().insert(g);
        }
    }
    seen.into_iter()
        .filter(|(_, g)| g.len() >= min_groups)
        .map(|(t, _)| t.to_owned())
        .collect()
}

impl Vocabulary {
    /// Terms that occur in at least `min_df` of `docs` (each a document's terms).
    pub fn fit(docs: &[Vec<String>], min_df: usize) -> Vocabulary {
        let mut df: BTreeMap<&str, usize> = BTreeMap::new();
        for d in docs {
            let mut seen: Vec<&str> = d.iter().map(String::as_str).collect();
            seen.sort_unstable();
            seen.dedup();
            for t in seen {
                *df.entry(t).or_default() += 1;
            }
        }
        let n = docs.len() as f32;
        let mut terms = BTreeMap::new();
        let mut idf = Vec::new();
        for (t, c) in df {
            if c >= min_df.max(1) {
                terms.insert(t.to_owned(), idf.len());
                // Smoothed idf, as scikit-learn computes it.
                idf.push(((1.0 + n) / (1.0 + c as f32)).ln() + 1.0);
            }
        }
        Vocabulary { terms, idf }
    }

    pub fn len(&self) -> usize {
        self.idf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.idf.is_empty()
    }

    /// The L2-normalised TF-IDF vector of a document's terms (sublinear tf: 1 + ln count).
    pub fn vector(&self, doc: &[String]) -> Vec<f32> {
        let mut counts: BTreeMap<usize, f32> = BTreeMap::new();
        for t in doc {
            if let Some(&i) = self.terms.get(t) {
                *counts.entry(i).or_default() += 1.0;
            }
        }
        let mut v = vec![0f32; self.idf.len()];
        for (i, c) in counts {
            v[i] = (1.0 + c.ln()) * self.idf[i];
        }
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            v.iter_mut().for_each(|x| *x /= norm);
        }
        v
    }
}

/// How to fit a [`Softmax`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FitOptions {
    /// L2 penalty on the weights (not the biases), per example: loss = CE + l2·‖W‖²/2.
    pub l2: f32,
    pub lr: f32,
    /// Upper bound on full-batch epochs.
    pub max_epochs: usize,
    /// Stop when the training top-1 accuracy has not risen for this many epochs (after the
    /// first `patience`): the fit has converged on what it can separate.
    pub patience: usize,
    /// Log every this-many epochs (and the last).
    pub log_every: usize,
    /// Standardise each feature to zero mean, unit variance on the training set (dense model
    /// features); TF-IDF vectors are already on one scale and are left as they are.
    pub standardise: bool,
    /// With `standardise`, the last `raw_tail.0` features are not standardised but multiplied
    /// by `raw_tail.1`: sparse counts (hashed terms) that standardising blows up wherever a
    /// bucket is rare in training, so that a word seen in three traces weighs as much as one
    /// seen in all. None: every feature standardised.
    #[serde(default)]
    pub raw_tail: Option<(usize, f32)>,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            l2: 1e-3,
            lr: 0.05,
            max_epochs: 400,
            patience: 60,
            log_every: 20,
            standardise: true,
            raw_tail: None,
        }
    }
}

/// Adam's moments for one parameter vector (β₁ 0.9, β₂ 0.999, ε 1e-8, bias-corrected):
/// `p ← p − lr · m̂ / (√v̂ + ε)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Adam {
    m: Vec<f32>,
    v: Vec<f32>,
    t: i32,
}

impl Adam {
    pub fn new(len: usize) -> Adam {
        Adam {
            m: vec![0.0; len],
            v: vec![0.0; len],
            t: 0,
        }
    }

    /// One step of `params` down the gradient `grad` (both of the length given to `new`).
    pub fn step(&mut self, params: &mut [f32], grad: &[f32], lr: f32) {
        let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
        self.t += 1;
        let (c1, c2) = (1.0 - b1.powi(self.t), 1.0 - b2.powi(self.t));
        for ((p, g), (m, v)) in params
            .iter_mut()
            .zip(grad)
            .zip(self.m.iter_mut().zip(self.v.iter_mut()))
        {
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * g * g;
            *p -= lr * (*m / c1) / ((*v / c2).sqrt() + eps);
        }
    }
}

/// One line of a fit's log: what the decision has learned so far.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FitLog {
    pub epoch: usize,
    pub train_nll: f64,
    pub train_top1: f64,
    pub train_top5: f64,
    pub val_nll: Option<f64>,
    pub val_top1: Option<f64>,
    pub val_top5: Option<f64>,
}

/// Multinomial logistic regression: p(k | x) = softmax(W·z + b)_k with z the standardised x.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Softmax {
    pub classes: usize,
    pub dim: usize,
    /// `classes × dim`, row-major.
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
    /// Per-feature mean and inverse standard deviation applied before the product.
    pub mean: Vec<f32>,
    pub inv_std: Vec<f32>,
    /// A fixed shift of each class's score, added after the fit and never trained (empty: no
    /// shift): the decision's operating point, e.g. how much more evidence a deficiency needs
    /// than `none` before a detector names it. [`Softmax::fitted_logits_z`] leaves it out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prior: Vec<f32>,
}

/// The factor that standardises a feature of variance `var` and mean `mean` over the fitted
/// rows. A feature constant there (e.g. a hashed term bucket no train trace fills; constant up
/// to the rounding of an f32 mean) is left at its own scale rather than divided by zero:
/// dividing by ~1e-6 turned a word first seen in a live trace into a feature of a million, and
/// one PPO step on it into a weight that swamped every later trace holding that word
/// (`pathfinder train`'s decision head lost 9 points in 32 steps).
fn inverse_spread(var: f32, mean: f32) -> f32 {
    let sd = var.sqrt();
    if sd > 1e-5 * (1.0 + mean.abs()) {
        1.0 / sd
    } else {
        1.0
    }
}

fn check(x: &[Vec<f32>], y: &[usize], classes: usize) -> Result<usize> {
    let dim = x.first().ok_or(LinearError::Empty)?.len();
    for (index, v) in x.iter().enumerate() {
        if v.len() != dim {
            return Err(LinearError::Dimension {
                index,
                got: v.len(),
                want: dim,
            });
        }
    }
    for (index, &class) in y.iter().enumerate() {
        if class >= classes {
            return Err(LinearError::Class {
                index,
                class,
                classes,
            });
        }
    }
    Ok(dim)
}

/// Log-softmax of `logits` in place.
pub fn log_softmax(logits: &mut [f32]) {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let lse = logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln() + max;
    logits.iter_mut().for_each(|l| *l -= lse);
}

/// Mean NLL, top-1 and top-5 accuracy of log-probabilities `lp` against `y`.
pub fn score(lp: &[Vec<f32>], y: &[usize]) -> (f64, f64, f64) {
    let n = y.len().max(1) as f64;
    let (mut nll, mut top1, mut top5) = (0f64, 0usize, 0usize);
    for (row, &t) in lp.iter().zip(y) {
        nll -= row[t] as f64;
        // The true class's rank under `argmax`'s order: larger values first, ties to the
        // earlier class (so a model that scores every class alike is right only for class 0).
        let rank = row
            .iter()
            .enumerate()
            .filter(|&(j, &v)| v > row[t] || (v == row[t] && j < t))
            .count();
        top1 += usize::from(rank == 0);
        top5 += usize::from(rank < 5);
    }
    (nll / n, top1 as f64 / n, top5 as f64 / n)
}

impl Softmax {
    /// Fits on `x` (one vector per example) and classes `y` in `0..classes`, logging through
    /// `log` every `options.log_every` epochs, with the validation set's figures when given.
    pub fn fit(
        x: &[Vec<f32>],
        y: &[usize],
        classes: usize,
        options: &FitOptions,
        val: Option<(&[Vec<f32>], &[usize])>,
        mut log: impl FnMut(&FitLog),
    ) -> Result<Softmax> {
        let dim = check(x, y, classes)?;
        if let Some((vx, vy)) = val {
            if !vx.is_empty() {
                check(vx, vy, classes).and_then(|d| {
                    if d == dim {
                        Ok(d)
                    } else {
                        Err(LinearError::Dimension {
                            index: 0,
                            got: d,
                            want: dim,
                        })
                    }
                })?;
            }
        }
        let n = x.len();
        let (mean, inv_std) = if options.standardise {
            let mut mean = vec![0f32; dim];
            for v in x {
                mean.iter_mut().zip(v).for_each(|(m, a)| *m += a / n as f32);
            }
            let mut var = vec![0f32; dim];
            for v in x {
                for ((s, a), m) in var.iter_mut().zip(v).zip(&mean) {
                    *s += (a - m) * (a - m) / n as f32;
                }
            }
            let mut inv: Vec<f32> = var
                .iter()
                .zip(&mean)
                .map(|(s, m)| inverse_spread(*s, *m))
                .collect();
            if let Some((tail, scale)) = options.raw_tail {
                let from = dim.saturating_sub(tail);
                mean[from..].iter_mut().for_each(|m| *m = 0.0);
                inv[from..].iter_mut().for_each(|s| *s = scale);
            }
            (mean, inv)
        } else {
            (vec![0.0; dim], vec![1.0; dim])
        };
        let mut model = Softmax {
            classes,
            dim,
            weight: vec![0.0; classes * dim],
            bias: vec![0.0; classes],
            mean,
            inv_std,
            prior: Vec::new(),
        };
        // An epoch costs the inputs' non-zeros, not their width (bags of terms are mostly
        // zeros). In a column most examples leave at zero, example i's standardised value
        // z_ij = (x_ij − mean_j)·inv_std_j is kept as s_ij = x_ij·inv_std_j where x_ij ≠ 0, less
        // c_j = mean_j·inv_std_j which every example shares: W·z_i = W·s_i − W·c and
        // Σ_i g_ik z_i = Σ_i g_ik s_i − (Σ_i g_ik) c. The other columns keep z_ij itself (c_j = 0),
        // so that they take the steps the dense sums take (Adam follows a near-zero
        // gradient's sign, so where it cancels, the order of the sums shows).
        let mut filled = vec![0usize; dim];
        for v in x {
            for (f, a) in filled.iter_mut().zip(v) {
                *f += usize::from(*a != 0.0);
            }
        }
        let sparse: Vec<bool> = filled.iter().map(|f| 2 * f < n).collect();
        let shared: Vec<f32> = (0..dim)
            .map(|j| {
                if sparse[j] {
                    model.mean[j] * model.inv_std[j]
                } else {
                    0.0
                }
            })
            .collect();
        let scaled: Vec<Vec<(usize, f32)>> = x
            .iter()
            .map(|v| {
                (0..dim)
                    .filter(|&j| !sparse[j] || v[j] != 0.0)
                    .map(|j| {
                        let (m, inv) = (model.mean[j], model.inv_std[j]);
                        (
                            j,
                            if sparse[j] {
                                v[j] * inv
                            } else {
                                (v[j] - m) * inv
                            },
                        )
                    })
                    .collect()
            })
            .collect();
        let (mut adam_w, mut adam_b) = (Adam::new(classes * dim), Adam::new(classes));
        let mut best_top1 = -1.0;
        let mut since_best = 0;
        for epoch in 1..=options.max_epochs {
            // Gradient of mean CE + l2/2·‖W‖² over the whole batch.
            let rows = || model.weight.chunks_exact(dim);
            let w_shared: Vec<f32> = rows().map(|r| dot(r, &shared)).collect();
            let mut gw = vec![0f32; classes * dim];
            let mut gb = vec![0f32; classes];
            let mut lps = Vec::with_capacity(n);
            for (si, &yi) in scaled.iter().zip(y) {
                let mut lp: Vec<f32> = rows()
                    .zip(&model.bias)
                    .zip(&w_shared)
                    .map(|((r, b), c)| b + si.iter().map(|&(j, a)| r[j] * a).sum::<f32>() - c)
                    .collect();
                log_softmax(&mut lp);
                for (k, row) in gw.chunks_exact_mut(dim).enumerate() {
                    let g = (lp[k].exp() - f32::from(k == yi)) / n as f32;
                    gb[k] += g;
                    si.iter().for_each(|&(j, a)| row[j] += g * a);
                }
                lps.push(lp);
            }
            for ((row, g), w) in gw
                .chunks_exact_mut(dim)
                .zip(&gb)
                .zip(model.weight.chunks_exact(dim))
            {
                for ((gj, c), wj) in row.iter_mut().zip(&shared).zip(w) {
                    *gj += options.l2 * wj - g * c;
                }
            }
            adam_w.step(&mut model.weight, &gw, options.lr);
            adam_b.step(&mut model.bias, &gb, options.lr);
            // lps are the log-probabilities before this epoch's update.
            let (nll, top1, top5) = score(&lps, y);
            if top1 > best_top1 {
                best_top1 = top1;
                since_best = 0;
            } else {
                since_best += 1;
            }
            let done = epoch == options.max_epochs
                || (epoch > options.patience && since_best >= options.patience);
            if epoch % options.log_every.max(1) == 0 || done {
                let (val_nll, val_top1, val_top5) = match val {
                    Some((vx, vy)) if !vx.is_empty() => {
                        let lp: Vec<Vec<f32>> = vx.iter().map(|v| model.log_probs(v)).collect();
                        let (a, b, c) = score(&lp, vy);
                        (Some(a), Some(b), Some(c))
                    }
                    _ => (None, None, None),
                };
                log(&FitLog {
                    epoch,
                    train_nll: nll,
                    train_top1: top1,
                    train_top5: top5,
                    val_nll,
                    val_top1,
                    val_top5,
                });
            }
            if done {
                break;
            }
        }
        Ok(model)
    }

    /// `x` standardised with the training set's mean and scale (what the weights multiply).
    pub fn standardised(&self, x: &[f32]) -> Vec<f32> {
        x.iter()
            .zip(&self.mean)
            .zip(&self.inv_std)
            .map(|((a, m), s)| (a - m) * s)
            .collect()
    }

    /// The scores of an already standardised `z`, with the [`Softmax::prior`] shift: what
    /// a decision acts on.
    pub fn logits_z(&self, z: &[f32]) -> Vec<f32> {
        let mut l = self.fitted_logits_z(z);
        l.iter_mut().zip(&self.prior).for_each(|(l, p)| *l += p);
        l
    }

    /// W·z + b without the prior shift: the model of the training data's labels, which a
    /// cross-entropy fit changes.
    pub fn fitted_logits_z(&self, z: &[f32]) -> Vec<f32> {
        (0..self.classes)
            .map(|k| {
                let row = &self.weight[k * self.dim..(k + 1) * self.dim];
                self.bias[k] + row.iter().zip(z).map(|(w, a)| w * a).sum::<f32>()
            })
            .collect()
    }

    /// The unnormalised scores of `x`.
    pub fn logits(&self, x: &[f32]) -> Vec<f32> {
        self.logits_z(&self.standardised(x))
    }

    /// Log-probabilities of every class.
    pub fn log_probs(&self, x: &[f32]) -> Vec<f32> {
        let mut lp = self.logits(x);
        log_softmax(&mut lp);
        lp
    }

    /// Probabilities of every class (they sum to one).
    pub fn probs(&self, x: &[f32]) -> Vec<f32> {
        self.log_probs(x).into_iter().map(f32::exp).collect()
    }

    /// The most probable class (the first on ties).
    pub fn predict(&self, x: &[f32]) -> usize {
        argmax(&self.logits(x))
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The index of class `name` in `classes`, which grows by `name` when it is new: how label
/// lists are built in the order the training data names them.
pub fn class_index(classes: &mut Vec<String>, name: &str) -> usize {
    match classes.iter().position(|c| c == name) {
        Some(i) => i,
        None => {
            classes.push(name.to_owned());
            classes.len() - 1
        }
    }
}

/// Index of the largest value (the first on ties); 0 for an empty slice.
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

/// `options.max_epochs` of the fit's Adam steps in their plain dense form — every input
/// standardised in full by `scale`'s statistics, W·z and g ⊗ z over every column, no early stop —
/// from zero weights: the reference [`Softmax::fit`]'s sums over non-zeros are tested and
/// benchmarked against (`benches/fit.rs`). Not for fitting.
#[doc(hidden)]
pub fn dense_fit(
    x: &[Vec<f32>],
    y: &[usize],
    classes: usize,
    options: &FitOptions,
    scale: &Softmax,
) -> Softmax {
    let (n, dim) = (x.len(), x[0].len());
    let mut model = Softmax {
        weight: vec![0.0; classes * dim],
        bias: vec![0.0; classes],
        ..scale.clone()
    };
    let z: Vec<Vec<f32>> = x.iter().map(|v| model.standardised(v)).collect();
    let (mut adam_w, mut adam_b) = (Adam::new(classes * dim), Adam::new(classes));
    for _ in 0..options.max_epochs {
        let mut gw = vec![0f32; classes * dim];
        let mut gb = vec![0f32; classes];
        for (zi, &yi) in z.iter().zip(y) {
            let mut lp = model.fitted_logits_z(zi);
            log_softmax(&mut lp);
            for k in 0..classes {
                let g = (lp[k].exp() - f32::from(k == yi)) / n as f32;
                gb[k] += g;
                let row = &mut gw[k * dim..(k + 1) * dim];
                row.iter_mut().zip(zi).for_each(|(w, a)| *w += g * a);
            }
        }
        gw.iter_mut()
            .zip(&model.weight)
            .for_each(|(g, w)| *g += options.l2 * w);
        adam_w.step(&mut model.weight, &gw, options.lr);
        adam_b.step(&mut model.bias, &gb, options.lr);
    }
    model
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_terms_keeps_what_enough_groups_print() {
        let doc = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        let docs = vec![
            doc("error retry a"),
            doc("error b"),
            doc("retry c"),
            doc("c"),
        ];
        let groups = ["x", "x", "y", "z"];
        let two = shared_terms(&docs, &groups, 2);
        // `b` is printed twice but by one framework: it names x, not a behaviour.
        assert_eq!(
            two.into_iter().collect::<Vec<_>>(),
            ["c", "retry"].map(String::from)
        );
        assert!(shared_terms(&docs, &groups, 3).is_empty());
        assert_eq!(shared_terms(&docs, &groups, 1).len(), 5);
    }

    #[test]
    fn the_fit_over_non_zeros_takes_the_dense_gradient_steps() {
        // Sparse inputs (a bag of terms beside a dense block), standardised, with a raw tail:
        // every epoch of the fit must take the step the dense gradient of mean CE + l2 gives.
        let (n, dim, classes) = (24, 12, 3);
        // A small linear congruential stream: data without the symmetries that make a true
        // gradient exactly zero (where Adam's step follows the rounding's sign).
        let mut state = 12345u32;
        let mut next = move || {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (state >> 8) as f32 / (1u32 << 24) as f32
        };
        let x: Vec<Vec<f32>> = (0..n)
            .map(|_| {
                (0..dim)
                    .map(|j| match j {
                        0..=2 => next() * 2.0 - 1.0,
                        // A constant column and a column no example fills.
                        3 => 0.7,
                        4 => 0.0,
                        _ if next() < 0.25 => 1.0 + next() * 2.0,
                        _ => 0.0,
                    })
                    .collect()
            })
            .collect();
        let y: Vec<usize> = (0..n).map(|i| i % classes).collect();
        let options = FitOptions {
            l2: 0.05,
            lr: 0.03,
            max_epochs: 25,
            patience: 1000,
            log_every: 1000,
            standardise: true,
            raw_tail: Some((4, 0.5)),
        };
        let fitted = Softmax::fit(&x, &y, classes, &options, None, |_| {}).unwrap();
        // The same steps taken densely, from the fitted scale.
        let model = dense_fit(&x, &y, classes, &options, &fitted);
        for (a, b) in fitted.weight.iter().zip(&model.weight) {
            assert!((a - b).abs() < 1e-4, "{a} against {b}");
        }
        for (a, b) in fitted.bias.iter().zip(&model.bias) {
            assert!((a - b).abs() < 1e-4, "{a} against {b}");
        }
        assert!(fitted.weight.iter().any(|w| w.abs() > 0.1));
        // The column no example fills is never stepped on.
        for k in 0..classes {
            assert_eq!(fitted.weight[k * dim + 4], 0.0);
        }
    }

    fn blobs() -> (Vec<Vec<f32>>, Vec<usize>) {
        // Three separable clusters in 2-D with a useless third feature.
        let mut x = Vec::new();
        let mut y = Vec::new();
        for i in 0..30 {
            let k = i % 3;
            let j = (i / 3) as f32 * 0.01;
            let c = [(0.0, 0.0), (3.0, 0.0), (0.0, 3.0)][k];
            x.push(vec![c.0 + j, c.1 - j, 1.0]);
            y.push(k);
        }
        (x, y)
    }

    #[test]
    fn adam_steps_scale_by_each_parameter_and_reach_the_minimum() {
        // f(p) = (p₀ − 3)² + 100·(p₁ + 1)²: the first step moves each parameter by lr alone,
        // whatever its gradient's size, and the steps then settle at the minimum.
        let grad = |p: &[f32]| vec![2.0 * (p[0] - 3.0), 200.0 * (p[1] + 1.0)];
        let mut p = vec![0.0f32, 0.0];
        let mut adam = Adam::new(2);
        let g = grad(&p);
        adam.step(&mut p, &g, 0.1);
        assert!(
            (p[0] - 0.1).abs() < 1e-4 && (p[1] + 0.1).abs() < 1e-4,
            "{p:?}"
        );
        for _ in 0..2000 {
            let g = grad(&p);
            adam.step(&mut p, &g, 0.05);
        }
        assert!(
            (p[0] - 3.0).abs() < 1e-2 && (p[1] + 1.0).abs() < 1e-2,
            "{p:?}"
        );
    }

    #[test]
    fn a_feature_constant_in_the_fit_keeps_its_scale() {
        // The third feature is 1.0 in every fitted row: a later row's 3.0 is 2.0 above the
        // mean, not two million standard deviations.
        let (x, y) = blobs();
        let m = Softmax::fit(&x, &y, 3, &FitOptions::default(), None, |_| {}).unwrap();
        let z = m.standardised(&[0.0, 0.0, 3.0]);
        assert!((z[2] - 2.0).abs() < 1e-4, "{z:?}");
        let mut wide = x.clone();
        wide.iter_mut().for_each(|r| r[2] = 250.0);
        let m = Softmax::fit(&wide, &y, 3, &FitOptions::default(), None, |_| {}).unwrap();
        let z = m.standardised(&[0.0, 0.0, 251.0]);
        assert!((z[2] - 1.0).abs() < 1e-2, "{z:?}");
        // A feature that varies is standardised as before.
        assert!((m.inv_std[0] - 1.0).abs() > 0.1, "{:?}", m.inv_std);
    }

    #[test]
    fn a_raw_tail_is_scaled_not_standardised() {
        let (x, y) = blobs();
        let options = FitOptions {
            max_epochs: 5,
            raw_tail: Some((1, 4.0)),
            ..FitOptions::default()
        };
        let m = Softmax::fit(&x, &y, 3, &options, None, |_| {}).unwrap();
        // The first two features are centred; the last (1.0 everywhere) is only scaled.
        let z = m.standardised(&x[0]);
        assert!(m.mean[0] != 0.0 && m.mean[2] == 0.0, "{:?}", m.mean);
        assert_eq!(z[2], 4.0);
        let all = Softmax::fit(
            &x,
            &y,
            3,
            &FitOptions {
                raw_tail: None,
                ..options
            },
            None,
            |_| {},
        )
        .unwrap();
        // Standardised, the same feature is centred on its mean, 1.
        assert!((all.mean[2] - 1.0).abs() < 1e-4, "{:?}", all.mean);
    }

    #[test]
    fn fits_separable_classes_and_probabilities_sum_to_one() {
        let (x, y) = blobs();
        let mut logs = Vec::new();
        let m = Softmax::fit(&x, &y, 3, &FitOptions::default(), Some((&x, &y)), |l| {
            logs.push(*l)
        })
        .unwrap();
        for (v, &k) in x.iter().zip(&y) {
            assert_eq!(m.predict(v), k);
            let p = m.probs(v);
            assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            assert_eq!(argmax(&p), m.predict(v));
        }
        let last = logs.last().unwrap();
        assert_eq!(last.train_top1, 1.0);
        assert!(last.train_nll < logs[0].train_nll);
        assert_eq!(last.val_top1, Some(1.0));
    }

    #[test]
    fn a_prior_shifts_the_decision_but_not_the_fit() {
        let (x, y) = blobs();
        let mut m = Softmax::fit(&x, &y, 3, &FitOptions::default(), None, |_| {}).unwrap();
        let z = m.standardised(&x[0]);
        let fitted = m.logits_z(&z);
        assert_eq!(m.predict(&x[0]), 0);
        // A written model without the field (an older checkpoint) reads back with no shift.
        let json = serde_json::to_string(&m).unwrap();
        assert!(!json.contains("prior"));
        assert_eq!(serde_json::from_str::<Softmax>(&json).unwrap(), m);
        m.prior = vec![0.0, 1e3, 0.0];
        assert_eq!(m.predict(&x[0]), 1);
        assert_eq!(m.fitted_logits_z(&z), fitted);
        assert!((m.logits_z(&z)[1] - fitted[1] - 1e3).abs() < 1e-2);
        assert!((m.probs(&x[0]).iter().sum::<f32>() - 1.0).abs() < 1e-5);
        let back: Softmax = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn ties_rank_like_argmax() {
        // A model that scores every class alike: only class 0 counts as its top-1 answer.
        let lp = vec![vec![0.5f32; 8]; 3];
        let (_, top1, top5) = score(&lp, &[0, 3, 7]);
        assert!((top1 - 1.0 / 3.0).abs() < 1e-9);
        assert!((top5 - 2.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn bad_input_is_named() {
        assert_eq!(
            Softmax::fit(&[], &[], 2, &FitOptions::default(), None, |_| {}).unwrap_err(),
            LinearError::Empty
        );
        let e = Softmax::fit(
            &[vec![1.0], vec![1.0, 2.0]],
            &[0, 1],
            2,
            &FitOptions::default(),
            None,
            |_| {},
        )
        .unwrap_err();
        assert_eq!(
            e,
            LinearError::Dimension {
                index: 1,
                got: 2,
                want: 1
            }
        );
        let e =
            Softmax::fit(&[vec![1.0]], &[5], 2, &FitOptions::default(), None, |_| {}).unwrap_err();
        assert!(matches!(e, LinearError::Class { class: 5, .. }));
    }

    #[test]
    fn tf_idf_vectors_are_unit_length_and_ignore_unknown_terms() {
        let docs = vec![
            terms(&[vec!["error".into(), "recursion".into()]]),
            terms(&[vec!["error".into(), "timeout".into()]]),
        ];
        let voc = Vocabulary::fit(&docs, 1);
        assert!(voc.terms.contains_key("error recursion"));
        let v = voc.vector(&docs[0]);
        assert!((v.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-5);
        assert!(voc
            .vector(&["unseen".to_string()])
            .iter()
            .all(|x| *x == 0.0));
        // A term in every document weighs less than one in a single document.
        let e = voc.terms["error"];
        let r = voc.terms["recursion"];
        assert!(v[e] < v[r]);
    }
}
