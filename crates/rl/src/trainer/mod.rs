//! The self-play loop. A step:
//!
//! 1. the Injector proposes `injections_per_step` injections (a constrained choice per agent);
//! 2. a worker thread applies, runs and validates them one after another, while
//! 3. the Detector investigates each valid trace as soon as it is there;
//! 4. rewards are computed for both roles (and for higher-order reviews of earlier failures);
//! 5. each role's adapter gets one PPO update (role-alternating: Injector, then Detector).
//!
//! Before the first step, a supervised warm start on the expert's demonstrations (when a
//! corpus is configured) and a held-out evaluation; after the last, another evaluation.
//!
//! [`Trainer::run`] and [`Trainer::step`] here are the whole loop, top to bottom; each phase
//! is a file beside this one: `warm_start`, `episodes` (1–3), `update` (4–5), `blame` (the
//! learned blamer's warm start and PPO step), `held_out` and `checkpointing`; and what the
//! phases stand on: `build` (a fresh or resumed trainer), `ranks` (data-parallel coordination)
//! and `draws` (every random number, one named stream per purpose).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use detect::policies::KeywordPolicy;
use eval::store_eval::Labelled;
use indicatif::{ProgressBar, ProgressStyle};
use model::{AdamW, AdamWConfig, DType, Device, LoraConfig, Projection};
use policy::decision::{DecisionHead, HeadReads};
use policy::{ActionGrammar, Conversation, DetectorOptions, PolicyModel, SharedModel};

use collective::Collective;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, TrainerState, RNG_SCHEME};
use crate::config::{DecisionMode, FoldsBy, InjectorFocus, InjectorMode, RunConfig, Topology};
use crate::environment::{self, CorpusPrior, Environment};
use crate::evaluate::{self, Accuracy, SplitTraces};
use crate::head::{self, HeadSample};
use crate::higher_order::{self, FailedInvestigation};
use crate::ppo::{self, Role, Sample};
use crate::reward::{self, Answered};
use crate::run_log::{self, EvalCase, EvalMetrics, StepMetrics};
use crate::{Result, RlError};

mod blame;
mod build;
mod checkpointing;
mod draws;
mod episodes;
mod held_out;
mod ranks;
mod update;
mod warm_start;

pub use draws::{mix, unit, Draw};
use ranks::collective_err;

/// How a `pathfinder train` invocation runs.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// The repository root (with `agents/` and `deficiencies/`).
    pub root: PathBuf,
    pub run_dir: PathBuf,
    /// Continue from the newest checkpoint of `run_dir`.
    pub resume: bool,
    /// Stop after the warm start.
    pub sft_only: bool,
    /// Stop after this many PPO steps in this invocation (the run stays resumable).
    pub max_steps: Option<u64>,
    /// Show progress bars (rank 0 only).
    pub progress: bool,
    /// This process's place in a data-parallel job ([`collective::Single`] for one process):
    /// each rank runs its share of a step's episodes and investigations, the results and
    /// gradients are gathered and summed, and every rank takes the same update; rank 0 alone
    /// writes the run's files.
    pub ranks: Arc<dyn Collective>,
}

/// What a finished invocation reports.
#[derive(Debug, Clone, Default)]
pub struct TrainOutcome {
    pub last_step: u64,
    /// Held-out accuracy after the warm start (before any PPO step) and at the end.
    pub before: Option<Accuracy>,
    pub after: Option<Accuracy>,
    /// The same on the frameworks left out of training (`[eval] leave_out`).
    pub left_out_before: Option<Accuracy>,
    pub left_out_after: Option<Accuracy>,
    /// The blame head (`[blame]`) on the held-out logs after its warm start and at the end,
    /// and on the logs of the frameworks left out.
    pub blame_before: Option<crate::blame::BlameAccuracy>,
    pub blame_after: Option<crate::blame::BlameAccuracy>,
    pub blame_left_out_before: Option<crate::blame::BlameAccuracy>,
    pub blame_left_out_after: Option<crate::blame::BlameAccuracy>,
}

/// One step's injection and what became of it. Each rank fills its own share of a step's
/// episodes; they travel between ranks as JSON.
#[derive(Serialize, Deserialize)]
struct Episode {
    /// Its place in the step (`0..injections_per_step`), the same whatever the world size.
    index: usize,
    agent: String,
    deficiency: String,
    injector: Conversation,
    /// The options the Injector chose among (one: the focus chose for it, and its choice
    /// carries no gradient).
    offered: usize,
    manifest: Option<corpus::Manifest>,
    /// The Detector's investigations of the episode's trace (`detector.samples_per_trace` of
    /// them); empty when the injection was not valid.
    injected: Investigations,
    /// The investigations of the clean run beside the injection, as a healthy trace
    /// (`run.healthy_per_step`); empty when it was not investigated.
    healthy: Investigations,
}

/// A live trace's investigations by the Detector: `detector.samples_per_trace` of them and,
/// with the decision head, the draw behind each (empty in token mode).
#[derive(Default, Serialize, Deserialize)]
struct Investigations {
    detections: Vec<Detection>,
    draws: Vec<HeadDraw>,
}

impl Investigations {
    fn is_empty(&self) -> bool {
        self.detections.is_empty()
    }
}

/// One investigation of a live trace: what it answered, the token policy's conversation
/// (empty for the decision head) and the transcript.
#[derive(Serialize, Deserialize)]
struct Detection {
    answered: Answered,
    conversation: Conversation,
    transcript: detect::Transcript,
}

/// The decision head's choice on a live trace, as PPO needs it: the input it read (through
/// the trace's frame), the class drawn and that class's log-probability.
#[derive(Clone, Serialize, Deserialize)]
struct HeadDraw {
    features: Vec<f32>,
    class: usize,
    log_prob: f32,
}

/// What the Injector proposed in a step: the episodes, their plans and (diff mode) diffs.
struct Proposed {
    episodes: Vec<Episode>,
    planned: Vec<corpus::Planned>,
    diffs: Vec<Option<String>>,
}

/// A step's scored investigations: the PPO batches and the sums its metrics are made of.
struct Scored {
    samples_inj: Vec<Sample>,
    samples_det: Vec<Sample>,
    samples_head: Vec<HeadSample>,
    r_inj_sum: f64,
    r_det_sum: f64,
    /// Each episode's joint reward (what the Injector's sample is trained on), summed.
    r_joint_sum: f64,
    detected: usize,
    localised: usize,
    calls: usize,
    investigated: usize,
    /// Healthy traces investigated, and those the greedy answer called deficient.
    healthy: usize,
    healthy_flagged: usize,
    new_failures: Vec<FailedInvestigation>,
    /// Live traces the decision head named wrongly (its higher-order examples).
    new_head_failures: Vec<head::Failure>,
    chosen_types: Vec<String>,
    log: String,
}

/// What the decision head's update did: its PPO step and, when enabled, its review.
struct HeadUpdate {
    ppo: head::HeadStats,
    review: Option<head::ReviewStats>,
    /// The operating point set again in this step (`[head] recalibrate_every`).
    none_shift: Option<f32>,
}

/// The warm start measures its KL to the base on every this-many-th update and the last: each
/// measurement is a forward pass of the batch with the adapter off, about a quarter of an
/// update's cost.
const SFT_KL_EVERY: usize = 8;

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What a cached out-of-fold reading was made with: the fold count and how folds split.
type FoldKey = (usize, FoldsBy);

pub struct Trainer {
    config: RunConfig,
    config_text: String,
    options: TrainOptions,
    shared: SharedModel,
    grammar: Arc<ActionGrammar>,
    optimizers: BTreeMap<String, AdamW>,
    state: TrainerState,
    keyword: KeywordPolicy,
    /// The Detector's decision head and its warm-started reference (`decision = "head"`).
    heads: Option<(DecisionHead, DecisionHead)>,
    /// The decision's system prompt: the catalog's ids with their short names.
    decision_system: Arc<String>,
    /// Train-split traces with their features, replayed in each PPO step (`decision = "head"`).
    replay: Vec<(Labelled, Vec<f32>)>,
    /// The train split read out of fold, with the fold count (see `Trainer::out_of_fold`).
    out_of_fold: Option<(FoldKey, Arc<[head::OutOfFold]>)>,
    /// The warm-started head's cross-validated errors per type (`[injector] focus =
    /// "confusion"`), which the Injector's episodes are drawn by.
    focus: Option<BTreeMap<String, (usize, usize)>>,
    /// The learned blamer (`[blame]`), once fitted or resumed.
    blamer: Option<blame::Blamer>,
}

impl Trainer {
    fn adapter(&self, role: Role) -> &'static str {
        match (self.config.run.topology, role) {
            (Topology::Shared, _) => "policy",
            (Topology::Separate, Role::Injector) => "injector",
            (Topology::Separate, _) => "detector",
        }
    }

    fn bar(&self, len: u64, template: &str) -> ProgressBar {
        if !self.options.progress || !self.leader() {
            return ProgressBar::hidden();
        }
        ProgressBar::new(len).with_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        )
    }

    /// Appends metric lines to a run log (rank 0 only).
    fn log_metrics<T: serde::Serialize>(&self, file: &str, lines: &[T]) -> Result<()> {
        if self.leader() {
            run_log::append_all(&self.options.run_dir.join(file), lines)?;
        }
        Ok(())
    }

    /// Writes `value` as `name` in the run directory: a record of a choice the run made (not a
    /// checkpoint; the choice is made again on a resume).
    fn write_record(&self, name: &str, value: &impl serde::Serialize) -> Result<()> {
        if !self.leader() {
            return Ok(());
        }
        let path = self.options.run_dir.join(name);
        let json = serde_json::to_string_pretty(value)
            .map_err(|e| RlError::Sample(format!("{name}: {e}")))?;
        std::fs::write(&path, json).map_err(|e| RlError::io(&path, e))
    }

    /// Runs the warm start (if due), the PPO steps and the evaluations.
    pub fn run(&mut self) -> Result<TrainOutcome> {
        let held_out = self.held_out()?;
        let left_out = self.left_out()?;
        let mut outcome = TrainOutcome {
            last_step: self.state.step,
            ..TrainOutcome::default()
        };
        let fresh = checkpoint::latest(&self.options.run_dir)?.is_none();
        if fresh {
            if held_out.is_some() {
                self.warm_start()?;
            }
            if let Some(split) = &held_out {
                outcome.before = Some(self.evaluate(split, "sft")?);
            }
            if let Some(traces) = &left_out {
                outcome.left_out_before = Some(self.evaluate_left_out(traces, "sft")?);
            }
            if self.config.blame.enabled {
                self.warm_start_blame()?;
                (outcome.blame_before, outcome.blame_left_out_before) =
                    self.evaluate_blame("sft")?;
            }
            self.save()?;
        } else if let Some(split) = &held_out {
            outcome.before = read_eval(&self.options.run_dir.join(run_log::EVAL_FILE), 0)?;
            outcome.left_out_before =
                read_eval(&self.options.run_dir.join(run_log::LEFT_OUT_FILE), 0)?;
            if outcome.before.is_none() && self.state.step == 0 {
                // The warm start finished but its evaluation is not on record (its lines were
                // removed because the evaluation settings changed): evaluate it now.
                outcome.before = Some(self.evaluate(split, "sft")?);
                if let Some(traces) = &left_out {
                    outcome.left_out_before = Some(self.evaluate_left_out(traces, "sft")?);
                }
                self.save()?;
            }
        }
        if self.options.sft_only {
            return Ok(outcome);
        }
        self.reread_blame_logs()?;
        if self.config.detector.decision == DecisionMode::Head {
            if self.heads.is_none() {
                return Err(RlError::Environment(
                    "`detector.decision = \"head\"` but the run has no decision head (its warm start did not run)".into(),
                ));
            }
            if self.replay.is_empty() && self.config.head.replay > 0 {
                // A resumed run reads the train split again (the same features: greedy, no
                // randomness).
                let warm_start::TrainFeatures { train, x, .. } = self.train_features()?;
                let frames = self.heads.as_ref().map(|(h, _)| h.frames.clone());
                let x = head::framed_inputs(&train.traces, &x, &frames.unwrap_or_default());
                self.replay = train.traces.into_iter().zip(x).collect();
            }
            if self.config.injector.focus != InjectorFocus::None {
                self.focus = Some(self.confusion_focus()?);
            }
        }

        let mut env = Environment::new(
            &self.options.root,
            &self.config.run.agents,
            &self.live_dir(),
            self.config.run.seed,
            Duration::from_secs(self.config.run.agent_timeout_secs),
            runner::BackendChoice::parse(&self.config.run.backend).map_err(RlError::Environment)?,
            self.config.run.jobs,
        )?;
        if !self.config.eval.corpus.is_empty() {
            let prior = CorpusPrior::read(
                &self.options.root.join(&self.config.eval.corpus),
                &self.config.eval.split,
                self.config.injector.validated_only,
            )?;
            let prior = if self.config.injector.new_tasks {
                prior.new_tasks_only()
            } else {
                prior
            };
            let (held_out, validated) = prior.counts();
            tracing::info!(held_out, ?validated, "injector options: corpus prior");
            env.set_prior(prior)?;
        }
        let last = self.config.run.steps;
        let first = self.state.step + 1;
        let stop = match self.options.max_steps {
            Some(n) => (first + n).saturating_sub(1).min(last),
            None => last,
        };
        let bar = self.bar(last, "train {bar:30} {pos}/{len} {msg} [{elapsed_precise}]");
        bar.set_position(self.state.step);
        for step in first..=stop {
            let mut m = self.step(&mut env, step)?;
            self.blame_step(step, &mut m);
            self.state.step = step;
            self.log_metrics("metrics.jsonl", std::slice::from_ref(&m))?;
            bar.set_position(step);
            bar.set_message(format!(
                "R_inj {:.2} R_det {:.2} det {:.0}% calls {:.1} kl {:.3}",
                m.reward_injector.unwrap_or(0.0),
                m.reward_detector.unwrap_or(0.0),
                100.0 * m.detection_accuracy.unwrap_or(0.0),
                m.query_depth.unwrap_or(0.0),
                m.kl.unwrap_or(0.0)
            ));
            let evaluate_now = self.config.eval.every > 0 && step % self.config.eval.every == 0;
            if let (Some(split), true) = (&held_out, evaluate_now && step != last) {
                self.evaluate(split, "ppo")?;
                if let Some(traces) = &left_out {
                    self.evaluate_left_out(traces, "ppo")?;
                }
                self.evaluate_blame("ppo")?;
            }
            if step % self.config.run.checkpoint_every == 0 || step == last {
                self.save()?;
            }
        }
        bar.finish_and_clear();
        outcome.last_step = self.state.step;
        if first > last {
            // The run had already finished: report its final evaluation.
            outcome.after = read_eval(&self.options.run_dir.join(run_log::EVAL_FILE), last)?;
            outcome.left_out_after =
                read_eval(&self.options.run_dir.join(run_log::LEFT_OUT_FILE), last)?;
        } else if self.state.step == last {
            if let Some(split) = &held_out {
                outcome.after = Some(self.evaluate(split, "ppo")?);
                if let Some(traces) = &left_out {
                    outcome.left_out_after = Some(self.evaluate_left_out(traces, "ppo")?);
                }
                (outcome.blame_after, outcome.blame_left_out_after) = self.evaluate_blame("ppo")?;
                // The final checkpoint carries the final evaluation line too.
                self.save()?;
            }
        }
        Ok(outcome)
    }

    /// One self-play step: the Injector proposes, the agents run, the Detector investigates,
    /// rewards are computed and both roles are updated. Each phase is a function below.
    fn step(&mut self, env: &mut Environment, step: u64) -> Result<StepMetrics> {
        let started = Instant::now();
        let mut phases: BTreeMap<String, f64> = BTreeMap::new();
        let mut lap = Instant::now();
        let mut phase_done = |phases: &mut BTreeMap<String, f64>, name: &str| {
            phases.insert(name.to_owned(), lap.elapsed().as_secs_f64());
            lap = Instant::now();
        };
        let n = self.config.run.injections_per_step;
        // 1. The Injector proposes.
        let mut proposed = self.propose(env, step)?;
        phase_done(&mut phases, "propose");
        // 2 + 3. Agents run on worker threads; the Detector takes each trace as it arrives.
        let healthy_pairs = self.run_and_investigate(env, step, &mut proposed)?;
        phase_done(&mut phases, "episodes");
        self.state.healthy_seen.extend(healthy_pairs);
        // Every rank goes on with every rank's episodes, in step order.
        let episodes = self.gather_episodes(proposed.episodes)?;
        for e in &episodes {
            if let Some(m) = &e.manifest {
                let key = template_key(
                    &e.agent,
                    &policy::InjectionOption {
                        deficiency: m.deficiency.clone(),
                        variant: m.variant.clone(),
                    },
                );
                self.state.planted_tasks.insert(format!("{key}/{}", m.task));
                *self.state.planted.entry(key).or_default() += 1;
            }
        }
        // 4. Rewards, and the higher-order reviews that join the Detector's batch.
        let mut scored = self.score(env, step, &episodes)?;
        self.write_investigations(step, &scored.log)?;
        let reviews = self.higher_order_reviews(step, std::mem::take(&mut scored.new_failures))?;
        let review_reward = (!reviews.is_empty())
            .then(|| reviews.iter().map(|s| s.reward).sum::<f64>() / reviews.len() as f64);
        let n_reviews = reviews.len();
        scored.samples_det.extend(reviews);
        phase_done(&mut phases, "score");
        let tokens: usize = scored
            .samples_inj
            .iter()
            .chain(&scored.samples_det)
            .map(|s| s.conversation.len())
            .sum();
        // 5. PPO, role-alternating: the Injector's batch, then the Detector's.
        let (stats, head_update) = self.update(env, step, &mut scored, &mut phases)?;
        let head_ppo = head_update.as_ref().map(|u| &u.ppo);
        let review = head_update.as_ref().and_then(|u| u.review);
        let Scored {
            r_joint_sum,
            r_inj_sum,
            r_det_sum,
            detected,
            localised,
            calls,
            investigated,
            healthy,
            healthy_flagged,
            chosen_types,
            ..
        } = scored;
        let weighted = |f: fn(&ppo::PpoStats) -> f64| {
            let t: usize = stats.iter().map(|s| s.tokens).sum();
            (t > 0).then(|| stats.iter().map(|s| f(s) * s.tokens as f64).sum::<f64>() / t as f64)
        };
        let secs = started.elapsed().as_secs_f64();
        let nf = n as f64;
        let valid = episodes.iter().filter(|e| !e.injected.is_empty()).count();
        let per_inv = |x: f64| (investigated > 0).then(|| x / investigated as f64);
        let mut unique = chosen_types.clone();
        unique.sort();
        unique.dedup();
        Ok(StepMetrics {
            step,
            phase: "ppo".into(),
            unix_ms: unix_ms(),
            reward_injector: Some(r_inj_sum / nf),
            reward_detector: per_inv(r_det_sum),
            reward_joint: Some(r_joint_sum / nf),
            detection_accuracy: per_inv(detected as f64),
            localisation_accuracy: per_inv(localised as f64),
            injection_unique_types: Some(unique.len()),
            injection_entropy: Some(run_log::entropy_of(&chosen_types)),
            query_depth: per_inv(calls as f64),
            kl: weighted(|s| s.kl),
            value_loss: weighted(|s| s.value_loss),
            sft_loss: None,
            episodes_per_min: Some(nf / (secs / 60.0)),
            tokens_per_s: Some(tokens as f64 / secs.max(1e-9)),
            valid_injections: Some(valid),
            investigations: Some(investigated),
            episodes: Some(n),
            higher_order: Some(n_reviews),
            reward_review: review_reward,
            seconds: Some(secs),
            head_kl: head_ppo.map(|s| s.kl),
            skipped_update: head_ppo.map(|s| s.skipped),
            policy_loss: head_ppo
                .map(|s| s.policy_loss)
                .or(weighted(|s| s.policy_loss)),
            entropy: head_ppo.map(|s| s.entropy).or(weighted(|s| s.entropy)),
            clip_fraction: head_ppo
                .map(|s| s.clip_fraction)
                .or(weighted(|s| s.clip_fraction)),
            none_shift: head_update
                .as_ref()
                .and_then(|u| u.none_shift)
                .map(f64::from),
            review_failures: review.map(|r| r.failures),
            review_top1_before: review.map(|r| r.failures_top1_before),
            review_top1_after: review.map(|r| r.failures_top1_after),
            review_train_top1_after: review.map(|r| r.anchor_top1_after),
            healthy_investigated: (healthy > 0).then_some(healthy),
            healthy_false_positive_rate: (healthy > 0)
                .then(|| healthy_flagged as f64 / healthy as f64),
            phase_seconds: Some(phases),
            ..StepMetrics::default()
        })
    }
}

/// The head's higher-order example for a live trace (§5.5): its features and true class when
/// the greedy answer is wrong (the investigation's choices are sampled), or with `keep_named`
/// whatever it answered; none when the head has no class for the truth. Also whether the
/// greedy answer named the truth.
fn review_example(
    h: &DecisionHead,
    features: &[f32],
    truth: &traces::Truth,
    agent: &str,
    keep_named: bool,
) -> (Option<head::Failure>, bool) {
    let answered = h.type_model.predict(features);
    let class = h.types.iter().position(|t| t == truth.id());
    let named = class == Some(answered);
    let example = class
        .filter(|_| keep_named || !named)
        .map(|class| head::Failure {
            features: features.to_vec(),
            agent: Some(agent.to_owned()),
            class,
            answered,
        });
    (example, named)
}

/// The key of a template in [`TrainerState::planted`].
fn template_key(agent: &str, option: &policy::InjectionOption) -> String {
    format!("{agent}/{}/{}", option.deficiency, option.variant)
}

/// The Injector's PPO sample for an episode, or none when it chose among one option (the
/// focus made the choice, so it teaches the policy nothing).
fn injector_sample(e: &Episode, reward: f64) -> Option<Sample> {
    (e.offered > 1).then(|| Sample {
        role: Role::Injector,
        conversation: e.injector.clone(),
        reward,
        group: 0,
    })
}

/// What a head decision answers, as the reward sees it: the verdict placed where the battery
/// places the investigation's own answer (`DecisionHead::located_verdict`), so a sampled
/// decision and the transcript's answer are the same verdict for the same choice.
fn head_detection(
    h: &DecisionHead,
    d: &policy::decision::HeadChoice,
    failing_function: Option<&str>,
    calls: usize,
) -> Answered {
    Answered {
        verdict: Some(h.located_verdict(d, failing_function)),
        tool_calls: calls,
    }
}

/// Adapter names per topology.
fn adapter_names(topology: Topology) -> Vec<&'static str> {
    match topology {
        Topology::Separate => vec!["detector", "injector"],
        Topology::Shared => vec!["policy"],
    }
}

/// The Injector's view of the run's history: recent types and whether they were detected.
fn history_line(history: &[(String, bool)]) -> String {
    history
        .iter()
        .rev()
        .take(8)
        .map(|(t, d)| format!("{t} {}", if *d { "detected" } else { "missed" }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The evaluation a run recorded at `step` (the warm-started policy at step 0).
/// The evaluation of `step` recorded in `path` (an [`run_log::EVAL_FILE`]-like log), if any.
fn read_eval(path: &Path, step: u64) -> Result<Option<Accuracy>> {
    if !path.exists() {
        return Ok(None);
    }
    for m in run_log::read_jsonl::<EvalMetrics>(path)? {
        if m.step == step {
            return Ok(Some(Accuracy {
                detection: m.detection_accuracy,
                localisation: m.localisation_accuracy,
                avg_tool_calls: m.avg_tool_calls,
                n: m.n,
                false_positive_rate: m.false_positive_rate,
            }));
        }
    }
    Ok(None)
}
