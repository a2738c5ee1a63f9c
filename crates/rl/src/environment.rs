//! The self-play environment: the four agents, the engine's valid injections for each, the
//! episode runner that applies, runs and validates an injection (`corpus::EpisodeRunner`, the
//! same code that generates corpora), and the per-step trace store the Detector investigates.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use agents::Workspace;
use corpus::{EpisodeRunner, GenerateOptions, Manifest, Planned};
use inject::Template;
use policy::InjectionOption;
use taxonomy::Catalog;

use crate::reward::{Site, Truth};
use crate::{Result, RlError};

/// What the Injector and the rewards need to know about one agent.
#[derive(Debug, Clone)]
pub struct AgentInfo {
    /// Component ids the agent's manifest maps code to, sorted.
    pub components: Vec<String>,
    pub sites: Vec<Site>,
    /// Task ids of the agent's suite.
    pub tasks: Vec<String>,
    pub templates: Vec<Template>,
}

pub struct Environment {
    catalog: Catalog,
    agents: BTreeMap<String, AgentInfo>,
    runner: EpisodeRunner,
    prior: CorpusPrior,
}

/// What a corpus tells the Injector's options. The held-out split's (agent, type, variant,
/// task) combinations are never planted in training: the Detector would otherwise be trained
/// on a held-out trace's twin. Optionally, only the (agent, type, variant) combinations that
/// validated in the corpus are offered: an untrained Injector otherwise spends most of a step
/// on injections that are known to fail validation and never reach the Detector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CorpusPrior {
    held_out: BTreeSet<(String, String, String, String)>,
    /// Every combination the corpus holds, in any split.
    in_corpus: BTreeSet<(String, String, String, String)>,
    /// Plant only combinations the corpus does not hold ([`CorpusPrior::new_tasks_only`]).
    new_only: bool,
    /// `None`: no filter.
    validated: Option<BTreeSet<(String, String, String)>>,
    /// The (agent, task) pairs whose clean run is a held-out healthy trace: their clean runs are
    /// never shown to the Detector in training (the same task's clean run is that trace's twin).
    held_out_healthy: BTreeSet<(String, String)>,
    /// Train-split traces per (agent, type, variant).
    train: BTreeMap<(String, String, String), usize>,
}

/// The fields of a `corpus.jsonl` record the prior reads.
#[derive(serde::Deserialize)]
struct RecordKey {
    split: String,
    agent: String,
    task: String,
    deficiency: String,
    variant: String,
}

/// The fields of a `healthy.jsonl` record the prior reads.
#[derive(serde::Deserialize)]
struct HealthyKey {
    split: String,
    agent: String,
    task: String,
}

/// The records of a JSON Lines file of the corpus, a bad line named with its number.
fn read_records<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let text = std::fs::read_to_string(path).map_err(|e| RlError::io(path, e))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| {
                RlError::Environment(format!("{}: line {}: {e}", path.display(), i + 1))
            })
        })
        .collect()
}

impl CorpusPrior {
    /// Reads `CORPUS/corpus.jsonl` (one record per validated episode, with its split) and, when
    /// the corpus has one, `CORPUS/healthy.jsonl` (its healthy traces).
    pub fn read(corpus: &Path, held_out_split: &str, validated_only: bool) -> Result<CorpusPrior> {
        let records: Vec<RecordKey> = read_records(&corpus.join("corpus.jsonl"))?;
        let mut prior = CorpusPrior {
            held_out: BTreeSet::new(),
            in_corpus: BTreeSet::new(),
            new_only: false,
            validated: validated_only.then(BTreeSet::new),
            held_out_healthy: BTreeSet::new(),
            train: BTreeMap::new(),
        };
        let held_out = |split: &str| held_out_split.split('+').any(|s| s == split);
        let healthy = corpus.join("healthy.jsonl");
        if healthy.is_file() {
            for r in read_records::<HealthyKey>(&healthy)? {
                if held_out(&r.split) {
                    prior.held_out_healthy.insert((r.agent, r.task));
                }
            }
        }
        for r in records {
            if let Some(v) = &mut prior.validated {
                v.insert((r.agent.clone(), r.deficiency.clone(), r.variant.clone()));
            }
            prior.in_corpus.insert((
                r.agent.clone(),
                r.deficiency.clone(),
                r.variant.clone(),
                r.task.clone(),
            ));
            if r.split == "train" {
                *prior
                    .train
                    .entry((r.agent.clone(), r.deficiency.clone(), r.variant.clone()))
                    .or_default() += 1;
            }
            if held_out(&r.split) {
                prior
                    .held_out
                    .insert((r.agent, r.deficiency, r.variant, r.task));
            }
        }
        Ok(prior)
    }

    /// Plants only (agent, type, variant, task) combinations the corpus does not hold, in any
    /// split: live episodes are then new data for the Detector, not replays of traces the warm
    /// start already fitted (a template's other tasks, or its agent's other tasks).
    pub fn new_tasks_only(mut self) -> CorpusPrior {
        self.new_only = true;
        self
    }

    /// Whether `agent`'s clean run of `task` is a held-out healthy trace.
    pub fn healthy_held_out(&self, agent: &str, task: &str) -> bool {
        self.held_out_healthy
            .contains(&(agent.to_owned(), task.to_owned()))
    }

    /// The corpus's train-split traces of `agent`'s template for `option`.
    pub fn train_count(&self, agent: &str, option: &InjectionOption) -> usize {
        let key = (
            agent.to_owned(),
            option.deficiency.clone(),
            option.variant.clone(),
        );
        self.train.get(&key).copied().unwrap_or(0)
    }

    /// Held-out combinations and, under the filter, validated ones.
    pub fn counts(&self) -> (usize, Option<usize>) {
        (
            self.held_out.len(),
            self.validated.as_ref().map(BTreeSet::len),
        )
    }

    fn offers(&self, agent: &str, t: &Template) -> bool {
        self.validated.as_ref().is_none_or(|v| {
            v.contains(&(agent.to_owned(), t.deficiency.clone(), t.variant.clone()))
        })
    }

    /// Whether the combination may not be planted: it is held out, or (under
    /// [`CorpusPrior::new_tasks_only`]) the corpus holds it.
    fn held_out(&self, agent: &str, t: &Template, task: &str) -> bool {
        let key = (
            agent.to_owned(),
            t.deficiency.clone(),
            t.variant.clone(),
            task.to_owned(),
        );
        self.held_out.contains(&key) || (self.new_only && self.in_corpus.contains(&key))
    }
}

/// The tasks a template names (its code path runs there), else the agent's whole suite.
fn task_pool<'a>(info: &'a AgentInfo, t: &'a Template) -> &'a [String] {
    if t.tasks.is_empty() {
        &info.tasks
    } else {
        &t.tasks
    }
}

fn env_err(e: impl std::fmt::Display) -> RlError {
    RlError::Environment(e.to_string())
}

impl Environment {
    /// `root` is the repository (with `agents/` and `deficiencies/templates/`); episodes are
    /// written under `out`, `jobs` of them at once (0: one per core).
    pub fn new(
        root: &Path,
        agent_names: &[String],
        out: &Path,
        seed: u64,
        timeout: Duration,
        backend: runner::BackendChoice,
        jobs: usize,
    ) -> Result<Environment> {
        let workspace = Workspace::open(&root.join("agents")).map_err(env_err)?;
        let catalog = Catalog::embedded().map_err(env_err)?;
        let templates_dir = std::path::absolute(root.join("deficiencies/templates"))
            .map_err(|e| RlError::io(root, e))?;
        let all = inject::template::load_dir(&templates_dir, &catalog).map_err(|problems| {
            RlError::Environment(
                problems
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })?;
        let mut agents = BTreeMap::new();
        for name in agent_names {
            let agent = workspace.agent(name, &catalog).map_err(env_err)?;
            let tasks = workspace
                .suite(&agent)
                .map_err(env_err)?
                .iter()
                .map(|t| t.id().to_owned())
                .collect();
            let sites: Vec<Site> = agent
                .manifest
                .sites
                .iter()
                .map(|s| Site {
                    component: s.component.clone(),
                    file: s.file.clone(),
                    function: s.function.clone(),
                })
                .collect();
            let mut components: Vec<String> = sites.iter().map(|s| s.component.clone()).collect();
            components.sort();
            components.dedup();
            let mut templates: Vec<Template> =
                all.iter().filter(|t| &t.agent == name).cloned().collect();
            templates.sort_by_key(|t| (t.deficiency.clone(), t.variant.clone()));
            if templates.is_empty() {
                return Err(RlError::Environment(format!(
                    "agent {name} has no injection templates"
                )));
            }
            agents.insert(
                name.clone(),
                AgentInfo {
                    components,
                    sites,
                    tasks,
                    templates,
                },
            );
        }
        let options = GenerateOptions {
            agents: agent_names.to_vec(),
            types: catalog
                .deficiencies()
                .iter()
                .map(|d| d.id.clone())
                .collect(),
            tasks: 1,
            seed,
            holdout_agent: None,
            templates_dir,
            keyword: false,
            python: "python3".into(),
            timeout,
            max_episodes: None,
            llm: None,
            // A ctrl-C during training removes the live episodes' sandboxes before it ends the
            // process (checkpoints are written atomically; the run resumes from the last).
            isolation: runner::ExecutorOptions {
                backend,
                recipe: root.join("infra/base-image.toml"),
                exit_on_interrupt: true,
                jobs: if jobs == 0 {
                    runner::default_jobs()
                } else {
                    jobs
                },
                ..runner::ExecutorOptions::default()
            },
            shard: None,
        };
        let runner = EpisodeRunner::new(&workspace, &catalog, &options, out).map_err(env_err)?;
        Ok(Environment {
            catalog,
            agents,
            runner,
            prior: CorpusPrior::default(),
        })
    }

    /// Restricts the Injector's options by what a corpus knows (see [`CorpusPrior`]). An agent
    /// left with no option is an error (its steps could plant nothing), and then the prior in
    /// place before stays.
    pub fn set_prior(&mut self, prior: CorpusPrior) -> Result<()> {
        let before = std::mem::replace(&mut self.prior, prior);
        let names: Vec<String> = self.agents.keys().cloned().collect();
        for name in names {
            if self.options(&name, false)?.is_empty() {
                let validated = self.prior.validated.is_some();
                self.prior = before;
                return Err(RlError::Environment(format!(
                    "agent {name}: no injection is left once the corpus's held-out combinations{} are taken out",
                    if validated {
                        " and those that never validated"
                    } else {
                        ""
                    }
                )));
            }
        }
        Ok(())
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// What the corpus told the Injector's options ([`Environment::set_prior`]).
    pub fn prior(&self) -> &CorpusPrior {
        &self.prior
    }

    pub fn agent(&self, name: &str) -> Result<&AgentInfo> {
        self.agents
            .get(name)
            .ok_or_else(|| RlError::Environment(format!("unknown agent {name}")))
    }

    /// The injections the engine can apply to `agent`: one per template (with `editable`,
    /// only templates that edit code, which a free-form diff can rewrite) that the corpus prior
    /// offers and that has a task left outside the held-out split.
    pub fn options(&self, agent: &str, editable: bool) -> Result<Vec<InjectionOption>> {
        let info = self.agent(agent)?;
        Ok(info
            .templates
            .iter()
            .filter(|t| !editable || !t.edits.is_empty())
            .filter(|t| self.prior.offers(agent, t) && !self.tasks(agent, info, t).is_empty())
            .map(|t| InjectionOption {
                deficiency: t.deficiency.clone(),
                variant: t.variant.clone(),
            })
            .collect())
    }

    /// The template behind an option.
    pub fn template(&self, agent: &str, option: &InjectionOption) -> Result<&Template> {
        self.agent(agent)?
            .templates
            .iter()
            .find(|t| t.deficiency == option.deficiency && t.variant == option.variant)
            .ok_or_else(|| {
                RlError::Environment(format!("{agent} has no template {}", option.text()))
            })
    }

    /// The tasks a template may run on ([`task_pool`]), less any that would repeat a held-out
    /// combination.
    fn tasks<'a>(&self, agent: &str, info: &'a AgentInfo, t: &'a Template) -> Vec<&'a String> {
        task_pool(info, t)
            .iter()
            .filter(|task| !self.prior.held_out(agent, t, task))
            .collect()
    }

    /// An episode for a chosen injection: one of its [`Environment::tasks`], picked by `pick`.
    pub fn plan(
        &self,
        id: &str,
        agent: &str,
        option: &InjectionOption,
        pick: u64,
    ) -> Result<Planned> {
        self.plan_new(id, agent, option, pick, |_| false)
    }

    /// [`Environment::plan`] among the tasks for which `planted` is false, when there are any:
    /// the same injection on the same task gives the same trace again, which teaches nothing.
    pub fn plan_new(
        &self,
        id: &str,
        agent: &str,
        option: &InjectionOption,
        pick: u64,
        planted: impl Fn(&str) -> bool,
    ) -> Result<Planned> {
        let info = self.agent(agent)?;
        let template = self.template(agent, option)?;
        let pool = self.tasks(agent, info, template);
        let fresh: Vec<&String> = pool.iter().copied().filter(|t| !planted(t)).collect();
        let pool = if fresh.is_empty() { pool } else { fresh };
        if pool.is_empty() {
            return Err(RlError::Environment(format!(
                "{agent}: {} has no task outside the held-out split",
                option.text()
            )));
        }
        let task = pool[(pick % pool.len() as u64) as usize].clone();
        Ok(Planned {
            id: id.to_owned(),
            agent: agent.to_owned(),
            deficiency: option.deficiency.clone(),
            variant: option.variant.clone(),
            task,
        })
    }

    /// Applies, runs and validates one planned injection. Episodes may run from several
    /// threads at once (the runner's executor is shared; each episode has its own directory).
    pub fn run(&self, planned: &Planned) -> Result<Manifest> {
        self.runner.run(planned).map_err(env_err)
    }

    /// Applies a free-form diff instead of `planned`'s template, runs and validates it.
    pub fn run_diff(&self, planned: &Planned, diff: &str) -> Result<Manifest> {
        self.runner.run_diff(planned, diff).map_err(env_err)
    }

    /// The clean run beside an episode as a healthy trace the Detector may train on: the run
    /// succeeded and left a trace, and it is not a held-out healthy trace's twin.
    pub fn clean_trace(&self, m: &Manifest) -> Option<PathBuf> {
        if !m.clean.success || self.prior.healthy_held_out(&m.agent, &m.task) {
            return None;
        }
        let path = self.out().join(corpus::clean_trace_path(&m.agent, &m.task));
        path.is_file().then_some(path)
    }

    /// How many episodes the executor runs at once (`-j`, by default the machine's cores).
    pub fn jobs(&self) -> usize {
        self.runner.executor().jobs()
    }

    /// The runner's output directory (manifests' trace paths are relative to it).
    pub fn out(&self) -> &Path {
        self.runner.out()
    }
}

/// The ground truth of an episode.
pub fn truth(m: &Manifest) -> Truth {
    Truth {
        component: m.location.as_ref().and_then(|l| l.component.clone()),
        file: m.location.as_ref().map(|l| l.file.clone()),
        function: m.location.as_ref().and_then(|l| l.function.clone()),
        ..Truth::deficiency(m.deficiency.clone())
    }
}

/// Imports an episode's injected trace into `store` under `trace_id` (agents pick random trace
/// ids; a step's ids are fixed so that a resumed run prompts the Detector with the same text),
/// with its label. The rewritten trace file is kept beside the original.
pub fn import(store: &mut traces::Store, out: &Path, m: &Manifest, trace_id: &str) -> Result<()> {
    let rel = m
        .trace
        .as_deref()
        .ok_or_else(|| RlError::Environment(format!("episode {} left no trace", m.id)))?;
    let mut label = traces::Label::of(trace_id, truth(m));
    label.source = serde_json::json!({"episode": m.id, "agent": m.agent, "task": m.task});
    import_trace(store, &out.join(rel), label)
}

/// The ground truth of a healthy trace: no deficiency, and nowhere to find one.
pub fn healthy_truth() -> Truth {
    Truth {
        component: Some(policy::decision::NO_COMPONENT.to_owned()),
        ..Truth::deficiency(policy::decision::NONE)
    }
}

/// Imports the clean run beside episode `m` (at `clean`, from [`Environment::clean_trace`])
/// into `store` under `trace_id`, labelled healthy.
pub fn import_healthy(
    store: &mut traces::Store,
    clean: &Path,
    m: &Manifest,
    trace_id: &str,
) -> Result<()> {
    let mut label = traces::Label::new(trace_id);
    label.truth.deficiency_id = Some(policy::decision::NONE.to_owned());
    label.source = serde_json::json!({"clean_run_of": m.id, "agent": m.agent, "task": m.task});
    import_trace(store, clean, label)
}

/// Imports the trace file `original` under `label.trace_id` (through the store, the file left
/// as the agent wrote it), with `label`.
fn import_trace(store: &mut traces::Store, original: &Path, label: traces::Label) -> Result<()> {
    let store_err =
        |e: traces::Error| RlError::Environment(format!("importing {}: {e}", original.display()));
    store
        .import_file_as(original, traces::Format::Jsonl, &label.trace_id)
        .map_err(store_err)?;
    store.put_label(&label).map_err(store_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(split: &str, agent: &str, t: &Template, task: &str) -> String {
        serde_json::json!({
            "split": split, "trace_id": "x", "agent": agent, "task": task,
            "deficiency": t.deficiency, "variant": t.variant,
        })
        .to_string()
    }

    fn pool(info: &AgentInfo, t: &Template) -> Vec<String> {
        task_pool(info, t).to_vec()
    }

    #[test]
    fn the_corpus_prior_keeps_held_out_combinations_out_and_can_offer_only_validated_ones() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = tempfile::tempdir().unwrap();
        let agent = "toolcaller";
        let mut env = Environment::new(
            &root,
            &[agent.to_owned()],
            &dir.path().join("live"),
            0,
            Duration::from_secs(5),
            runner::BackendChoice::Local,
            0,
        )
        .unwrap();
        let info = env.agent(agent).unwrap().clone();
        let all = env.options(agent, false).unwrap();
        let option = |t: &Template| InjectionOption {
            deficiency: t.deficiency.clone(),
            variant: t.variant.clone(),
        };
        // `gone`: every task it may run on is held out. `partly`: all but its last task.
        let gone = &info.templates[0];
        let partly = info.templates[1..]
            .iter()
            .find(|t| pool(&info, t).len() >= 2)
            .expect("a template that may run on two tasks");
        let kept = pool(&info, partly).last().unwrap().clone();
        let mut lines: Vec<String> = pool(&info, gone)
            .iter()
            .map(|task| record("test", agent, gone, task))
            .collect();
        lines.extend(
            pool(&info, partly)
                .iter()
                .filter(|task| **task != kept)
                .map(|task| record("test", agent, partly, task)),
        );
        lines.push(record("train", agent, partly, &kept));
        let corpus = dir.path().join("corpus");
        std::fs::create_dir_all(&corpus).unwrap();
        std::fs::write(corpus.join("corpus.jsonl"), lines.join("\n")).unwrap();

        env.set_prior(CorpusPrior::read(&corpus, "test", false).unwrap())
            .unwrap();
        // The train split's traces per template: one for `partly`, none for `gone`.
        assert_eq!(env.prior().train_count(agent, &option(partly)), 1);
        assert_eq!(env.prior().train_count(agent, &option(gone)), 0);
        let offered = env.options(agent, false).unwrap();
        assert_eq!(offered.len(), all.len() - 1);
        assert!(!offered.contains(&option(gone)) && offered.contains(&option(partly)));
        for pick in 0..8 {
            let planned = env.plan("p", agent, &option(partly), pick).unwrap();
            assert_eq!(planned.task, kept, "pick {pick} planned a held-out task");
        }
        assert!(env.plan("p", agent, &option(gone), 0).is_err());
        // New tasks only: `partly`'s one task outside the held-out split is in the corpus (as
        // train), so it is gone too; every other template is still offered.
        env.set_prior(
            CorpusPrior::read(&corpus, "test", false)
                .unwrap()
                .new_tasks_only(),
        )
        .unwrap();
        let offered = env.options(agent, false).unwrap();
        assert_eq!(offered.len(), all.len() - 2);
        assert!(!offered.contains(&option(partly)));

        // Validated only: of the two combinations in the corpus, one is wholly held out.
        env.set_prior(CorpusPrior::read(&corpus, "test", true).unwrap())
            .unwrap();
        assert_eq!(env.options(agent, false).unwrap(), vec![option(partly)]);

        // Nothing left to plant is an error, and so is a corpus line that is not a record.
        let only_gone: Vec<String> = pool(&info, gone)
            .iter()
            .map(|task| record("test", agent, gone, task))
            .collect();
        std::fs::write(corpus.join("corpus.jsonl"), only_gone.join("\n")).unwrap();
        let err = env
            .set_prior(CorpusPrior::read(&corpus, "test", true).unwrap())
            .unwrap_err();
        assert!(err.to_string().contains("no injection is left"), "{err}");
        // The refused prior left the one before it in place.
        assert_eq!(env.options(agent, false).unwrap(), vec![option(partly)]);
        std::fs::write(corpus.join("corpus.jsonl"), "{\"split\": \"test\"}\n").unwrap();
        let err = CorpusPrior::read(&corpus, "test", false).unwrap_err();
        assert!(err.to_string().contains("corpus.jsonl: line 1"), "{err}");
    }

    #[test]
    fn held_out_healthy_traces_keep_their_clean_runs_out_of_training() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path();
        std::fs::write(corpus.join("corpus.jsonl"), "").unwrap();
        let healthy = |split: &str, task: &str| {
            serde_json::json!({"split": split, "trace_id": "h", "agent": "swe", "task": task,
                "healthy": true, "trace": format!("clean/swe/runs/{task}/trace.jsonl")})
            .to_string()
        };
        std::fs::write(
            corpus.join("healthy.jsonl"),
            [
                healthy("train", "a"),
                healthy("val", "b"),
                healthy("test", "c"),
            ]
            .join("\n"),
        )
        .unwrap();
        let prior = CorpusPrior::read(corpus, "val+test", false).unwrap();
        assert!(!prior.healthy_held_out("swe", "a"));
        assert!(prior.healthy_held_out("swe", "b") && prior.healthy_held_out("swe", "c"));
        assert!(!prior.healthy_held_out("toolcaller", "b"));
        let prior = CorpusPrior::read(corpus, "test", false).unwrap();
        assert!(!prior.healthy_held_out("swe", "b") && prior.healthy_held_out("swe", "c"));
        // A corpus without healthy traces holds none out; a bad line is named.
        std::fs::write(corpus.join("healthy.jsonl"), "{\"split\": 3}\n").unwrap();
        let err = CorpusPrior::read(corpus, "test", false).unwrap_err();
        assert!(err.to_string().contains("healthy.jsonl: line 1"), "{err}");
        std::fs::remove_file(corpus.join("healthy.jsonl")).unwrap();
        let prior = CorpusPrior::read(corpus, "test", false).unwrap();
        assert!(!prior.healthy_held_out("swe", "c"));
    }
}
