//! `rl`: the self-play trainer (paper §5).
//!
//! One training step, in [`trainer`]: the Injector proposes a batch of injections
//! ([`policy::choose_injection`] over the engine's valid options); [`environment`] applies and
//! validates them and runs the agents (through `corpus`'s episode runner) while the Detector
//! investigates the traces already produced; [`reward`] scores both roles; [`ppo::update`]
//! updates each role's adapter. Failed investigations become [`higher_order`] examples mixed
//! into later batches. [`checkpoint`] writes everything a run needs to continue exactly;
//! [`run_log`] appends one JSON line per step and per held-out evaluation.
//!
//! Invariants: the base model is never trained (only adapter variables reach the optimizer);
//! a checkpoint directory is complete or absent (written under a temporary name, then
//! renamed); all randomness of a step derives from (run seed, step), so a resumed run repeats
//! an uninterrupted one; a truth is `traces::Truth` and an answer `detect::Verdict`, as
//! everywhere; depends on `model`, `collective`, `policy`, `detect`, `traces`, `corpus`,
//! `runner`, `eval`, `linear`, `inject`, `agents` and `taxonomy`.

pub mod blame;
pub mod checkpoint;
pub mod config;
pub mod environment;
pub mod evaluate;
pub mod head;
pub mod higher_order;
pub mod ppo;
pub mod report;
pub mod reward;
pub mod run_log;
pub mod testing;
pub mod trainer;

use std::path::{Path, PathBuf};

pub use config::RunConfig;
pub use trainer::{TrainOutcome, Trainer};

#[derive(Debug, thiserror::Error)]
pub enum RlError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("model: {0}")]
    Model(String),
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    #[error("sample: {0}")]
    Sample(String),
    #[error("environment: {0}")]
    Environment(String),
    #[error("checkpoint {path}: {reason}")]
    Checkpoint { path: PathBuf, reason: String },
}

impl RlError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> RlError {
        RlError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

impl From<model::ModelError> for RlError {
    fn from(e: model::ModelError) -> Self {
        RlError::Model(e.to_string())
    }
}

impl From<candle_core::Error> for RlError {
    fn from(e: candle_core::Error) -> Self {
        RlError::Model(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, RlError>;
