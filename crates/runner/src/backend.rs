//! Choosing and driving a backend: Docker when an engine answers, the local sandbox otherwise.

use std::path::Path;

use crate::cancel::Cancel;
use crate::docker::{self, DockerBackend};
use crate::image::{self, ImageError, ImageSource};
use crate::local::LocalBackend;
use crate::recipe::{ImageRecipe, RecipeError};
use crate::spec::{EpisodeSpec, Job, JobRun, SandboxPaths};

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("--backend docker: {0}")]
    NoEngine(#[from] docker::EngineError),
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("cannot set up the local sandbox: {0}")]
    Local(std::io::Error),
}

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// Docker if an engine answers, else local (with a notice).
    Auto,
    Docker,
    Local,
}

impl BackendChoice {
    /// `auto`, `docker` or `local` (configuration files and flags).
    pub fn parse(text: &str) -> Result<BackendChoice, String> {
        match text {
            "auto" => Ok(BackendChoice::Auto),
            "docker" => Ok(BackendChoice::Docker),
            "local" => Ok(BackendChoice::Local),
            other => Err(format!("backend {other:?}: expected auto, docker or local")),
        }
    }
}

/// Where the image recipe and the apt configuration are.
#[derive(Debug, Clone)]
pub struct ImageInputs<'a> {
    pub recipe: &'a Path,
    pub apt_root: &'a Path,
}

pub enum Backend {
    Docker(DockerBackend),
    Local(LocalBackend),
}

impl Backend {
    /// Selects a backend; `notice` receives one-line messages (the automatic fallback, an
    /// image build).
    pub async fn select(
        choice: BackendChoice,
        inputs: &ImageInputs<'_>,
        notice: &(dyn Fn(&str) + Sync),
    ) -> Result<Backend, BackendError> {
        let local = || -> Result<Backend, BackendError> {
            Ok(Backend::Local(
                LocalBackend::detect().map_err(BackendError::Local)?,
            ))
        };
        match choice {
            BackendChoice::Local => {
                let b = local()?;
                notice(&b.isolation());
                Ok(b)
            }
            BackendChoice::Docker => Backend::docker(inputs, notice).await,
            BackendChoice::Auto => match docker::connect().await {
                Ok(d) => Backend::docker_with(d, inputs, notice).await,
                Err(e) => {
                    let b = local()?;
                    notice(&format!("{e}; falling back to the {}", b.isolation()));
                    Ok(b)
                }
            },
        }
    }

    /// The Docker backend, building the base image if needed.
    pub async fn docker(
        inputs: &ImageInputs<'_>,
        notice: &(dyn Fn(&str) + Sync),
    ) -> Result<Backend, BackendError> {
        let d = docker::connect().await?;
        Backend::docker_with(d, inputs, notice).await
    }

    async fn docker_with(
        d: bollard::Docker,
        inputs: &ImageInputs<'_>,
        notice: &(dyn Fn(&str) + Sync),
    ) -> Result<Backend, BackendError> {
        let recipe = ImageRecipe::load(inputs.recipe)?;
        let (image, source) = image::ensure_image(&d, &recipe, inputs.apt_root, notice).await?;
        if let ImageSource::Built { seconds, .. } = source {
            notice(&format!("built {image} in {seconds:.0} s"));
        }
        Ok(Backend::Docker(DockerBackend::new(d, image).await))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::Docker(_) => "docker",
            Backend::Local(_) => "local",
        }
    }

    pub fn isolation(&self) -> String {
        match self {
            Backend::Docker(d) => d.isolation(),
            Backend::Local(l) => l.isolation(),
        }
    }

    pub fn sandbox_paths(&self, spec: &EpisodeSpec) -> SandboxPaths {
        match self {
            Backend::Docker(d) => d.sandbox_paths(spec),
            Backend::Local(l) => l.sandbox_paths(spec),
        }
    }

    pub async fn run_job(
        &self,
        spec: &EpisodeSpec,
        job: &Job,
        cancel: &Cancel,
    ) -> Result<JobRun, String> {
        match self {
            Backend::Docker(d) => d.run_job(spec, job, cancel).await,
            Backend::Local(l) => l.run_job(spec, job, cancel).await,
        }
    }

    /// Waits for pending container removals, then removes anything of this backend's still
    /// present (Docker: containers with its batch label); returns how many it had to remove.
    /// Call it before dropping a backend that ran episodes outside [`crate::run_batch`].
    pub async fn sweep(&self) -> usize {
        match self {
            Backend::Docker(d) => match d.sweep().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!("cannot sweep containers of batch {}: {e}", d.batch_id());
                    0
                }
            },
            Backend::Local(_) => 0,
        }
    }
}
