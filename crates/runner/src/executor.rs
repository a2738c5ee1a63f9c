//! The runner's blocking face for callers that are not async — corpus generation and the
//! trainer's live episodes: one backend and one LLM endpoint for the whole run, episodes
//! started from any number of threads at once, the backend's choice said once, and an
//! interruption (ctrl-C, SIGTERM) that stops every episode and removes its sandbox before the
//! process ends.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agents::Workspace;

use crate::backend::{Backend, BackendChoice, BackendError, ImageInputs};
use crate::cancel::Cancel;
use crate::endpoint::{EndpointError, LlmChoice, LlmEndpoint};
use crate::episode::run_episode;
use crate::local::Namespaces;
use crate::spec::{EpisodeError, EpisodeOutcome, EpisodeSpec};

#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error(
        "the local backend found no namespaces on this machine (bubblewrap and unshare both \
         fail), and injected agents never run as a plain process: install bubblewrap, or use \
         --backend docker with a Docker engine"
    )]
    Unsandboxed,
}

type Notice = Arc<dyn Fn(&str) + Send + Sync>;

/// How episodes are isolated; `Default` is what a user runs without flags.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutorOptions {
    pub backend: BackendChoice,
    /// The base image recipe (Docker).
    pub recipe: PathBuf,
    /// Where the apt configuration naming the Debian archive lives (Docker image builds).
    pub apt_root: PathBuf,
    /// Episodes running at once.
    pub jobs: usize,
    /// End the process on ctrl-C or SIGTERM once every sandbox is removed (the executor's
    /// interruption watcher); for command-line runs, not for libraries' tests.
    pub exit_on_interrupt: bool,
}

impl Default for ExecutorOptions {
    fn default() -> ExecutorOptions {
        ExecutorOptions {
            backend: BackendChoice::Auto,
            recipe: PathBuf::from("infra/base-image.toml"),
            apt_root: PathBuf::from("/etc/apt"),
            jobs: default_jobs(),
            exit_on_interrupt: false,
        }
    }
}

/// One episode per core.
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs episodes on one backend against one endpoint. Dropping it waits for pending sandbox
/// removals and sweeps anything of its batch that is left.
pub struct Executor {
    backend: Arc<Backend>,
    endpoint: LlmEndpoint,
    cancel: Cancel,
    in_flight: Arc<AtomicUsize>,
    /// Set by the interruption watcher (see [`Executor::exit_on_interrupt`]); held while the
    /// process is being ended, so that the watcher and `drop` end it once.
    interrupted: Arc<std::sync::Mutex<bool>>,
    /// Where the interruption's lines go; `None` when interruptions are left to the process's
    /// default handling.
    exit_notice: Option<Notice>,
    jobs: usize,
    // Last, so that the endpoint's forwarder and the backend are dropped while it still runs.
    runtime: tokio::runtime::Runtime,
}

impl Executor {
    /// Selects the backend (building the Docker image if it must), starts the endpoint and
    /// says the choice once through `notice`. The local backend without any namespace is
    /// refused: the code it would run was changed on purpose.
    pub fn start(
        workspace: &Workspace,
        llm: &LlmChoice,
        options: &ExecutorOptions,
        notice: &(dyn Fn(&str) + Sync),
    ) -> Result<Executor, ExecutorError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("pf-runner")
            .enable_all()
            .build()
            .map_err(ExecutorError::Runtime)?;
        let inputs = ImageInputs {
            recipe: &options.recipe,
            apt_root: &options.apt_root,
        };
        let (backend, endpoint) = runtime.block_on(async {
            let backend = Backend::select(options.backend, &inputs, notice).await?;
            if let Backend::Local(l) = &backend {
                if *l.namespaces() == Namespaces::None {
                    return Err(ExecutorError::Unsandboxed);
                }
            }
            let endpoint = LlmEndpoint::start(workspace, llm).await?;
            Ok::<_, ExecutorError>((backend, endpoint))
        })?;
        // The local backend's choice and its reason were said by `select`.
        if matches!(backend, Backend::Docker(_)) {
            notice(&format!("episodes run in a {}", backend.isolation()));
        }
        let executor = Executor {
            backend: Arc::new(backend),
            endpoint,
            cancel: Cancel::new(),
            in_flight: Arc::default(),
            interrupted: Arc::default(),
            exit_notice: options
                .exit_on_interrupt
                .then(|| Arc::new(|line: &str| eprintln!("{line}")) as Notice),
            jobs: options.jobs.max(1),
            runtime,
        };
        executor.exit_on_interrupt(Duration::from_secs(30));
        Ok(executor)
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The host socket episodes reach the model through.
    pub fn llm_socket(&self) -> &Path {
        self.endpoint.socket()
    }

    /// Episodes the caller should run at once.
    pub fn jobs(&self) -> usize {
        self.jobs
    }

    /// Runs one episode to its outcome (blocking; callable from several threads at once).
    pub fn run(&self, spec: &EpisodeSpec) -> Result<EpisodeOutcome, EpisodeError> {
        if self.cancel.is_cancelled() {
            return Err(EpisodeError::Cancelled {
                id: spec.id().to_owned(),
            });
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let result = self
            .runtime
            .block_on(run_episode(&self.backend, spec, &self.cancel));
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }

    /// With an exit notice, on the first ctrl-C or SIGTERM: cancel every running episode,
    /// wait (at most `grace`) until each has removed its sandbox, sweep, say so, and end the
    /// process with status 130. What an episode finished before is on disk already (the
    /// callers write their records atomically), so a rerun resumes. If the caller drops the
    /// executor first (its episodes returned cancelled), the drop ends the process the same
    /// way, so that nothing reports the interruption as a normal end.
    fn exit_on_interrupt(&self, grace: Duration) {
        let Some(notice) = self.exit_notice.clone() else {
            return;
        };
        let cancel = self.cancel.clone();
        let backend = self.backend.clone();
        let in_flight = self.in_flight.clone();
        let interrupted = self.interrupted.clone();
        self.runtime.spawn(async move {
            crate::cancel::interruption().await;
            notice("interrupted: stopping every episode and removing its sandbox");
            *interrupted.lock().unwrap_or_else(|p| p.into_inner()) = true;
            cancel.cancel();
            let deadline = tokio::time::Instant::now() + grace;
            while in_flight.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let swept = backend.sweep().await;
            end_interrupted(&interrupted, swept, &*notice);
        });
    }
}

/// Says that the interruption is complete and ends the process (once: the second caller
/// blocks on the lock until the first has ended it).
fn end_interrupted(interrupted: &std::sync::Mutex<bool>, swept: usize, notice: &dyn Fn(&str)) {
    let _ending = interrupted.lock().unwrap_or_else(|p| p.into_inner());
    notice(&format!(
        "interrupted: every sandbox removed{}; run the same command again to resume",
        if swept > 0 {
            format!(" ({swept} by the final sweep)")
        } else {
            String::new()
        }
    ));
    std::process::exit(130);
}

impl Drop for Executor {
    fn drop(&mut self) {
        let backend = self.backend.clone();
        let swept = self.runtime.block_on(async move { backend.sweep().await });
        let interrupted = *self.interrupted.lock().unwrap_or_else(|p| p.into_inner());
        if let (true, Some(notice)) = (interrupted, &self.exit_notice) {
            end_interrupted(&self.interrupted, swept, &**notice);
        }
        if swept > 0 {
            tracing::warn!("removed {swept} sandboxes that episodes left behind");
        }
    }
}
