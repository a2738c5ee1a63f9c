//! The run configuration (`rl/*.toml`): every weight of the rewards, every PPO
//! hyper-parameter, the model, the adapters and the size of the run. Unknown fields are errors,
//! so a misspelt weight cannot silently fall back to its default.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Result, RlError};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub model: ModelSection,
    #[serde(default)]
    pub lora: LoraSection,
    pub run: RunSection,
    #[serde(default)]
    pub injector: InjectorSection,
    #[serde(default)]
    pub detector: DetectorSection,
    #[serde(default)]
    pub reward: RewardWeights,
    #[serde(default)]
    pub ppo: PpoConfig,
    #[serde(default)]
    pub higher_order: HigherOrderConfig,
    #[serde(default)]
    pub sft: SftConfig,
    #[serde(default)]
    pub eval: EvalConfig,
    #[serde(default)]
    pub head: HeadConfig,
    #[serde(default)]
    pub blame: BlameConfig,
}

/// The learned blamer (`rl::blame`): which agent, at which turn, made a multi-agent run's
/// decisive mistake. Fitted on the corpus's multi-agent logs (`[eval] corpus`, train split)
/// and trained by PPO beside the Detector; saved with the Detector's adapter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BlameConfig {
    /// Train a blame head (needs `[eval] corpus`; a corpus without multi-agent logs trains
    /// none, and says so).
    pub enabled: bool,
    /// The warm start: L2 penalty, Adam's step size, full-batch epochs.
    pub l2: f64,
    pub lr: f64,
    pub epochs: usize,
    /// PPO: train logs drawn per step, turns sampled per log, step size, epochs over the
    /// batch, clip range and KL coefficient towards the warm-started head.
    pub logs_per_step: usize,
    pub samples_per_log: usize,
    pub ppo_lr: f64,
    pub ppo_epochs: usize,
    pub clip: f64,
    pub kl_coef: f64,
}

impl Default for BlameConfig {
    fn default() -> Self {
        BlameConfig {
            enabled: false,
            l2: 1e-2,
            lr: 0.05,
            epochs: 300,
            logs_per_step: 32,
            samples_per_log: 4,
            ppo_lr: 0.005,
            ppo_epochs: 4,
            clip: 0.2,
            kl_coef: 0.3,
        }
    }
}

/// How the Detector decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DecisionMode {
    /// Free-form `sql:`/`bash:` calls and an answer spelt token by token under the grammar
    /// (for models able to write queries).
    #[default]
    Tokens,
    /// The probe library, then one whole choice among the types and `none` through a decision
    /// head on the model's hidden states (`policy::decision`; the CPU default).
    Head,
}

/// How the operating point's cross-validation splits the train split (`[head] folds_by`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FoldsBy {
    /// Trace i in fold i mod `folds`.
    #[default]
    Trace,
    /// One fold per framework (the agent that produced the trace).
    Framework,
}

/// What the decision head reads each trace relative to (`[head] frame`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrameBy {
    /// Inputs as they are.
    #[default]
    None,
    /// Each input minus its framework's typical input (`policy::frame`): the fit subtracts
    /// each train framework's median, and a new framework is read minus the median of its
    /// own traces.
    Framework,
}

/// The decision head's fit (warm start) and its PPO updates (`decision = "head"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeadConfig {
    /// L2 penalty of the fit, per example (2.5e-3 is scikit-learn's default `C = 1` on about
    /// 400 training traces).
    pub l2: f64,
    /// Adam's step size in the fit.
    pub lr: f64,
    /// Most epochs of the fit; it stops earlier when the train split's top-1 accuracy has not
    /// risen for `patience` epochs.
    pub max_epochs: usize,
    pub patience: usize,
    /// Step size of the head's PPO updates (plain gradient steps on ~1,200 standardised
    /// features: at 0.5 one step moved the answer distribution by a KL of 1.9 nats and four
    /// collapsed it, BENCHMARKS.md).
    pub ppo_lr: f64,
    /// Train-split traces replayed in each PPO step beside the live ones, so that every type
    /// keeps appearing in the batches (the Injector plants only a few types a step).
    pub replay: usize,
    /// The decision's operating point: the share of the train split's healthy traces that
    /// must be answered `none` by heads that did not fit them (`folds`-fold cross-validation).
    /// The warm start raises `none`'s score by the smallest amount that meets it
    /// (`head::none_shift`), so a deficiency is named only on evidence that beats a healthy
    /// reading by that margin; most traces a user brings are healthy. 0 leaves the fit as is.
    pub none_target: f64,
    /// Folds of the cross-validation that sets the operating point.
    pub folds: usize,
    /// How that cross-validation splits the train split: `trace` (trace i in fold i mod
    /// `folds`) or `framework` (each framework's traces one fold, so the share of healthy
    /// traces answered `none` is met on frameworks the fold's head never read: the operating
    /// point a user's own framework meets; by trace when the split holds one framework).
    pub folds_by: FoldsBy,
    /// Set the operating point again every this many PPO steps, by the same cross-validation
    /// over the train split and every live trace reviewed so far (0: keep the warm start's).
    /// The live stream changes the share of healthy traces the head is fitted on (each
    /// (agent, task) shows its clean run once per run), and a fixed shift then drifts.
    pub recalibrate_every: u64,
    /// Hashed term buckets of the probe digests the head reads beside the model's features
    /// (`policy::decision::head_input`; 0: the model's features alone).
    pub terms: usize,
    /// How the fit scales the term buckets: 0 standardises them like the model's features;
    /// s > 0 leaves them as they are (L2-normalised counts) times s. Standardised, a bucket
    /// that few train traces fill gets as large a scale as one every trace fills, and a word
    /// only one framework prints becomes as loud as the words every framework prints.
    pub term_scale: f64,
    /// `framework`: the head reads every trace relative to its framework's typical trace, so
    /// that what all runs of a framework show is not read as a deficiency (leave one
    /// framework out: false positives on the left-out framework's healthy runs; BENCHMARKS.md).
    /// The trainer fits on framed train traces, reads live and replayed traces through their
    /// framework's frame and saves the frames with the head; `pathfinder eval --leave-out`
    /// fits and scores such warm starts.
    pub frame: FrameBy,
    /// A term of the probe digests reaches the head's hashed buckets only when the train
    /// traces of at least this many frameworks print it (`rl::head::term_filter`; 0 or 1:
    /// every term). A word one framework alone prints (its tool names, its span names, its
    /// paths) tells the fit which framework a trace came from, and a head that learned it
    /// reads a framework it never saw by its nearest look-alike.
    pub term_frameworks: usize,
    /// k > 0: the head reads the digests' terms by an exact TF-IDF vocabulary of the terms at
    /// least k train traces print (as the `classifier` reference does), fitted on the train
    /// split and saved with the head, instead of hashing them (`terms` must then be 0).
    pub vocabulary_min_df: usize,
    /// Whether the head reads the model's pooled states before the terms. False: the terms
    /// alone, and no model pass reads a trace (the frozen model's states carry less that
    /// transfers to a framework left out than the digests' words; BENCHMARKS.md).
    pub states: bool,
}

impl HeadConfig {
    /// [`linear::FitOptions::raw_tail`] for these settings, when the head's input ends in
    /// `term_width` term values.
    pub fn raw_terms(&self, term_width: usize) -> Option<(usize, f32)> {
        (term_width > 0 && self.term_scale > 0.0).then_some((term_width, self.term_scale as f32))
    }

    /// Whether the terms the head reads depend on its train split (a term filter or a
    /// vocabulary, `rl::head::reads`).
    pub fn reads_train_terms(&self) -> bool {
        self.term_frameworks >= 2 || self.vocabulary_min_df > 0
    }

    /// Whether the head reads the digests' terms at all (hashed or by a vocabulary).
    pub fn reads_terms(&self) -> bool {
        self.terms > 0 || self.vocabulary_min_df > 0
    }
}

impl Default for HeadConfig {
    fn default() -> Self {
        HeadConfig {
            l2: 2.5e-3,
            lr: 0.02,
            max_epochs: 400,
            patience: 60,
            ppo_lr: 0.02,
            replay: 24,
            none_target: 0.9,
            recalibrate_every: 0,
            terms: 0,
            folds: 5,
            folds_by: FoldsBy::Trace,
            term_scale: 0.0,
            frame: FrameBy::None,
            term_frameworks: 0,
            vocabulary_min_df: 0,
            states: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A known model name from the cache (`smollm2-135m`), a GGUF file or a Hugging Face
    /// directory.
    pub path: String,
    /// `f32` or `bf16`.
    #[serde(default = "default_dtype")]
    pub dtype: String,
}

fn default_dtype() -> String {
    "f32".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSection {
    pub rank: usize,
    pub alpha: f64,
    pub dropout: f64,
    pub targets: Vec<String>,
}

impl Default for LoraSection {
    fn default() -> Self {
        LoraSection {
            rank: 8,
            alpha: 16.0,
            dropout: 0.0,
            targets: [
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ]
            .map(String::from)
            .to_vec(),
        }
    }
}

/// One adapter per role (the default) or one policy alternating roles (§5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    Separate,
    Shared,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    pub seed: u64,
    /// PPO steps.
    pub steps: u64,
    pub agents: Vec<String>,
    pub injections_per_step: usize,
    #[serde(default = "one")]
    pub checkpoint_every: u64,
    #[serde(default = "separate")]
    pub topology: Topology,
    /// Wall-clock limit of one agent run, seconds.
    #[serde(default = "sixty")]
    pub agent_timeout_secs: u64,
    /// Where live episodes' agents run: `auto` (Docker when an engine answers, else the
    /// bubblewrap sandbox), `docker` or `local` (the sandbox). Never a plain process.
    #[serde(default = "auto")]
    pub backend: String,
    /// Healthy traces the Detector investigates per step beside the injected ones: the clean
    /// runs that validation already made for the step's valid injections, each (agent, task)
    /// once per run and never a held-out healthy trace's twin. Without them every live trace
    /// is deficient, and PPO and the reviews only ever pull the Detector away from `none`.
    #[serde(default)]
    pub healthy_per_step: usize,
    /// Episodes of a step run at once (0: one per core). Each episode's randomness is its
    /// own, so the number changes how long a step takes, not what it does.
    #[serde(default)]
    pub jobs: usize,
}

fn one() -> u64 {
    1
}
fn sixty() -> u64 {
    60
}
fn auto() -> String {
    "auto".into()
}
fn separate() -> Topology {
    Topology::Separate
}

/// How the Injector proposes an injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InjectorMode {
    /// A constrained choice among the engine's templates (any model size).
    Choice,
    /// The choice, then a free-form unified diff of the code the template targets, applied by
    /// the engine (for models able to write patches; rejected diffs earn `r_invalid`).
    Diff,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InjectorSection {
    pub mode: InjectorMode,
    pub max_diff_tokens: usize,
    /// Offer only the (agent, type, variant) combinations that validated in the `[eval]`
    /// corpus (`rl::environment::CorpusPrior`). The held-out split's combinations are never
    /// offered, whatever this says.
    pub validated_only: bool,
    /// Plant only (agent, type, variant, task) combinations the `[eval]` corpus does not hold
    /// in any split, so that every live trace is new to the warm-started Detector.
    pub new_tasks: bool,
    /// Which types each episode plants (see [`InjectorFocus`]).
    pub focus: InjectorFocus,
    /// Folds of the cross-validation behind `focus = "confusion"`.
    pub focus_folds: usize,
    /// Added to every type's cross-validated error rate, so that no type stops appearing.
    pub focus_floor: f64,
}

/// Which types the Injector's episodes plant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InjectorFocus {
    /// Any type the options offer: the Injector's policy alone chooses.
    None,
    /// Each episode first draws a type with probability proportional to the warm-started
    /// head's cross-validated error rate on that type's train traces (plus `focus_floor`),
    /// then the Injector chooses among that type's options: the adversary plants what the
    /// Detector gets wrong, estimated without touching held-out traces.
    Confusion,
    /// Each episode draws one template (agent, type, variant) with probability proportional
    /// to its type's cross-validated error rate (plus `focus_floor`) divided by one plus the
    /// traces of that template the Detector has learned from so far (the corpus's train split
    /// and this run's earlier episodes): a template the train split lacks teaches the most
    /// (held out, the warm start names 29% of the traces whose template no train trace shares
    /// and 63% of those with two or more; BENCHMARKS.md), and each repeat teaches less. Types
    /// the head has no class for are not planted (their traces could not be learned from).
    Coverage,
}

impl Default for InjectorSection {
    fn default() -> Self {
        InjectorSection {
            mode: InjectorMode::Choice,
            max_diff_tokens: 512,
            validated_only: false,
            new_tasks: false,
            focus: InjectorFocus::None,
            focus_folds: 5,
            focus_floor: 0.1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DetectorSection {
    pub max_turns: usize,
    pub max_action_tokens: usize,
    pub observation_chars: usize,
    /// Sampling temperature during training (evaluation is greedy).
    pub temperature: f32,
    /// Investigations of each valid trace per step. Above 1, the Detector's samples of one
    /// trace form a group and the `group` baseline compares them with each other (as GRPO
    /// does), so a trace's difficulty no longer passes for the quality of an investigation.
    pub samples_per_trace: usize,
    /// `tokens` or `head` (see [`DecisionMode`]).
    pub decision: DecisionMode,
}

impl Default for DetectorSection {
    fn default() -> Self {
        DetectorSection {
            max_turns: 4,
            max_action_tokens: 160,
            observation_chars: 400,
            temperature: 1.0,
            samples_per_trace: 1,
            decision: DecisionMode::Tokens,
        }
    }
}

/// The weights of equations (1) and (2) of the paper, and the localisation credits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardWeights {
    /// α: correct deficiency type.
    pub alpha: f64,
    /// β: localisation score.
    pub beta: f64,
    /// γ: efficiency.
    pub gamma: f64,
    /// Tool calls at which efficiency reaches 0.
    pub max_calls: usize,
    /// Efficiency counts only for a correct type. Off, as the paper writes equation (1); on,
    /// a Detector that detects nothing yet is not taught merely to stop early (the only part
    /// of R_det its samples could otherwise change).
    pub efficiency_needs_detection: bool,
    /// Localisation credit counts only for a correct type. Off, as equation (1) has it; on, a
    /// Detector that names the wrong type is not paid for a component it names often, which is
    /// how a few PPO steps otherwise sharpen one answer for every trace.
    pub localisation_needs_detection: bool,
    /// Localisation credit for naming a component whose sites include the injected function,
    /// only its file, or only the injected component.
    pub loc_function: f64,
    pub loc_file: f64,
    pub loc_component: f64,
    /// Detected after more than `k_min` tool calls: challenging.
    pub k_min: usize,
    pub r_high: f64,
    pub r_med: f64,
    pub r_low: f64,
    /// An injection that fails validation (and never reaches the Detector).
    pub r_invalid: f64,
    /// Both roles are trained on R = R_inj + R_det (the paper); otherwise each on its own.
    pub joint: bool,
}

impl Default for RewardWeights {
    fn default() -> Self {
        RewardWeights {
            alpha: 1.0,
            beta: 0.5,
            gamma: 0.2,
            max_calls: 10,
            efficiency_needs_detection: false,
            localisation_needs_detection: false,
            loc_function: 1.0,
            loc_file: 0.6,
            loc_component: 0.3,
            k_min: 2,
            r_high: 1.0,
            r_med: 0.5,
            r_low: 0.0,
            r_invalid: -1.0,
            joint: true,
        }
    }
}

/// How advantages are estimated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Baseline {
    /// A learned value head and generalised advantage estimation.
    Gae,
    /// The episode's reward minus the mean of its group (the investigations of one trace when
    /// `detector.samples_per_trace` > 1, else the role's batch of the step), divided by the
    /// spread of those differences over the batch; no critic.
    Group,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PpoConfig {
    pub baseline: Baseline,
    /// ε of the clipped surrogate.
    pub clip: f64,
    /// Discount and GAE λ over the policy's own tokens.
    pub gamma: f64,
    pub lambda: f64,
    /// β_KL of the per-token penalty towards the base model (adapters off).
    pub kl_coef: f64,
    /// Entropy bonus of the Injector (prevents collapse onto one type).
    pub entropy_coef_injector: f64,
    pub entropy_coef_detector: f64,
    pub vf_coef: f64,
    pub lr: f64,
    pub weight_decay: f64,
    /// Passes over each batch.
    pub epochs: usize,
    pub max_grad_norm: f64,
}

impl Default for PpoConfig {
    fn default() -> Self {
        PpoConfig {
            baseline: Baseline::Gae,
            clip: 0.2,
            gamma: 1.0,
            lambda: 0.95,
            kl_coef: 0.05,
            entropy_coef_injector: 0.01,
            entropy_coef_detector: 0.0,
            vf_coef: 0.5,
            lr: 5e-5,
            weight_decay: 0.0,
            epochs: 1,
            max_grad_norm: 1.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HigherOrderConfig {
    pub enabled: bool,
    /// Higher-order examples mixed into each step's batch.
    pub per_step: usize,
    /// Failed investigations kept for them.
    pub buffer: usize,
    /// The whole-choice Detector's review of its failures ([`crate::head::review`]): plain
    /// gradient steps and their size.
    pub epochs: usize,
    pub lr: f64,
    /// With the decision head, also keep the live traces it named right, so that the review
    /// weighs the live traces as they came (a mean over all of them) instead of its misses
    /// alone, whose mean gives each miss the weight of many train traces.
    pub keep_named: bool,
    /// With the decision head, how the review weighs the live examples against the train
    /// split: `set` (two means, so the live examples together weigh as much as the whole train
    /// split) or `example` (one mean over both, so a live trace weighs as much as a train trace:
    /// the live traces grow the train set instead of outweighing it).
    pub weighting: ReviewWeighting,
    /// With the decision head, the review's steps: `gradient` (plain gradient steps of size
    /// `lr`) or `adam` (full-batch Adam from the current head, as the warm start fits it).
    pub optimizer: ReviewOptimizer,
}

/// The steps of the decision head's review ([`crate::head::review`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewOptimizer {
    /// Plain gradient steps.
    #[default]
    Gradient,
    /// Full-batch Adam with fresh moments from the current head.
    Adam,
}

/// How the decision head's review weighs its live examples ([`crate::head::review`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewWeighting {
    /// The live examples' mean plus the train split's mean.
    #[default]
    Set,
    /// One mean over the live examples and the train split together.
    Example,
}

impl Default for HigherOrderConfig {
    fn default() -> Self {
        HigherOrderConfig {
            enabled: true,
            per_step: 1,
            buffer: 32,
            epochs: 10,
            lr: 0.02,
            keep_named: false,
            weighting: ReviewWeighting::Set,
            optimizer: ReviewOptimizer::Gradient,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftConfig {
    pub epochs: usize,
    pub lr: f64,
    /// Tool calls of each expert investigation kept before its answer.
    pub max_probes: usize,
    /// Train-split traces used (0: all).
    pub max_examples: usize,
    /// Demonstrations end in the trace's label (the expert's probes, then the true answer);
    /// otherwise in the expert's own verdict, right or wrong.
    pub label_answers: bool,
    /// Weight in the loss of the tokens the grammar leaves a choice (a reply's head, the
    /// answer's type and component) against 1 for free text (`ppo::sft_step`). 1: plain NLL.
    pub decision_weight: f64,
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            epochs: 2,
            lr: 2e-4,
            max_probes: 3,
            max_examples: 0,
            label_answers: true,
            decision_weight: 1.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// A corpus directory (`pathfinder corpus generate --out DIR`): its train split feeds the
    /// warm start, its `split` is the held-out evaluation. Empty: no warm start, no evaluation.
    pub corpus: String,
    pub split: String,
    /// Held-out traces evaluated (0: all).
    pub max_traces: usize,
    /// Evaluate every this many steps as well as before and after (0: only before and after).
    pub every: u64,
    /// Frameworks (the corpus labels' agents) the run never trains on: their traces are left
    /// out of the warm start, the replay and the held-out split, and every one of them, of
    /// any split, is evaluated beside the held-out split (`eval-left-out.jsonl`), the measure
    /// of a Detector on frameworks it never trained on. `run.agents` may not name them.
    pub leave_out: Vec<String>,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            corpus: String::new(),
            split: "test".into(),
            max_traces: 0,
            every: 0,
            leave_out: Vec::new(),
        }
    }
}

impl RunConfig {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<RunConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| RlError::io(path, e))?;
        RunConfig::parse(&text, path)
    }

    pub fn parse(text: &str, origin: &Path) -> Result<RunConfig> {
        let config: RunConfig = toml::from_str(text).map_err(|e| RlError::Config {
            path: origin.to_owned(),
            reason: e.to_string(),
        })?;
        config.validate(origin)?;
        Ok(config)
    }

    /// The configuration text `text` with `[run] seed` set to `seed` (`pathfinder train --seed`):
    /// the text a run records, so its checkpoints say which seed it ran. Every field is spelt
    /// out and comments are dropped.
    pub fn text_with_seed(text: &str, origin: &Path, seed: u64) -> Result<String> {
        let mut config = RunConfig::parse(text, origin)?;
        config.run.seed = seed;
        let out = toml::to_string(&config).map_err(|e| RlError::Config {
            path: origin.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(format!(
            "# {} with [run] seed = {seed} (pathfinder train --seed); every field spelt out\n{out}",
            origin.display()
        ))
    }

    /// The configuration `text` with `frameworks` left out of training (`[eval] leave_out`,
    /// and no longer in `[run] agents`), every field spelt out: `pathfinder train --leave-out`.
    pub fn text_leaving_out(text: &str, origin: &Path, frameworks: &[String]) -> Result<String> {
        let mut config = RunConfig::parse(text, origin)?;
        config.run.agents.retain(|a| !frameworks.contains(a));
        for f in frameworks {
            if !config.eval.leave_out.contains(f) {
                config.eval.leave_out.push(f.clone());
            }
        }
        config.validate(origin)?;
        let out = toml::to_string(&config).map_err(|e| RlError::Config {
            path: origin.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(format!(
            "# {} with {} left out of training (pathfinder train --leave-out); every field spelt out\n{out}",
            origin.display(),
            frameworks.join(", ")
        ))
    }

    fn validate(&self, origin: &Path) -> Result<()> {
        let bad = |field: &str, reason: &str| {
            Err(RlError::Config {
                path: origin.to_owned(),
                reason: format!("field `{field}`: {reason}"),
            })
        };
        if self.run.agents.is_empty() {
            return bad("run.agents", "name at least one agent");
        }
        if self.run.injections_per_step == 0 {
            return bad("run.injections_per_step", "must be at least 1");
        }
        if self.run.checkpoint_every == 0 {
            return bad("run.checkpoint_every", "must be at least 1");
        }
        if let Err(reason) = runner::BackendChoice::parse(&self.run.backend) {
            return bad("run.backend", &reason);
        }
        if !matches!(self.model.dtype.as_str(), "f32" | "bf16") {
            return bad("model.dtype", "must be `f32` or `bf16`");
        }
        if self.lora.rank == 0 {
            return bad("lora.rank", "must be at least 1");
        }
        if !(self.ppo.clip > 0.0 && self.ppo.clip < 1.0) {
            return bad("ppo.clip", "must be in (0, 1)");
        }
        if !(0.0..=1.0).contains(&self.ppo.gamma) || !(0.0..=1.0).contains(&self.ppo.lambda) {
            return bad("ppo.gamma / ppo.lambda", "must be in [0, 1]");
        }
        if self.ppo.lr <= 0.0 || self.sft.lr <= 0.0 {
            return bad("ppo.lr / sft.lr", "must be positive");
        }
        if self.ppo.epochs == 0 {
            return bad("ppo.epochs", "must be at least 1");
        }
        if self.detector.max_turns < 2 {
            return bad(
                "detector.max_turns",
                "must be at least 2 (one call and the answer)",
            );
        }
        if self.detector.samples_per_trace == 0 {
            return bad("detector.samples_per_trace", "must be at least 1");
        }
        if self.reward.max_calls == 0 {
            return bad("reward.max_calls", "must be at least 1");
        }
        if self.injector.new_tasks && self.eval.corpus.is_empty() {
            return bad(
                "injector.new_tasks",
                "needs a corpus to read the combinations it holds from (`[eval] corpus`)",
            );
        }
        if self.injector.focus != InjectorFocus::None {
            if self.detector.decision != DecisionMode::Head {
                return bad(
                    "injector.focus",
                    "`confusion` and `coverage` need the decision head (`[detector] decision = \"head\"`), whose errors they estimate",
                );
            }
            if self.injector.focus == InjectorFocus::Coverage && self.eval.corpus.is_empty() {
                return bad(
                    "injector.focus",
                    "`coverage` needs a corpus to count the train split's templates in (`[eval] corpus`)",
                );
            }
            if self.injector.focus_folds < 2 {
                return bad("injector.focus_folds", "must be at least 2");
            }
            if !(self.injector.focus_floor > 0.0 && self.injector.focus_floor.is_finite()) {
                return bad("injector.focus_floor", "must be a positive number");
            }
        }
        if self.blame.enabled {
            if self.eval.corpus.is_empty() {
                return bad(
                    "blame.enabled",
                    "the blamer is fitted on a corpus's multi-agent logs: set `[eval] corpus`",
                );
            }
            if self.blame.logs_per_step == 0 || self.blame.samples_per_log < 2 {
                return bad(
                    "blame.logs_per_step / blame.samples_per_log",
                    "PPO needs at least one log a step and two samples a log (advantages compare samples of one log)",
                );
            }
            if !(self.blame.clip > 0.0 && self.blame.clip < 1.0) {
                return bad("blame.clip", "must be in (0, 1)");
            }
            if self.blame.lr <= 0.0 || self.blame.ppo_lr <= 0.0 || self.blame.l2 < 0.0 {
                return bad(
                    "blame.lr / blame.ppo_lr / blame.l2",
                    "step sizes must be positive and the penalty not negative",
                );
            }
        }
        if !self.eval.leave_out.is_empty() {
            if self.eval.corpus.is_empty() {
                return bad(
                    "eval.leave_out",
                    "names frameworks of a corpus: set `[eval] corpus`",
                );
            }
            if let Some(a) = self
                .run
                .agents
                .iter()
                .find(|a| self.eval.leave_out.contains(a))
            {
                return bad(
                    "run.agents",
                    &format!("`{a}` is left out of training (`eval.leave_out`); its live episodes would train on it"),
                );
            }
        }
        if self.injector.validated_only && self.eval.corpus.is_empty() {
            return bad(
                "injector.validated_only",
                "needs a corpus to read the validated combinations from (`[eval] corpus`)",
            );
        }
        if self.detector.decision == DecisionMode::Head {
            if self.eval.corpus.is_empty() {
                return bad(
                    "detector.decision",
                    "the decision head is fitted on a corpus's train split: set `[eval] corpus`",
                );
            }
            if !(self.head.lr > 0.0 && self.head.ppo_lr > 0.0 && self.head.l2 >= 0.0) {
                return bad(
                    "head.lr / head.ppo_lr / head.l2",
                    "must be positive (l2 may be 0)",
                );
            }
            if !(0.0..=1.0).contains(&self.head.none_target) {
                return bad("head.none_target", "must be a share between 0 and 1");
            }
            if !(self.head.term_scale.is_finite() && self.head.term_scale >= 0.0) {
                return bad(
                    "head.term_scale",
                    "must be 0 (standardise the terms) or a positive scale",
                );
            }
            if self.head.folds < 2 {
                return bad("head.folds", "cross-validation needs at least 2 folds");
            }
            if self.head.term_frameworks >= 2 && !self.head.reads_terms() {
                return bad(
                    "head.term_frameworks",
                    "filters the digests' terms, but head.terms and head.vocabulary_min_df are 0 (the head reads no terms)",
                );
            }
            if self.head.vocabulary_min_df > 0 && self.head.terms > 0 {
                return bad(
                    "head.vocabulary_min_df",
                    "reads the terms by an exact vocabulary, but head.terms also hashes them: set one of the two to 0",
                );
            }
            if !self.head.states && !self.head.reads_terms() {
                return bad(
                    "head.states",
                    "is false and the head reads no terms either (head.terms and head.vocabulary_min_df are 0): it would read nothing",
                );
            }
        }
        if !(self.sft.decision_weight > 0.0 && self.sft.decision_weight.is_finite()) {
            return bad("sft.decision_weight", "must be a positive number");
        }
        Ok(())
    }

    /// The model file or directory: a known name resolves to its cached file.
    pub fn model_path(&self) -> Result<PathBuf> {
        match model::fetch::known_model(&self.model.path) {
            Ok(known) => {
                let path = model::fetch::cached_path(&model::fetch::default_cache_dir(), known);
                if path.exists() {
                    Ok(path)
                } else {
                    Err(RlError::Model(format!(
                        "{} is not in the cache ({}); run `pathfinder model fetch {}`",
                        self.model.path,
                        path.display(),
                        self.model.path
                    )))
                }
            }
            Err(_) => Ok(PathBuf::from(&self.model.path)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "[model]\npath = \"m.gguf\"\n[run]\nseed = 1\nsteps = 2\nagents = [\"toolcaller\"]\ninjections_per_step = 2\n";

    #[test]
    fn a_seed_override_keeps_every_other_field() {
        let text = &format!("{MINIMAL}\n[ppo]\nlr = 1e-4\n");
        let out = RunConfig::text_with_seed(text, Path::new("x.toml"), 7).unwrap();
        let c = RunConfig::parse(&out, Path::new("x.toml")).unwrap();
        let mut expected = RunConfig::parse(text, Path::new("x.toml")).unwrap();
        assert_eq!(expected.ppo.lr, 1e-4);
        expected.run.seed = 7;
        assert_eq!(c, expected);
    }

    #[test]
    fn leaving_a_framework_out_drops_it_from_the_live_agents() {
        let text = format!("{MINIMAL}[eval]\ncorpus = \"c\"\n").replace(
            "agents = [\"toolcaller\"]",
            "agents = [\"toolcaller\", \"ag2\"]",
        );
        let out = RunConfig::text_leaving_out(&text, Path::new("x.toml"), &["ag2".into()]).unwrap();
        let c = RunConfig::parse(&out, Path::new("x.toml")).unwrap();
        assert_eq!(c.run.agents, vec!["toolcaller"]);
        assert_eq!(c.eval.leave_out, vec!["ag2"]);
        // Nothing left to run live: refused, naming the field.
        let e = RunConfig::text_leaving_out(
            &text,
            Path::new("x.toml"),
            &["ag2".into(), "toolcaller".into()],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("run.agents"), "{e}");
    }

    #[test]
    fn minimal_config_gets_the_paper_defaults() {
        let c = RunConfig::parse(MINIMAL, Path::new("x.toml")).unwrap();
        assert_eq!(c.run.topology, Topology::Separate);
        assert_eq!(c.ppo.baseline, Baseline::Gae);
        assert!(c.reward.joint);
        assert_eq!(c.lora.targets.len(), 7);
    }

    #[test]
    fn misspelt_and_invalid_fields_are_named() {
        let e = RunConfig::parse(
            &format!("{MINIMAL}[reward]\nalpah = 2.0\n"),
            Path::new("x.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("x.toml") && e.contains("alpah"), "{e}");
        let e = RunConfig::parse(
            &format!("{MINIMAL}[ppo]\nclip = 1.5\n"),
            Path::new("y.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("y.toml") && e.contains("ppo.clip"), "{e}");
        for (extra, field) in [
            (
                "[injector]\nvalidated_only = true\n[eval]\ncorpus = \"\"\n",
                "injector.validated_only",
            ),
            ("[sft]\ndecision_weight = 0.0\n", "sft.decision_weight"),
            (
                "[detector]\ndecision = \"head\"\n[higher_order]\nenabled = false\n",
                "detector.decision",
            ),
            ("[injector]\nfocus = \"confusion\"\n", "injector.focus"),
            // Still in MINIMAL's [run] table.
            ("backend = \"vm\"\n", "run.backend"),
            ("[higher_order]\noptimizer = \"sgd\"\n", "optimizer"),
            // A framework left out of training may not be trained on live.
            (
                "[eval]\ncorpus = \"c\"\nleave_out = [\"toolcaller\"]\n",
                "run.agents",
            ),
            ("[eval]\nleave_out = [\"ag2\"]\n", "eval.leave_out"),
            // A head that hashes and counts the same terms, or reads nothing at all.
            (
                "[detector]\ndecision = \"head\"\n[eval]\ncorpus = \"c\"\n[head]\nterms = 64\nvocabulary_min_df = 2\n",
                "head.vocabulary_min_df",
            ),
            (
                "[detector]\ndecision = \"head\"\n[eval]\ncorpus = \"c\"\n[head]\nstates = false\n",
                "head.states",
            ),
        ] {
            let e = RunConfig::parse(&format!("{MINIMAL}{extra}"), Path::new("z.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("z.toml") && e.contains(field), "{e}");
        }
    }

    #[test]
    fn the_repository_configurations_parse() {
        let rl = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../rl");
        for name in [
            "default.toml",
            "cpu.toml",
            "transfer.toml",
            "transfer-vocabulary.toml",
        ] {
            let path = rl.join(name);
            let text = std::fs::read_to_string(&path).unwrap();
            RunConfig::parse(&text, &path).unwrap_or_else(|e| panic!("{e}"));
        }
        // The transfer configuration is rl/cpu.toml, framed, on six frameworks.
        let read = |name: &str| {
            let path = rl.join(name);
            RunConfig::parse(&std::fs::read_to_string(&path).unwrap(), &path).unwrap()
        };
        let (cpu, mut transfer) = (read("cpu.toml"), read("transfer.toml"));
        assert_eq!(transfer.head.frame, FrameBy::Framework);
        assert_eq!(transfer.run.agents.len(), 6);
        assert_eq!(transfer.eval.corpus, "runs/corpus7");
        transfer.head.frame = FrameBy::None;
        transfer.run.agents = cpu.run.agents.clone();
        transfer.eval.corpus = cpu.eval.corpus.clone();
        assert_eq!(transfer, cpu);
        // The vocabulary configuration is rl/transfer.toml but for how its head reads and fits.
        let (transfer, mut vocabulary) = (read("transfer.toml"), read("transfer-vocabulary.toml"));
        assert!(!vocabulary.head.states && vocabulary.head.vocabulary_min_df == 2);
        vocabulary.head = transfer.head.clone();
        assert_eq!(vocabulary, transfer);
    }
}
