//! `pathfinder eval --leave-out FRAMEWORK|all`: the Detector on a framework it never trained
//! on. For each framework left out, every detector that learns is fitted on the other
//! frameworks' train split alone and scored on every trace of the one left out, and on the
//! other frameworks' held-out traces (the in-distribution figure of the same fit) beside it.
//!
//! A trace's framework is the agent its label says produced it (the corpus records it); a
//! store whose labels name none cannot be split this way. Detectors: `keyword` and `expert`
//! (nothing to fit; run once per trace), `classifier` (the linear reader of the probe
//! digests), `nearest` (the train traces with the most similar digests vote) and
//! `warm-start:CONFIG` (the decision head of a run configuration's warm start,
//! fitted as `pathfinder train` fits it, on the frozen model's features of each trace, read
//! once and cached).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ::eval::bootstrap::{self, Bootstrap, Estimate};
use ::eval::metrics::{self, Case};
use ::eval::store_eval::{self, Labelled};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use policy::decision::DecisionHead;
use policy::frame::Frame;
use policy::{PolicyModel, SharedModel};
use serde::Serialize;

use super::EvalArgs;

/// A detector of the comparison.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Builtin(String),
    /// A reader of the probe digests fitted on each fold's train traces.
    Reference(Reference),
    WarmStart(PathBuf),
}

/// The non-LM references: what they read is the same (the probe battery of every trace, read
/// once), what they fit on a fold's train traces differs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reference {
    /// The linear reader of the digests' terms; with `terms_in` ≥ 2, of the terms the train
    /// traces of at least that many frameworks print (`classifier:frameworks=K`).
    Classifier { terms_in: usize },
    /// The k train traces with the most similar digests vote (`nearest`, `nearest:k=K`).
    Nearest { k: usize },
}

impl Reference {
    /// Fitted on `train` (whose batteries are `b`), a policy per investigation.
    fn fit(
        self,
        train: &[Labelled],
        b: &[Vec<detect::probes::ProbeResult>],
    ) -> Result<Box<dyn Fn() -> Box<dyn detect::Policy> + Sync>> {
        Ok(match self {
            Reference::Classifier { terms_in } => {
                let keep = rl::head::term_filter(train, b, terms_in);
                let c = Arc::new(::eval::classifier::Classifier::fit_on_terms(
                    train,
                    b,
                    None,
                    keep.as_ref(),
                    |_| {},
                )?);
                Box::new(move || c.policy())
            }
            Reference::Nearest { k } => {
                let n = Arc::new(::eval::nearest::Nearest::fit(train, b, k)?);
                Box::new(move || n.policy())
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            Reference::Classifier { .. } => "classifier",
            Reference::Nearest { .. } => "nearest",
        }
    }
}

impl Kind {
    fn parse(name: &str) -> Result<Kind> {
        if let Some(file) = name.strip_prefix("warm-start:") {
            if file.is_empty() {
                bail!(
                    "detector `warm-start:` needs a run configuration, e.g. warm-start:rl/cpu.toml"
                );
            }
            return Ok(Kind::WarmStart(PathBuf::from(file)));
        }
        if let Some(k) = name.strip_prefix("classifier:frameworks=") {
            let terms_in = k.parse().ok().filter(|k| *k >= 1).with_context(|| {
                format!("detector `{name}`: expected classifier:frameworks=K with K a count of frameworks (1 or more)")
            })?;
            return Ok(Kind::Reference(Reference::Classifier { terms_in }));
        }
        if let Some(k) = name.strip_prefix("nearest:k=") {
            let k = k.parse().ok().filter(|k| *k >= 1).with_context(|| {
                format!("detector `{name}`: expected nearest:k=K with K a count of neighbours (1 or more)")
            })?;
            return Ok(Kind::Reference(Reference::Nearest { k }));
        }
        match name {
            "classifier" => Ok(Kind::Reference(Reference::Classifier { terms_in: 1 })),
            "nearest" => Ok(Kind::Reference(Reference::Nearest {
                k: ::eval::nearest::DEFAULT_K,
            })),
            n if store_eval::DETECTORS.contains(&n) => Ok(Kind::Builtin(n.into())),
            n => bail!(
                "detector `{n}` cannot be scored with --leave-out: expected {}, classifier, classifier:frameworks=K, nearest, nearest:k=K or warm-start:CONFIG (a fixed checkpoint was fitted on every framework, so nothing of it is left out)",
                store_eval::DETECTORS.join(", ")
            ),
        }
    }
}

/// One detector on one left-out framework.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub framework: String,
    pub detector: String,
    /// Deficient and healthy traces of the left-out framework.
    pub deficient: usize,
    pub healthy: usize,
    /// The type named, over its deficient traces.
    pub detection: Option<Estimate>,
    /// The category of the type named, over its deficient traces.
    pub category: Option<Estimate>,
    pub localisation: Option<Estimate>,
    pub code_localisation: Option<Estimate>,
    /// Its healthy traces called deficient.
    pub false_positive_rate: Option<Estimate>,
    /// The same fit on the other frameworks' held-out traces.
    pub in_distribution: Option<Estimate>,
    pub in_distribution_false_positive_rate: Option<Estimate>,
    /// Train traces the fit read (0 for detectors that fit nothing).
    pub train: usize,
    /// How unlike the train traces the left-out framework's traces read (warm start only):
    /// the share of its healthy and of its deficient traces whose standardised distance to the
    /// train features is beyond the 99th percentile of the train traces' own.
    pub unfamiliar: Option<Unfamiliar>,
    /// What a framed head read the left-out framework's traces relative to (`[head] frame =
    /// "framework"`): the median of which of its traces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame: Option<String>,
}

/// Shares of traces beyond the train traces' 99th percentile of distance.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Unfamiliar {
    pub healthy: f64,
    pub deficient: f64,
    /// The same share over the other frameworks' held-out traces.
    pub in_distribution: f64,
}

/// The report: a row per framework and detector, and each detector's mean over frameworks.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub store: String,
    pub train_split: String,
    /// The share of the train split the fits read (`--train-fraction`, draw `train_sample`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_fraction: Option<f64>,
    pub train_sample: u64,
    pub rows: Vec<Row>,
    pub means: Vec<Mean>,
    /// Each detector after the first against the first, on the same left-out traces.
    pub paired: Vec<Paired>,
}

/// A detector against another on the same traces of the frameworks left out (each scored by
/// the fit without its framework), pooled over them: per-trace differences, `detector −
/// against`, with bootstrap intervals over the traces.
#[derive(Debug, Clone, Serialize)]
pub struct Paired {
    pub detector: String,
    pub against: String,
    #[serde(flatten)]
    pub difference: metrics::PairedDifference,
    /// Category named (1) or not (0), `detector − against`, over the deficient traces.
    pub category_difference: Option<Estimate>,
}

/// A detector's mean over the frameworks left out (each framework weighs the same).
#[derive(Debug, Clone, Serialize)]
pub struct Mean {
    pub detector: String,
    pub frameworks: usize,
    pub detection: f64,
    pub category: f64,
    pub false_positive_rate: Option<f64>,
    pub in_distribution: Option<f64>,
    /// The largest drop from in distribution to left out, and its framework.
    pub worst_drop: Option<(String, f64)>,
}

/// The report as Markdown and JSON.
pub fn run(db: &Path, args: &EvalArgs, bootstrap: Bootstrap) -> Result<(String, String)> {
    let which = args
        .leave_out
        .as_deref()
        .expect("run only with --leave-out");
    if args.labels.is_some() || args.split.is_some() || args.holdout_agent.is_some() {
        bail!("--leave-out scores a store's own labels over all its traces: drop --labels, --split and --holdout-agent");
    }
    let Some(train_path) = &args.train_split else {
        bail!("--leave-out needs --train-split FILE (the corpus's splits/train.jsonl): detectors are fitted on its traces of the other frameworks");
    };
    let catalog = taxonomy::Catalog::embedded().context("loading the deficiency catalog")?;
    let all = store_eval::labelled_traces(db, None)?;
    let train_ids: HashSet<String> = store_eval::read_split(train_path)?.into_iter().collect();
    let frameworks: BTreeSet<String> = all.iter().filter_map(|t| t.agent.clone()).collect();
    if frameworks.len() < 2 {
        bail!(
            "{}: its labels name {} framework(s) ({}); leaving one out needs two or more",
            db.display(),
            frameworks.len(),
            frameworks.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    let left_out: Vec<String> = if which == "all" {
        frameworks.iter().cloned().collect()
    } else if frameworks.contains(which) {
        vec![which.to_owned()]
    } else {
        bail!(
            "--leave-out {which}: no labelled trace of {} comes from it; frameworks: {}, or all",
            db.display(),
            frameworks.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    };
    let detectors: Vec<(String, Kind)> = args
        .detector
        .as_deref()
        .unwrap_or("keyword,expert,classifier")
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| Kind::parse(d).map(|k| (d.to_owned(), k)))
        .collect::<Result<_>>()?;
    // What each fold scores: every trace of the framework left out, and the others' traces
    // outside the train split.
    let scored: Vec<Labelled> = all
        .iter()
        .filter(|t| t.agent.is_some() && !train_ids.contains(&t.trace_id))
        .cloned()
        .chain(
            all.iter()
                .filter(|t| {
                    train_ids.contains(&t.trace_id)
                        && t.agent
                            .as_deref()
                            .is_some_and(|a| left_out.iter().any(|f| f == a))
                })
                .cloned(),
        )
        .collect();
    let mut train_all: Vec<Labelled> = all
        .iter()
        .filter(|t| t.agent.is_some() && train_ids.contains(&t.trace_id))
        .cloned()
        .collect();
    // A learning curve's point: fewer train traces, the same scored ones (`scored` is fixed
    // above from the whole split, so a trace left out of the fit is not scored instead).
    if let Some(fraction) = args.train_fraction {
        train_all = train_share(train_all, fraction, args.train_sample)
            .with_context(|| format!("--train-fraction {fraction}"))?;
    }
    if train_all.is_empty() {
        bail!(
            "{}: none of its traces is in the train split {}",
            db.display(),
            train_path.display()
        );
    }

    let calibrate_with: Vec<usize> = match &args.calibrate_with {
        Some(list) => list
            .split(',')
            .map(|n| {
                n.trim()
                    .parse::<usize>()
                    .with_context(|| format!("--calibrate-with {list}: `{n}` is not a count"))
            })
            .collect::<Result<_>>()?,
        None => Vec::new(),
    };
    let trained_on: BTreeSet<&str> = train_all
        .iter()
        .filter_map(|t| t.agent.as_deref())
        .collect();
    let mut rows = Vec::new();
    // Each detector's cases of the frameworks it left out, for the paired comparisons.
    let mut left_out_cases: Vec<Vec<Case>> = Vec::new();
    for (name, kind) in &detectors {
        left_out_cases.push(Vec::new());
        let mut fitted = Fitted::new(kind, db, &train_all, &scored, &args.feature_cache)?;
        if let Some(path) = &args.head_inputs {
            let read = (&train_all[..], &scored[..], &train_ids);
            match &fitted {
                Fitted::WarmStart {
                    batteries,
                    features,
                    ..
                } => write_head_inputs(path, read, batteries, Some(features))?,
                Fitted::Reference { batteries, .. } => {
                    write_head_inputs(path, read, batteries, None)?
                }
                Fitted::Builtin { .. } => {}
            }
        }
        for framework in &left_out {
            let train: Vec<Labelled> = train_all
                .iter()
                .filter(|t| t.agent.as_deref() != Some(framework))
                .cloned()
                .collect();
            // Its every trace, and the held-out traces of the other frameworks the fit read
            // (a framework with no train trace is left out of every fold, never inside one).
            let fold: Vec<Labelled> = scored
                .iter()
                .filter(|t| match t.agent.as_deref() {
                    Some(a) if a == framework => true,
                    Some(a) => trained_on.contains(a) && !train_ids.contains(&t.trace_id),
                    None => false,
                })
                .cloned()
                .collect();
            let cases = fitted.cases(db, &train, &fold, framework)?;
            let unfamiliar = fitted.unfamiliar(&train, &fold, framework);
            let (held, inside): (Vec<Case>, Vec<Case>) = cases
                .into_iter()
                .partition(|c| c.agent.as_deref() == Some(framework));
            let summary = metrics::summarise(&held, &catalog, &bootstrap);
            let within = metrics::summarise(&inside, &catalog, &bootstrap);
            if let Some(mine) = left_out_cases.last_mut() {
                mine.extend(held.iter().cloned());
            }
            rows.push(Row {
                framework: framework.clone(),
                detector: name.clone(),
                deficient: held.iter().filter(|c| !metrics::healthy(c)).count(),
                healthy: summary.healthy,
                detection: summary.detection,
                category: category_detection(&held, &catalog, &bootstrap),
                localisation: summary.localisation,
                code_localisation: summary.code_localisation,
                false_positive_rate: summary.false_positive_rate,
                in_distribution: within.detection,
                in_distribution_false_positive_rate: within.false_positive_rate,
                train: if matches!(kind, Kind::Builtin(_)) {
                    0
                } else {
                    train.len()
                },
                unfamiliar,
                frame: fitted.frame_used(),
            });
            // The same head calibrated on N of the framework's own healthy runs (drawn in a
            // fixed order), every N scored on the same traces: the framework's traces but
            // the largest N's calibration runs.
            let most = calibrate_with.iter().copied().max().unwrap_or(0);
            if most == 0 || !matches!(kind, Kind::WarmStart(_)) {
                continue;
            }
            let mut healthy: Vec<&Labelled> = fold
                .iter()
                .filter(|t| {
                    t.agent.as_deref() == Some(framework.as_str()) && t.truth.id() == taxonomy::NONE
                })
                .collect();
            healthy.sort_by_key(|t| fnv(&t.trace_id));
            if healthy.len() <= most {
                tracing::warn!(
                    framework = framework.as_str(),
                    healthy = healthy.len(),
                    "too few healthy runs to calibrate on {most} and score the rest; no calibrated rows"
                );
                continue;
            }
            let held_back: HashSet<&str> = healthy[..most]
                .iter()
                .map(|t| t.trace_id.as_str())
                .collect();
            let rest: Vec<Labelled> = fold
                .iter()
                .filter(|t| {
                    t.agent.as_deref() == Some(framework.as_str())
                        && !held_back.contains(t.trace_id.as_str())
                })
                .cloned()
                .collect();
            // N = 0 is the head as fitted; each N > 0 twice: the threshold alone, and the
            // threshold over inputs recentred on the N runs (what `calibrate` does by default).
            let settings = std::iter::once((0, false)).chain(
                calibrate_with
                    .iter()
                    .flat_map(|n| [(*n, false), (*n, true)]),
            );
            for (n, recentre) in settings {
                let Some(cases) =
                    fitted.calibrated_cases(db, &healthy[..n], recentre, &rest, framework)?
                else {
                    continue;
                };
                let summary = metrics::summarise(&cases, &catalog, &bootstrap);
                rows.push(Row {
                    framework: framework.clone(),
                    detector: if recentre {
                        format!("{name} recentred and calibrated on {n} healthy")
                    } else {
                        format!("{name} calibrated on {n} healthy")
                    },
                    deficient: cases.iter().filter(|c| !metrics::healthy(c)).count(),
                    healthy: summary.healthy,
                    detection: summary.detection,
                    category: category_detection(&cases, &catalog, &bootstrap),
                    localisation: summary.localisation,
                    code_localisation: summary.code_localisation,
                    false_positive_rate: summary.false_positive_rate,
                    in_distribution: None,
                    in_distribution_false_positive_rate: None,
                    train: train.len(),
                    unfamiliar: None,
                    frame: fitted.frame_used(),
                });
            }
        }
    }
    let means = means(&rows, &detectors);
    let paired = detectors
        .iter()
        .zip(&left_out_cases)
        .skip(1)
        .map(|((name, _), cases)| Paired {
            detector: name.clone(),
            against: detectors[0].0.clone(),
            difference: metrics::paired_difference(&left_out_cases[0], cases, &bootstrap),
            category_difference: paired_category(&left_out_cases[0], cases, &catalog, &bootstrap),
        })
        .collect();
    let report = Report {
        store: db.display().to_string(),
        train_split: train_path.display().to_string(),
        train_fraction: args.train_fraction,
        train_sample: args.train_sample,
        rows,
        means,
        paired,
    };
    Ok((markdown(&report), serde_json::to_string_pretty(&report)?))
}

/// A detector and what it keeps between folds: nothing to fit, the probe batteries, or the
/// model's features of every trace.
enum Fitted<'a> {
    Builtin {
        name: &'a str,
        /// Cases by trace: a detector that fits nothing answers each trace once.
        cases: HashMap<String, Case>,
    },
    Reference {
        reference: Reference,
        batteries: HashMap<String, Vec<detect::probes::ProbeResult>>,
    },
    WarmStart {
        /// The probe battery's digests of every trace (what the features were read from).
        batteries: HashMap<String, Vec<detect::probes::ProbeResult>>,
        config: Box<rl::RunConfig>,
        shared: SharedModel,
        reader: Arc<policy::decision::FeatureReader>,
        /// The model's features of every trace, before the terms (`[head] term_frameworks`
        /// decides the terms per fold, from the frameworks it trains on).
        model_features: HashMap<String, Vec<f32>>,
        /// The head's input of every trace for the fold fitted last.
        features: HashMap<String, Vec<f32>>,
        /// The head of the last fold fitted, for its calibrations.
        head: Option<Box<DecisionHead>>,
    },
}

impl<'a> Fitted<'a> {
    fn new(
        kind: &'a Kind,
        db: &Path,
        train: &[Labelled],
        scored: &[Labelled],
        cache: &Path,
    ) -> Result<Fitted<'a>> {
        let everything: Vec<Labelled> = train.iter().chain(scored).cloned().collect();
        match kind {
            Kind::Builtin(name) => {
                let bar = progress(scored.len(), name);
                let options = store_eval::RunOptions {
                    detector: name.clone(),
                    ablations: detect::Ablations::default(),
                    references: None,
                };
                let cases = store_eval::run_transcribed(db, scored, &options, |_, _| bar.inc(1))?;
                bar.finish_and_clear();
                Ok(Fitted::Builtin {
                    name,
                    cases: cases.into_iter().map(|c| (c.trace_id.clone(), c)).collect(),
                })
            }
            Kind::Reference(reference) => {
                let batteries = ::eval::classifier::battery(db, &everything)?;
                Ok(Fitted::Reference {
                    reference: *reference,
                    batteries: everything
                        .iter()
                        .map(|t| t.trace_id.clone())
                        .zip(batteries)
                        .collect(),
                })
            }
            Kind::WarmStart(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let config = rl::RunConfig::parse(&text, path)?;
                if config.detector.decision != rl::config::DecisionMode::Head {
                    bail!(
                        "{}: `[detector] decision` is not \"head\"; only a decision head's warm start is fitted here",
                        path.display()
                    );
                }
                let base = config.model_path()?;
                let dtype = if config.model.dtype == "bf16" {
                    model::DType::BF16
                } else {
                    model::DType::F32
                };
                let device = model::Device::cuda_if_available(0).context("choosing the device")?;
                let pm = PolicyModel::load(&base, dtype, &device)
                    .with_context(|| format!("loading the base model {}", base.display()))?;
                let shared: SharedModel = Arc::new(Mutex::new(pm));
                let catalog = taxonomy::Catalog::embedded()?;
                let system = policy::decision::system_prompt(&catalog);
                // The warm start reads the base model (an adapter whose B factors are zero
                // reads the same), through the feature cache it shares with training runs.
                let cache = cache.to_path_buf();
                let reader = {
                    let mut pm = shared.lock().unwrap_or_else(|p| p.into_inner());
                    let reader = policy::decision::FeatureReader::new(&mut pm, None, &system)?;
                    Arc::new(reader.with_cache(&pm, cache)?)
                };
                let batteries = ::eval::classifier::battery(db, &everything)?;
                let bar = progress(batteries.len(), "read");
                // The model's states alone (none when the head reads the terms alone): the
                // terms are read per fold, as the frameworks it trains on decide them.
                let states = policy::decision::HeadReads {
                    states: config.head.states,
                    ..Default::default()
                };
                let x = rl::head::features(&reader, &shared, &batteries, &states, |i| {
                    bar.set_position(i as u64)
                })?;
                bar.finish_and_clear();
                let ids = || everything.iter().map(|t| t.trace_id.clone());
                let batteries: HashMap<_, _> = ids().zip(batteries).collect();
                let model_features: HashMap<_, _> = ids().zip(x).collect();
                // Every term hashed; a fold whose head filters the terms or counts them by a
                // vocabulary of its train split reads them again.
                let reads = rl::head::base_reads(&config.head);
                let features = head_inputs(&model_features, &batteries, &reads);
                Ok(Fitted::WarmStart {
                    batteries,
                    config: Box::new(config),
                    shared,
                    reader,
                    model_features,
                    features,
                    head: None,
                })
            }
        }
    }

    /// The cases of `scored` by a detector fitted on `train`.
    fn cases(
        &mut self,
        db: &Path,
        train: &[Labelled],
        scored: &[Labelled],
        framework: &str,
    ) -> Result<Vec<Case>> {
        match self {
            Fitted::Builtin { name, cases } => scored
                .iter()
                .map(|t| {
                    cases
                        .get(&t.trace_id)
                        .cloned()
                        .with_context(|| format!("{name}: no case for trace {}", t.trace_id))
                })
                .collect(),
            Fitted::Reference {
                reference,
                batteries,
            } => {
                let b: Vec<_> = train
                    .iter()
                    .map(|t| batteries[&t.trace_id].clone())
                    .collect();
                let policy = reference.fit(train, &b)?;
                let bar = progress(
                    scored.len(),
                    &format!("{} without {framework}", reference.name()),
                );
                let cases = store_eval::run_policies_transcribed(
                    db,
                    scored,
                    detect::Config::default(),
                    |_| Ok(policy()),
                    |_, _| bar.inc(1),
                )?;
                bar.finish_and_clear();
                Ok(cases)
            }
            Fitted::WarmStart {
                config,
                shared,
                reader,
                batteries,
                model_features,
                features,
                head: last,
            } => {
                // The terms this fold's head may read, and its vocabulary, come from the
                // frameworks it trains on.
                let reads = if config.head.reads_train_terms() {
                    let b: Vec<_> = train
                        .iter()
                        .map(|t| batteries[&t.trace_id].clone())
                        .collect();
                    let reads = rl::head::reads(&config.head, train, &b);
                    *features = head_inputs(model_features, batteries, &reads);
                    reads
                } else {
                    rl::head::base_reads(&config.head)
                };
                let x: Vec<Vec<f32>> = train
                    .iter()
                    .map(|t| features[&t.trace_id].clone())
                    .collect();
                let head = fit_head(config, train, &x, reads)?;
                *last = Some(Box::new(head.clone()));
                if !head.is_framed() {
                    return head_cases(
                        db,
                        scored,
                        (shared, reader, head),
                        &format!("warm start without {framework}"),
                    );
                }
                // A framed head reads each framework through its frame: the train frameworks'
                // own, and for the one left out the median of all its traces (unlabelled: what
                // a user's store of their runs gives).
                let mut groups: BTreeMap<&str, Vec<Labelled>> = BTreeMap::new();
                for t in scored {
                    groups
                        .entry(t.agent.as_deref().unwrap_or_default())
                        .or_default()
                        .push(t.clone());
                }
                let mut cases = Vec::with_capacity(scored.len());
                for (name, traces) in groups {
                    let frame = if name == framework {
                        frame_of(
                            &format!("{framework}'s traces, unlabelled"),
                            &traces,
                            features,
                        )?
                    } else {
                        head.frames.get(name).cloned().with_context(|| {
                            format!("the framed head has no frame of {name}, whose held-out traces it scores")
                        })?
                    };
                    let mut head = head.clone();
                    head.set_frame(Some(frame))?;
                    cases.extend(head_cases(
                        db,
                        &traces,
                        (shared, reader, head),
                        &format!("warm start without {framework}, {name}"),
                    )?);
                }
                Ok(cases)
            }
        }
    }
}

impl Fitted<'_> {
    /// For a framed warm start: how the left-out framework's frame is taken.
    fn frame_used(&self) -> Option<String> {
        match self {
            Fitted::WarmStart {
                head: Some(head), ..
            } if head.is_framed() => Some(
                "the median of the left-out framework's traces (calibrated rows: of their N healthy runs)"
                    .into(),
            ),
            _ => None,
        }
    }

    /// The last fold's warm-started head calibrated on the healthy runs `healthy` (none: as
    /// fitted), its input `recentre`d on them or not, scored on `scored`. `None` for detectors
    /// without a head.
    fn calibrated_cases(
        &self,
        db: &Path,
        healthy: &[&Labelled],
        recentre: bool,
        scored: &[Labelled],
        framework: &str,
    ) -> Result<Option<Vec<Case>>> {
        let Fitted::WarmStart {
            shared,
            reader,
            features,
            head: Some(head),
            ..
        } = self
        else {
            return Ok(None);
        };
        let mut head = DecisionHead::clone(head);
        if head.is_framed() {
            // N = 0: the median of the scored traces (the framework's, unlabelled, but the
            // calibration runs); N > 0: the median of the N healthy runs, what a user's
            // calibration runs give.
            let frame = if healthy.is_empty() {
                frame_of(
                    &format!("{framework}'s traces, unlabelled"),
                    scored,
                    features,
                )?
            } else {
                let name = format!("{} healthy runs of {framework}", healthy.len());
                frame_of(&name, healthy.iter().copied(), features)?
            };
            head.set_frame(Some(frame))?;
        }
        if !healthy.is_empty() {
            let inputs: Vec<&[f32]> = healthy
                .iter()
                .map(|t| features[&t.trace_id].as_slice())
                .collect();
            let c = head.calibration_on(framework, &inputs, 0.05, recentre)?;
            head.set_calibration(Some(c))?;
        }
        head_cases(
            db,
            scored,
            (shared, reader, head),
            &format!("{framework}: calibrated on {} healthy runs", healthy.len()),
        )
        .map(Some)
    }

    /// [`Unfamiliar`] for a warm start's fold: distances in the train features' standardised
    /// coordinates, d(x) = √(mean_j ((x_j − μ_j)/σ_j)²), a diagonal Mahalanobis distance to
    /// the train traces.
    fn unfamiliar(
        &self,
        train: &[Labelled],
        fold: &[Labelled],
        framework: &str,
    ) -> Option<Unfamiliar> {
        let Fitted::WarmStart { features, .. } = self else {
            return None;
        };
        let x: Vec<&Vec<f32>> = train.iter().map(|t| &features[&t.trace_id]).collect();
        let dim = x.first()?.len();
        let n = x.len() as f64;
        let mut mean = vec![0f64; dim];
        for v in &x {
            for (m, a) in mean.iter_mut().zip(v.iter()) {
                *m += f64::from(*a) / n;
            }
        }
        let mut sd = vec![0f64; dim];
        for v in &x {
            for ((s, a), m) in sd.iter_mut().zip(v.iter()).zip(&mean) {
                *s += (f64::from(*a) - m).powi(2) / n;
            }
        }
        sd.iter_mut().for_each(|s| *s = s.sqrt().max(1e-3));
        let distance = |v: &Vec<f32>| {
            let sum: f64 = v
                .iter()
                .zip(&mean)
                .zip(&sd)
                .map(|((a, m), s)| ((f64::from(*a) - m) / s).powi(2))
                .sum();
            (sum / dim as f64).sqrt()
        };
        let mut own: Vec<f64> = x.iter().map(|v| distance(v)).collect();
        own.sort_by(f64::total_cmp);
        let edge = own[((own.len() as f64 * 0.99).ceil() as usize).clamp(1, own.len()) - 1];
        let share = |pick: &dyn Fn(&Labelled) -> bool| {
            let d: Vec<bool> = fold
                .iter()
                .filter(|t| pick(t))
                .map(|t| distance(&features[&t.trace_id]) > edge)
                .collect();
            d.iter().filter(|b| **b).count() as f64 / d.len().max(1) as f64
        };
        let mine = |t: &Labelled| t.agent.as_deref() == Some(framework);
        let healthy = |t: &Labelled| t.truth.id() == taxonomy::NONE;
        Some(Unfamiliar {
            healthy: share(&|t| mine(t) && healthy(t)),
            deficient: share(&|t| mine(t) && !healthy(t)),
            in_distribution: share(&|t| !mine(t)),
        })
    }
}

/// The frame over `traces`, whose head inputs are in `features`.
fn frame_of<'t>(
    name: &str,
    traces: impl IntoIterator<Item = &'t Labelled>,
    features: &HashMap<String, Vec<f32>>,
) -> Result<Frame> {
    let rows: Vec<&[f32]> = traces
        .into_iter()
        .map(|t| features[&t.trace_id].as_slice())
        .collect();
    Ok(Frame::median_of(name, &rows)?)
}

/// `--head-inputs`: each trace of `train` and `scored` once, its head input (a warm start's;
/// null for the classifier, which reads the lines) beside its label and the digest lines the
/// detector read, written whole to a temporary file and renamed into place.
fn write_head_inputs(
    path: &Path,
    (train, scored, train_ids): (&[Labelled], &[Labelled], &HashSet<String>),
    batteries: &HashMap<String, Vec<detect::probes::ProbeResult>>,
    features: Option<&HashMap<String, Vec<f32>>>,
) -> Result<()> {
    use std::io::Write;
    let mut seen = HashSet::new();
    let traces = train
        .iter()
        .chain(scored)
        .filter(|t| seen.insert(t.trace_id.as_str()));
    let tmp = path.with_extension("partial");
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for t in traces {
        let row = serde_json::json!({
            "trace_id": t.trace_id,
            "framework": t.agent,
            "deficiency_id": t.truth.id(),
            "train": train_ids.contains(&t.trace_id),
            "lines": detect::probes::battery_lines(&batteries[&t.trace_id]),
            "input": features.map(|f| &f[&t.trace_id]),
        });
        writeln!(out, "{row}").with_context(|| format!("writing {}", tmp.display()))?;
    }
    out.flush()
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(out);
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The cases of `scored` investigated by a decision head, as the trainer's held-out
/// evaluation investigates them, with a progress bar named `what`.
fn head_cases(
    db: &Path,
    scored: &[Labelled],
    (shared, reader, head): (
        &SharedModel,
        &Arc<policy::decision::FeatureReader>,
        DecisionHead,
    ),
    what: &str,
) -> Result<Vec<Case>> {
    let head = Arc::new(head);
    let bar = progress(scored.len(), what);
    let cases = store_eval::run_policies_transcribed(
        db,
        scored,
        rl::evaluate::learned_config(detect::probes::battery_turns()),
        |_| Ok(rl::head::evaluation_policy(shared, &head, reader)),
        |_, _| bar.inc(1),
    )?;
    bar.finish_and_clear();
    Ok(cases)
}

/// Every trace's head input: its model features and its battery's terms, as `reads` says.
fn head_inputs(
    model_features: &HashMap<String, Vec<f32>>,
    batteries: &HashMap<String, Vec<detect::probes::ProbeResult>>,
    reads: &policy::decision::HeadReads,
) -> HashMap<String, Vec<f32>> {
    model_features
        .iter()
        .map(|(id, x)| {
            let x = policy::decision::head_input(x.clone(), &batteries[id], reads);
            (id.clone(), x)
        })
        .collect()
}

/// The decision head of a warm start, as the trainer fits it: the type and component
/// softmaxes on the train traces' features, and `none`'s operating point set out of fold.
fn fit_head(
    config: &rl::RunConfig,
    train: &[Labelled],
    x: &[Vec<f32>],
    reads: policy::decision::HeadReads,
) -> Result<DecisionHead> {
    let h = &config.head;
    let options = linear::FitOptions {
        l2: h.l2 as f32,
        lr: h.lr as f32,
        max_epochs: h.max_epochs,
        patience: h.patience,
        log_every: 0,
        standardise: true,
        raw_tail: h.raw_terms(reads.term_width()),
    };
    let (frames, x) = rl::head::framed_fit(h.frame, train, x)?;
    let x = &x[..];
    let mut head = rl::head::fit(train, x, None, reads, &options, |_| {})?;
    if h.none_target > 0.0 {
        let read = rl::head::out_of_fold(train, x, h.folds, h.folds_by, &options)?;
        head.set_none_shift(rl::head::none_shift(&read, h.none_target).shift);
    }
    head.frames = frames;
    Ok(head)
}

/// The share of deficient cases whose answer names a type of the labelled type's category.
fn category_detection(
    cases: &[Case],
    catalog: &taxonomy::Catalog,
    b: &Bootstrap,
) -> Option<Estimate> {
    let hits: Vec<bool> = cases
        .iter()
        .filter(|c| !metrics::healthy(c))
        .map(|c| category_named(c, catalog))
        .collect();
    bootstrap::proportion(&hits, b)
}

/// Whether a case's answer names a type of its labelled type's category.
fn category_named(c: &Case, catalog: &taxonomy::Catalog) -> bool {
    let category = |id: &str| catalog.get(id).map(|d| d.category.to_string());
    let truth = category(c.truth.id());
    let named = c
        .predicted
        .as_ref()
        .and_then(|p| p.deficiency_id().and_then(category));
    truth.is_some() && truth == named
}

/// Category named (1) or not (0), `other − base`, over the deficient traces both scored.
fn paired_category(
    base: &[Case],
    other: &[Case],
    catalog: &taxonomy::Catalog,
    b: &Bootstrap,
) -> Option<Estimate> {
    let by_id: BTreeMap<&str, &Case> = base.iter().map(|c| (c.trace_id.as_str(), c)).collect();
    let one = |c: &Case| f64::from(u8::from(category_named(c, catalog)));
    let differences: Vec<f64> = other
        .iter()
        .filter_map(|o| Some((*by_id.get(o.trace_id.as_str())?, o)))
        .filter(|(b, _)| !metrics::healthy(b))
        .map(|(b, o)| one(o) - one(b))
        .collect();
    bootstrap::mean(&differences, b)
}

fn means(rows: &[Row], detectors: &[(String, Kind)]) -> Vec<Mean> {
    let mut out = Vec::new();
    for (name, _) in detectors {
        let mine: Vec<&Row> = rows.iter().filter(|r| &r.detector == name).collect();
        let avg = |f: &dyn Fn(&Row) -> Option<f64>| -> Option<f64> {
            let v: Vec<f64> = mine.iter().filter_map(|r| f(r)).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let worst_drop = mine
            .iter()
            .filter_map(|r| {
                Some((
                    r.framework.clone(),
                    r.in_distribution.as_ref()?.value - r.detection.as_ref()?.value,
                ))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1));
        out.push(Mean {
            detector: name.clone(),
            frameworks: mine.len(),
            detection: avg(&|r| r.detection.as_ref().map(|e| e.value)).unwrap_or(0.0),
            category: avg(&|r| r.category.as_ref().map(|e| e.value)).unwrap_or(0.0),
            false_positive_rate: avg(&|r| r.false_positive_rate.as_ref().map(|e| e.value)),
            in_distribution: avg(&|r| r.in_distribution.as_ref().map(|e| e.value)),
            worst_drop,
        });
    }
    out
}

fn pct(e: &Option<Estimate>) -> String {
    match e {
        Some(e) => format!(
            "{:.1}% [{:.1}, {:.1}]",
            100.0 * e.value,
            100.0 * e.lo,
            100.0 * e.hi
        ),
        None => "–".into(),
    }
}

fn markdown(r: &Report) -> String {
    let share = match r.train_fraction {
        Some(f) => format!(" ({:.1}% of it, draw {})", 100.0 * f, r.train_sample),
        None => String::new(),
    };
    let mut s = format!(
        "# Leave one framework out\n\nStore `{}`; detectors that learn were fitted on `{}`{share} without the framework left out.\n\n",
        r.store, r.train_split
    );
    s.push_str("| left out | detector | deficient / healthy | type | category | component | code | false positives | in distribution (type) | train | unfamiliar (healthy / deficient / in distribution) |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for row in &r.rows {
        s.push_str(&format!(
            "| {} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            row.framework,
            row.detector,
            row.deficient,
            row.healthy,
            pct(&row.detection),
            pct(&row.category),
            pct(&row.localisation),
            pct(&row.code_localisation),
            pct(&row.false_positive_rate),
            pct(&row.in_distribution),
            row.train,
            row.unfamiliar.map_or("–".into(), |u| format!(
                "{:.0}% / {:.0}% / {:.0}%",
                100.0 * u.healthy,
                100.0 * u.deficient,
                100.0 * u.in_distribution
            )),
        ));
    }
    // The framed detectors by the names of their uncalibrated rows (those the means are of).
    let framed: Vec<&str> = r
        .means
        .iter()
        .map(|m| m.detector.as_str())
        .filter(|d| {
            r.rows
                .iter()
                .any(|row| row.detector == *d && row.frame.is_some())
        })
        .collect();
    if let Some(how) = r.rows.iter().find_map(|row| row.frame.as_deref()) {
        s.push_str(&format!(
            "\nFramed heads ({}) read each train framework relative to its train traces' median input and the left-out framework relative to {how}.\n",
            framed.join(", ")
        ));
    }
    s.push_str("\n| detector | frameworks | mean type | mean category | mean false positives | mean in distribution | largest drop |\n|---|---|---|---|---|---|---|\n");
    for m in &r.means {
        s.push_str(&format!(
            "| {} | {} | {:.1}% | {:.1}% | {} | {} | {} |\n",
            m.detector,
            m.frameworks,
            100.0 * m.detection,
            100.0 * m.category,
            m.false_positive_rate
                .map_or("–".into(), |v| format!("{:.1}%", 100.0 * v)),
            m.in_distribution
                .map_or("–".into(), |v| format!("{:.1}%", 100.0 * v)),
            m.worst_drop.as_ref().map_or("–".into(), |(f, d)| format!(
                "{:.1} points ({f})",
                100.0 * d
            )),
        ));
    }
    if !r.paired.is_empty() {
        s.push_str("\nPaired on the same left-out traces, pooled over the frameworks (differences in points, 95% bootstrap intervals):\n\n| detector | against | type named | deficient traces won / lost | category named | false positives |\n|---|---|---|---|---|---|\n");
        let points = |e: &Option<Estimate>| {
            e.as_ref().map_or("–".into(), |e| {
                format!(
                    "{:+.1} [{:+.1}, {:+.1}] (n = {})",
                    100.0 * e.value,
                    100.0 * e.lo,
                    100.0 * e.hi,
                    e.n
                )
            })
        };
        for p in &r.paired {
            s.push_str(&format!(
                "| {} | {} | {} | {} / {} | {} | {} |\n",
                p.detector,
                p.against,
                points(&p.difference.type_difference),
                p.difference.won,
                p.difference.lost,
                points(&p.category_difference),
                points(&p.difference.false_positive_difference)
            ));
        }
    }
    s
}

fn progress(len: usize, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template(&format!("{what} {{bar:30}} {{pos}}/{{len}}"))
            .expect("valid template"),
    );
    bar
}

/// The `fraction` of `train` (rounded up) whose ids rank first by a hash of (`sample`, id):
/// the same traces on every machine, and each share inside every larger one of its sample.
/// The traces keep their order in the split (a fit's folds follow it), so the whole split is
/// the same fit as no share at all.
fn train_share(train: Vec<Labelled>, fraction: f64, sample: u64) -> Result<Vec<Labelled>> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        bail!("a share of the train split is above 0 and at most 1");
    }
    let keep = ((train.len() as f64 * fraction).ceil() as usize).min(train.len());
    let mut ranked: Vec<(u64, &str)> = train
        .iter()
        .map(|t| {
            (
                fnv(&format!("{sample}:{}", t.trace_id)),
                t.trace_id.as_str(),
            )
        })
        .collect();
    ranked.sort_unstable();
    let kept: HashSet<String> = ranked[..keep]
        .iter()
        .map(|(_, id)| id.to_string())
        .collect();
    Ok(train
        .into_iter()
        .filter(|t| kept.contains(&t.trace_id))
        .collect())
}

/// FNV-1a of a trace id: an order for drawing calibration runs that no import order decides.
fn fnv(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traces(n: usize) -> Vec<Labelled> {
        (0..n)
            .map(|i| Labelled {
                trace_id: format!("trace-{i:03}"),
                truth: metrics::Truth::deficiency("P1"),
                agent: Some("toolcaller".into()),
            })
            .collect()
    }

    fn ids(t: &[Labelled]) -> Vec<String> {
        t.iter().map(|t| t.trace_id.clone()).collect()
    }

    #[test]
    fn a_train_share_is_inside_every_larger_one_and_keeps_the_split_order() {
        let all = traces(40);
        let quarter = ids(&train_share(all.clone(), 0.25, 0).unwrap());
        let half = ids(&train_share(all.clone(), 0.5, 0).unwrap());
        assert_eq!((quarter.len(), half.len()), (10, 20));
        assert!(
            quarter.iter().all(|id| half.contains(id)),
            "{quarter:?} {half:?}"
        );
        let mut sorted = half.clone();
        sorted.sort();
        assert_eq!(half, sorted, "the split's order, not the draw's");
        assert_eq!(ids(&train_share(all.clone(), 1.0, 7).unwrap()), ids(&all));
        // Another draw, another subset; the same draw, the same subset.
        assert_ne!(quarter, ids(&train_share(all.clone(), 0.25, 1).unwrap()));
        assert_eq!(quarter, ids(&train_share(all.clone(), 0.25, 0).unwrap()));
        for bad in [0.0, -0.5, 1.5, f64::NAN] {
            assert!(train_share(all.clone(), bad, 0).is_err(), "{bad}");
        }
    }
}
