//! The learned Detector's decision as one whole choice.
//!
//! The Detector runs the probe library (`detect::probes`), reads the digests as a conversation
//! — the catalog with every id's short name in the system prompt, each probe as a named call
//! and its digest as the observation, then `answer:` — and decides through a head on the
//! model's hidden states: the mean over the trace-specific part of the conversation and the
//! state at the answer position, standardised, then a softmax over the types the corpus labels
//! (the catalog's ids, plus `none` for healthy traces) and a second over components.
//!
//! Why a head and not the answer spelled token by token: decoded digit by digit, a diffuse
//! posterior follows the heaviest prefix (22 of the 50 ids start with `1` after their letter),
//! and sampling over whole options needs every option's sequence probability. A head gives the
//! categorical distribution over whole options in one pass: it sums to one, greedy is its
//! argmax, and PPO samples from it with exact log-probabilities.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use detect::probes::{self, ProbeResult};
use detect::Verdict;
use linear::{Softmax, Vocabulary};
use serde::{Deserialize, Serialize};

use crate::calibration::{deficiency_score, Calibration};
use crate::chat::Conversation;
use crate::frame::Frame;
use crate::policy_model::PolicyModel;
use crate::{PolicyError, Result};

/// The answer for a trace with no deficiency (the taxonomy's own word for it).
pub use taxonomy::NONE;

/// The component named with `none` (a healthy trace has no faulty component).
pub const NO_COMPONENT: &str = "none";

/// File of a checkpoint's decision head, in the directory of the adapter it reads.
pub const HEAD_FILE: &str = "decision_head.json";
/// The warm-started head PPO's KL term is anchored at, beside it.
pub const REFERENCE_HEAD_FILE: &str = "decision_head_reference.json";

/// A catalog id's short name: the catalog name before its colon, at most six words.
pub fn short_name(name: &str) -> String {
    let head = name.split(':').next().unwrap_or(name);
    head.split_whitespace()
        .take(6)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The system prompt of a whole-choice investigation: the task and the compact catalog.
pub fn system_prompt(catalog: &taxonomy::Catalog) -> String {
    let mut s = String::from(
        "You are the Detector. Probes measured an AI agent's run; decide which deficiency of the agent's code the run shows, or none if it is healthy. The deficiencies:\n",
    );
    for d in catalog.deficiencies() {
        s.push_str(&d.id);
        s.push(' ');
        s.push_str(&short_name(&d.name));
        s.push('\n');
    }
    s
}

/// The conversation the decision reads, and where its trace-specific part starts.
pub fn conversation(
    pm: &PolicyModel,
    system: &str,
    battery: &[ProbeResult],
) -> Result<(Vec<u32>, usize)> {
    let mut c = Conversation::new();
    c.push_message(&pm.tokenizer, "system", system)?;
    let from = c.len();
    c.push_message(&pm.tokenizer, "user", "Investigate the trace.")?;
    // Only the feature probes: the code's own names say which framework ran, not what failed.
    for r in battery.iter().filter(|r| probes::is_feature(r.probe)) {
        c.push_message(&pm.tokenizer, "assistant", &format!("probe: {}", r.probe))?;
        c.push_message(&pm.tokenizer, "user", &r.digest)?;
    }
    c.open_reply(&pm.tokenizer)?;
    let mut tokens = c.tokens;
    tokens.extend(pm.tokenizer.encode("answer:", false)?);
    Ok((tokens, from))
}

/// The features of a battery: `[mean of the hidden states from the trace-specific part on;
/// the hidden state at the answer position]`, `2 × hidden` values.
pub fn features(
    pm: &PolicyModel,
    adapter: Option<&str>,
    system: &str,
    battery: &[ProbeResult],
) -> Result<Vec<f32>> {
    let (tokens, from) = conversation(pm, system, battery)?;
    let hidden = pm.model.hidden(&tokens, adapter)?;
    pool(&hidden, from)
}

/// What a decision head reads of a battery besides its label: the model's pooled features
/// (`states`), then the digests' terms, hashed into `terms` buckets or counted in an exact
/// `vocabulary`. Saved with the head, so that every trace it reads later is read the way its
/// fit read the train split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeadReads {
    /// The model's features lead the input (false: the head reads the terms alone, and no
    /// model runs to read a trace).
    #[serde(default = "reads_states", skip_serializing_if = "is_true")]
    pub states: bool,
    /// Hashed term buckets its input ends with (0: none, or an exact `vocabulary`).
    #[serde(default)]
    pub terms: usize,
    /// The only terms it reads (`[head] term_frameworks`), when it was fitted with a filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term_filter: Option<BTreeSet<String>>,
    /// The terms counted one by one, weighted by their rarity in the train split (TF-IDF, as
    /// the `classifier` reference reads them; `[head] vocabulary_min_df`), instead of hashed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocabulary: Option<Vocabulary>,
}

fn reads_states() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

impl Default for HeadReads {
    /// The model's features alone.
    fn default() -> Self {
        HeadReads::hashed(0, None)
    }
}

impl HeadReads {
    /// The model's features and `terms` hashed buckets of the terms in `keep` (every term
    /// when `None`).
    pub fn hashed(terms: usize, keep: Option<BTreeSet<String>>) -> HeadReads {
        HeadReads {
            states: true,
            terms,
            term_filter: keep,
            vocabulary: None,
        }
    }

    /// How many of the input's values are terms (the rest, before them, the model's).
    pub fn term_width(&self) -> usize {
        match &self.vocabulary {
            Some(v) => v.len(),
            None => self.terms,
        }
    }
}

/// What the decision head reads ([`HeadReads`]): the model's features of a battery (unless
/// `reads.states` is false, when `features` is ignored), then the battery's terms. The terms
/// are the words and within-line word pairs of the digests (numbers by their order of
/// magnitude, `probes::battery_lines` and `linear::terms`, as the `classifier` reference reads
/// them): hashed into `reads.terms` buckets, each 1 + ln(count), the whole L2-normalised; or,
/// with a vocabulary, its TF-IDF vector. Why both: the pooled hidden states blur which exact
/// lines a digest holds, and on the default corpus a linear reader of the hashed terms alone
/// names more held-out traces than one of the pooled states, and gains more from new traces
/// (BENCHMARKS.md, "What the live traces are worth to each reader").
///
/// `reads.term_filter`: when given, only these terms are read (a head fitted with `[head]
/// term_frameworks`: the terms the train traces of several frameworks print,
/// [`linear::shared_terms`]); a term outside it never reaches the head.
pub fn head_input(features: Vec<f32>, battery: &[ProbeResult], reads: &HeadReads) -> Vec<f32> {
    let mut input = if reads.states { features } else { Vec::new() };
    let keep = reads.term_filter.as_ref();
    let terms = || {
        linear::terms(&probes::battery_lines(battery))
            .into_iter()
            .filter(|t| keep.is_none_or(|k| k.contains(t)))
    };
    if let Some(vocabulary) = &reads.vocabulary {
        input.extend(vocabulary.vector(&terms().collect::<Vec<_>>()));
        return input;
    }
    if reads.terms == 0 {
        return input;
    }
    let mut buckets = vec![0f32; reads.terms];
    for term in terms() {
        // FNV-1a: stable across runs and machines, unlike the standard library's hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in term.as_bytes() {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        buckets[(h % reads.terms as u64) as usize] += 1.0;
    }
    for b in buckets.iter_mut().filter(|b| **b > 0.0) {
        *b = 1.0 + b.ln();
    }
    let norm = buckets.iter().map(|b| b * b).sum::<f32>().sqrt();
    if norm > 0.0 {
        buckets.iter_mut().for_each(|b| *b /= norm);
    }
    input.extend(buckets);
    input
}

/// `features` moved by a calibration's `shift`.
pub fn recentre(features: &[f32], shift: &[f32]) -> Vec<f32> {
    features.iter().zip(shift).map(|(a, b)| a + b).collect()
}

/// Mean of the rows from `from` on, then the last row.
fn pool(hidden: &model::Tensor, from: usize) -> Result<Vec<f32>> {
    let hidden = hidden
        .to_dtype(model::DType::F32)
        .map_err(model::ModelError::from)?;
    let t = hidden.dim(0).map_err(model::ModelError::from)?;
    let rows = hidden
        .narrow(0, from, t - from)
        .and_then(|h| h.mean(0))
        .and_then(|m| m.to_vec1::<f32>())
        .map_err(model::ModelError::from)?;
    let last = hidden
        .narrow(0, t - 1, 1)
        .and_then(|h| h.squeeze(0))
        .and_then(|h| h.to_vec1::<f32>())
        .map_err(model::ModelError::from)?;
    Ok(rows.into_iter().chain(last).collect())
}

/// [`features`] for many batteries with the system prompt computed once: its keys and values
/// are cached and each battery continues a copy of that cache, so only the trace-specific
/// tokens are run again (the same numbers as [`features`] up to the fused kernels' rounding).
pub struct FeatureReader {
    prefix: model::KvCache,
    prefix_len: usize,
    adapter: Option<String>,
    system: String,
    /// A directory of features already computed, by model and conversation (see
    /// [`FeatureReader::with_cache`]).
    cache: Option<(std::path::PathBuf, String)>,
}

/// What the features depend on besides the conversation: the base weights' source and the
/// adapter's effective change. An adapter whose `B` factors are all zero changes nothing (PEFT's
/// initialisation), so it reads like the base whatever its `A`.
pub fn model_fingerprint(pm: &PolicyModel, adapter: Option<&str>) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(pm.base_name.as_bytes());
    if let Some(a) = adapter.and_then(|a| pm.model.adapter(a)) {
        let mut factors = Sha256::new();
        let mut zero = true;
        let values = |v: &model::Var| {
            v.as_tensor()
                .flatten_all()
                .and_then(|t| t.to_dtype(model::DType::F32))
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(model::ModelError::from)
        };
        for ((layer, proj), pair) in a.pairs() {
            let b = values(&pair.b)?;
            let av = values(&pair.a)?;
            zero &= b.iter().all(|x| *x == 0.0);
            factors.update(format!("{layer}{proj:?}").as_bytes());
            for x in av.iter().chain(&b) {
                factors.update(x.to_le_bytes());
            }
        }
        if !zero {
            h.update(factors.finalize());
        }
    }
    Ok(format!("{:x}", h.finalize()))
}

impl FeatureReader {
    pub fn new(pm: &mut PolicyModel, adapter: Option<&str>, system: &str) -> Result<FeatureReader> {
        let mut c = Conversation::new();
        c.push_message(&pm.tokenizer, "system", system)?;
        pm.model.set_active_adapter(adapter)?;
        let mut prefix = model::KvCache::new(&pm.model, 1);
        pm.model
            .feed_hidden(&mut prefix, std::slice::from_ref(&c.tokens))?;
        Ok(FeatureReader {
            prefix,
            prefix_len: c.len(),
            adapter: adapter.map(str::to_owned),
            system: system.to_owned(),
            cache: None,
        })
    }

    /// Keeps every computed feature vector in `dir` under the sha256 of the model's
    /// [`model_fingerprint`] and the conversation's tokens, and reads it back instead of
    /// running the model again: the same trace is read by the warm start, every evaluation
    /// and every seed of a run with the same frozen features. A file that cannot be read back
    /// whole is recomputed.
    pub fn with_cache(
        mut self,
        pm: &PolicyModel,
        dir: std::path::PathBuf,
    ) -> Result<FeatureReader> {
        let fingerprint = model_fingerprint(pm, self.adapter.as_deref())?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| PolicyError::Io(format!("{}: {e}", dir.display())))?;
        self.cache = Some((dir, fingerprint));
        Ok(self)
    }

    /// The model's features a head that reads as `reads` says needs of a battery: none (and
    /// no model pass) when it reads the terms alone.
    pub fn features_for(
        &self,
        pm: &mut PolicyModel,
        battery: &[ProbeResult],
        reads: &HeadReads,
    ) -> Result<Vec<f32>> {
        if reads.states {
            self.features(pm, battery)
        } else {
            Ok(Vec::new())
        }
    }

    pub fn features(&self, pm: &mut PolicyModel, battery: &[ProbeResult]) -> Result<Vec<f32>> {
        let (tokens, from) = conversation(pm, &self.system, battery)?;
        debug_assert_eq!(from, self.prefix_len);
        let width = 2 * pm.model.config().hidden_size;
        let cached = self.cache.as_ref().map(|(dir, fingerprint)| {
            use sha2::{Digest, Sha256};
            let mut h = Sha256::new();
            h.update(fingerprint.as_bytes());
            for t in &tokens {
                h.update(t.to_le_bytes());
            }
            dir.join(format!("{:x}.f32", h.finalize()))
        });
        if let Some(path) = &cached {
            if let Ok(bytes) = std::fs::read(path) {
                if bytes.len() == 4 * width {
                    return Ok(bytes
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect());
                }
            }
        }
        let x = self.compute(pm, &tokens)?;
        if let Some(path) = &cached {
            let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
            // A name of this process's own: the ranks of a data-parallel job share the cache.
            let tmp = path.with_extension(format!("partial-{}", std::process::id()));
            std::fs::write(&tmp, bytes)
                .and_then(|_| std::fs::rename(&tmp, path))
                .map_err(|e| PolicyError::Io(format!("{}: {e}", path.display())))?;
        }
        Ok(x)
    }

    fn compute(&self, pm: &mut PolicyModel, tokens: &[u32]) -> Result<Vec<f32>> {
        pm.model.set_active_adapter(self.adapter.as_deref())?;
        let mut cache = self.prefix.clone();
        let rest = tokens[self.prefix_len..].to_vec();
        let hidden = pm
            .model
            .feed_hidden(&mut cache, &[rest])?
            .squeeze(0)
            .map_err(model::ModelError::from)?;
        pool(&hidden, 0)
    }
}

/// The decision head: a softmax over types and one over components, on [`features`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionHead {
    /// Type ids in class order (`none` among them when the training data had healthy traces).
    pub types: Vec<String>,
    pub type_model: Softmax,
    pub components: Vec<String>,
    pub component_model: Softmax,
    /// What its input holds and how the digests' terms are read ([`head_input`]).
    #[serde(flatten)]
    pub reads: HeadReads,
    /// The mean input of the healthy traces it was fitted on (empty: it had none, or it was
    /// saved before heads recorded it): where a calibration recentres a framework's healthy
    /// runs ([`crate::calibration::recentre_shift`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub healthy_mean: Vec<f32>,
    /// The operating point set on a user's healthy runs, when one is in use (greedy
    /// decisions only; kept in its own file beside the checkpoint, not in the head's).
    #[serde(skip)]
    pub calibration: Option<Calibration>,
    /// A framed head's training frameworks and their frames: it was fitted on each
    /// framework's inputs minus that framework's typical input ([`crate::frame`]), and reads a
    /// trace only through a frame. Empty: it reads inputs as they are.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub frames: BTreeMap<String, Frame>,
    /// The frame of the traces it is reading now (set with [`DecisionHead::set_frame`]),
    /// applied before everything else, sampled decisions included.
    #[serde(skip)]
    pub frame: Option<Frame>,
}

/// The head's choice in its own terms: indices into [`DecisionHead::types`] and
/// [`DecisionHead::components`] and the type distribution they were drawn from (what PPO's
/// ratio needs). The answer it stands for is [`DecisionHead::verdict`].
#[derive(Debug, Clone, PartialEq)]
pub struct HeadChoice {
    pub type_index: usize,
    pub component_index: usize,
    /// Log-probabilities over [`DecisionHead::types`] (they exponentiate to a sum of one).
    pub type_log_probs: Vec<f32>,
}

impl DecisionHead {
    /// Its input for a battery whose model features are `features`: the features and the
    /// battery's terms as this head hashes them ([`head_input`]), checked against its width.
    pub fn input(
        &self,
        features: Vec<f32>,
        battery: &[ProbeResult],
    ) -> std::result::Result<Vec<f32>, String> {
        let x = head_input(features, battery, &self.reads);
        if x.len() != self.type_model.dim {
            return Err(format!(
                "the decision head reads {} features, the model{} and {} terms give {}",
                self.type_model.dim,
                if self.reads.states { "" } else { " (not read)" },
                self.reads.term_width(),
                x.len()
            ));
        }
        Ok(x)
    }

    /// Greedy (`temperature` 0: the argmax) or sampled with `u`, a uniform number in [0, 1).
    ///
    /// With a [`Calibration`], a greedy decision also answers `none` when the trace's
    /// deficiency score is at or below its threshold: a calibration only takes back
    /// deficiencies the head would name (it never names one the head's operating point would
    /// not), so the false-positive rate is at most the lower of the two.
    pub fn decide(&self, features: &[f32], temperature: f32, u: f64) -> HeadChoice {
        self.decide_framed(&self.framed(features), temperature, u)
    }

    /// [`DecisionHead::decide`] on an input already read through the head's frame
    /// ([`DecisionHead::framed`]): the trainer keeps framed inputs and samples from them again.
    pub fn decide_framed(&self, features: &[f32], temperature: f32, u: f64) -> HeadChoice {
        let recentred;
        let features = match &self.calibration {
            Some(c) if temperature <= 0.0 && !c.recentre.is_empty() => {
                recentred = recentre(features, &c.recentre);
                &recentred[..]
            }
            _ => features,
        };
        let lp = self.type_model.log_probs(features);
        let type_index = match (&self.calibration, self.none_index()) {
            (Some(c), Some(none)) if temperature <= 0.0 => {
                if c.flags(deficiency_score(&self.types, &lp)) {
                    linear::argmax(&lp)
                } else {
                    none
                }
            }
            _ if temperature <= 0.0 => linear::argmax(&lp),
            _ => sample(&lp, temperature, u),
        };
        HeadChoice {
            type_index,
            component_index: self.component_for(type_index, features),
            type_log_probs: lp,
        }
    }

    /// The component of an answer naming class `type_index`: the component head's argmax,
    /// except that a deficiency is never placed at `none` (a verdict the Detector's grammar
    /// refuses, so the episode would end without an answer): then the best other component.
    fn component_for(&self, type_index: usize, features: &[f32]) -> usize {
        let logits = self.component_model.logits(features);
        let best = linear::argmax(&logits);
        if self.types[type_index] == NONE || self.components[best] != NO_COMPONENT {
            return best;
        }
        logits
            .iter()
            .enumerate()
            .filter(|(i, _)| self.components[*i] != NO_COMPONENT)
            .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
            .map_or(best, |(i, _)| i)
    }

    /// The calibration set on a framework's `healthy` head inputs: for a framed head, their
    /// median as the frame; its input recentred on them when `recentre_first`
    /// ([`crate::calibration::recentre_shift`]); then the conformal threshold at `alpha` over
    /// their deficiency scores as the head then reads them.
    pub fn calibration_on(
        &self,
        name: &str,
        healthy: &[&[f32]],
        alpha: f64,
        recentre_first: bool,
    ) -> Result<Calibration> {
        // A framed head reads the runs, and every trace under this calibration, through
        // their own typical input: the median of the healthy runs ([`crate::frame`]).
        let frame = if self.is_framed() {
            let name = format!("{} healthy runs of {name}", healthy.len());
            Some(Frame::median_of(&name, healthy)?)
        } else {
            None
        };
        self.calibration_through(name, frame, healthy, alpha, recentre_first)
    }

    /// [`DecisionHead::calibration_on`] with the frame taken over a user's `runs` of unknown
    /// health (a store of them: many more than the runs known to be healthy, most of them
    /// healthy) and the recentring and threshold set on the `healthy` runs read through that
    /// frame. Only a framed head reads traces through a frame.
    pub fn calibration_framed_by(
        &self,
        name: &str,
        runs: &[&[f32]],
        healthy: &[&[f32]],
        alpha: f64,
        recentre_first: bool,
    ) -> Result<Calibration> {
        self.check_framed()?;
        let frame = Frame::median_of(&format!("{} runs of {name}", runs.len()), runs)?;
        self.calibration_through(name, Some(frame), healthy, alpha, recentre_first)
    }

    /// The recentring and threshold on `healthy` read through `frame` (none: as the head reads
    /// them now).
    fn calibration_through(
        &self,
        name: &str,
        frame: Option<Frame>,
        healthy: &[&[f32]],
        alpha: f64,
        recentre_first: bool,
    ) -> Result<Calibration> {
        // The runs as the head reads them: under the frame, which the shift then moves (a
        // framed head's `healthy_mean` is of framed inputs too).
        let framed: Vec<Vec<f32>> = healthy
            .iter()
            .map(|x| match &frame {
                Some(f) => f.apply(x),
                None => self.framed(x),
            })
            .collect();
        let shift = if recentre_first {
            let rows: Vec<&[f32]> = framed.iter().map(Vec::as_slice).collect();
            Some(crate::calibration::recentre_shift(
                &self.healthy_mean,
                &rows,
            )?)
        } else {
            None
        };
        let scores: Vec<f32> = framed
            .iter()
            .map(|x| {
                let lp = match &shift {
                    Some(s) => self.type_model.log_probs(&recentre(x, s)),
                    None => self.type_model.log_probs(x),
                };
                deficiency_score(&self.types, &lp)
            })
            .collect();
        let calibration = Calibration::conformal(name, &scores, alpha)?.with_frame(frame);
        Ok(match shift {
            Some(s) => calibration.with_recentre(s),
            None => calibration,
        })
    }

    /// The frame-only calibration over a user's `runs` of unknown health (head inputs, most of
    /// them healthy runs): their per-input median as the frame, no threshold
    /// ([`Calibration::unlabelled`]). Only a framed head reads traces through a frame.
    pub fn frame_on(&self, name: &str, runs: &[&[f32]]) -> Result<Calibration> {
        self.check_framed()?;
        let frame = Frame::median_of(&format!("{} runs of {name}", runs.len()), runs)?;
        let scores: Vec<f32> = runs
            .iter()
            .map(|x| deficiency_score(&self.types, &self.type_model.log_probs(&frame.apply(x))))
            .collect();
        Calibration::unlabelled(name, frame, &scores)
    }

    /// Whether runs of unknown health can calibrate it: only a framed head has a frame to
    /// set ([`DecisionHead::frame_on`]); callers check before reading the runs.
    pub fn check_framed(&self) -> Result<()> {
        if self.is_framed() {
            return Ok(());
        }
        Err(PolicyError::Calibration(
            "this head reads its inputs as they are (it was not fitted with `[head] frame = \"framework\"`): runs of unknown health can only set a framed head's frame; give healthy runs instead".into(),
        ))
    }

    /// `x` under the head's current frame (as it is when none is set).
    pub fn framed(&self, x: &[f32]) -> Vec<f32> {
        match &self.frame {
            Some(f) => f.apply(x),
            None => x.to_vec(),
        }
    }

    /// Whether the head was fitted on framed inputs and so reads traces through a frame.
    pub fn is_framed(&self) -> bool {
        !self.frames.is_empty()
    }

    /// The frame a framed head reads a trace of `framework` through (none for a head fitted
    /// on raw inputs): the calibration's, when it took one over a user's healthy runs; else
    /// the framework's own, when the head was fitted on it; else the per-input median of its
    /// training frameworks' frames, the best guess without a single run of the framework.
    pub fn frame_for(&self, framework: Option<&str>) -> Option<Frame> {
        if !self.is_framed() {
            return None;
        }
        if let Some(f) = self.calibration.as_ref().and_then(|c| c.frame.as_ref()) {
            return Some(f.clone());
        }
        crate::frame::for_framework(&self.frames, framework)
    }

    /// Reads the next traces through `frame` (none: as they are), checking that it fits the
    /// head's input.
    pub fn set_frame(&mut self, frame: Option<Frame>) -> Result<()> {
        if let Some(f) = &frame {
            self.check_width(f.centre.len(), |dim| {
                format!(
                    "frame `{}` has {} inputs; this head reads {dim}",
                    f.name,
                    f.centre.len()
                )
            })?;
        }
        self.frame = frame;
        Ok(())
    }

    /// Attaches `calibration`, checking that a recentring shift fits the head's input.
    pub fn set_calibration(&mut self, calibration: Option<Calibration>) -> Result<()> {
        if let Some(c) = calibration.as_ref().filter(|c| !c.recentre.is_empty()) {
            self.check_width(c.recentre.len(), |dim| {
                format!(
                    "calibration `{}` recentres {} values; this head reads {dim} (a calibration of another checkpoint?)",
                    c.name,
                    c.recentre.len()
                )
            })?;
        }
        if let Some(f) = calibration.as_ref().and_then(|c| c.frame.clone()) {
            self.set_frame(Some(f))?;
        }
        self.calibration = calibration;
        Ok(())
    }

    /// `Ok` when `len` values fit the head's input; else the error `describe(width)` says.
    fn check_width(&self, len: usize, describe: impl FnOnce(usize) -> String) -> Result<()> {
        let dim = self.type_model.mean.len();
        if len == dim {
            Ok(())
        } else {
            Err(PolicyError::Calibration(describe(dim)))
        }
    }

    /// The class index of `none`, when the head has it.
    pub fn none_index(&self) -> Option<usize> {
        self.types.iter().position(|t| t == NONE)
    }

    /// Raises `none`'s score by `shift` in every decision (greedy and sampled alike), so a
    /// deficiency is named only when its evidence beats a healthy reading by that margin: the
    /// operating point for users whose traces are mostly healthy. A head without `none` is
    /// left as it is.
    pub fn set_none_shift(&mut self, shift: f32) {
        let Some(k) = self.types.iter().position(|t| t == NONE) else {
            return;
        };
        let mut prior = vec![0.0; self.types.len()];
        prior[k] = shift;
        self.type_model.prior = prior;
    }

    /// The answer a choice stands for, its evidence the type's probability (and the
    /// calibration's reading, when one is in use).
    pub fn verdict(&self, d: &HeadChoice) -> Verdict {
        let t = &self.types[d.type_index];
        let p = d.type_log_probs[d.type_index].exp();
        let c = if t == NONE {
            NO_COMPONENT
        } else {
            &self.components[d.component_index]
        };
        let evidence = match &self.calibration {
            Some(cal) if cal.runs == crate::calibration::Runs::Unlabelled => format!(
                "the probe digests above, p = {p:.2}, deficiency score {:.3} read relative to `{}` ({} runs of unknown health, no threshold)",
                deficiency_score(&self.types, &d.type_log_probs),
                cal.name,
                cal.healthy_scores.len()
            ),
            Some(cal) => format!(
                "the probe digests above, p = {p:.2}, deficiency score {:.3} against calibration `{}` (threshold {:.3}, p-value {:.2})",
                deficiency_score(&self.types, &d.type_log_probs),
                cal.name,
                cal.threshold,
                cal.p_value(deficiency_score(&self.types, &d.type_log_probs))
            ),
            None => format!("the probe digests above, p = {p:.2}"),
        };
        Verdict::deficiency(t, c, evidence)
    }

    /// The verdict of a choice placed at `failing_function` as the probe battery places its
    /// answer (`probes::at_function`): what a transcript of this decision holds.
    pub fn located_verdict(&self, d: &HeadChoice, failing_function: Option<&str>) -> Verdict {
        probes::at_function(self.verdict(d), failing_function)
    }

    /// The `answer:` line of a choice.
    pub fn answer(&self, d: &HeadChoice) -> String {
        self.verdict(d).render()
    }

    /// Writes the head as JSON to `path` (a temporary name beside it, then a rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.tmp"));
        let text = serde_json::to_string(self).expect("a head serialises");
        std::fs::write(&tmp, text)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| PolicyError::Io(format!("{}: {e}", path.display())))
    }

    /// Reads a head written by [`DecisionHead::save`], checking that its parts agree.
    pub fn load(path: &Path) -> Result<DecisionHead> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PolicyError::Io(format!("{}: {e}", path.display())))?;
        let head: DecisionHead = serde_json::from_str(&text)
            .map_err(|e| PolicyError::Io(format!("{}: {e}", path.display())))?;
        let consistent = |m: &Softmax, classes: usize| {
            m.classes == classes
                && (m.prior.is_empty() || m.prior.len() == m.classes)
                && m.weight.len() == m.classes * m.dim
                && m.bias.len() == m.classes
                && m.mean.len() == m.dim
                && m.inv_std.len() == m.dim
        };
        if !consistent(&head.type_model, head.types.len())
            || !consistent(&head.component_model, head.components.len())
            || head.type_model.dim != head.component_model.dim
        {
            return Err(PolicyError::Io(format!(
                "{}: the head's class lists and weight shapes disagree",
                path.display()
            )));
        }
        Ok(head)
    }
}

/// Samples an index from log-probabilities sharpened or flattened by `temperature`.
pub fn sample(log_probs: &[f32], temperature: f32, u: f64) -> usize {
    let scaled: Vec<f64> = log_probs
        .iter()
        .map(|l| *l as f64 / temperature as f64)
        .collect();
    let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scaled.iter().map(|l| (l - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w / total;
        if u < acc {
            return i;
        }
    }
    weights.len() - 1
}

/// What one investigation of the learned decider left: the features it read, its decision and
/// where the battery placed it, for the trainer.
#[derive(Debug, Clone, PartialEq)]
pub struct Investigated {
    /// The head's input as it read it: through its frame, when one was set.
    pub features: Vec<f32>,
    pub choice: HeadChoice,
    /// The function the battery's failing spans came from (`probes::failing_function`), where
    /// a deficiency answer is placed ([`DecisionHead::located_verdict`]).
    pub failing_function: Option<String>,
}

/// The learned Detector as a `detect::Policy`: the probe battery, then the head's decision on
/// the features `reader` computes (its adapter and system prompt).
pub fn policy(
    shared: crate::SharedModel,
    head: std::sync::Arc<DecisionHead>,
    reader: std::sync::Arc<FeatureReader>,
    temperature: f32,
    u: f64,
    sink: Option<std::sync::Arc<std::sync::Mutex<Option<Investigated>>>>,
) -> Box<dyn detect::Policy> {
    Box::new(probes::BatteryPolicy::new(
        format!(
            "learned-head:{}",
            reader.adapter.as_deref().unwrap_or("base")
        ),
        Box::new(move |battery| {
            let mut pm = shared.lock().unwrap_or_else(|p| p.into_inner());
            let x = reader
                .features_for(&mut pm, battery, &head.reads)
                .map_err(|e| e.to_string())?;
            let x = head.input(x, battery)?;
            let x = head.framed(&x);
            let d = head.decide_framed(&x, temperature, u);
            // The battery places the verdict at the failing function; the trainer places its
            // sampled decisions there by the same function.
            let verdict = head.verdict(&d);
            if let Some(sink) = &sink {
                *sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(Investigated {
                    features: x,
                    choice: d,
                    failing_function: probes::failing_function(battery),
                });
            }
            Ok(verdict)
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_keep_the_head_of_the_catalog_name() {
        assert_eq!(
            short_name("Infinite loop: no termination condition on iterative refinement"),
            "Infinite loop"
        );
        assert_eq!(
            short_name("Temperature value out of model's accepted range"),
            "Temperature value out of model's accepted"
        );
    }

    #[test]
    fn the_head_input_appends_the_battery_terms_hashed_and_normalised() {
        let battery = |flags: &str| {
            vec![
                ProbeResult {
                    probe: "errors",
                    digest: "error RecursionError on tool load_schema x3 step 1".into(),
                },
                ProbeResult {
                    probe: "flags",
                    digest: flags.into(),
                },
            ]
        };
        let lm = vec![0.5f32, -1.0];
        let hashed = |keep| HeadReads::hashed(64, keep);
        // No buckets: the model's features as they are.
        assert_eq!(
            head_input(lm.clone(), &battery("none"), &HeadReads::default()),
            lm
        );
        let x = head_input(lm.clone(), &battery("flag recursion 3"), &hashed(None));
        assert_eq!(x.len(), 2 + 64);
        assert_eq!(&x[..2], &lm[..]);
        let norm: f32 = x[2..].iter().map(|b| b * b).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        assert!(x[2..].iter().all(|b| *b >= 0.0));
        // The same battery gives the same input; another flag line gives another.
        assert_eq!(
            x,
            head_input(lm.clone(), &battery("flag recursion 3"), &hashed(None))
        );
        assert_ne!(
            x,
            head_input(lm.clone(), &battery("flag timeout 1"), &hashed(None))
        );
        // Numbers count by their order of magnitude, as the classifier reads them.
        assert_eq!(
            head_input(lm.clone(), &battery("flag recursion 3"), &hashed(None)),
            head_input(lm.clone(), &battery("flag recursion 7"), &hashed(None))
        );
        // With a filter, a term outside it never reaches the input: the two flag lines differ
        // only in terms the filter leaves out, so they read the same; an empty filter leaves
        // no term at all.
        let keep: BTreeSet<String> = ["error", "tool", "step"].map(String::from).into();
        let kept = head_input(
            lm.clone(),
            &battery("flag recursion 3"),
            &hashed(Some(keep.clone())),
        );
        assert_ne!(kept, x);
        assert_eq!(
            kept,
            head_input(
                lm.clone(),
                &battery("flag timeout 1"),
                &hashed(Some(keep.clone()))
            )
        );
        let none = head_input(
            lm.clone(),
            &battery("flag recursion 3"),
            &hashed(Some(BTreeSet::new())),
        );
        assert_eq!(&none[..2], &lm[..]);
        assert!(none[2..].iter().all(|b| *b == 0.0));
    }

    #[test]
    fn a_head_can_read_the_terms_alone_and_by_an_exact_vocabulary() {
        let battery = |flags: &str| {
            vec![ProbeResult {
                probe: "flags",
                digest: flags.into(),
            }]
        };
        let docs: Vec<Vec<String>> = ["flag recursion 3", "flag timeout 1", "flag timeout 2"]
            .iter()
            .map(|f| linear::terms(&probes::battery_lines(&battery(f))))
            .collect();
        let vocabulary = Vocabulary::fit(&docs, 1);
        let lm = vec![0.5f32, -1.0];
        let reads = HeadReads {
            states: false,
            terms: 0,
            term_filter: None,
            vocabulary: Some(vocabulary.clone()),
        };
        // Without states the model's features never reach the input; the terms are the
        // vocabulary's TF-IDF vector, one value per known term.
        let x = head_input(lm.clone(), &battery("flag timeout 1"), &reads);
        assert_eq!(x.len(), vocabulary.len());
        assert_eq!(reads.term_width(), vocabulary.len());
        assert_eq!(x, vocabulary.vector(&docs[1]));
        // With states they lead, as with hashed terms.
        let with_states = HeadReads {
            states: true,
            ..reads.clone()
        };
        let y = head_input(lm.clone(), &battery("flag timeout 1"), &with_states);
        assert_eq!(&y[..2], &lm[..]);
        assert_eq!(&y[2..], &x[..]);
        // Words the train split never printed read as nothing.
        assert_eq!(
            head_input(lm.clone(), &battery("flag timeout 1 zebra giraffe"), &reads),
            head_input(lm.clone(), &battery("flag timeout 1"), &reads)
        );
        // The reading survives a round trip through JSON, and a head saved before heads
        // recorded it reads the model's states.
        let back: HeadReads =
            serde_json::from_str(&serde_json::to_string(&reads).unwrap()).unwrap();
        assert_eq!(back, reads);
        let old: HeadReads = serde_json::from_str(r#"{"terms": 2048}"#).unwrap();
        assert_eq!(old, HeadReads::hashed(2048, None));
    }

    #[test]
    fn sampling_follows_the_distribution_and_greedy_is_its_argmax() {
        let lp: Vec<f32> = [0.1f32, 0.6, 0.3].iter().map(|p| p.ln()).collect();
        assert_eq!(sample(&lp, 1.0, 0.05), 0);
        assert_eq!(sample(&lp, 1.0, 0.2), 1);
        assert_eq!(sample(&lp, 1.0, 0.95), 2);
        let mut counts = [0usize; 3];
        for i in 0..1000 {
            counts[sample(&lp, 1.0, (i as f64 + 0.5) / 1000.0)] += 1;
        }
        assert_eq!(counts, [100, 600, 300]);
        assert_eq!(linear::argmax(&lp), 1);
    }

    /// A one-feature softmax whose scores are its biases.
    fn model(classes: usize, bias: Vec<f32>) -> linear::Softmax {
        linear::Softmax {
            classes,
            dim: 1,
            weight: vec![0.0; classes],
            bias,
            mean: vec![0.0],
            inv_std: vec![1.0],
            prior: Vec::new(),
        }
    }

    #[test]
    fn a_deficiency_is_never_placed_at_no_component() {
        // Components: none (the most likely), tools.schema, llm_client.request.
        let head = DecisionHead {
            types: vec![NONE.into(), "P16".into()],
            type_model: model(2, vec![0.0, 1.0]),
            components: vec![
                NO_COMPONENT.into(),
                "tools.schema".into(),
                "llm_client.request".into(),
            ],
            component_model: model(3, vec![2.0, 0.5, 1.0]),
            reads: HeadReads::default(),
            healthy_mean: Vec::new(),
            calibration: None,
            frames: BTreeMap::new(),
            frame: None,
        };
        let d = head.decide(&[0.0], 0.0, 0.0);
        assert_eq!(head.types[d.type_index], "P16");
        assert_eq!(head.components[d.component_index], "llm_client.request");
        assert!(head
            .answer(&d)
            .starts_with("answer: P16 llm_client.request |"));
        // `none` keeps no component.
        let healthy = DecisionHead {
            type_model: model(2, vec![1.0, 0.0]),
            ..head
        };
        let d = healthy.decide(&[0.0], 0.0, 0.0);
        assert!(healthy.answer(&d).starts_with("answer: none none |"));
    }

    #[test]
    fn a_none_shift_moves_the_whole_distribution_towards_none() {
        let mut head = DecisionHead {
            types: vec!["P1".into(), NONE.into(), "C8".into()],
            type_model: model(3, vec![1.0, 0.0, 0.5]),
            components: vec![NO_COMPONENT.into(), "llm_client.request".into()],
            component_model: model(2, vec![0.0, 1.0]),
            reads: HeadReads::default(),
            healthy_mean: Vec::new(),
            calibration: None,
            frames: BTreeMap::new(),
            frame: None,
        };
        assert_eq!(head.types[head.decide(&[0.0], 0.0, 0.0).type_index], "P1");
        head.set_none_shift(1.5);
        let d = head.decide(&[0.0], 0.0, 0.0);
        assert_eq!(head.types[d.type_index], NONE);
        // Still one distribution over whole options, greedy its argmax, sampling from it.
        let p: Vec<f32> = d.type_log_probs.iter().map(|l| l.exp()).collect();
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        assert_eq!(linear::argmax(&d.type_log_probs), d.type_index);
        let want = 1.5f32.exp() / (1f32.exp() + 1.5f32.exp() + 0.5f32.exp());
        assert!((p[1] - want).abs() < 1e-5);
        // It is kept through a save and load.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("head.json");
        head.save(&path).unwrap();
        assert_eq!(DecisionHead::load(&path).unwrap(), head);
    }

    #[test]
    fn a_calibration_only_takes_back_deficiencies_the_head_would_name() {
        // p(P1) = 0.7, p(none) = 0.3: deficiency score 0.7.
        let mut head = DecisionHead {
            types: vec!["P1".into(), NONE.into()],
            type_model: model(2, vec![0.7f32.ln(), 0.3f32.ln()]),
            components: vec![NO_COMPONENT.into(), "llm_client.request".into()],
            component_model: model(2, vec![0.0, 1.0]),
            reads: HeadReads::default(),
            healthy_mean: Vec::new(),
            calibration: None,
            frames: BTreeMap::new(),
            frame: None,
        };
        let named =
            |head: &DecisionHead| head.types[head.decide(&[0.0], 0.0, 0.0).type_index].clone();
        assert_eq!(named(&head), "P1");
        // Healthy runs that scored up to 0.8: 0.7 is like them, so `none`.
        head.calibration = Some(Calibration::conformal("fw", &[0.8; 19], 0.05).unwrap());
        assert_eq!(named(&head), NONE);
        let d = head.decide(&[0.0], 0.0, 0.0);
        assert!(
            head.answer(&d)
                .contains("against calibration `fw` (threshold 0.800"),
            "{}",
            head.answer(&d)
        );
        // Healthy runs that all scored near 0: 0.7 is flagged, and the head names P1.
        head.calibration = Some(Calibration::conformal("fw", &[0.01; 19], 0.05).unwrap());
        assert_eq!(named(&head), "P1");
        // A trace the head answers `none` (score 0.4) stays `none` above any threshold.
        head.type_model = model(2, vec![0.4f32.ln(), 0.6f32.ln()]);
        assert_eq!(named(&head), NONE);
        // Sampling (training) ignores the calibration.
        let d = head.decide(&[0.0], 1.0, 0.0);
        assert_eq!(head.types[d.type_index], "P1");
    }
    #[test]
    fn a_framed_head_reads_through_its_frame_and_recentres_framed_inputs() {
        // The head of the test below, fitted on framed inputs; this framework's traces sit 10
        // above the head's frameworks on the one feature.
        let mut type_model = model(2, vec![0.0, 0.0]);
        type_model.weight = vec![2.0, 0.0];
        let frame =
            Frame::median_of("fw's traces", &[&[10.0f32][..], &[10.0][..], &[12.0][..]]).unwrap();
        let mut head = DecisionHead {
            types: vec!["P1".into(), NONE.into()],
            type_model,
            components: vec![NO_COMPONENT.into(), "llm_client.request".into()],
            component_model: model(2, vec![0.0, 1.0]),
            reads: HeadReads::default(),
            healthy_mean: vec![-1.0],
            calibration: None,
            frames: BTreeMap::from([("ours".to_string(), frame.clone())]),
            frame: None,
        };
        assert!(head.is_framed());
        head.set_frame(Some(frame)).unwrap();
        let named = |head: &DecisionHead, x: f32, t: f32| {
            head.types[head.decide(&[x], t, 0.0).type_index].clone()
        };
        // Framed, 9 reads as −1 (none) and 11 as 1 (P1), sampled decisions too.
        assert_eq!(named(&head, 9.0, 0.0), NONE);
        assert_eq!(named(&head, 11.0, 0.0), "P1");
        assert_eq!(
            head.decide(&[9.0], 1.0, 0.99).type_log_probs,
            head.decide(&[9.0], 0.0, 0.0).type_log_probs
        );
        // Healthy runs at 11 recentred on the framed inputs (1 → the head's healthy −1): a
        // run like them is `none`, one three above them is still P1.
        let runs = [[11.0f32]; 20];
        let rows: Vec<&[f32]> = runs.iter().map(|r| &r[..]).collect();
        let c = head.calibration_on("fw", &rows, 0.05, true).unwrap();
        head.set_calibration(Some(c)).unwrap();
        assert_eq!(named(&head, 11.0, 0.0), NONE);
        assert_eq!(named(&head, 14.0, 0.0), "P1");

        // Runs of unknown health, most at 20 and one deficient at 40: their median is the
        // frame, so a run at 19 reads as −1 (none) and one at 21 as P1 — the head's own
        // operating point, with no threshold.
        let runs = [[20.0f32], [20.0], [40.0], [20.0], [19.0]];
        let rows: Vec<&[f32]> = runs.iter().map(|r| &r[..]).collect();
        let c = head.frame_on("store", &rows).unwrap();
        assert_eq!(c.frame.as_ref().unwrap().centre, vec![20.0]);
        head.set_calibration(Some(c)).unwrap();
        head.set_frame(head.frame_for(None)).unwrap();
        assert_eq!(named(&head, 19.0, 0.0), NONE);
        assert_eq!(named(&head, 21.0, 0.0), "P1");
        // A head fitted on raw inputs has no frame to set.
        head.frames.clear();
        let err = head.frame_on("store", &rows).unwrap_err().to_string();
        assert!(err.contains("not fitted with"), "{err}");
    }

    #[test]
    fn a_framed_head_picks_the_calibrations_frame_then_the_frameworks_then_the_median() {
        let frame = |name: &str, v: f32| Frame::median_of(name, &[&[v][..]]).unwrap();
        let mut head = DecisionHead {
            types: vec!["P1".into(), NONE.into()],
            type_model: model(2, vec![0.0, 0.0]),
            components: vec![NO_COMPONENT.into(), "llm_client.request".into()],
            component_model: model(2, vec![0.0, 1.0]),
            reads: HeadReads::default(),
            healthy_mean: Vec::new(),
            calibration: None,
            frames: BTreeMap::from([
                ("a".to_string(), frame("a", 1.0)),
                ("b".to_string(), frame("b", 2.0)),
                ("c".to_string(), frame("c", 9.0)),
            ]),
            frame: None,
        };
        let centre = |head: &DecisionHead, fw: Option<&str>| head.frame_for(fw).unwrap().centre;
        assert_eq!(centre(&head, Some("b")), vec![2.0]);
        // A framework it never read, or none named: the median of its frameworks' frames.
        assert_eq!(centre(&head, Some("new")), vec![2.0]);
        assert_eq!(centre(&head, None), vec![2.0]);
        // A calibration over a user's healthy runs takes their median, is saved with it, and
        // is the frame every trace is read through while it is in use.
        let runs = [[5.0f32], [6.0], [7.0]];
        let rows: Vec<&[f32]> = runs.iter().map(|r| &r[..]).collect();
        let c = head.calibration_on("mine", &rows, 0.5, false).unwrap();
        assert_eq!(c.frame.as_ref().unwrap().centre, vec![6.0]);
        // With runs of unknown health beside them, the frame is theirs and the threshold is
        // set on the healthy runs read through it.
        let store = [[1.0f32], [2.0], [3.0], [4.0], [5.0]];
        let store: Vec<&[f32]> = store.iter().map(|r| &r[..]).collect();
        let both = head
            .calibration_framed_by("mine", &store, &rows, 0.5, false)
            .unwrap();
        assert_eq!(both.frame.as_ref().unwrap().centre, vec![3.0]);
        assert_eq!(both.frame.as_ref().unwrap().traces, 5);
        assert_eq!(both.healthy_scores.len(), 3);
        assert_eq!(both.runs, crate::calibration::Runs::Healthy);
        let dir = tempfile::tempdir().unwrap();
        let c = Calibration::load(&c.save(dir.path()).unwrap()).unwrap();
        assert!(c.describe().contains("typical input"), "{}", c.describe());
        head.set_calibration(Some(c)).unwrap();
        assert_eq!(head.frame.as_ref().unwrap().centre, vec![6.0]);
        assert_eq!(centre(&head, Some("a")), vec![6.0]);
        // A head fitted on raw inputs has no frame to read through.
        head.frames.clear();
        assert!(head.frame_for(Some("a")).is_none());
        assert!(head
            .calibration_framed_by("mine", &store, &rows, 0.5, false)
            .is_err());
    }

    #[test]
    fn a_recentring_calibration_moves_the_input_before_the_head_reads_it() {
        // One feature: P1's score rises with it, none's does not.
        let mut type_model = model(2, vec![0.0, 0.0]);
        type_model.weight = vec![2.0, 0.0];
        let mut head = DecisionHead {
            types: vec!["P1".into(), NONE.into()],
            type_model,
            components: vec![NO_COMPONENT.into(), "llm_client.request".into()],
            component_model: model(2, vec![0.0, 1.0]),
            reads: HeadReads::default(),
            healthy_mean: vec![-1.0],
            calibration: None,
            frames: BTreeMap::new(),
            frame: None,
        };
        let named = |head: &DecisionHead, x: f32| {
            head.types[head.decide(&[x], 0.0, 0.0).type_index].clone()
        };
        // The framework's healthy runs sit at x = 1, where the head reads P1.
        assert_eq!(named(&head, 1.0), "P1");
        let runs = [[1.0f32]; 20];
        let rows: Vec<&[f32]> = runs.iter().map(|r| &r[..]).collect();
        let shift = crate::calibration::recentre_shift(&head.healthy_mean, &rows).unwrap();
        let scores: Vec<f32> = rows
            .iter()
            .map(|x| {
                deficiency_score(
                    &head.types,
                    &head.type_model.log_probs(&recentre(x, &shift)),
                )
            })
            .collect();
        let c = Calibration::conformal("fw", &scores, 0.05)
            .unwrap()
            .with_recentre(shift);
        head.set_calibration(Some(c)).unwrap();
        // Recentred, a run like the healthy ones is `none`; one far beyond them is P1.
        assert_eq!(named(&head, 1.0), NONE);
        assert_eq!(named(&head, 4.0), "P1");
        // Sampling (training) reads the input as it is.
        assert_eq!(head.types[head.decide(&[1.0], 1.0, 0.0).type_index], "P1");
        // A calibration of another head's width is refused with the reason.
        let other = Calibration::conformal("fw", &[0.1], 0.05)
            .unwrap()
            .with_recentre(vec![0.0, 0.0]);
        let err = head.set_calibration(Some(other)).unwrap_err().to_string();
        assert!(err.contains("reads 1"), "{err}");
    }
}
