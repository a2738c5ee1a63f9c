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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use detect::policies::KeywordPolicy;
use detect::Verdict;
use eval::store_eval::Labelled;
use indicatif::{ProgressBar, ProgressStyle};
use model::{AdamW, AdamWConfig, DType, Device, LoraConfig, Projection};
use policy::decision::DecisionHead;
use policy::{ActionGrammar, Conversation, DetectorOptions, PolicyModel, SharedModel};

use collective::Collective;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, TrainerState, RNG_SCHEME};
use crate::config::{Decision, FoldsBy, InjectorFocus, InjectorMode, RunConfig, Topology};
use crate::environment::{self, CorpusPrior, Environment};
use crate::evaluate::{self, Accuracy, SplitTraces};
use crate::head::{self, HeadSample};
use crate::higher_order::{self, FailedInvestigation};
use crate::metrics::{self, EvalCase, EvalMetrics, StepMetrics};
use crate::ppo::{self, Role, Sample};
use crate::reward::{self, Detection};
use crate::{Result, RlError};

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
    detections: Vec<(Detection, Conversation, detect::Transcript)>,
    /// With the decision head, each detection's sampled choice: (features, class, log-prob).
    head_choices: Vec<(Vec<f32>, usize, f32)>,
    /// The investigations of the clean run beside the injection, as a healthy trace
    /// (`run.healthy_per_step`); empty when it was not investigated.
    healthy: Vec<(Detection, Conversation, detect::Transcript)>,
    healthy_choices: Vec<(Vec<f32>, usize, f32)>,
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

/// A stable 64-bit mix of the run seed and a position (SplitMix64 finaliser), the only source of
/// randomness in a run.
pub fn mix(seed: u64, step: u64, index: u64, purpose: u64) -> u64 {
    let mut z = seed
        ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ index.wrapping_mul(0xBF58_476D_1CE4_E5B9)
        ^ purpose.wrapping_mul(0x94D0_49BB_1331_11EB);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
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
}

impl Trainer {
    /// Loads the model and prepares fresh adapters (or the run's newest checkpoint with
    /// `resume`).
    pub fn new(config_text: &str, config_path: &Path, options: TrainOptions) -> Result<Trainer> {
        let config = RunConfig::parse(config_text, config_path)?;
        let dtype = match config.model.dtype.as_str() {
            "bf16" => DType::BF16,
            _ => DType::F32,
        };
        // A rank takes its node's GPU by its local rank (GPU 0 for one process).
        let device = Device::cuda_if_available(collective::local_rank())?;
        let pm = PolicyModel::load(&config.model_path()?, dtype, &device)?;
        Trainer::with_model(config, config_text, options, pm)
    }

    /// [`Trainer::new`] with a model already in memory (tests use a tiny random one).
    pub fn with_model(
        config: RunConfig,
        config_text: &str,
        options: TrainOptions,
        mut pm: PolicyModel,
    ) -> Result<Trainer> {
        let run_config = options.run_dir.join("config.toml");
        let latest = checkpoint::latest(&options.run_dir)?;
        if options.resume {
            let stored =
                std::fs::read_to_string(&run_config).map_err(|e| RlError::io(&run_config, e))?;
            let mut a = RunConfig::parse(&stored, &run_config)?;
            let mut b = config.clone();
            // A resumed run may be extended; everything else must match.
            a.run.steps = 0;
            b.run.steps = 0;
            if a != b {
                return Err(RlError::Config {
                    path: run_config,
                    reason: "the run was started with another configuration (only run.steps may change on --resume)".into(),
                });
            }
        } else if latest.is_some() {
            return Err(RlError::Config {
                path: options.run_dir.clone(),
                reason: "this run already has checkpoints; pass --resume to continue it or choose another --run".into(),
            });
        }
        // Every rank has read what it checks before rank 0 writes.
        options.ranks.barrier().map_err(collective_err)?;
        let leader = options.ranks.is_leader();
        std::fs::create_dir_all(&options.run_dir).map_err(|e| RlError::io(&options.run_dir, e))?;
        if leader {
            std::fs::write(&run_config, config_text).map_err(|e| RlError::io(&run_config, e))?;
        }
        if latest.is_none() && leader {
            // Lines of an attempt that died before its first checkpoint are redone.
            for file in metrics::RUN_LOGS {
                let p = options.run_dir.join(file);
                if p.exists() {
                    std::fs::remove_file(&p).map_err(|e| RlError::io(&p, e))?;
                }
            }
        }

        let lora = LoraConfig {
            rank: config.lora.rank,
            alpha: config.lora.alpha,
            dropout: config.lora.dropout,
            target_modules: config
                .lora
                .targets
                .iter()
                .map(|t| {
                    Projection::from_peft_name(t).ok_or_else(|| RlError::Config {
                        path: run_config.clone(),
                        reason: format!("field `lora.targets`: unknown projection `{t}`"),
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            use_rslora: false,
        };
        let names = adapter_names(config.run.topology);
        let mut optimizers = BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            if pm.model.adapter(name).is_none() {
                pm.model
                    .add_adapter(name, lora.clone(), mix(config.run.seed, 0, i as u64, 7))?;
                pm.model.add_value_head(name)?;
            }
        }
        let mut heads = None;
        let mut state = TrainerState {
            seed: config.run.seed,
            rng_scheme: RNG_SCHEME.into(),
            ..TrainerState::default()
        };
        if options.resume {
            if let Some((step, dir)) = &latest {
                for name in &names {
                    checkpoint::load_adapter(&mut pm.model, dir, name)?;
                }
                if config.detector.decision == Decision::Head {
                    let detector = adapter_names(config.run.topology)[0];
                    heads = head::load(dir, detector)?;
                }
                state = checkpoint::read_state(dir)?;
                if options.ranks.is_leader() {
                    for file in metrics::RUN_LOGS {
                        metrics::truncate_after(&options.run_dir.join(file), *step)?;
                    }
                }
                tracing::info!(step, "resuming from {}", dir.display());
            }
        }
        for name in &names {
            let mut opt = AdamW::new(
                pm.model.trainable_vars(name)?,
                AdamWConfig {
                    lr: config.ppo.lr,
                    weight_decay: config.ppo.weight_decay,
                    ..AdamWConfig::default()
                },
            )?;
            if let (true, Some((_, dir))) = (options.resume, &latest) {
                checkpoint::load_optimizer(dir, name, &mut opt)?;
            }
            optimizers.insert(name.to_string(), opt);
        }
        let catalog = taxonomy::Catalog::embedded().map_err(|e| RlError::Model(e.to_string()))?;
        let grammar = Arc::new(ActionGrammar::new(
            &pm.tokenizer,
            &catalog,
            &policy::grammar::LEARNED_TOOLS,
        )?);
        Ok(Trainer {
            decision_system: Arc::new(policy::decision::system_prompt(&catalog)),
            config,
            config_text: config_text.to_owned(),
            options,
            shared: Arc::new(Mutex::new(pm)),
            grammar,
            optimizers,
            state,
            keyword: KeywordPolicy::new().map_err(RlError::Environment)?,
            heads,
            replay: Vec::new(),
            out_of_fold: None,
            focus: None,
        })
    }

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

    /// Whether this process writes the run's files (rank 0 of a data-parallel job).
    fn leader(&self) -> bool {
        self.options.ranks.is_leader()
    }

    fn ranks(&self) -> &dyn Collective {
        self.options.ranks.as_ref()
    }

    /// A scratch file of this rank in the run directory: `name` for rank 0, `name` with the
    /// rank before its extension for the others (ranks never share a store being written).
    fn rank_file(&self, name: &str) -> PathBuf {
        let rank = self.ranks().rank();
        let dir = &self.options.run_dir;
        if rank == 0 {
            return dir.join(name);
        }
        match name.rsplit_once('.') {
            Some((stem, ext)) => dir.join(format!("{stem}.rank{rank}.{ext}")),
            None => dir.join(format!("{name}.rank{rank}")),
        }
    }

    /// Where this rank's live episodes run and their stores are written.
    fn live_dir(&self) -> PathBuf {
        let live = self.options.run_dir.join("live");
        match self.ranks().rank() {
            0 => live,
            r => live.join(format!("rank-{r}")),
        }
    }

    /// Appends metric lines to a run log (rank 0 only).
    fn log_metrics<T: serde::Serialize>(&self, file: &str, lines: &[T]) -> Result<()> {
        if self.leader() {
            metrics::append_all(&self.options.run_dir.join(file), lines)?;
        }
        Ok(())
    }

    /// Writes a checkpoint (rank 0), after checking that every rank holds the same weights:
    /// a fingerprint of each rank's adapters, optimizer moments, heads and state is gathered,
    /// and ranks that differ stop the run rather than train on diverged copies.
    fn save(&self) -> Result<PathBuf> {
        let pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        // One process has nothing to compare: the fingerprint is a pass over every weight.
        let fingerprint = if self.ranks().world() > 1 {
            let mine = self.fingerprint(&pm.model)?;
            let all = collective::gather_json(self.ranks(), &mine).map_err(collective_err)?;
            if let Some(r) = all.iter().position(|f| *f != mine) {
                return Err(RlError::Environment(format!(
                    "data-parallel ranks diverged at step {}: rank {r}'s weights differ from rank {}'s (fingerprints {} and {mine})",
                    self.state.step,
                    self.ranks().rank(),
                    all[r]
                )));
            }
            Some(mine)
        } else {
            None
        };
        let dir = checkpoint::step_dir(&self.options.run_dir, self.state.step);
        if !self.leader() {
            return Ok(dir);
        }
        let adapters: Vec<(&str, &AdamW)> = self
            .optimizers
            .iter()
            .map(|(n, o)| (n.as_str(), o))
            .collect();
        let heads = self
            .heads
            .as_ref()
            .map(|(h, r)| (self.adapter(Role::Detector), h, r));
        let dir = checkpoint::save(
            &self.options.run_dir,
            &pm.model,
            &adapters,
            heads,
            &self.state,
            &self.config_text,
        )?;
        if let Some(fingerprint) = fingerprint {
            tracing::info!(
                step = self.state.step,
                world = self.ranks().world(),
                fingerprint,
                "checkpoint: every rank holds the same weights"
            );
        }
        Ok(dir)
    }

    /// FNV-1a over the bits of everything a rank's update changes: the adapters' trainable
    /// parameters, the optimizers' moments, the decision heads and the trainer's state.
    fn fingerprint(&self, model: &model::Model) -> Result<String> {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
            }
        };
        let tensor_bits = |t: &model::Tensor| -> Result<Vec<u8>> {
            let v = t
                .flatten_all()
                .and_then(|t| t.to_dtype(DType::F32))
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(model::ModelError::from)?;
            Ok(v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect())
        };
        for (name, opt) in &self.optimizers {
            for var in model.trainable_vars(name)? {
                eat(&tensor_bits(var.as_tensor())?);
            }
            let st = opt.state();
            for t in st.m.iter().chain(&st.v) {
                eat(&tensor_bits(t)?);
            }
        }
        if let Some((h1, h2)) = &self.heads {
            for head in [h1, h2] {
                eat(&serde_json::to_vec(head).map_err(|e| RlError::Sample(e.to_string()))?);
            }
        }
        eat(&serde_json::to_vec(&self.state).map_err(|e| RlError::Sample(e.to_string()))?);
        Ok(format!("{h:016x}"))
    }

    fn detector_options(&self, seed: u64) -> DetectorOptions {
        DetectorOptions {
            adapter: Some(self.adapter(Role::Detector).into()),
            temperature: self.config.detector.temperature,
            max_action_tokens: self.config.detector.max_action_tokens,
            observation_chars: self.config.detector.observation_chars,
            seed,
        }
    }

    fn held_out(&self) -> Result<Option<SplitTraces>> {
        if self.config.eval.corpus.is_empty() {
            return Ok(None);
        }
        let corpus = self.options.root.join(&self.config.eval.corpus);
        let split = evaluate::split_traces(
            &corpus,
            &self.config.eval.split,
            self.config.eval.max_traces,
        )?;
        evaluate::rekey(&split, &self.rank_file("held-out.sqlite")).map(Some)
    }

    /// Evaluates the Detector on the held-out split and appends the result to `eval.jsonl`.
    /// Each rank evaluates its share of the traces; the cases are gathered in the split's order.
    fn evaluate(&self, split: &SplitTraces, label: &str) -> Result<Accuracy> {
        let whole = split;
        let mine = self.share(whole);
        let split = &mine;
        let bar = self.bar(
            split.traces.len() as u64,
            "eval  {bar:30} {pos}/{len} {msg}",
        );
        let mut right = 0;
        let mut cases = Vec::new();
        let on_done = |case: &eval::metrics::Case| {
            if eval::metrics::detected(case) {
                right += 1;
            }
            cases.push(case.clone());
            bar.inc(1);
            bar.set_message(format!("{right} right"));
        };
        match &self.heads {
            Some((h, _)) => evaluate::evaluate_head(
                &self.shared,
                &Arc::new(h.clone()),
                self.adapter(Role::Detector),
                &self.decision_system,
                Some(&self.feature_cache()),
                split,
                on_done,
            )?,
            None => evaluate::evaluate(
                &self.shared,
                &self.grammar,
                &self.detector_options(0),
                self.config.detector.max_turns,
                split,
                on_done,
            )?,
        };
        bar.finish_and_clear();
        let cases = self.gather_in_order(cases, whole, |c| &c.trace_id)?;
        let acc = evaluate::accuracy(&cases);
        if !self.leader() {
            return Ok(acc);
        }
        let cases: Vec<EvalCase> = cases
            .into_iter()
            .map(|case| EvalCase {
                step: self.state.step,
                policy: label.into(),
                case,
            })
            .collect();
        metrics::append_all(&self.options.run_dir.join("eval-cases.jsonl"), &cases)?;
        metrics::append(
            &self.options.run_dir.join("eval.jsonl"),
            &EvalMetrics {
                step: self.state.step,
                split: self.config.eval.split.clone(),
                detection_accuracy: acc.detection,
                localisation_accuracy: acc.localisation,
                avg_tool_calls: acc.avg_tool_calls,
                n: acc.n,
                policy: label.into(),
                false_positive_rate: acc.false_positive_rate,
            },
        )?;
        Ok(acc)
    }

    /// This rank's share of a split's traces (all of them for one process).
    fn share(&self, split: &SplitTraces) -> SplitTraces {
        SplitTraces {
            db: split.db.clone(),
            traces: split
                .traces
                .iter()
                .enumerate()
                .filter(|(i, _)| self.ranks().owns(*i))
                .map(|(_, t)| t.clone())
                .collect(),
        }
    }

    /// Every rank's `items` (one per trace of its [`Trainer::share`] of `split`), in the order
    /// of `split`'s traces.
    fn gather_in_order<T>(
        &self,
        items: Vec<T>,
        split: &SplitTraces,
        trace_id: impl Fn(&T) -> &str,
    ) -> Result<Vec<T>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        if self.ranks().world() == 1 {
            return Ok(items);
        }
        let order: BTreeMap<&str, usize> = split
            .traces
            .iter()
            .enumerate()
            .map(|(i, t)| (t.trace_id.as_str(), i))
            .collect();
        self.gather_sorted(items, |t| {
            order.get(trace_id(t)).copied().unwrap_or(usize::MAX)
        })
    }

    /// Every rank's `items`, on every rank, ordered by `key` (the identity for one process):
    /// how a rank's share of a list rejoins the whole.
    fn gather_sorted<T, K: Ord>(&self, items: Vec<T>, key: impl Fn(&T) -> K) -> Result<Vec<T>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        if self.ranks().world() == 1 {
            return Ok(items);
        }
        let mut all: Vec<T> = collective::gather_json(self.ranks(), &items)
            .map_err(collective_err)?
            .into_iter()
            .flatten()
            .collect();
        all.sort_by_key(|t| key(t));
        Ok(all)
    }

    /// Where the decision head's features are kept, beside the runs (`RUNS_DIR/.feature-cache`):
    /// the frozen model reads a trace the same way in every evaluation and every seed.
    fn feature_cache(&self) -> PathBuf {
        self.options
            .run_dir
            .parent()
            .unwrap_or(&self.options.run_dir)
            .join(".feature-cache")
    }

    /// The Detector's feature reader (its adapter, the decision's system prompt, the cache).
    fn head_reader(&self) -> Result<Arc<policy::decision::FeatureReader>> {
        head::reader(
            &self.shared,
            self.adapter(Role::Detector),
            &self.decision_system,
            Some(&self.feature_cache()),
        )
    }

    /// The probe battery's features of every trace of `split` (decision head).
    fn battery_features(&self, split: &SplitTraces, what: &str) -> Result<Vec<Vec<f32>>> {
        let batteries = eval::classifier::battery(&split.db, &split.traces)
            .map_err(|e| RlError::Environment(e.to_string()))?;
        let bar = self.bar(
            batteries.len() as u64,
            &format!("read  {{bar:30}} {{pos}}/{{len}} {what} traces"),
        );
        let reader = self.head_reader()?;
        // Each rank reads its share of the traces; the features are gathered in order.
        let (indices, mine): (Vec<usize>, Vec<_>) = batteries
            .iter()
            .enumerate()
            .filter(|(i, _)| self.ranks().owns(*i))
            .map(|(i, b)| (i, b.clone()))
            .unzip();
        let terms = self.config.head.terms;
        let x = head::features(&reader, &self.shared, &mine, terms, |i| {
            bar.set_position(i as u64)
        })?;
        bar.finish_and_clear();
        let all = self.gather_sorted(indices.into_iter().zip(x).collect(), |(i, _)| *i)?;
        if all.len() != batteries.len() {
            return Err(RlError::Environment(format!(
                "the ranks returned features for {} of {} traces",
                all.len(),
                batteries.len()
            )));
        }
        Ok(all.into_iter().map(|(_, x)| x).collect())
    }

    /// The train split with its features, for the head's fit and PPO's replay.
    fn train_features(&self) -> Result<(SplitTraces, Vec<Vec<f32>>)> {
        let corpus = self.options.root.join(&self.config.eval.corpus);
        let train = evaluate::split_traces(&corpus, "train", self.config.sft.max_examples)?;
        let x = self.battery_features(&train, "train")?;
        Ok((train, x))
    }

    /// How the decision head is fitted (`[head]`), logging every `log_every` epochs.
    fn head_fit_options(&self, log_every: usize) -> linear::FitOptions {
        let h = &self.config.head;
        linear::FitOptions {
            l2: h.l2 as f32,
            lr: h.lr as f32,
            max_epochs: h.max_epochs,
            patience: h.patience,
            log_every,
            standardise: true,
            raw_tail: h.raw_terms(),
        }
    }

    /// Warm start of the decision head: the language model reads every train trace's probe
    /// battery once, and a softmax over its features is fitted to the labels (types and
    /// `none`; components), its fit logged on train and validation epoch by epoch.
    fn warm_start_head(&mut self) -> Result<()> {
        let started = Instant::now();
        let corpus = self.options.root.join(&self.config.eval.corpus);
        let (train, train_x) = self.train_features()?;
        let val = evaluate::split_traces(&corpus, "val", 0).ok();
        let val_x = match &val {
            Some(v) => Some(self.battery_features(v, "val")?),
            None => None,
        };
        let options = self.head_fit_options(10);
        let mut lines = Vec::new();
        let mut fitted = head::fit(
            &train.traces,
            &train_x,
            val.as_ref()
                .zip(val_x.as_ref())
                .map(|(v, x)| (v.traces.as_slice(), x.as_slice())),
            self.config.head.terms,
            &options,
            |l| {
                lines.push(StepMetrics {
                    step: 0,
                    phase: "sft-head".into(),
                    unix_ms: unix_ms(),
                    sft_loss: Some(l.train_nll),
                    epoch: Some(l.epoch),
                    answer_nll: Some(l.train_nll),
                    answer_top1: Some(l.train_top1),
                    answer_top5: Some(l.train_top5),
                    val_answer_nll: l.val_nll,
                    val_answer_top1: l.val_top1,
                    val_answer_top5: l.val_top5,
                    episodes: Some(train.traces.len()),
                    ..StepMetrics::default()
                })
            },
        )?;
        if let Some(last) = lines.last_mut() {
            last.seconds = Some(started.elapsed().as_secs_f64());
            tracing::info!(
                epochs = last.epoch,
                train_top1 = last.answer_top1,
                val_top1 = last.val_answer_top1,
                types = fitted.types.len(),
                "decision head fitted"
            );
        }
        self.log_metrics("metrics.jsonl", &lines)?;
        self.replay = train.traces.into_iter().zip(train_x).collect();
        if self.config.head.none_target > 0.0 {
            let point = self.operating_point()?;
            fitted.set_none_shift(point.shift);
        }
        self.heads = Some((fitted.clone(), fitted));
        self.state.warm_started = true;
        Ok(())
    }

    /// The train split read out of fold (cross-validation of the type head, `folds` folds
    /// split `by` trace or framework), computed once per split and kept for the operating
    /// point and the focus.
    fn out_of_fold(&mut self, folds: usize, by: FoldsBy) -> Result<Arc<[head::OutOfFold]>> {
        if let Some((k, read)) = &self.out_of_fold {
            if *k == (folds, by) {
                return Ok(Arc::clone(read));
            }
        }
        let options = self.head_fit_options(0);
        let (train, x): (Vec<Labelled>, Vec<Vec<f32>>) = self.replay.iter().cloned().unzip();
        let read: Arc<[head::OutOfFold]> =
            head::out_of_fold(&train, &x, folds, by, &options)?.into();
        self.out_of_fold = Some(((folds, by), Arc::clone(&read)));
        Ok(read)
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

    /// The decision's operating point (`[head] none_target`): the shift of `none`'s score set
    /// on the train split's out-of-fold readings, logged and written to `operating-point.json`
    /// in the run directory.
    fn operating_point(&mut self) -> Result<head::NoneShift> {
        let read = self.out_of_fold(self.config.head.folds, self.config.head.folds_by)?;
        let point = head::none_shift(&read, self.config.head.none_target);
        let share = |a: usize, n: usize| a as f64 / n.max(1) as f64;
        tracing::info!(
            shift = point.shift,
            target = point.target,
            healthy_none = format!(
                "{:.3} -> {:.3} of {}",
                share(point.healthy_none_before, point.healthy),
                share(point.healthy_none_after, point.healthy),
                point.healthy
            ),
            deficient_named = format!(
                "{:.3} -> {:.3} of {}",
                share(point.deficient_named_before, point.deficient),
                share(point.deficient_named_after, point.deficient),
                point.deficient
            ),
            "operating point: `none` raised until the target share of healthy train traces (out of fold) is answered `none`"
        );
        self.write_record("operating-point.json", &point)?;
        Ok(point)
    }

    /// Sets the head's operating point again as the warm start did, cross-validated over the
    /// train split and every live trace the head has reviewed so far (their true types); the
    /// reference head keeps the warm start's. Returns the new shift.
    fn recalibrate(&mut self, step: u64) -> Result<f32> {
        let Some((h, _)) = &self.heads else {
            return Ok(0.0);
        };
        let mut truths: Vec<&str> = Vec::new();
        let mut frameworks: Vec<Option<&str>> = Vec::new();
        let mut x: Vec<Vec<f32>> = Vec::new();
        for (t, f) in &self.replay {
            truths.push(&t.truth.deficiency_id);
            frameworks.push(t.agent.as_deref());
            x.push(f.clone());
        }
        for f in &self.state.head_failures {
            truths.push(&h.types[f.class]);
            frameworks.push(f.agent.as_deref());
            x.push(f.features.clone());
        }
        let fold_of = head::fold_assignment(
            &frameworks,
            self.config.head.folds,
            self.config.head.folds_by,
        );
        let read = head::out_of_fold_of(&truths, &x, &fold_of, &self.head_fit_options(0))?;
        let point = head::none_shift(&read, self.config.head.none_target);
        tracing::info!(
            step,
            shift = point.shift,
            healthy = point.healthy,
            healthy_none = point.healthy_none_after,
            deficient_named = format!("{} of {}", point.deficient_named_after, point.deficient),
            "operating point set again over the train split and the reviewed live traces"
        );
        if let Some((h, _)) = &mut self.heads {
            h.set_none_shift(point.shift);
        }
        Ok(point.shift)
    }

    /// Supervised warm start on the expert's demonstrations of the corpus's train split.
    fn warm_start(&mut self) -> Result<()> {
        if self.config.detector.decision == Decision::Head {
            return self.warm_start_head();
        }
        let corpus = self.options.root.join(&self.config.eval.corpus);
        let split = evaluate::split_traces(&corpus, "train", self.config.sft.max_examples)?;
        let split = evaluate::rekey(&split, &self.rank_file("demonstrations.sqlite"))?;
        let bar = self.bar(
            split.traces.len() as u64,
            "expert {bar:30} {pos}/{len} demonstrations",
        );
        let demos = evaluate::demonstrations(
            &self.shared,
            &self.grammar,
            &split,
            self.config.sft.max_probes,
            self.config.detector.observation_chars,
            self.config.sft.label_answers,
            |i| bar.set_position(i as u64),
        )?;
        bar.finish_and_clear();
        tracing::info!(
            demonstrations = demos.len(),
            traces = split.traces.len(),
            label_answers = self.config.sft.label_answers,
            "warm start"
        );
        if demos.is_empty() {
            return Err(RlError::Environment(format!(
                "{}: the expert's train-split investigations gave no demonstration the grammar can write",
                corpus.display()
            )));
        }
        let adapter = self.adapter(Role::Detector);
        let sft_opt = AdamWConfig {
            lr: self.config.sft.lr,
            weight_decay: self.config.ppo.weight_decay,
            ..AdamWConfig::default()
        };
        let batch = 4;
        let updates = self.config.sft.epochs * demos.len().div_ceil(batch);
        let bar = self.bar(updates as u64, "sft   {bar:30} {pos}/{len} {msg}");
        // A separate optimizer: the warm start's moments should not steer PPO's first steps.
        let vars = {
            let pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            pm.model.trainable_vars(adapter)?
        };
        let mut opt = AdamW::new(vars, sft_opt)?;
        let mut update = 0;
        for epoch in 0..self.config.sft.epochs {
            for chunk in demos.chunks(batch) {
                let started = Instant::now();
                let sft = {
                    let mut pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                    ppo::sft_step(
                        &mut pm.model,
                        adapter,
                        &mut opt,
                        chunk,
                        ppo::SftStep {
                            max_grad_norm: 1.0,
                            decision_weight: self.config.sft.decision_weight,
                            measure_kl: update % SFT_KL_EVERY == 0 || update + 1 == updates,
                        },
                        self.options.ranks.as_ref(),
                    )?
                };
                let loss = sft.nll;
                update += 1;
                let tokens: usize = chunk.iter().map(Conversation::len).sum();
                let secs = started.elapsed().as_secs_f64();
                self.log_metrics(
                    "metrics.jsonl",
                    &[StepMetrics {
                        step: 0,
                        phase: "sft".into(),
                        unix_ms: unix_ms(),
                        sft_loss: Some(loss),
                        kl: sft.kl,
                        episodes: Some(chunk.len()),
                        tokens_per_s: Some(tokens as f64 / secs.max(1e-9)),
                        seconds: Some(secs),
                        ..StepMetrics::default()
                    }],
                )?;
                bar.inc(1);
                bar.set_message(format!("epoch {} loss {loss:.3}", epoch + 1));
                tracing::debug!(update, loss, "sft update");
            }
        }
        bar.finish_and_clear();
        self.state.warm_started = true;
        Ok(())
    }

    /// Runs the warm start (if due), the PPO steps and the evaluations.
    pub fn run(&mut self) -> Result<TrainOutcome> {
        let held_out = self.held_out()?;
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
            self.save()?;
        } else if let Some(split) = &held_out {
            outcome.before = read_eval(&self.options.run_dir, 0)?;
            if outcome.before.is_none() && self.state.step == 0 {
                // The warm start finished but its evaluation is not on record (its lines were
                // removed because the evaluation settings changed): evaluate it now.
                outcome.before = Some(self.evaluate(split, "sft")?);
                self.save()?;
            }
        }
        if self.options.sft_only {
            return Ok(outcome);
        }
        if self.config.detector.decision == Decision::Head {
            if self.heads.is_none() {
                return Err(RlError::Environment(
                    "`detector.decision = \"head\"` but the run has no decision head (its warm start did not run)".into(),
                ));
            }
            if self.replay.is_empty() && self.config.head.replay > 0 {
                // A resumed run reads the train split again (the same features: greedy, no
                // randomness).
                let (train, x) = self.train_features()?;
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
            let m = self.step(&mut env, step)?;
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
            }
            if step % self.config.run.checkpoint_every == 0 || step == last {
                self.save()?;
            }
        }
        bar.finish_and_clear();
        outcome.last_step = self.state.step;
        if first > last {
            // The run had already finished: report its final evaluation.
            outcome.after = read_eval(&self.options.run_dir, last)?;
        } else if self.state.step == last {
            if let Some(split) = &held_out {
                outcome.after = Some(self.evaluate(split, "ppo")?);
                // The final checkpoint carries the final evaluation line too.
                self.save()?;
            }
        }
        Ok(outcome)
    }

    /// The head's errors per type by cross-validation on the train split (`[injector] focus =
    /// "confusion"`), logged and written to `focus.json` in the run directory.
    fn confusion_focus(&mut self) -> Result<BTreeMap<String, (usize, usize)>> {
        let read = self.out_of_fold(self.config.injector.focus_folds, FoldsBy::Trace)?;
        let errors = head::cross_validated_errors(&read);
        let (missed, total) = errors
            .values()
            .fold((0, 0), |(m, t), (e, n)| (m + e, t + n));
        let mut hardest: Vec<(&String, f64)> = errors
            .iter()
            .map(|(t, (e, n))| (t, *e as f64 / (*n).max(1) as f64))
            .collect();
        hardest.sort_by(|a, b| b.1.total_cmp(&a.1));
        tracing::info!(
            folds = self.config.injector.focus_folds,
            cv_top1 = 1.0 - missed as f64 / total.max(1) as f64,
            hardest = ?hardest.iter().take(8).map(|(t, r)| format!("{t} {r:.2}")).collect::<Vec<_>>(),
            "injector focus: the head's cross-validated errors per type"
        );
        self.write_record("focus.json", &errors)?;
        Ok(errors)
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
        let valid = episodes.iter().filter(|e| !e.detections.is_empty()).count();
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
            injection_entropy: Some(metrics::entropy_of(&chosen_types)),
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

    /// Phase 1: the Injector chooses `injections_per_step` (type, site, variant) options, one
    /// agent after another, and (in diff mode) writes each diff; each choice is planned as an
    /// episode.
    fn propose(&mut self, env: &mut Environment, step: u64) -> Result<Proposed> {
        let seed = self.config.run.seed;
        let n = self.config.run.injections_per_step;
        let agents = self.config.run.agents.clone();
        let injector = self.adapter(Role::Injector);
        let history = history_line(&self.state.history);
        let diff_mode = self.config.injector.mode == InjectorMode::Diff;
        // Each rank proposes its share of the step's episodes (every rank for one process):
        // first every choice, then (free-form mode) every diff, decoded together.
        let mut chosen = Vec::with_capacity(n);
        for i in (0..n).filter(|i| self.options.ranks.owns(*i)) {
            let agent = agents[((step - 1) as usize * n + i) % agents.len()].clone();
            let mut options = env.options(&agent, diff_mode)?;
            if let Some(errors) = &self.focus {
                let u = unit(mix(seed, step, i as u64, 7));
                let floor = self.config.injector.focus_floor;
                match self.config.injector.focus {
                    InjectorFocus::Coverage => {
                        let weights: Vec<f64> = options
                            .iter()
                            .map(|o| {
                                let learned = env.prior().train_count(&agent, o)
                                    + self
                                        .state
                                        .planted
                                        .get(&template_key(&agent, o))
                                        .copied()
                                        .unwrap_or(0);
                                head::coverage_weight(errors, &o.deficiency, floor, learned)
                            })
                            .collect();
                        if let Some(k) = head::draw(&weights, u) {
                            options = vec![options[k].clone()];
                        }
                    }
                    _ => {
                        let mut offered: Vec<&str> =
                            options.iter().map(|o| o.deficiency.as_str()).collect();
                        offered.sort_unstable();
                        offered.dedup();
                        if let Some(ty) =
                            head::focus_type(&offered, errors, floor, u).map(str::to_owned)
                        {
                            options.retain(|o| o.deficiency == ty);
                        }
                    }
                }
            }
            let offered = options.len();
            let info = env.agent(&agent)?;
            let choice = {
                let mut pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                policy::choose_injection(
                    &mut pm,
                    Some(injector),
                    &agent,
                    &info.components,
                    &history,
                    &options,
                    self.config.detector.temperature,
                    mix(seed, step, i as u64, 1),
                )?
            };
            let option = options[choice.index].clone();
            // (file, code, type with its name) of the template the free-form diff rewrites.
            let target = if diff_mode {
                let edit = &env.template(&agent, &option)?.edits[0];
                let name = env
                    .catalog()
                    .get(&option.deficiency)
                    .map_or(String::new(), |d| format!(" ({})", d.name));
                Some((
                    edit.file.clone(),
                    edit.find.clone(),
                    format!("{}{name}", option.deficiency),
                ))
            } else {
                None
            };
            chosen.push((i, agent, option, choice, target, offered));
        }
        let mut diffs: Vec<Option<String>> = vec![None; chosen.len()];
        if diff_mode && !chosen.is_empty() {
            let mut proposals: Vec<(&mut Conversation, policy::DiffRequest<'_>)> = chosen
                .iter_mut()
                .filter_map(|(i, _, _, choice, target, _)| {
                    let (file, code, deficiency) = target.as_ref()?;
                    Some((
                        &mut choice.conversation,
                        policy::DiffRequest {
                            file,
                            code,
                            deficiency,
                            seed: mix(seed, step, *i as u64, 5),
                        },
                    ))
                })
                .collect();
            let mut pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            let texts = policy::write_diffs(
                &mut pm,
                Some(injector),
                &mut proposals,
                self.config.injector.max_diff_tokens,
                self.config.detector.temperature,
            )?;
            diffs = texts.into_iter().map(Some).collect();
        }
        let mut episodes = Vec::with_capacity(n);
        let mut planned = Vec::with_capacity(n);
        for (i, agent, option, choice, _, offered) in chosen {
            let key = template_key(&agent, &option);
            planned.push(env.plan_new(
                &format!("s{step:05}i{i:02}"),
                &agent,
                &option,
                mix(seed, step, i as u64, 2),
                |task| self.state.planted_tasks.contains(&format!("{key}/{task}")),
            )?);
            episodes.push(Episode {
                index: i,
                agent,
                deficiency: option.deficiency.clone(),
                injector: choice.conversation,
                offered,
                manifest: None,
                detections: Vec::new(),
                head_choices: Vec::new(),
                healthy: Vec::new(),
                healthy_choices: Vec::new(),
            });
        }

        Ok(Proposed {
            episodes,
            planned,
            diffs,
        })
    }

    /// Phases 2 and 3: the agents run the planned episodes on a worker thread, and the
    /// Detector investigates each valid trace as it arrives (through the decision head, or
    /// `samples_per_trace` sampled investigations); then up to `run.healthy_per_step` of the
    /// clean runs beside them are investigated as healthy traces — the first in step order
    /// whose (agent, task) the run has not shown yet, chosen over every rank's episodes.
    /// Returns those (agent, task) pairs, the same on every rank.
    fn run_and_investigate(
        &self,
        env: &mut Environment,
        step: u64,
        proposed: &mut Proposed,
    ) -> Result<Vec<(String, String)>> {
        let Proposed {
            episodes,
            planned,
            diffs,
        } = proposed;
        let stores = self.live_dir().join("stores");
        std::fs::create_dir_all(&stores).map_err(|e| RlError::io(&stores, e))?;
        let store_path = stores.join(format!("step-{step}.sqlite"));
        evaluate::remove_store(&store_path)?;
        let mut store = traces::Store::open(&store_path)
            .map_err(|e| RlError::Environment(format!("{}: {e}", store_path.display())))?;
        let max_turns = match self.heads {
            Some(_) => detect::probes::battery_turns(),
            None => self.config.detector.max_turns,
        };
        let detector = detect::Detector::new(
            store_path.clone(),
            evaluate::learned_config(max_turns),
            false,
        )
        .map_err(|e| RlError::Environment(e.to_string()))?;
        let out = env.out().to_owned();
        let n = self.config.run.injections_per_step;
        // This rank's valid episodes with a clean run to show: (step index, local index, path).
        let mut candidates: Vec<(usize, usize, PathBuf)> = Vec::new();
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let worker_result: Result<()> = std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel();
            let env_ref = &*env;
            let planned_ref = &*planned;
            let diffs_ref = &*diffs;
            // `jobs` workers take the planned episodes in order; the first failure stops new
            // ones from starting. Each episode's randomness is its own (seeded by its index),
            // so the order they finish in changes nothing.
            let jobs = env_ref.jobs().min(planned_ref.len()).max(1);
            for _ in 0..jobs {
                let tx = tx.clone();
                let (next, stop) = (&next, &stop);
                scope.spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(p) = planned_ref.get(i) else {
                            break;
                        };
                        let r = match &diffs_ref[i] {
                            Some(d) => env_ref.run_diff(p, d),
                            None => env_ref.run(p),
                        };
                        let clean = r.as_ref().ok().and_then(|m| env_ref.clean_trace(m));
                        if r.is_err() {
                            stop.store(true, Ordering::SeqCst);
                        }
                        if tx.send((i, r, clean)).is_err() {
                            stop.store(true, Ordering::SeqCst);
                            break;
                        }
                    }
                });
            }
            drop(tx);
            let mut first_error = None;
            for (i, manifest, clean) in rx {
                let manifest = match manifest {
                    Ok(m) => m,
                    Err(e) => {
                        first_error.get_or_insert(e);
                        continue;
                    }
                };
                if first_error.is_some() {
                    continue;
                }
                // Kept beside the episode for inspection (the corpus layout).
                let record = corpus::manifest_path(&out, &manifest.id);
                let json = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
                std::fs::write(&record, json).map_err(|e| RlError::io(&record, e))?;
                if manifest.validation.valid {
                    let index = episodes[i].index;
                    let trace_id = format!("t{step:05}{index:02}");
                    environment::import(&mut store, &out, &manifest, &trace_id)?;
                    (episodes[i].detections, episodes[i].head_choices) =
                        self.investigate(&detector, &trace_id, step, index)?;
                    if let Some(clean) = clean {
                        candidates.push((index, i, clean));
                    }
                }
                episodes[i].manifest = Some(manifest);
            }
            first_error.map_or(Ok(()), Err)
        });
        worker_result?;
        // In step order, whichever episode finished first.
        candidates.sort_by_key(|(index, _, _)| *index);
        if let Some(e) = episodes.iter().find(|e| e.manifest.is_none()) {
            return Err(RlError::Environment(format!(
                "episode {} of step {step} did not run",
                e.index
            )));
        }

        // The healthy traces, chosen in step order over every rank's candidates.
        let pairs_of = |c: &[(usize, usize, PathBuf)]| -> Vec<(usize, (String, String))> {
            c.iter()
                .map(|(index, i, _)| {
                    let m = episodes[*i].manifest.as_ref().expect("checked above");
                    (*index, (m.agent.clone(), m.task.clone()))
                })
                .collect()
        };
        let offered = self.gather_sorted(pairs_of(&candidates), |(index, _)| *index)?;
        let mut chosen: Vec<(usize, (String, String))> = Vec::new();
        for (index, pair) in offered {
            if chosen.len() < self.config.run.healthy_per_step
                && !self.state.healthy_seen.contains(&pair)
                && !chosen.iter().any(|(_, p)| *p == pair)
            {
                chosen.push((index, pair));
            }
        }
        for (index, i, clean) in &candidates {
            if !chosen.iter().any(|(c, _)| c == index) {
                continue;
            }
            let manifest = episodes[*i].manifest.clone().expect("checked above");
            // Its randomness is drawn after the step's injected traces' (n + index).
            let trace_id = format!("h{step:05}{index:02}");
            environment::import_healthy(&mut store, clean, &manifest, &trace_id)?;
            (episodes[*i].healthy, episodes[*i].healthy_choices) =
                self.investigate(&detector, &trace_id, step, n + index)?;
        }
        drop(store);
        Ok(chosen.into_iter().map(|(_, pair)| pair).collect())
    }

    /// Every rank's episodes of a step, in step order, on every rank (the identity for one
    /// process). Each rank has run and investigated its own share; rewards, reviews and the
    /// update then see the whole step.
    fn gather_episodes(&self, mine: Vec<Episode>) -> Result<Vec<Episode>> {
        if self.ranks().world() == 1 {
            return Ok(mine);
        }
        let all = self.gather_sorted(mine, |e| e.index)?;
        let n = self.config.run.injections_per_step;
        if all.len() != n || all.iter().enumerate().any(|(i, e)| e.index != i) {
            return Err(RlError::Environment(format!(
                "the ranks returned {} episodes for a step of {n}",
                all.len()
            )));
        }
        Ok(all)
    }

    /// Phase 4: the rewards. Each investigation is scored on its own joint reward; the
    /// Injector's reward is its expected reward over the trace's investigations; an invalid
    /// injection gets the Injector's invalid-episode reward. Also records the Injector's
    /// history and the step's higher-order candidates.
    fn score(&mut self, env: &mut Environment, step: u64, episodes: &[Episode]) -> Result<Scored> {
        let per_trace = self.config.detector.samples_per_trace;
        let w = &self.config.reward;
        let mut samples_inj = Vec::new();
        let mut samples_det = Vec::new();
        let mut samples_head: Vec<HeadSample> = Vec::new();
        let (mut r_inj_sum, mut r_det_sum, mut detected, mut localised, mut calls) =
            (0.0, 0.0, 0usize, 0usize, 0usize);
        let mut r_joint_sum = 0.0;
        let mut new_failures: Vec<FailedInvestigation> = Vec::new();
        let mut new_head_failures: Vec<head::Failure> = Vec::new();
        let mut investigated = 0usize;
        let (mut healthy, mut healthy_flagged) = (0usize, 0usize);
        // With `keep_named`, every live trace is kept for the review, not only the misses.
        let keep_named = self.config.higher_order.keep_named;
        let mut chosen_types = Vec::new();
        let mut log = String::new();
        for (i, e) in episodes.iter().enumerate() {
            chosen_types.push(e.deficiency.clone());
            let manifest = e.manifest.as_ref().expect("checked above");
            let truth = environment::truth(manifest);
            let sites = &env.agent(&e.agent)?.sites;
            if e.detections.is_empty() {
                // Invalid: the injection never reached the Detector.
                let r_inj = reward::injector_reward(None, &truth, w);
                r_inj_sum += r_inj;
                r_joint_sum += r_inj;
                samples_inj.extend(injector_sample(e, r_inj));
                self.state.history.push((truth.deficiency.clone(), false));
                continue;
            }
            // The Injector's reward is its expected reward over the trace's investigations;
            // each investigation is trained on its own joint reward.
            let k = e.detections.len() as f64;
            let (mut r_inj, mut r_det_mean) = (0.0, 0.0);
            for (j, (d, conversation, transcript)) in e.detections.iter().enumerate() {
                let r_det = reward::detector_reward(d, &truth, sites, w);
                let r_inj_j = reward::injector_reward(Some(d), &truth, w);
                let line = serde_json::json!({
                    "step": step,
                    "episode": i,
                    "sample": j,
                    "truth": &truth,
                    "reward_detector": r_det,
                    "reward_injector": r_inj_j,
                    "transcript": transcript,
                });
                log.push_str(&line.to_string());
                log.push('\n');
                r_inj += r_inj_j / k;
                r_det_mean += r_det / k;
                investigated += 1;
                r_det_sum += r_det;
                calls += d.tool_calls;
                let correct = d.deficiency.as_deref() == Some(truth.deficiency.as_str());
                detected += usize::from(correct);
                localised += usize::from(
                    reward::loc_score(d.component.as_deref(), &truth, sites, w) >= w.loc_function,
                );
                if j == 0 {
                    self.state.history.push((truth.deficiency.clone(), correct));
                    if let (Some((h, _)), Some((features, _, _))) =
                        (&self.heads, e.head_choices.first())
                    {
                        new_head_failures
                            .extend(review_example(h, features, &truth, &e.agent, keep_named).0);
                    }
                    // One higher-order example per trace: its other investigations' failures
                    // would be near copies.
                    if let Some(f) =
                        higher_order::from_transcript(transcript, &truth, &self.keyword)
                    {
                        new_failures.push(f);
                    }
                }
                if let Some((features, action, old_log_prob)) = e.head_choices.get(j) {
                    samples_head.push(HeadSample {
                        features: features.clone(),
                        action: *action,
                        old_log_prob: *old_log_prob,
                        reward: if w.joint { r_inj_j + r_det } else { r_det },
                        group: 1 + i as u64,
                    });
                }
                if conversation.generated_count() > 0 {
                    samples_det.push(Sample {
                        role: Role::Detector,
                        conversation: conversation.clone(),
                        reward: if w.joint { r_inj_j + r_det } else { r_det },
                        // One group per trace when it was investigated several times.
                        group: if per_trace > 1 { 1 + i as u64 } else { 0 },
                    });
                }
            }
            r_inj_sum += r_inj;
            let r_joint = if w.joint { r_inj + r_det_mean } else { r_inj };
            r_joint_sum += r_joint;
            samples_inj.extend(injector_sample(e, r_joint));
            // The clean run beside it, as a healthy trace: the Detector's reward alone (no
            // injection to credit), its own group, and a failure to review when the greedy
            // answer called it deficient.
            let truth = environment::healthy_truth();
            let group = 1 + (episodes.len() + i) as u64;
            for (j, (d, conversation, transcript)) in e.healthy.iter().enumerate() {
                let r_det = reward::detector_reward(d, &truth, sites, w);
                let line = serde_json::json!({
                    "step": step,
                    "episode": i,
                    "healthy": true,
                    "sample": j,
                    "truth": &truth,
                    "reward_detector": r_det,
                    "transcript": transcript,
                });
                log.push_str(&line.to_string());
                log.push('\n');
                if j == 0 {
                    healthy += 1;
                    if let (Some((h, _)), Some((features, _, _))) =
                        (&self.heads, e.healthy_choices.first())
                    {
                        let (example, named) =
                            review_example(h, features, &truth, &e.agent, keep_named);
                        healthy_flagged += usize::from(!named);
                        new_head_failures.extend(example);
                    } else {
                        healthy_flagged +=
                            usize::from(d.deficiency.as_deref() != Some(truth.deficiency.as_str()));
                    }
                }
                if let Some((features, action, old_log_prob)) = e.healthy_choices.get(j) {
                    samples_head.push(HeadSample {
                        features: features.clone(),
                        action: *action,
                        old_log_prob: *old_log_prob,
                        reward: r_det,
                        group,
                    });
                }
                if conversation.generated_count() > 0 {
                    samples_det.push(Sample {
                        role: Role::Detector,
                        conversation: conversation.clone(),
                        reward: r_det,
                        group: if per_trace > 1 { group } else { 0 },
                    });
                }
            }
        }
        // The Injector sees its last 16 outcomes.
        let keep = self.state.history.len().saturating_sub(16);
        self.state.history.drain(..keep);
        Ok(Scored {
            samples_inj,
            samples_det,
            samples_head,
            r_inj_sum,
            r_det_sum,
            r_joint_sum,
            detected,
            localised,
            calls,
            investigated,
            healthy,
            healthy_flagged,
            new_failures,
            new_head_failures,
            chosen_types,
            log,
        })
    }

    /// Every investigation of the step as JSON Lines, for reading what the Detector did (never
    /// read back).
    fn write_investigations(&self, step: u64, log: &str) -> Result<()> {
        if !self.leader() {
            return Ok(());
        }
        let log_path = self
            .options
            .run_dir
            .join("live")
            .join("investigations")
            .join(format!("step-{step}.jsonl"));
        if let Some(dir) = log_path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| RlError::io(dir, e))?;
        }
        std::fs::write(&log_path, log).map_err(|e| RlError::io(&log_path, e))?;
        Ok(())
    }

    /// The higher-order reviews of earlier steps' failed investigations (when enabled), and
    /// this step's failures queued for later steps.
    fn higher_order_reviews(
        &mut self,
        step: u64,
        new_failures: Vec<FailedInvestigation>,
    ) -> Result<Vec<Sample>> {
        let seed = self.config.run.seed;
        let mut reviews = Vec::new();
        // The whole-choice Detector reviews its failures in its head's update instead.
        if self.config.higher_order.enabled && self.heads.is_none() {
            let take = self
                .config
                .higher_order
                .per_step
                .min(self.state.failed.len());
            let chosen: Vec<FailedInvestigation> = self.state.failed.drain(..take).collect();
            // Each rank writes its share of the reviews; they are gathered in order.
            let mut mine: Vec<(usize, Sample)> = Vec::new();
            for (k, f) in chosen.iter().enumerate() {
                if !self.options.ranks.owns(k) {
                    continue;
                }
                let mut pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                let (conversation, reward) = higher_order::review(
                    &mut pm,
                    self.adapter(Role::Review),
                    f,
                    self.config.detector.temperature,
                    mix(seed, step, k as u64, 4),
                )?;
                mine.push((
                    k,
                    Sample {
                        role: Role::Review,
                        conversation,
                        reward,
                        // Reviews are measured against each other, not against investigations.
                        group: u64::MAX,
                    },
                ));
            }
            let all = self.gather_sorted(mine, |(k, _)| *k)?;
            reviews.extend(all.into_iter().map(|(_, s)| s));
            self.state.failed.extend(new_failures);
            let excess = self
                .state
                .failed
                .len()
                .saturating_sub(self.config.higher_order.buffer);
            self.state.failed.drain(..excess);
        }

        Ok(reviews)
    }

    /// Phase 5: PPO, role-alternating — the Injector's batch, then the Detector's — and the
    /// decision head's update (head mode).
    fn update(
        &mut self,
        env: &mut Environment,
        step: u64,
        scored: &mut Scored,
        phases: &mut BTreeMap<String, f64>,
    ) -> Result<(Vec<ppo::PpoStats>, Option<HeadUpdate>)> {
        let (samples_inj, samples_det) = (&scored.samples_inj, &scored.samples_det);
        let ppo_cfg = self.config.ppo.clone();
        let mut stats = Vec::new();
        for (role, batch, entropy_coef) in [
            (Role::Injector, samples_inj, ppo_cfg.entropy_coef_injector),
            (Role::Detector, samples_det, ppo_cfg.entropy_coef_detector),
        ] {
            if batch.is_empty() {
                continue;
            }
            let lap = Instant::now();
            let name = self.adapter(role);
            let optimizer = self
                .optimizers
                .get_mut(name)
                .expect("one optimizer per adapter");
            let mut pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            stats.push(ppo::update(
                &mut pm.model,
                name,
                optimizer,
                batch,
                &ppo_cfg,
                entropy_coef,
                self.options.ranks.as_ref(),
            )?);
            let phase = match role {
                Role::Injector => "update_injector",
                _ => "update_detector",
            };
            phases.insert(phase.to_owned(), lap.elapsed().as_secs_f64());
        }
        let lap = Instant::now();
        let head_stats = self.update_head(
            env,
            step,
            std::mem::take(&mut scored.samples_head),
            std::mem::take(&mut scored.new_head_failures),
        )?;
        if head_stats.is_some() {
            phases.insert("update_head".to_owned(), lap.elapsed().as_secs_f64());
        }
        Ok((stats, head_stats))
    }
}

impl Trainer {
    /// `samples_per_trace` investigations of a live trace by the learned Detector, token by
    /// token through the grammar, each with its own generated conversation. Several run at
    /// once, each on its own thread, and their replies are decoded together as the rows of
    /// one batch ([`TurnBatcher`]); one alone decodes through its own cache.
    fn investigate_tokens(
        &self,
        detector: &detect::Detector,
        trace_id: &str,
        step: u64,
        i: usize,
    ) -> Result<Vec<(Detection, Conversation, detect::Transcript)>> {
        let seed = self.config.run.seed;
        let per_trace = self.config.detector.samples_per_trace;
        let options: Vec<DetectorOptions> = (0..per_trace)
            .map(|k| self.detector_options(mix(seed, step, (i * per_trace + k) as u64, 3)))
            .collect();
        policy::investigate_many(
            detector,
            trace_id,
            &self.shared,
            &self.grammar,
            &options,
            per_trace > 1,
        )
        .into_iter()
        .map(|done| {
            let (transcript, conversation) = done.map_err(RlError::Environment)?;
            let (deficiency, component) = match transcript.verdict() {
                Some(Verdict::Deficiency {
                    deficiency_id,
                    component,
                    ..
                }) => (Some(deficiency_id.clone()), Some(component.clone())),
                _ => (None, None),
            };
            let detection = Detection {
                deficiency,
                component,
                tool_calls: eval::store_eval::tool_calls(&transcript),
            };
            Ok((detection, conversation, transcript))
        })
        .collect()
    }

    /// A live trace's investigations: through the decision head when the run has one (with
    /// each choice's features, class and log-probability), else token by token. `i` places
    /// the investigation's randomness among the step's.
    fn investigate(
        &self,
        detector: &detect::Detector,
        trace_id: &str,
        step: u64,
        i: usize,
    ) -> Result<Investigations> {
        match &self.heads {
            Some((h, _)) => self.investigate_head(detector, h, trace_id, step, i),
            None => Ok((
                self.investigate_tokens(detector, trace_id, step, i)?,
                Vec::new(),
            )),
        }
    }

    /// One investigation of a live trace with the probe battery and the decision head, then
    /// `samples_per_trace` choices sampled from the head's distribution over the same
    /// features (the battery is deterministic; only the choice is random). Returns each
    /// choice's detection and its (features, class, log-probability).
    fn investigate_head(
        &self,
        detector: &detect::Detector,
        h: &DecisionHead,
        trace_id: &str,
        step: u64,
        i: usize,
    ) -> Result<Investigations> {
        let seed = self.config.run.seed;
        let per_trace = self.config.detector.samples_per_trace;
        let temperature = self.config.detector.temperature;
        let sink: head::Sink = Arc::new(Mutex::new(None));
        let reader = self.head_reader()?;
        let policy = policy::decision::policy(
            Arc::clone(&self.shared),
            Arc::new(h.clone()),
            reader,
            temperature,
            unit(mix(seed, step, (i * per_trace) as u64, 3)),
            Some(Arc::clone(&sink)),
        );
        let transcript = detector
            .investigate(trace_id, policy)
            .map_err(|e| RlError::Environment(format!("investigating {trace_id}: {e}")))?;
        let investigated = sink
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| {
                RlError::Environment(format!(
                    "investigating {trace_id}: the probe battery ended without a decision ({})",
                    transcript.outcome.describe()
                ))
            })?;
        let calls = eval::store_eval::tool_calls(&transcript);
        let mut detections = Vec::with_capacity(per_trace);
        let mut choices = Vec::with_capacity(per_trace);
        for k in 0..per_trace {
            let d = if k == 0 {
                investigated.decision.clone()
            } else {
                h.decide(
                    &investigated.features,
                    temperature,
                    unit(mix(seed, step, (i * per_trace + k) as u64, 3)),
                )
            };
            detections.push((
                head_detection(h, &d, calls),
                Conversation::new(),
                transcript.clone(),
            ));
            choices.push((
                investigated.features.clone(),
                d.type_index,
                d.type_log_probs[d.type_index],
            ));
        }
        Ok((detections, choices))
    }

    /// The Detector's update of its decision head: the PPO step on the live samples, plus
    /// `head.replay` train-split traces decided afresh (`samples_per_trace` choices each),
    /// anchored at the warm-started head; then (with `higher_order.enabled`) the review of the
    /// live traces it has named wrongly so far ([`head::review`]). `None` when the Detector
    /// decides token by token.
    fn update_head(
        &mut self,
        env: &Environment,
        step: u64,
        mut batch: Vec<HeadSample>,
        failures: Vec<head::Failure>,
    ) -> Result<Option<HeadUpdate>> {
        let Some((h, reference)) = &mut self.heads else {
            return Ok(None);
        };
        let seed = self.config.run.seed;
        let per_trace = self.config.detector.samples_per_trace;
        let temperature = self.config.detector.temperature;
        let w = &self.config.reward;
        let calls = detect::probes::LIBRARY.len();
        let take = self.config.head.replay.min(self.replay.len());
        for j in 0..take {
            let (t, x) =
                &self.replay[(mix(seed, step, j as u64, 6) % self.replay.len() as u64) as usize];
            let truth = reward::Truth {
                deficiency: t.truth.deficiency_id.clone(),
                component: t.truth.component.clone(),
                file: t.truth.file.clone(),
                function: t.truth.function.clone(),
            };
            let sites = t
                .agent
                .as_deref()
                .and_then(|a| env.agent(a).ok())
                .map(|a| a.sites.clone())
                .unwrap_or_default();
            for k in 0..per_trace {
                let d = h.decide(
                    x,
                    temperature,
                    unit(mix(seed, step, (j * per_trace + k) as u64, 7)),
                );
                let r = reward::detector_reward(&head_detection(h, &d, calls), &truth, &sites, w);
                batch.push(HeadSample {
                    features: x.clone(),
                    action: d.type_index,
                    old_log_prob: d.type_log_probs[d.type_index],
                    reward: r,
                    group: u64::MAX / 2 + j as u64,
                });
            }
        }
        let cfg = head::HeadPpo {
            lr: self.config.head.ppo_lr,
            epochs: self.config.ppo.epochs,
            clip: self.config.ppo.clip,
            kl_coef: self.config.ppo.kl_coef,
        };
        let stats = head::update(&mut h.type_model, &reference.type_model, &batch, &cfg);
        tracing::debug!(?stats, "decision head update");
        let ho = &self.config.higher_order;
        let review = if ho.enabled {
            let failed = &mut self.state.head_failures;
            failed.extend(failures);
            let excess = failed.len().saturating_sub(ho.buffer);
            failed.drain(..excess);
            let anchor: Vec<(&[f32], usize)> = self
                .replay
                .iter()
                .filter_map(|(t, x)| {
                    let class = h.types.iter().position(|c| *c == t.truth.deficiency_id)?;
                    Some((x.as_slice(), class))
                })
                .collect();
            let cfg = head::Review {
                lr: ho.lr,
                epochs: ho.epochs,
                l2: self.config.head.l2,
                weighting: ho.weighting,
                optimizer: ho.optimizer,
            };
            let r = head::review(&mut h.type_model, failed, &anchor, &cfg);
            tracing::info!(
                failures = r.failures,
                named_before = r.failures_top1_before,
                named_after = r.failures_top1_after,
                train_top1_after = r.anchor_top1_after,
                "higher-order review of the head's failures"
            );
            Some(r)
        } else {
            None
        };
        let every = self.config.head.recalibrate_every;
        let none_shift = if every > 0 && step % every == 0 && self.config.head.none_target > 0.0 {
            Some(self.recalibrate(step)?)
        } else {
            None
        };
        Ok(Some(HeadUpdate {
            ppo: stats,
            review,
            none_shift,
        }))
    }
}

/// A live trace's investigations (detection, conversation, transcript) and, with the decision
/// head, each choice's (features, class, log-probability).
type Investigations = (
    Vec<(Detection, Conversation, detect::Transcript)>,
    Vec<(Vec<f32>, usize, f32)>,
);

/// The head's higher-order example for a live trace (§5.5): its features and true class when
/// the greedy answer is wrong (the investigation's choices are sampled), or with `keep_named`
/// whatever it answered; none when the head has no class for the truth. Also whether the
/// greedy answer named the truth.
fn review_example(
    h: &DecisionHead,
    features: &[f32],
    truth: &reward::Truth,
    agent: &str,
    keep_named: bool,
) -> (Option<head::Failure>, bool) {
    let answered = h.type_model.predict(features);
    let class = h.types.iter().position(|t| *t == truth.deficiency);
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

/// A uniform number in [0, 1) from a mixed 64-bit value.
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// What a head decision answers, as the reward sees it.
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

fn head_detection(h: &DecisionHead, d: &policy::decision::Decision, calls: usize) -> Detection {
    let ty = h.types[d.type_index].clone();
    let component = if ty == policy::decision::NONE {
        policy::decision::NO_COMPONENT.to_owned()
    } else {
        h.components[d.component_index].clone()
    };
    Detection {
        deficiency: Some(ty),
        component: Some(component),
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
fn read_eval(run: &Path, step: u64) -> Result<Option<Accuracy>> {
    let path = run.join("eval.jsonl");
    if !path.exists() {
        return Ok(None);
    }
    for m in metrics::read_jsonl::<EvalMetrics>(&path)? {
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

fn collective_err(e: collective::CollectiveError) -> RlError {
    RlError::Environment(e.to_string())
}
