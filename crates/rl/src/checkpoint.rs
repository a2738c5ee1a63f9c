//! Checkpoints: `RUN/step-N/` holds everything a run needs to continue exactly where it was —
//! each adapter in PEFT's format with its value head, each optimizer's moments, the trainer's
//! state (step, seed, the injection history and the higher-order buffer), the configuration
//! and the metrics so far. A checkpoint is written under `RUN/.step-N.partial` and renamed, so
//! a killed run leaves either a whole checkpoint or none.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use model::{AdamW, AdamWState, Model, Tensor};
use serde::{Deserialize, Serialize};

use crate::higher_order::FailedInvestigation;
use crate::{Result, RlError};

/// What the trainer carries from step to step besides weights.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// The last completed step (0: after the warm start, before any PPO step).
    pub step: u64,
    pub seed: u64,
    /// The randomness of step s is derived from (seed, s); this is that derivation's version,
    /// so a checkpoint from an incompatible trainer is refused instead of silently diverging.
    pub rng_scheme: String,
    /// Recent injections: (type, detected), newest last, for the Injector's prompt.
    pub history: Vec<(String, bool)>,
    pub failed: Vec<FailedInvestigation>,
    /// The whole-choice Detector's higher-order examples: live traces it named wrongly.
    #[serde(default)]
    pub head_failures: Vec<crate::head::Failure>,
    /// The (agent, task) pairs whose clean runs the Detector has investigated as healthy
    /// traces (each once per run).
    #[serde(default)]
    pub healthy_seen: std::collections::BTreeSet<(String, String)>,
    /// Live episodes planted so far per template (`agent/type/variant`), which `[injector]
    /// focus = "coverage"` divides a template's weight by.
    #[serde(default)]
    pub planted: std::collections::BTreeMap<String, usize>,
    /// The (template, task) pairs planted so far (`agent/type/variant/task`): a template is
    /// planted on a task it has not run on while it has one.
    #[serde(default)]
    pub planted_tasks: std::collections::BTreeSet<String>,
    /// Whether the warm start ran.
    pub warm_started: bool,
}

/// The current scheme of [`TrainerState::rng_scheme`].
/// v2: each draw's purpose is named (`trainer::Draw`); under v1 the focus draw of episode `i`
/// and the replay's `j`-th sample shared numbers whenever the indices met.
pub const RNG_SCHEME: &str = "splitmix64(seed, step, index, draw) v2";

fn checkpoint_err(path: &Path, reason: impl Into<String>) -> RlError {
    RlError::Checkpoint {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// The directory of step `step`.
pub fn step_dir(run: &Path, step: u64) -> PathBuf {
    run.join(format!("step-{step}"))
}

/// A decision head saved with an adapter: (adapter, head, its warm-started reference).
pub type Heads<'a> = Option<(
    &'a str,
    &'a policy::decision::DecisionHead,
    &'a policy::decision::DecisionHead,
)>;

/// A blame head saved with an adapter: (adapter, head, its warm-started reference).
pub type BlameHeads<'a> = Option<(
    &'a str,
    &'a policy::blame_head::BlameHead,
    &'a policy::blame_head::BlameHead,
)>;

/// The file a blame head's warm-started reference is kept in, beside
/// [`policy::blame_head::FILE`].
pub const BLAME_REFERENCE_FILE: &str = "blame-reference.json";

/// Writes a checkpoint of `adapters` (name and optimizer), the decision and blame heads if there
/// are any, and `state` into `RUN/step-N/`.
pub fn save(
    run: &Path,
    model: &Model,
    adapters: &[(&str, &AdamW)],
    heads: Heads<'_>,
    blame: BlameHeads<'_>,
    state: &TrainerState,
    config_text: &str,
) -> Result<PathBuf> {
    let dest = step_dir(run, state.step);
    let tmp = run.join(format!(".step-{}.partial", state.step));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| RlError::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| RlError::io(&tmp, e))?;
    for (name, optimizer) in adapters {
        model.save_adapter(name, &tmp.join(name))?;
        let st = optimizer.state();
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for (i, (m, v)) in st.m.iter().zip(&st.v).enumerate() {
            tensors.insert(format!("m.{i}"), m.clone());
            tensors.insert(format!("v.{i}"), v.clone());
        }
        tensors.insert(
            "step".into(),
            Tensor::new(&[st.step as i64], &candle_core::Device::Cpu)?,
        );
        let path = tmp.join(format!("optimizer-{name}.safetensors"));
        candle_core::safetensors::save(&tensors, &path)?;
    }
    if let Some((adapter, head, reference)) = heads {
        let dir = tmp.join(adapter);
        std::fs::create_dir_all(&dir).map_err(|e| RlError::io(&dir, e))?;
        head.save(&dir.join(policy::decision::HEAD_FILE))?;
        reference.save(&dir.join(policy::decision::REFERENCE_HEAD_FILE))?;
    }
    if let Some((adapter, head, reference)) = blame {
        let dir = tmp.join(adapter);
        std::fs::create_dir_all(&dir).map_err(|e| RlError::io(&dir, e))?;
        let path = dir.join(policy::blame_head::FILE);
        head.save(&path).map_err(|e| RlError::io(&path, e))?;
        let path = dir.join(BLAME_REFERENCE_FILE);
        reference.save(&path).map_err(|e| RlError::io(&path, e))?;
    }
    // Compact: with the decision head the state holds every reviewed live trace's features.
    let json = serde_json::to_string(state).expect("state serialises");
    let write = |file: &str, bytes: &[u8]| {
        let p = tmp.join(file);
        std::fs::write(&p, bytes).map_err(|e| RlError::io(&p, e))
    };
    write("state.json", json.as_bytes())?;
    write("config.toml", config_text.as_bytes())?;
    for file in crate::run_log::RUN_LOGS {
        let src = run.join(file);
        if src.exists() {
            let dst = tmp.join(file);
            std::fs::copy(&src, &dst).map_err(|e| RlError::io(&dst, e))?;
        }
    }
    if dest.exists() {
        std::fs::remove_dir_all(&dest).map_err(|e| RlError::io(&dest, e))?;
    }
    std::fs::rename(&tmp, &dest).map_err(|e| RlError::io(&dest, e))?;
    Ok(dest)
}

/// The blame head and its reference saved with `adapter` in checkpoint `dir`, if any.
pub fn load_blame(
    dir: &Path,
    adapter: &str,
) -> Result<Option<(policy::blame_head::BlameHead, policy::blame_head::BlameHead)>> {
    let sub = dir.join(adapter);
    let head = sub.join(policy::blame_head::FILE);
    if !head.is_file() {
        return Ok(None);
    }
    let load = |path: &Path| {
        policy::blame_head::BlameHead::load(path).map_err(|e| RlError::Checkpoint {
            path: path.to_owned(),
            reason: e.to_string(),
        })
    };
    Ok(Some((load(&head)?, load(&sub.join(BLAME_REFERENCE_FILE))?)))
}

/// The newest complete checkpoint of a run.
pub fn latest(run: &Path) -> Result<Option<(u64, PathBuf)>> {
    if !run.exists() {
        return Ok(None);
    }
    let mut best: Option<(u64, PathBuf)> = None;
    for entry in std::fs::read_dir(run).map_err(|e| RlError::io(run, e))? {
        let entry = entry.map_err(|e| RlError::io(run, e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(n) = name
            .strip_prefix("step-")
            .and_then(|n| n.parse::<u64>().ok())
        {
            if entry.path().join("state.json").is_file() && best.as_ref().is_none_or(|b| n > b.0) {
                best = Some((n, entry.path()));
            }
        }
    }
    Ok(best)
}

/// Reads a checkpoint's trainer state.
pub fn read_state(dir: &Path) -> Result<TrainerState> {
    let p = dir.join("state.json");
    let text = std::fs::read_to_string(&p).map_err(|e| RlError::io(&p, e))?;
    let state: TrainerState =
        serde_json::from_str(&text).map_err(|e| checkpoint_err(&p, e.to_string()))?;
    if state.rng_scheme != RNG_SCHEME {
        return Err(checkpoint_err(
            &p,
            format!(
                "written with randomness scheme `{}`, this trainer uses `{RNG_SCHEME}`",
                state.rng_scheme
            ),
        ));
    }
    Ok(state)
}

/// Replaces adapter `name` of `model` with the checkpoint's copy.
pub fn load_adapter(model: &mut Model, dir: &Path, name: &str) -> Result<()> {
    if model.adapter(name).is_some() {
        model.remove_adapter(name)?;
    }
    model.load_adapter(name, &dir.join(name))?;
    if model.adapter(name).and_then(|a| a.value_head()).is_none() {
        model.add_value_head(name)?;
    }
    Ok(())
}

/// Restores an optimizer's moments from the checkpoint.
pub fn load_optimizer(dir: &Path, name: &str, optimizer: &mut AdamW) -> Result<()> {
    let path = dir.join(format!("optimizer-{name}.safetensors"));
    let mut tensors = candle_core::safetensors::load(&path, &candle_core::Device::Cpu)
        .map_err(|e| checkpoint_err(&path, e.to_string()))?;
    let step = tensors
        .remove("step")
        .ok_or_else(|| checkpoint_err(&path, "no `step` tensor"))?
        .to_vec1::<i64>()?
        .first()
        .copied()
        .ok_or_else(|| checkpoint_err(&path, "empty `step` tensor"))?;
    let n = tensors.len() / 2;
    let mut m = Vec::with_capacity(n);
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let take = |tensors: &mut HashMap<String, Tensor>, key: String| {
            tensors
                .remove(&key)
                .ok_or_else(|| checkpoint_err(&path, format!("missing tensor `{key}`")))
        };
        m.push(take(&mut tensors, format!("m.{i}"))?);
        v.push(take(&mut tensors, format!("v.{i}"))?);
    }
    let device = optimizer.state().m.first().map(|t| t.device().clone());
    let (m, v) = match device {
        Some(d) => (
            m.iter()
                .map(|t| t.to_device(&d))
                .collect::<candle_core::Result<Vec<_>>>()?,
            v.iter()
                .map(|t| t.to_device(&d))
                .collect::<candle_core::Result<Vec<_>>>()?,
        ),
        None => (m, v),
    };
    optimizer
        .restore(AdamWState {
            step: step as u64,
            m,
            v,
        })
        .map_err(|e| checkpoint_err(&path, e.to_string()))
}
