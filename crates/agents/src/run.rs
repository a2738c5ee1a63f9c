//! Running one agent on one task: the run protocol of `agents/CONTRACT.md`.
//!
//! The pieces are separate so that other runners reuse them: [`AgentCommand::build`] only
//! builds the command line and environment (the container runner builds it with in-container
//! paths), [`prepare`] lays out the run directory, [`execute`] spawns with a wall-clock limit,
//! [`collect`] reads `result.json` and checks `trace.jsonl`, and [`judge`] decides success.
//! [`run`] ties them together for a local run.
//!
//! Layout of a run directory `OUT/`:
//!
//! ```text
//! OUT/task.json        the task as the agent sees it (GAIA tasks without their answer)
//! OUT/work/            --workdir: result.json; SWE tasks get the task repository in work/repo/
//! OUT/trace.jsonl      --trace
//! OUT/agent.stdout     the agent's output streams
//! OUT/agent.stderr
//! OUT/tests.log        the SWE test command's output
//! OUT/outcome.json     the RunOutcome
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::judge::{self, Judgement};
use crate::process::{self, Finished, ProcessEnd};
use crate::tasks::Task;

/// The default model name requested from the endpoint.
pub const DEFAULT_MODEL: &str = llmserve::SCRIPTED_MODEL;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start {program:?}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a run outcome")]
    Outcome {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |source| RunError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Everything one run needs.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The agent's name (the script key's first part).
    pub agent: String,
    /// Its Python package (`python3 -m PACKAGE`).
    pub package: String,
    pub task: Task,
    pub seed: u64,
    /// The agent's repository: the working directory of the agent process.
    pub repo_dir: PathBuf,
    /// The run directory (see the module documentation).
    pub out_dir: PathBuf,
    /// `PATHFINDER_LLM_URL`: `http://HOST:PORT` or `unix:/path`.
    pub llm_url: String,
    pub model: String,
    pub corpus_dir: PathBuf,
    /// The Python interpreter (`python3`).
    pub python: String,
    /// Wall-clock limit of the agent process.
    pub timeout: Duration,
    /// Wall-clock limit of a SWE task's test command.
    pub test_timeout: Duration,
    /// The agent's bytecode cache, outside its repository (shared by the runs of a suite).
    pub pycache_dir: Option<PathBuf>,
    /// The installed third-party packages of an agent built on a framework
    /// ([`crate::vendor`]), put on `PYTHONPATH`.
    pub python_site: Option<PathBuf>,
}

/// The files of a run directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunLayout {
    pub task_file: PathBuf,
    pub workdir: PathBuf,
    pub trace: PathBuf,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    pub tests_log: PathBuf,
    pub outcome: PathBuf,
}

impl RunLayout {
    pub fn new(out_dir: &Path) -> RunLayout {
        RunLayout {
            task_file: out_dir.join("task.json"),
            workdir: out_dir.join("work"),
            trace: out_dir.join("trace.jsonl"),
            stdout: out_dir.join("agent.stdout"),
            stderr: out_dir.join("agent.stderr"),
            tests_log: out_dir.join("tests.log"),
            outcome: out_dir.join("outcome.json"),
        }
    }

    /// Where `result.json` is written by the agent.
    pub fn result_file(&self) -> PathBuf {
        self.workdir.join("result.json")
    }

    /// The SWE task repository inside the work directory.
    pub fn task_repo(&self) -> PathBuf {
        self.workdir.join("repo")
    }
}

/// The paths and values of one agent invocation, as the agent process will see them.
#[derive(Debug, Clone)]
pub struct CommandInputs<'a> {
    pub python: &'a str,
    pub package: &'a str,
    pub agent: &'a str,
    pub task_id: &'a str,
    pub repo_dir: &'a Path,
    pub task_file: &'a Path,
    pub workdir: &'a Path,
    pub trace: &'a Path,
    pub seed: u64,
    pub llm_url: &'a str,
    pub model: &'a str,
    pub corpus: &'a Path,
    /// Where Python keeps its bytecode cache (`PYTHONPYCACHEPREFIX`), outside the repository;
    /// without one, no bytecode is written.
    pub pycache: Option<&'a Path>,
}

/// A fully built agent invocation: program, arguments, environment and working directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentCommand {
    pub program: String,
    pub args: Vec<String>,
    /// The complete environment (the child inherits nothing else but `PATH`, `HOME`, locale
    /// and `TMPDIR`, see [`AgentCommand::to_command`]).
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
}

/// A tag unique to one agent run in this process's lifetime, sent in the script key
/// (`NAME/TASK@TAG`) so that the scripted server counts a step's provider faults per run: the
/// clean and the injected run of a task each meet the same transient failures. It reaches no
/// trace.
fn run_tag() -> String {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{:x}-{n}", std::process::id())
}

/// Variables passed through from the runner's environment when set.
const PASSED_THROUGH: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR"];

impl AgentCommand {
    /// `cd REPO && python3 -m NAME --task T --workdir W --trace TR --seed S` with the
    /// contract's environment.
    pub fn build(inputs: &CommandInputs<'_>) -> AgentCommand {
        let path = |p: &Path| p.to_string_lossy().into_owned();
        AgentCommand {
            program: inputs.python.to_owned(),
            args: vec![
                "-m".into(),
                inputs.package.into(),
                "--task".into(),
                path(inputs.task_file),
                "--workdir".into(),
                path(inputs.workdir),
                "--trace".into(),
                path(inputs.trace),
                "--seed".into(),
                inputs.seed.to_string(),
            ],
            env: vec![
                ("PATHFINDER_LLM_URL".into(), inputs.llm_url.into()),
                ("PATHFINDER_MODEL".into(), inputs.model.into()),
                ("PATHFINDER_CORPUS".into(), path(inputs.corpus)),
                (
                    "PATHFINDER_SCRIPT".into(),
                    format!("{}/{}@{}", inputs.agent, inputs.task_id, run_tag()),
                ),
                // Reproducibility: fixed hash order.
                ("PYTHONHASHSEED".into(), "0".into()),
                // Never write bytecode into the repository (it would show up as changes).
                match inputs.pycache {
                    Some(dir) => ("PYTHONPYCACHEPREFIX".into(), path(dir)),
                    None => ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
                },
            ],
            cwd: inputs.repo_dir.to_owned(),
        }
    }

    /// A `std::process::Command` with a cleared environment plus [`PASSED_THROUGH`] and
    /// `self.env`.
    pub fn to_command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).current_dir(&self.cwd).env_clear();
        for key in PASSED_THROUGH {
            if let Some(value) = std::env::var_os(key) {
                cmd.env(key, value);
            }
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// The invocation as a shell line, for logs and for reproducing a run by hand.
    pub fn shell_line(&self) -> String {
        let quote = |s: &str| {
            if !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c))
            {
                s.to_owned()
            } else {
                format!("'{}'", s.replace('\'', "'\\''"))
            }
        };
        let mut parts = vec![format!("cd {} &&", quote(&self.cwd.to_string_lossy()))];
        parts.extend(self.env.iter().map(|(k, v)| format!("{k}={}", quote(v))));
        parts.push(quote(&self.program));
        parts.extend(self.args.iter().map(|a| quote(a)));
        parts.join(" ")
    }
}

impl RunSpec {
    /// A run of `agent` (its Python package `package`) on `task` with `seed`, from `repo_dir`
    /// into `out_dir`, reading `corpus_dir`. The rest takes [`LocalOptions`]' defaults (the
    /// scripted model, `python3`, two-minute limits, no bytecode cache, no installed packages)
    /// and no endpoint yet: whoever chooses the endpoint sets `llm_url`.
    ///
    /// [`LocalOptions`]: crate::local::LocalOptions
    pub fn new(
        agent: impl Into<String>,
        package: impl Into<String>,
        task: Task,
        seed: u64,
        repo_dir: impl Into<PathBuf>,
        out_dir: impl Into<PathBuf>,
        corpus_dir: impl Into<PathBuf>,
    ) -> RunSpec {
        RunSpec {
            agent: agent.into(),
            package: package.into(),
            task,
            seed,
            repo_dir: repo_dir.into(),
            out_dir: out_dir.into(),
            llm_url: String::new(),
            model: DEFAULT_MODEL.into(),
            corpus_dir: corpus_dir.into(),
            python: "python3".into(),
            timeout: Duration::from_secs(120),
            test_timeout: Duration::from_secs(120),
            pycache_dir: None,
            python_site: None,
        }
    }

    pub fn layout(&self) -> RunLayout {
        RunLayout::new(&self.out_dir)
    }

    /// The local invocation (host paths).
    pub fn command(&self) -> AgentCommand {
        let layout = self.layout();
        let mut command = AgentCommand::build(&CommandInputs {
            python: &self.python,
            package: &self.package,
            agent: &self.agent,
            task_id: self.task.id(),
            repo_dir: &self.repo_dir,
            task_file: &layout.task_file,
            workdir: &layout.workdir,
            trace: &layout.trace,
            seed: self.seed,
            llm_url: &self.llm_url,
            model: &self.model,
            corpus: &self.corpus_dir,
            pycache: self.pycache_dir.as_deref(),
        });
        if let Some(site) = &self.python_site {
            command
                .env
                .push(("PYTHONPATH".into(), site.to_string_lossy().into_owned()));
        }
        command
    }
}

/// `result.json` as the contract defines it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentResult {
    pub task_id: String,
    pub status: String,
    pub answer: String,
    pub steps: u64,
}

/// What came back from the agent: its result and a check of its trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Collected {
    pub result: Option<AgentResult>,
    /// Why `result` is missing or was rejected.
    pub result_error: Option<String>,
    pub spans: usize,
    /// Contract violations found in the trace (at most [`MAX_TRACE_PROBLEMS`]).
    pub trace_problems: Vec<String>,
}

/// The outcome of a run, also written to `OUT/outcome.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunOutcome {
    pub agent: String,
    pub task_id: String,
    pub seed: u64,
    pub out_dir: PathBuf,
    pub trace: PathBuf,
    pub command: String,
    pub end: ProcessEnd,
    pub duration_ms: u64,
    #[serde(flatten)]
    pub collected: Collected,
    pub judgement: Judgement,
    pub success: bool,
}

impl RunOutcome {
    /// Reads back an `outcome.json` that [`run`] wrote: a run directory is complete when it
    /// holds one, and what happens next (validation, a resumed corpus) reads its facts here.
    pub fn read(path: &Path) -> Result<RunOutcome, RunError> {
        let text = std::fs::read_to_string(path).map_err(io_err(path))?;
        serde_json::from_str(&text).map_err(|source| RunError::Outcome {
            path: path.to_owned(),
            source,
        })
    }
}

/// Lays out the run directory: task file, work directory, SWE task repository.
pub fn prepare(spec: &RunSpec) -> Result<RunLayout, RunError> {
    let layout = spec.layout();
    std::fs::create_dir_all(&layout.workdir).map_err(io_err(&layout.workdir))?;
    let task_json =
        serde_json::to_string_pretty(&spec.task.agent_view()).expect("a task view serialises");
    write_atomic(&layout.task_file, task_json.as_bytes())?;
    if let Task::Swe(task) = &spec.task {
        copy_dir(&task.repo_dir(), &layout.task_repo())?;
    }
    // A trace left by an earlier run in the same directory must not be mistaken for this one's.
    for stale in [&layout.trace, &layout.result_file(), &layout.outcome] {
        if stale.exists() {
            std::fs::remove_file(stale).map_err(io_err(stale))?;
        }
    }
    Ok(layout)
}

/// Spawns the agent and waits for it (at most `timeout`).
pub fn execute(
    command: &AgentCommand,
    timeout: Duration,
    layout: &RunLayout,
) -> Result<Finished, RunError> {
    tracing::debug!(command = %command.shell_line(), "starting agent");
    process::run_with_timeout(
        command.to_command(),
        timeout,
        &layout.stdout,
        &layout.stderr,
    )
    .map_err(|source| RunError::Spawn {
        program: command.program.clone(),
        source,
    })
}

/// The most trace problems reported per run.
pub const MAX_TRACE_PROBLEMS: usize = 10;

/// Reads `result.json` and checks every span of `trace.jsonl` against the contract.
pub fn collect(layout: &RunLayout, task_id: &str) -> Collected {
    let result_path = layout.result_file();
    let (result, result_error) = match std::fs::read_to_string(&result_path) {
        Err(e) => (None, Some(format!("{}: {e}", result_path.display()))),
        Ok(text) => match serde_json::from_str::<AgentResult>(&text) {
            Err(e) => (None, Some(format!("{}: {e}", result_path.display()))),
            Ok(r) if r.task_id != task_id => (
                None,
                Some(format!(
                    "{}: task_id {:?} is not the task that was run ({task_id:?})",
                    result_path.display(),
                    r.task_id
                )),
            ),
            Ok(r) if !matches!(r.status.as_str(), "completed" | "failed" | "gave_up") => (
                None,
                Some(format!(
                    "{}: status {:?} is not completed, failed or gave_up",
                    result_path.display(),
                    r.status
                )),
            ),
            Ok(r) => (Some(r), None),
        },
    };
    let (spans, trace_problems) = check_trace(&layout.trace);
    Collected {
        result,
        result_error,
        spans,
        trace_problems,
    }
}

/// Counts the spans of a trace file and lists contract violations (by line).
pub fn check_trace(path: &Path) -> (usize, Vec<String>) {
    let text = match std::fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => return (0, vec![format!("{}: {e}", path.display())]),
    };
    let mut problems = Vec::new();
    let mut spans = 0;
    let mut root = false;
    let note = |problems: &mut Vec<String>, p: String| {
        if problems.len() < MAX_TRACE_PROBLEMS {
            problems.push(p);
        }
    };
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), i + 1);
        let span: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                note(&mut problems, format!("{at}: not JSON: {e}"));
                continue;
            }
        };
        spans += 1;
        for key in [
            "trace_id",
            "span_id",
            "name",
            "kind",
            "start_time_unix_nano",
            "end_time_unix_nano",
            "status",
            "attributes",
        ] {
            if span.get(key).is_none() {
                note(&mut problems, format!("{at}: missing `{key}`"));
            }
        }
        let attrs = span.get("attributes").and_then(Value::as_object);
        for key in [
            "code.filepath",
            "code.function",
            "code.lineno",
            "gen_ai.agent.name",
            "pathfinder.step_index",
        ] {
            if !attrs.is_some_and(|a| a.contains_key(key)) {
                note(&mut problems, format!("{at}: missing attribute `{key}`"));
            }
        }
        if span.get("name").and_then(Value::as_str) == Some("agent.run") {
            root = true;
        }
    }
    if spans > 0 && !root {
        note(
            &mut problems,
            format!("{}: no root span `agent.run`", path.display()),
        );
    }
    if spans == 0 && problems.is_empty() {
        problems.push(format!("{}: empty trace", path.display()));
    }
    (spans, problems)
}

/// Decides success: the agent finished (exit 0 and a valid `result.json`) and its answer
/// matches (GAIA) or the task's tests pass in the edited repository (SWE).
pub fn judge(
    spec: &RunSpec,
    layout: &RunLayout,
    end: ProcessEnd,
    collected: &Collected,
) -> Judgement {
    if end != ProcessEnd::Exited(0) {
        return Judgement {
            success: false,
            reason: format!(
                "the agent {}: {}",
                end.describe(),
                process::tail(&layout.stderr, 300)
            ),
        };
    }
    let Some(result) = &collected.result else {
        return Judgement {
            success: false,
            reason: format!(
                "no valid result: {}",
                collected.result_error.as_deref().unwrap_or("unknown")
            ),
        };
    };
    match &spec.task {
        Task::Gaia(task) => judge::judge_gaia(task, &result.answer),
        Task::Swe(task) => judge::judge_swe(
            task,
            &layout.task_repo(),
            spec.test_timeout,
            &layout.tests_log,
        ),
    }
}

/// Runs the agent on the task locally against `spec.llm_url` and records the outcome.
pub fn run(spec: &RunSpec) -> Result<RunOutcome, RunError> {
    let layout = prepare(spec)?;
    let command = spec.command();
    let finished = execute(&command, spec.timeout, &layout)?;
    let collected = collect(&layout, spec.task.id());
    let judgement = judge(spec, &layout, finished.end, &collected);
    let outcome = RunOutcome {
        agent: spec.agent.clone(),
        task_id: spec.task.id().to_owned(),
        seed: spec.seed,
        out_dir: spec.out_dir.clone(),
        trace: layout.trace.clone(),
        command: command.shell_line(),
        end: finished.end,
        duration_ms: finished.duration.as_millis() as u64,
        success: judgement.success,
        collected,
        judgement,
    };
    let json = serde_json::to_string_pretty(&outcome).expect("an outcome serialises");
    write_atomic(&layout.outcome, json.as_bytes())?;
    Ok(outcome)
}

/// Writes via a temporary file and a rename, so readers never see half a file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RunError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// Copies a directory tree (files and directories; caches skipped).
pub fn copy_dir(from: &Path, to: &Path) -> Result<(), RunError> {
    std::fs::create_dir_all(to).map_err(io_err(to))?;
    let entries = std::fs::read_dir(from).map_err(io_err(from))?;
    for entry in entries {
        let entry = entry.map_err(io_err(from))?;
        let name = entry.file_name();
        if name == "__pycache__" || name == ".pytest_cache" {
            continue;
        }
        let src = entry.path();
        let dst = to.join(&name);
        let kind = entry.file_type().map_err(io_err(&src))?;
        if kind.is_dir() {
            copy_dir(&src, &dst)?;
        } else if kind.is_file() {
            std::fs::copy(&src, &dst).map_err(io_err(&dst))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_follows_the_contract() {
        let cmd = AgentCommand::build(&CommandInputs {
            python: "python3",
            package: "toolcaller",
            agent: "toolcaller",
            task_id: "gaia-001",
            repo_dir: Path::new("/r/repo"),
            task_file: Path::new("/r/task.json"),
            workdir: Path::new("/r/work"),
            trace: Path::new("/r/trace.jsonl"),
            seed: 7,
            llm_url: "unix:/tmp/s.sock",
            model: "pathfinder-scripted",
            corpus: Path::new("/a/tasks/corpus"),
            pycache: None,
        });
        assert_eq!(
            cmd.args,
            [
                "-m",
                "toolcaller",
                "--task",
                "/r/task.json",
                "--workdir",
                "/r/work",
                "--trace",
                "/r/trace.jsonl",
                "--seed",
                "7"
            ]
        );
        let env: std::collections::HashMap<_, _> = cmd.env.iter().cloned().collect();
        assert!(env["PATHFINDER_SCRIPT"].starts_with("toolcaller/gaia-001@"));
        assert_eq!(env["PATHFINDER_LLM_URL"], "unix:/tmp/s.sock");
        assert_eq!(env["PATHFINDER_CORPUS"], "/a/tasks/corpus");
        assert!(cmd
            .shell_line()
            .starts_with("cd /r/repo && PATHFINDER_LLM_URL=unix:/tmp/s.sock"));
    }

    #[test]
    fn trace_check_reports_missing_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let good = r#"{"trace_id":"a","span_id":"b","parent_span_id":null,"name":"agent.run","kind":"agent","start_time_unix_nano":1,"end_time_unix_nano":2,"status":{"code":"OK"},"attributes":{"code.filepath":"x.py","code.function":"f","code.lineno":1,"gen_ai.agent.name":"x","pathfinder.step_index":0}}"#;
        let no_id = good.replace(r#""span_id":"b","#, "");
        std::fs::write(&path, format!("{good}\n{no_id}\nnot json\n")).unwrap();
        let (spans, problems) = check_trace(&path);
        assert_eq!(spans, 2);
        assert!(
            problems.iter().any(|p| p.contains(":2: missing `span_id`")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains(":3: not JSON")),
            "{problems:?}"
        );
        std::fs::write(&path, format!("{good}\n")).unwrap();
        assert_eq!(check_trace(&path), (1, vec![]));
    }

    #[test]
    fn collect_rejects_foreign_results() {
        let dir = tempfile::tempdir().unwrap();
        let layout = RunLayout::new(dir.path());
        std::fs::create_dir_all(&layout.workdir).unwrap();
        std::fs::write(
            layout.result_file(),
            r#"{"task_id":"gaia-002","status":"completed","answer":"1","steps":2}"#,
        )
        .unwrap();
        let c = collect(&layout, "gaia-001");
        assert!(c.result.is_none());
        assert!(c.result_error.unwrap().contains("gaia-002"));
    }
}
