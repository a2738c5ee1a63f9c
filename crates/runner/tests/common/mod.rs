//! Shared helpers of the runner's end-to-end tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agents::run::RunSpec;
use agents::tasks::{AnswerType, GaiaTask};
use agents::{Task, Workspace};
use runner::{Backend, EpisodeSpec, ImageInputs, Limits, LlmChoice, LlmEndpoint};

/// Held by every test of one binary that starts containers or the local sandbox. The local
/// sandbox binds the host's root read-only, mounts included; a container that starts or stops
/// meanwhile adds or removes an overlay mount under /var/lib/docker, and bwrap's remount of it
/// then fails ("Can't bind mount /oldroot/ …: Invalid argument"), as CI once saw.
pub static MOUNTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile")
}

/// Whether this machine has an engine that should answer: a socket at the default place or
/// DOCKER_HOST. Where it has one, Docker tests must run and fail loudly, never skip.
pub fn engine_expected() -> bool {
    std::env::var_os("DOCKER_HOST").is_some() || Path::new("/var/run/docker.sock").exists()
}

/// The Docker backend, or `None` (with a message) on a machine without an engine.
pub async fn docker_backend() -> Option<Backend> {
    if let Err(e) = runner::docker::connect().await {
        if engine_expected() {
            panic!("a Docker engine socket exists but the engine does not answer: {e}");
        }
        eprintln!(
            "SKIPPED: no Docker engine on this machine ({e}); the Docker backend is untested here"
        );
        return None;
    }
    let root = repo_root();
    let recipe = root.join("infra/base-image.toml");
    let inputs = ImageInputs {
        recipe: &recipe,
        apt_root: Path::new("/etc/apt"),
    };
    Some(
        Backend::docker(&inputs, &|m| eprintln!("{m}"))
            .await
            .expect("the Docker backend starts (the base image builds)"),
    )
}

/// An empty agents workspace (the hostile fixtures never call the LLM) with a scripted
/// endpoint, so that episodes have a socket to mount.
pub struct Scratch {
    pub dir: tempfile::TempDir,
    pub endpoint: LlmEndpoint,
}

impl Scratch {
    pub async fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("CONTRACT.md"), "").unwrap();
        std::fs::create_dir_all(dir.path().join("tasks/corpus")).unwrap();
        std::fs::create_dir_all(dir.path().join("tasks/scripts")).unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let endpoint = LlmEndpoint::start(&ws, &LlmChoice::Scripted).await.unwrap();
        Scratch { dir, endpoint }
    }

    /// An episode of the hostile fixture `package`.
    pub fn spec(&self, package: &str, limits: Limits) -> EpisodeSpec {
        let task = Task::Gaia(GaiaTask {
            id: "fixture-001".into(),
            question: "misbehave".into(),
            answer: "contained".into(),
            answer_type: AnswerType::Exact,
            tools: vec![],
        });
        let run = RunSpec {
            model: "pathfinder-scripted".into(),
            ..RunSpec::new(
                package,
                package,
                task,
                1,
                fixtures(),
                self.dir.path().join("runs").join(package),
                self.dir.path().join("tasks/corpus"),
            )
        };
        EpisodeSpec::new(
            format!("fixture-{package}"),
            run,
            self.endpoint.socket().to_owned(),
            limits,
        )
    }
}

pub fn tight_limits() -> Limits {
    Limits {
        memory_bytes: 256 << 20,
        cpus: 1.0,
        pids: 32,
        tmp_bytes: 16 << 20,
        timeout: Duration::from_secs(4),
        test_timeout: Duration::from_secs(30),
    }
}

pub fn arc(b: Backend) -> Arc<Backend> {
    Arc::new(b)
}
