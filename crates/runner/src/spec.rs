//! What an episode is and what it leaves: its spec and limits, the paths and job a backend
//! runs, what the sandbox contained, the timing and the recorded outcome. Data only, so that the
//! backends and the episode driver (`episode`) both read it without importing each other.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agents::process::ProcessEnd;
use agents::run::{self, AgentCommand, CommandInputs, RunLayout, RunOutcome, RunSpec};
use serde::{Deserialize, Serialize};

/// What a job past its time limit gets between SIGTERM and SIGKILL: time to end its open
/// spans and write its trace, as an OpenTelemetry SDK flushes at shutdown. A hang (a deadlock,
/// a lost subscription) is then seen in the trace it leaves, not as a missing file.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

/// Resource limits of one episode's sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub memory_bytes: u64,
    /// CPU share in cores (the Docker backend enforces it; the local one does not).
    pub cpus: f64,
    /// Processes and threads, together.
    pub pids: u32,
    /// Size of the private `/tmp`.
    pub tmp_bytes: u64,
    /// Wall-clock limit of the agent process, after which the sandbox is killed.
    #[serde(with = "millis")]
    pub timeout: Duration,
    /// Wall-clock limit of a SWE task's test command.
    #[serde(with = "millis")]
    pub test_timeout: Duration,
}

mod millis {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<std::time::Duration, D::Error> {
        let ms = <u64 as serde::Deserialize>::deserialize(d)?;
        Ok(std::time::Duration::from_millis(ms))
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            memory_bytes: 1 << 30,
            cpus: 1.0,
            pids: 128,
            tmp_bytes: 64 << 20,
            timeout: Duration::from_secs(120),
            test_timeout: Duration::from_secs(120),
        }
    }
}

/// Everything one episode needs, in host paths: the run itself, as the agents crate prepares
/// and judges it, and what the sandbox adds (a name, the socket that is its only way out, its
/// limits). The sandbox decides part of the run, so the parts are only put together by
/// [`EpisodeSpec::new`].
#[derive(Debug, Clone)]
pub struct EpisodeSpec {
    id: String,
    run: RunSpec,
    llm_socket: PathBuf,
    limits: Limits,
}

impl EpisodeSpec {
    /// Episode `id` of `run` in a sandbox under `limits` whose only way out is `llm_socket`.
    /// The sandbox sets the run's endpoint (the socket's `unix:` URL), its time limits
    /// (`limits`'), its interpreter (`python3` inside the image) and no bytecode cache
    /// (sandboxes share no writable state; the image's standard library has its own,
    /// read-only); the rest of `run` (repository, task, seed, model, installed packages) is the
    /// caller's.
    pub fn new(
        id: impl Into<String>,
        run: RunSpec,
        llm_socket: PathBuf,
        limits: Limits,
    ) -> EpisodeSpec {
        let run = RunSpec {
            llm_url: format!("unix:{}", llm_socket.display()),
            timeout: limits.timeout,
            test_timeout: limits.test_timeout,
            python: "python3".into(),
            pycache_dir: None,
            ..run
        };
        EpisodeSpec {
            id: id.into(),
            run,
            llm_socket,
            limits,
        }
    }

    /// Unique within a batch; names the sandbox (container label) and the progress line.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The run, in host paths (for preparing and judging it, and for the command a backend
    /// maps into its sandbox).
    pub fn run(&self) -> &RunSpec {
        &self.run
    }

    /// The host Unix socket of the LLM endpoint.
    pub fn llm_socket(&self) -> &Path {
        &self.llm_socket
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn audit_log(&self) -> PathBuf {
        self.run.out_dir.join("audit.jsonl")
    }
}

/// The paths of an episode as the sandboxed process sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPaths {
    pub repo: PathBuf,
    pub out_dir: PathBuf,
    pub corpus: PathBuf,
    pub llm_socket: PathBuf,
    /// The directory holding the audit hook's `sitecustomize.py`.
    pub audit_dir: PathBuf,
    /// Where the agent's third-party packages are, if it has any.
    pub python_site: Option<PathBuf>,
}

impl SandboxPaths {
    pub fn layout(&self) -> RunLayout {
        RunLayout::new(&self.out_dir)
    }
}

/// A command to run inside an episode's sandbox.
#[derive(Debug, Clone)]
pub struct Job {
    /// `agent` or `tests` (labels and messages).
    pub role: &'static str,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Working directory, in sandbox paths.
    pub cwd: PathBuf,
    pub timeout: Duration,
    /// Host files that receive the output (may be the same file).
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

/// How a sandboxed command ended and what the sandbox saw.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRun {
    pub end: ProcessEnd,
    /// The command's own run time (process start to exit, as the sandbox measured it).
    pub duration: Duration,
    pub oom_killed: bool,
    /// Process creations refused at the pids limit; `None` where the backend cannot tell.
    pub pids_limit_hits: Option<u64>,
    /// The run was stopped because the batch was cancelled.
    pub cancelled: bool,
}

/// What the sandbox had to stop, as reported to the user and in `outcome.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Containment {
    pub timed_out: bool,
    pub oom_killed: bool,
    /// A process ended on a `MemoryError` (the local sandbox's address-space limit refused an
    /// allocation; from the audit hook).
    #[serde(default)]
    pub out_of_memory: bool,
    pub pids_limit_hits: Option<u64>,
    /// Blocked attempts to reach anything but the LLM socket (from the audit hook).
    pub network_attempts: Vec<String>,
    /// Writes, removals and renames outside the episode's directory and `/tmp`, e.g. `write to
    /// /etc/x` (from the audit hook); the read-only root refuses them on Docker and bubblewrap.
    #[serde(default)]
    pub filesystem_attempts: Vec<String>,
}

impl Containment {
    /// Whether the sandbox had to stop anything.
    pub fn contained_something(&self) -> bool {
        self.timed_out
            || self.oom_killed
            || self.out_of_memory
            || self.pids_limit_hits.unwrap_or(0) > 0
            || !self.network_attempts.is_empty()
            || !self.filesystem_attempts.is_empty()
    }

    /// Whether `clause` is [`Containment::describe`]'s timeout clause, which names the limit in
    /// seconds: a reader that must not depend on the limit (the corpus digest) leaves it out.
    pub fn is_timeout_clause(clause: &str) -> bool {
        clause.starts_with("ran past its ") && clause.ends_with(" s timeout and was killed")
    }

    /// One clause per contained behaviour.
    pub fn describe(&self, limits: &Limits) -> Vec<String> {
        let mut out = Vec::new();
        if self.timed_out {
            out.push(format!(
                "ran past its {} s timeout and was killed",
                limits.timeout.as_secs_f64()
            ));
        }
        if self.oom_killed {
            out.push(format!(
                "was killed at its memory limit ({} MiB)",
                limits.memory_bytes >> 20
            ));
        }
        if self.out_of_memory {
            out.push(format!(
                "ran out of memory at its limit ({} MiB)",
                limits.memory_bytes >> 20
            ));
        }
        if let Some(n) = self.pids_limit_hits.filter(|n| *n > 0) {
            out.push(format!(
                "{n} process creations refused at the pids limit ({})",
                limits.pids
            ));
        }
        for attempt in &self.network_attempts {
            out.push(format!("blocked network access ({attempt})"));
        }
        for attempt in &self.filesystem_attempts {
            out.push(format!("tried to write outside its episode ({attempt})"));
        }
        out
    }
}

/// Wall-clock accounting of an episode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// From the start of the episode until its trace was collected.
    pub until_collected_ms: f64,
    /// The agent process's own run time.
    pub agent_ms: f64,
    /// `until_collected_ms - agent_ms`: what the sandbox costs per episode.
    pub overhead_ms: f64,
    /// The whole episode including a SWE task's tests and writing the outcome.
    pub total_ms: f64,
}

/// An episode's result, also written to `OUT/outcome.json` (and read back by [`Self::read`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeOutcome {
    pub id: String,
    pub backend: String,
    /// What isolation applied (e.g. the image, or the local sandbox's mechanisms).
    pub isolation: String,
    #[serde(flatten)]
    pub run: RunOutcome,
    pub containment: Containment,
    pub limits: Limits,
    pub timing: Timing,
}

impl EpisodeOutcome {
    /// Reads back the `outcome.json` [`run_episode`] wrote.
    pub fn read(path: &Path) -> Result<EpisodeOutcome, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// One line for the terminal.
    pub fn summary(&self) -> String {
        let verdict = if self.run.success {
            "success"
        } else {
            "failure"
        };
        let mut line = format!(
            "{}: {verdict} ({}), {} spans, trace {}",
            self.id,
            self.run.judgement.reason,
            self.run.collected.spans,
            self.run.trace.display()
        );
        let contained = self.containment.describe(&self.limits);
        if !contained.is_empty() {
            line.push_str(&format!("; contained: {}", contained.join("; ")));
        }
        line
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EpisodeError {
    #[error("episode {id}: {source}")]
    Prepare {
        id: String,
        #[source]
        source: run::RunError,
    },
    #[error("episode {id}: the sandbox failed: {reason}")]
    Sandbox { id: String, reason: String },
    #[error("episode {id}: cancelled")]
    Cancelled { id: String },
    #[error("episode {id}: {path}: {reason}")]
    Output {
        id: String,
        path: PathBuf,
        reason: String,
    },
}

/// Variables every sandboxed process gets besides the contract's.
pub fn sandbox_env(paths: &SandboxPaths, home: &Path) -> Vec<(String, String)> {
    let s = |p: &Path| p.to_string_lossy().into_owned();
    vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), s(home)),
        ("TMPDIR".into(), "/tmp".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("PYTHONPATH".into(), python_path(paths)),
        (
            "PATHFINDER_AUDIT_LOG".into(),
            s(&paths.out_dir.join("audit.jsonl")),
        ),
        ("PATHFINDER_AUDIT_ALLOW_UNIX".into(), s(&paths.llm_socket)),
        (
            "PATHFINDER_AUDIT_WRITABLE".into(),
            format!("{}:/tmp", s(&paths.out_dir)),
        ),
        (
            "PATHFINDER_AUDIT_READ_ONLY".into(),
            format!("{}:{}", s(&paths.repo), s(&paths.corpus)),
        ),
    ]
}

/// The audit hook first (its `sitecustomize` must load before anything else), then the
/// agent's third-party packages.
fn python_path(paths: &SandboxPaths) -> String {
    let mut parts = vec![paths.audit_dir.to_string_lossy().into_owned()];
    if let Some(site) = &paths.python_site {
        parts.push(site.to_string_lossy().into_owned());
    }
    parts.join(":")
}

/// The agent's invocation inside the sandbox.
pub fn agent_command(spec: &EpisodeSpec, paths: &SandboxPaths) -> AgentCommand {
    let layout = paths.layout();
    AgentCommand::build(&CommandInputs {
        python: "python3",
        package: &spec.run().package,
        agent: &spec.run().agent,
        task_id: spec.run().task.id(),
        repo_dir: &paths.repo,
        task_file: &layout.task_file,
        workdir: &layout.workdir,
        trace: &layout.trace,
        seed: spec.run().seed,
        llm_url: &format!("unix:{}", paths.llm_socket.display()),
        model: &spec.run().model,
        corpus: &paths.corpus,
        pycache: None,
    })
}
