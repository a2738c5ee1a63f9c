//! The self-play environment: the four agents, the engine's valid injections for each, the
//! episode runner that applies, runs and validates an injection (`corpus::EpisodeRunner`, the
//! same code that generates corpora), and the per-step trace store the Detector investigates.

use std::collections::BTreeMap;
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
}

fn env_err(e: impl std::fmt::Display) -> RlError {
    RlError::Environment(e.to_string())
}

impl Environment {
    /// `root` is the repository (with `agents/` and `deficiencies/templates/`); episodes are
    /// written under `out`.
    pub fn new(
        root: &Path,
        agent_names: &[String],
        out: &Path,
        seed: u64,
        timeout: Duration,
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
        };
        let runner = EpisodeRunner::new(&workspace, &catalog, &options, out).map_err(env_err)?;
        Ok(Environment {
            catalog,
            agents,
            runner,
        })
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn agent(&self, name: &str) -> Result<&AgentInfo> {
        self.agents
            .get(name)
            .ok_or_else(|| RlError::Environment(format!("unknown agent {name}")))
    }

    /// The injections the engine can apply to `agent`: one per template (with `editable`,
    /// only templates that edit code, which a free-form diff can rewrite).
    pub fn options(&self, agent: &str, editable: bool) -> Result<Vec<InjectionOption>> {
        Ok(self
            .agent(agent)?
            .templates
            .iter()
            .filter(|t| !editable || !t.edits.is_empty())
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

    /// An episode for a chosen injection: a task the template names (its code path runs
    /// there), else any task of the suite, picked by `pick`.
    pub fn plan(
        &self,
        id: &str,
        agent: &str,
        option: &InjectionOption,
        pick: u64,
    ) -> Result<Planned> {
        let info = self.agent(agent)?;
        let template = self.template(agent, option)?;
        let pool: &[String] = if template.tasks.is_empty() {
            &info.tasks
        } else {
            &template.tasks
        };
        let task = pool[(pick % pool.len() as u64) as usize].clone();
        Ok(Planned {
            id: id.to_owned(),
            agent: agent.to_owned(),
            deficiency: option.deficiency.clone(),
            variant: option.variant.clone(),
            task,
        })
    }

    /// Applies, runs and validates one planned injection.
    pub fn run(&mut self, planned: &Planned) -> Result<Manifest> {
        self.runner.run(planned).map_err(env_err)
    }

    /// Applies a free-form diff instead of `planned`'s template, runs and validates it.
    pub fn run_diff(&mut self, planned: &Planned, diff: &str) -> Result<Manifest> {
        self.runner.run_diff(planned, diff).map_err(env_err)
    }

    /// The runner's output directory (manifests' trace paths are relative to it).
    pub fn out(&self) -> &Path {
        self.runner.out()
    }
}

/// The ground truth of an episode.
pub fn truth(m: &Manifest) -> Truth {
    Truth {
        deficiency: m.deficiency.clone(),
        component: m.location.as_ref().and_then(|l| l.component.clone()),
        file: m.location.as_ref().map(|l| l.file.clone()),
        function: m.location.as_ref().and_then(|l| l.function.clone()),
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
    let original = out.join(rel);
    let text = std::fs::read_to_string(&original).map_err(|e| RlError::io(&original, e))?;
    let mut rekeyed = String::with_capacity(text.len());
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
            RlError::Environment(format!("{}: line {}: {e}", original.display(), i + 1))
        })?;
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "trace_id".into(),
                serde_json::Value::String(trace_id.into()),
            );
        }
        rekeyed.push_str(&v.to_string());
        rekeyed.push('\n');
    }
    let path: PathBuf = original.with_file_name("trace.rekeyed.jsonl");
    std::fs::write(&path, rekeyed).map_err(|e| RlError::io(&path, e))?;
    let store_err =
        |e: traces::Error| RlError::Environment(format!("importing {}: {e}", path.display()));
    store
        .import_file(&path, traces::Format::Jsonl)
        .map_err(store_err)?;
    let t = truth(m);
    let mut label = traces::Label::new(trace_id);
    label.deficiency_id = Some(t.deficiency);
    label.component = t.component;
    label.file = t.file;
    label.function = t.function;
    label.source = serde_json::json!({"episode": m.id, "agent": m.agent, "task": m.task});
    store.put_label(&label).map_err(store_err)?;
    Ok(())
}
