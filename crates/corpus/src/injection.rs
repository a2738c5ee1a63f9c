//! One episode, from a planned choice to its manifest: the agent's clean run (once per
//! (agent, task)), the injection, the injected run — both through the runner's sandbox — and
//! the validation of the pair. `EpisodeRunner` runs one or many at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agents::process::ProcessEnd;
use agents::run::RunSpec;
use agents::{Agent, RunOutcome, Task, Workspace};
use inject::{template, Location, Options};
use runner::{EpisodeError, EpisodeOutcome, EpisodeSpec, Executor, Limits, LlmChoice};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use taxonomy::Catalog;

use crate::error::{io, CorpusError};
use crate::features::TraceFeatures;
use crate::files::{hex, to_json, write_atomic};
use crate::non_trivial;
use crate::planning::{GenerateOptions, Planned};
use crate::validate::{self, RunFacts, Validation};

/// Summary of one run, stable across reruns (no paths, no timings).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunSummary {
    pub end: String,
    pub success: bool,
    pub features: TraceFeatures,
    /// What the sandbox had to stop (a timeout, the memory or pids limit, network access, a
    /// write outside the episode), one clause each; empty for a well-behaved run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub contained: Vec<String>,
}

/// `OUT/episodes/ID/manifest.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub id: String,
    pub agent: String,
    pub task: String,
    pub deficiency: String,
    pub variant: String,
    pub strategy: String,
    /// The template, relative to the templates directory.
    pub template: String,
    pub seed: u64,
    pub diff: String,
    pub location: Option<Location>,
    pub commit: Option<String>,
    pub clean: RunSummary,
    pub injected: Option<RunSummary>,
    pub validation: Validation,
    /// The injected trace, relative to OUT (also for failed episodes, for inspection).
    pub trace: Option<String>,
}

/// The component of token-counting bugs: a type that lives there may show in the counts
/// alone (see [`validate::judge`]).
pub const TOKEN_COUNT_COMPONENT: &str = "context.token_count";

/// The clean side of one agent: its repository and its runs.
struct CleanAgent {
    agent: Agent,
    repo: PathBuf,
    runs: PathBuf,
}

fn prepare_clean(out: &Path, agent: Agent) -> Result<CleanAgent, CorpusError> {
    let base = out.join("clean").join(&agent.name);
    let repo = base.join("repo");
    if !repo.join(".git").exists() {
        let staging = base.join(".repo.partial");
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(io(&staging))?;
        }
        std::fs::create_dir_all(&base).map_err(io(&base))?;
        agents::history::materialize(&agent.name, &agent.dir, &agent.series, &staging)?;
        std::fs::rename(&staging, &repo).map_err(io(&repo))?;
    }
    Ok(CleanAgent {
        agent,
        repo,
        runs: base.join("runs"),
    })
}

struct Runner {
    workspace: Workspace,
    executor: Executor,
    options: GenerateOptions,
    /// Shared by every episode (one syntax-checking interpreter).
    inject: Options,
    /// One lock per clean run directory: episodes of the same (agent, task) running at once
    /// share one clean run.
    clean_runs: Mutex<BTreeMap<PathBuf, Arc<Mutex<()>>>>,
}

impl Runner {
    fn spec(
        &self,
        id: String,
        agent: &Agent,
        task: &Task,
        repo: &Path,
        out_dir: &Path,
        timeout: Duration,
    ) -> EpisodeSpec {
        let run = RunSpec {
            python_site: agent.python_site(),
            ..RunSpec::new(
                agent.name.clone(),
                agent.manifest.package.clone(),
                task.clone(),
                self.options.seed,
                repo,
                out_dir,
                self.workspace.corpus_dir(),
            )
        };
        EpisodeSpec::new(
            id,
            run,
            self.executor.llm_socket().to_owned(),
            Limits {
                timeout,
                test_timeout: timeout,
                ..Limits::default()
            },
        )
    }

    /// Runs (or reuses) the clean run of `task`.
    fn clean(&self, clean: &CleanAgent, task: &Task) -> Result<RunFacts, CorpusError> {
        let dir = clean.runs.join(task.id());
        let lock = self
            .clean_runs
            .lock()
            .expect("never poisoned")
            .entry(dir.clone())
            .or_default()
            .clone();
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        let outcome_file = dir.join("outcome.json");
        if !outcome_file.exists() {
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
            }
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            let id = format!("clean.{}.{}", clean.agent.name, task.id());
            self.executor.run(&self.spec(
                id,
                &clean.agent,
                task,
                &clean.repo,
                &dir,
                self.options.timeout,
            ))?;
        }
        read_facts(&dir)
    }
}

/// Reads a run directory's outcome.json (typed: the runner's [`EpisodeOutcome`], or a bare
/// [`RunOutcome`] that corpora made before episodes ran in the runner hold) and trace back
/// into [`RunFacts`].
fn read_facts(dir: &Path) -> Result<RunFacts, CorpusError> {
    let path = dir.join("outcome.json");
    let (outcome, contained) = match EpisodeOutcome::read(&path) {
        Ok(o) => {
            let contained = o.containment.describe(&o.limits);
            (o.run, contained)
        }
        Err(_) => (RunOutcome::read(&path)?, Vec::new()),
    };
    // Worded as manifests have always said it (the corpus digest covers them).
    let end = match outcome.end {
        ProcessEnd::Exited(c) => format!("exited with status {c}"),
        ProcessEnd::Signalled(s) => format!("was killed by signal {s}"),
        ProcessEnd::TimedOut => "ran past its time limit".into(),
    };
    let trace = dir.join("trace.jsonl");
    let features = TraceFeatures::from_file(&trace).unwrap_or_default();
    Ok(RunFacts {
        end,
        exit_ok: outcome.end == ProcessEnd::Exited(0),
        timed_out: outcome.end == ProcessEnd::TimedOut,
        success: outcome.success,
        spans: outcome.collected.spans,
        trace_problems: outcome.collected.trace_problems,
        features,
        contained,
        duration_ms: outcome.duration_ms,
    })
}

/// An injected run's time limit, learnt from its clean run: [`LIMIT_FACTOR`] times as long as
/// the clean agent ran, at least [`LIMIT_FLOOR`] (so that load on the machine cannot push a
/// healthy run past it), at most the corpus's `--timeout` (which the clean run has). A
/// deadlock then costs seconds instead of the full minute, and nothing else changes: the
/// slowest injected run that ends by itself takes about 2x its clean run (BENCHMARKS.md), and a
/// run killed at its limit is recorded as timed out either way (the digest leaves the limit's
/// value out, `publish::canonical`).
fn injected_timeout(clean: &RunFacts, ceiling: Duration) -> Duration {
    if clean.timed_out {
        return ceiling;
    }
    let learnt = Duration::from_millis(clean.duration_ms.saturating_mul(LIMIT_FACTOR));
    learnt.max(LIMIT_FLOOR).min(ceiling)
}

/// See [`injected_timeout`].
const LIMIT_FACTOR: u64 = 10;
const LIMIT_FLOOR: Duration = Duration::from_secs(10);

fn summary(facts: &RunFacts) -> RunSummary {
    RunSummary {
        end: facts.end.clone(),
        success: facts.success,
        features: facts.features.clone(),
        contained: facts.contained.clone(),
    }
}

/// `OUT/episodes/DIR/manifest.json` of the episode `id`: written last, so its presence means
/// the episode is complete.
pub fn manifest_path(out: &Path, id: &str) -> PathBuf {
    out.join("episodes")
        .join(episode_dir_name(id))
        .join("manifest.json")
}

/// Reads back a manifest an earlier run wrote.
pub(crate) fn read_manifest(path: &Path) -> Result<Manifest, CorpusError> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    serde_json::from_str(&text).map_err(|e| CorpusError::Plan(format!("{}: {e}", path.display())))
}

/// Runs single planned episodes into an output directory with the layout above: the clean run
/// of each (agent, task) once, then the injection, the injected run and its validation. Corpus
/// generation drives it over a plan; the self-play trainer drives it one Injector choice at a
/// time.
pub struct EpisodeRunner {
    runner: Runner,
    catalog: Catalog,
    clean: Mutex<BTreeMap<String, Arc<CleanAgent>>>,
    out: PathBuf,
}

impl EpisodeRunner {
    /// Starts the executor (the runner's backend, saying its choice once on stderr), the LLM
    /// endpoint (the scripted model unless `options.llm` names one) and the syntax-checking
    /// interpreter; `out` is created.
    pub fn new(
        workspace: &Workspace,
        catalog: &Catalog,
        options: &GenerateOptions,
        out: &Path,
    ) -> Result<EpisodeRunner, CorpusError> {
        let out = std::path::absolute(out).map_err(io(out))?;
        std::fs::create_dir_all(&out).map_err(io(&out))?;
        let llm = match &options.llm {
            None => LlmChoice::Scripted,
            Some(url) => LlmChoice::parse(url).map_err(|e| CorpusError::Llm(e.to_string()))?,
        };
        let executor = Executor::start(workspace, &llm, &options.isolation, &|line| {
            eprintln!("{line}")
        })?;
        Ok(EpisodeRunner {
            runner: Runner {
                workspace: workspace.clone(),
                executor,
                options: options.clone(),
                inject: Options::new(options.python.clone()),
                clean_runs: Mutex::default(),
            },
            catalog: catalog.clone(),
            clean: Mutex::default(),
            out,
        })
    }

    /// The output directory (absolute); manifests' `trace` paths are relative to it.
    pub fn out(&self) -> &Path {
        &self.out
    }

    /// The executor its episodes run on (the backend, ctrl-C handling).
    pub fn executor(&self) -> &Executor {
        &self.runner.executor
    }

    fn clean_agent(&self, name: &str) -> Result<Arc<CleanAgent>, CorpusError> {
        let mut clean = self.clean.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clean.get(name) {
            return Ok(c.clone());
        }
        let agent = self.runner.workspace.agent(name, &self.catalog)?;
        let c = Arc::new(prepare_clean(&self.out, agent)?);
        clean.insert(name.to_owned(), c.clone());
        Ok(c)
    }

    /// Runs `ep` from scratch in `OUT/episodes/DIR/` (an earlier partial attempt is removed) and
    /// returns its manifest; the caller decides whether to write it.
    pub fn run(&self, ep: &Planned) -> Result<Manifest, CorpusError> {
        self.run_with(ep, None)
    }

    /// Like [`EpisodeRunner::run`] for a free-form unified diff (a model's proposal) instead of
    /// `ep`'s template; `ep.variant` only names the episode. A diff the engine rejects gives a
    /// manifest whose `applies` check failed, with the engine's reason.
    pub fn run_diff(&self, ep: &Planned, diff: &str) -> Result<Manifest, CorpusError> {
        self.run_with(ep, Some(diff))
    }

    fn run_with(&self, ep: &Planned, diff: Option<&str>) -> Result<Manifest, CorpusError> {
        let clean = self.clean_agent(&ep.agent)?;
        let dir = self.out.join("episodes").join(episode_dir_name(&ep.id));
        run_episode(
            &self.runner,
            &self.catalog,
            &clean,
            ep,
            &dir,
            &self.out,
            diff,
        )
    }

    /// Resumes a run over `episodes` (a plan): the manifests an earlier run completed are read
    /// back, then up to `max` of the rest run, `jobs` at once.
    /// `on_episode(done, total, manifest)` hears of each, found or finished. Returns the
    /// manifests in plan order, `None` for episodes not reached (`max`, an interruption).
    pub fn resume(
        &self,
        episodes: &[Planned],
        max: Option<usize>,
        mut on_episode: impl FnMut(usize, usize, &Manifest) + Send,
    ) -> Result<Vec<Option<Manifest>>, CorpusError> {
        let total = episodes.len();
        let mut done = 0;
        let mut slots: Vec<Option<Manifest>> = vec![None; total];
        let mut todo = Vec::new();
        for (i, ep) in episodes.iter().enumerate() {
            let path = manifest_path(&self.out, &ep.id);
            if path.exists() {
                let m = read_manifest(&path)?;
                done += 1;
                on_episode(done, total, &m);
                slots[i] = Some(m);
            } else {
                todo.push(i);
            }
        }
        todo.truncate(max.unwrap_or(usize::MAX));
        let now: Vec<&Planned> = todo.iter().map(|&i| &episodes[i]).collect();
        let ran = self.run_many(&now, |m| {
            done += 1;
            on_episode(done, total, m);
        })?;
        for (&i, m) in todo.iter().zip(ran) {
            slots[i] = m;
        }
        Ok(slots)
    }

    /// Runs `episodes`, up to the executor's `jobs` at once, writing each one's manifest
    /// (atomically, the episode's last act) and calling `on_done` with it as it completes.
    /// Returns a manifest per episode completed, in the order given (`None` where an
    /// interruption stopped it: that is no error). The first error stops new episodes from
    /// starting; those already running finish, and then it is returned.
    fn run_many(
        &self,
        episodes: &[&Planned],
        on_done: impl FnMut(&Manifest) + Send,
    ) -> Result<Vec<Option<Manifest>>, CorpusError> {
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let on_done = Mutex::new(on_done);
        let results: Mutex<Vec<Option<Manifest>>> = Mutex::new(vec![None; episodes.len()]);
        let error: Mutex<Option<CorpusError>> = Mutex::new(None);
        let jobs = self.runner.executor.jobs().min(episodes.len()).max(1);
        std::thread::scope(|scope| {
            for _ in 0..jobs {
                scope.spawn(|| {
                    while !stop.load(Ordering::SeqCst) {
                        let k = next.fetch_add(1, Ordering::SeqCst);
                        let Some(ep) = episodes.get(k) else {
                            break;
                        };
                        let result = self.run(ep).and_then(|m| {
                            write_atomic(
                                &manifest_path(&self.out, &ep.id),
                                to_json(&m).as_bytes(),
                            )?;
                            Ok(m)
                        });
                        match result {
                            Ok(m) => {
                                (on_done.lock().unwrap_or_else(|p| p.into_inner()))(&m);
                                results.lock().unwrap_or_else(|p| p.into_inner())[k] = Some(m);
                            }
                            Err(e) => {
                                stop.store(true, Ordering::SeqCst);
                                if !matches!(
                                    e,
                                    CorpusError::Episode(EpisodeError::Cancelled { .. })
                                ) {
                                    error
                                        .lock()
                                        .unwrap_or_else(|p| p.into_inner())
                                        .get_or_insert(e);
                                }
                            }
                        }
                    }
                });
            }
        });
        match error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(results.into_inner().unwrap_or_else(|p| p.into_inner())),
        }
    }
}

fn run_episode(
    runner: &Runner,
    catalog: &Catalog,
    clean: &CleanAgent,
    ep: &Planned,
    dir: &Path,
    out: &Path,
    diff: Option<&str>,
) -> Result<Manifest, CorpusError> {
    if dir.exists() {
        // An episode interrupted before its manifest: redo it from scratch.
        std::fs::remove_dir_all(dir).map_err(io(dir))?;
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let options = &runner.options;
    let task = runner.workspace.task(&clean.agent, &ep.task)?;
    let clean_facts = runner.clean(clean, &task)?;
    let template = match diff {
        Some(_) => None,
        None => {
            let template_path = options
                .templates_dir
                .join(&ep.agent)
                .join(format!("{}-{}.toml", ep.deficiency, ep.variant));
            Some(template::load(&template_path, catalog)?)
        }
    };
    let def = catalog
        .get(&ep.deficiency)
        .ok_or_else(|| CorpusError::Plan(format!("{} is not a catalog id", ep.deficiency)))?;
    let mut m = Manifest {
        id: ep.id.clone(),
        agent: ep.agent.clone(),
        task: ep.task.clone(),
        deficiency: ep.deficiency.clone(),
        variant: ep.variant.clone(),
        strategy: template
            .as_ref()
            .map_or("free-form", |t| t.strategy.as_str())
            .into(),
        template: match &template {
            Some(_) => format!("{}/{}-{}.toml", ep.agent, ep.deficiency, ep.variant),
            None => String::new(),
        },
        seed: options.seed,
        diff: String::new(),
        location: None,
        commit: None,
        clean: summary(&clean_facts),
        injected: None,
        validation: Validation::not_applied(String::new()),
        trace: None,
    };
    let injected = match (&template, diff) {
        (Some(t), _) => inject::inject_template(
            &clean.agent,
            t,
            catalog,
            &dir.join("artifact"),
            &runner.inject,
        ),
        (None, diff) => inject::inject_diff(
            &clean.agent,
            diff.unwrap_or_default(),
            Some(&ep.deficiency),
            catalog,
            &dir.join("artifact"),
            &runner.inject,
        ),
    };
    let artifact = match injected {
        Ok(a) => a,
        Err(e) => {
            m.validation = Validation::not_applied(e.to_string());
            return Ok(m);
        }
    };
    m.diff = artifact.injection.diff.clone();
    m.location = Some(artifact.injection.location.clone());
    m.commit = Some(artifact.injection.commit.clone());
    let run_dir = dir.join("run");
    let spec = runner.spec(
        ep.id.clone(),
        &clean.agent,
        &task,
        &artifact.dir.join("repo"),
        &run_dir,
        injected_timeout(&clean_facts, options.timeout),
    );
    runner.executor.run(&spec)?;
    let facts = read_facts(&run_dir)?;
    let mut validation = validate::judge(
        def.manifestation,
        def.components.iter().any(|c| c == TOKEN_COUNT_COMPONENT),
        &clean_facts,
        &facts,
        format!(
            "applied on {} at {}",
            artifact.injection.branch,
            &artifact.injection.commit[..10]
        ),
    );
    let trace = run_dir.join("trace.jsonl");
    if options.keyword && facts.spans > 0 {
        validation.non_trivial = Some(non_trivial::keyword_baseline(&trace, &ep.deficiency));
    }
    m.injected = Some(summary(&facts));
    m.validation = validation;
    m.trace = trace
        .strip_prefix(out)
        .ok()
        .map(|p| p.display().to_string());
    Ok(m)
}

/// The directory of an episode under `OUT/episodes/`: the first 16 hex digits of the SHA-256
/// of its id, which names nothing a Detector could read an answer from.
pub fn episode_dir_name(id: &str) -> String {
    hex(&Sha256::digest(id.as_bytes()))[..16].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(duration_ms: u64, timed_out: bool) -> RunFacts {
        RunFacts {
            end: String::new(),
            exit_ok: !timed_out,
            timed_out,
            success: !timed_out,
            spans: 1,
            trace_problems: Vec::new(),
            features: TraceFeatures::default(),
            contained: Vec::new(),
            duration_ms,
        }
    }

    #[test]
    fn an_injected_run_gets_ten_times_its_clean_run_within_the_floor_and_the_ceiling() {
        let minute = Duration::from_secs(60);
        // A quick clean run: the floor.
        assert_eq!(injected_timeout(&clean(235, false), minute), LIMIT_FLOOR);
        // A slow one (a real model behind --llm): ten times as long.
        assert_eq!(
            injected_timeout(&clean(4_000, false), minute),
            Duration::from_secs(40)
        );
        // Never past --timeout, which a clean run that timed out gets whole.
        assert_eq!(injected_timeout(&clean(30_000, false), minute), minute);
        assert_eq!(injected_timeout(&clean(60_000, true), minute), minute);
        let short = Duration::from_secs(8);
        assert_eq!(injected_timeout(&clean(235, false), short), short);
    }
}
