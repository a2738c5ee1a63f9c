//! Template sweeps: which tasks of its agent's suite each template manifests on.
//!
//! A template's `tasks` list tells the corpus planner where to plant it first; a task listed
//! there on which the template does not manifest costs a failed episode in every corpus. A
//! sweep runs every template of the chosen (agent, type) pairs on the first `tasks` tasks of
//! the agent's suite (those it lists first), validates each episode exactly as corpus
//! generation does, and reports, per template, the tasks where it validated. With `write`,
//! the templates' task lists are replaced by that evidence.
//!
//! Layout of `OUT/` (a cache: an episode whose manifest exists is not redone, so a sweep widened
//! to more tasks or types in the same directory runs only what is new):
//!
//! ```text
//! OUT/plan.json                 the options and the planned (template, task) episodes
//! OUT/clean/, OUT/episodes/     as in a corpus (`generate`)
//! OUT/sweep.json                per template: tasks tried, tasks valid, failures by check
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use agents::Workspace;
use inject::template;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use taxonomy::Catalog;

use crate::error::{io, CorpusError};
use crate::files::write_atomic;
use crate::injection::{read_manifest, EpisodeRunner, Manifest};
use crate::planning::{GenerateOptions, Planned};
use crate::validate;

/// What one template did on the tasks it was swept over.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TemplateSweep {
    pub agent: String,
    pub deficiency: String,
    pub variant: String,
    /// The template file, relative to the templates directory.
    pub template: String,
    /// Its `tasks` list when the sweep was planned.
    pub listed: Vec<String>,
    /// Tasks it ran on, in the order tried.
    pub tried: Vec<String>,
    /// Tasks on which the episode validated, in the order tried.
    pub valid: Vec<String>,
    /// Failed episodes by the first check that failed.
    pub failures: BTreeMap<String, usize>,
    /// Failed episodes whose run differed from the clean run in token counts alone.
    pub token_only: usize,
}

/// `OUT/sweep.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Sweep {
    pub templates: Vec<TemplateSweep>,
}

impl Sweep {
    /// (episodes, valid episodes) over every template.
    pub fn totals(&self) -> (usize, usize) {
        self.templates
            .iter()
            .fold((0, 0), |(n, v), t| (n + t.tried.len(), v + t.valid.len()))
    }
}

/// `OUT/plan.json` of a sweep.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SweepPlan {
    pub options: GenerateOptions,
    /// When set, only these (agent, type) pairs of `options` are swept.
    pub only: Option<BTreeSet<(String, String)>>,
    pub episodes: Vec<Planned>,
}

/// Plans a sweep: for every agent and type in `options`, every template of the pair on the
/// agent's suite, the template's listed tasks first and then the rest in suite order, at most
/// `options.tasks` tasks per template. `only` narrows the pairs.
pub fn plan_sweep(
    workspace: &Workspace,
    catalog: &Catalog,
    options: &GenerateOptions,
    only: Option<&BTreeSet<(String, String)>>,
) -> Result<SweepPlan, CorpusError> {
    let mut episodes = Vec::new();
    for name in &options.agents {
        let suite = crate::planning::suite_ids(workspace, catalog, name)?;
        for ty in &options.types {
            if only.is_some_and(|o| !o.contains(&(name.clone(), ty.clone()))) {
                continue;
            }
            for t in template::load_for(&options.templates_dir, name, ty, catalog)? {
                let listed: Vec<&String> = suite.iter().filter(|s| t.tasks.contains(s)).collect();
                let rest = suite.iter().filter(|s| !t.tasks.contains(s));
                for task in listed.into_iter().chain(rest).take(options.tasks) {
                    episodes.push(Planned {
                        id: format!("{name}.{ty}.{}.{task}", t.variant),
                        agent: name.clone(),
                        deficiency: ty.clone(),
                        variant: t.variant.clone(),
                        task: task.clone(),
                    });
                }
            }
        }
    }
    let only = only.map(|o| {
        o.iter()
            .filter(|(a, t)| options.agents.contains(a) && options.types.contains(t))
            .cloned()
            .collect()
    });
    Ok(SweepPlan {
        options: options.clone(),
        only,
        episodes,
    })
}

/// Runs (or resumes) a sweep into `out` and writes `OUT/sweep.json`. `on_episode(done,
/// total, manifest)` is called after each episode.
pub fn sweep(
    workspace: &Workspace,
    catalog: &Catalog,
    options: &GenerateOptions,
    only: Option<&BTreeSet<(String, String)>>,
    out: &Path,
    on_episode: impl FnMut(usize, usize, &Manifest) + Send,
) -> Result<Sweep, CorpusError> {
    let out = &std::path::absolute(out).map_err(io(out))?;
    std::fs::create_dir_all(out).map_err(io(out))?;
    let planned = plan_sweep(workspace, catalog, options, only)?;
    let plan_path = out.join("plan.json");
    let plan_value = serde_json::to_value(&planned).expect("serialises");
    if plan_path.exists() {
        let text = std::fs::read_to_string(&plan_path).map_err(io(&plan_path))?;
        let previous: Value = serde_json::from_str(&text)
            .map_err(|e| CorpusError::Plan(format!("{}: {e}", plan_path.display())))?;
        if settings(&previous["options"]) != settings(&plan_value["options"]) {
            return Err(CorpusError::Plan(format!(
                "{} holds a sweep run with other settings (seed, templates or model); use another --out",
                out.display()
            )));
        }
    }
    // The directory is a cache of (template, task) episodes under these settings: a wider or
    // narrower sweep reuses every episode already run.
    write_atomic(
        &plan_path,
        serde_json::to_string_pretty(&plan_value)
            .expect("serialises")
            .as_bytes(),
    )?;
    let runner = EpisodeRunner::new(workspace, catalog, options, out)?;
    let slots = runner.resume(&planned.episodes, None, on_episode)?;
    if slots.iter().any(Option::is_none) {
        return Err(CorpusError::Plan(
            "the sweep was interrupted; run the same command again to resume".into(),
        ));
    }
    let manifests: Vec<Manifest> = slots.into_iter().flatten().collect();
    let result = summarise(catalog, options, &manifests)?;
    write_atomic(
        &out.join("sweep.json"),
        serde_json::to_string_pretty(&result)
            .expect("serialises")
            .as_bytes(),
    )?;
    Ok(result)
}

/// What an episode's result depends on besides its template and task: the plan's options
/// without the choice of agents, types and task count.
fn settings(options: &Value) -> Value {
    let mut v = options.clone();
    if let Some(o) = v.as_object_mut() {
        for k in ["agents", "types", "tasks", "keyword"] {
            o.remove(k);
        }
    }
    v
}

/// Groups episodes by template. The plan runs each template's tasks one after another, so a
/// template's episodes arrive together and its valid tasks in the order tried.
fn summarise(
    catalog: &Catalog,
    options: &GenerateOptions,
    manifests: &[Manifest],
) -> Result<Sweep, CorpusError> {
    let mut templates: Vec<TemplateSweep> = Vec::new();
    for m in manifests {
        let same = |t: &TemplateSweep| {
            (&t.agent, &t.deficiency, &t.variant) == (&m.agent, &m.deficiency, &m.variant)
        };
        if !templates.last().is_some_and(same) {
            let rel = format!("{}/{}-{}.toml", m.agent, m.deficiency, m.variant);
            let loaded = template::load(&options.templates_dir.join(&rel), catalog)?;
            templates.push(TemplateSweep {
                agent: m.agent.clone(),
                deficiency: m.deficiency.clone(),
                variant: m.variant.clone(),
                template: rel,
                listed: loaded.tasks,
                tried: Vec::new(),
                valid: Vec::new(),
                failures: BTreeMap::new(),
                token_only: 0,
            });
        }
        let t = templates.last_mut().expect("pushed above");
        t.tried.push(m.task.clone());
        match m.validation.failure() {
            None => t.valid.push(m.task.clone()),
            Some(check) => {
                *t.failures.entry(check.to_owned()).or_insert(0) += 1;
                if validate::token_only(&m.validation.classes) {
                    t.token_only += 1;
                }
            }
        }
    }
    Ok(Sweep { templates })
}

/// The (agent, type) pairs with at least one failed episode in the corpus at `corpus` (read
/// from its episode manifests): where a sweep can find better tasks.
pub fn failed_pairs(corpus: &Path) -> Result<BTreeSet<(String, String)>, CorpusError> {
    let episodes = corpus.join("episodes");
    let mut pairs = BTreeSet::new();
    for entry in std::fs::read_dir(&episodes).map_err(io(&episodes))? {
        let path = entry.map_err(io(&episodes))?.path().join("manifest.json");
        if !path.exists() {
            continue;
        }
        let m = read_manifest(&path)?;
        if !m.validation.valid {
            pairs.insert((m.agent, m.deficiency));
        }
    }
    Ok(pairs)
}

/// One template file whose task list [`write_task_lists`] changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    pub path: PathBuf,
    pub before: Vec<String>,
    pub after: Vec<String>,
}

/// Replaces each swept template's `tasks` list by the tasks it validated on, keeping any
/// listed task the sweep did not try. A template that validated nowhere gets an empty list
/// (any task), so the planner no longer prefers tasks known to fail. Each file is re-read as
/// a template before it replaces the original, so a rewrite never leaves a broken template.
pub fn write_task_lists(
    sweep: &Sweep,
    templates_dir: &Path,
    catalog: &Catalog,
) -> Result<Vec<Rewritten>, CorpusError> {
    // Rewrites are read back first under the same agent directory and file name (the loader
    // checks both), outside the templates, and only then written in place atomically.
    let scratch = tempfile::Builder::new()
        .prefix("pathfinder-sweep")
        .tempdir()
        .map_err(io(&std::env::temp_dir()))?;
    let mut changed = Vec::new();
    for t in &sweep.templates {
        let untried = t.listed.iter().filter(|l| !t.tried.contains(l));
        let after: Vec<String> = t.valid.iter().chain(untried).cloned().collect();
        if after == t.listed {
            continue;
        }
        let path = templates_dir.join(&t.template);
        let text = std::fs::read_to_string(&path).map_err(io(&path))?;
        let rewritten = replace_tasks_line(&text, &after).ok_or_else(|| {
            CorpusError::Plan(format!(
                "{}: no `tasks = [...]` line to rewrite",
                path.display()
            ))
        })?;
        let check_dir = scratch.path().join(&t.agent);
        std::fs::create_dir_all(&check_dir).map_err(io(&check_dir))?;
        let check = check_dir.join(path.file_name().unwrap_or_default());
        std::fs::write(&check, &rewritten).map_err(io(&check))?;
        let reread = template::load(&check, catalog);
        match reread {
            Ok(reread) if reread.tasks == after => {}
            Ok(reread) => {
                return Err(CorpusError::Plan(format!(
                    "{}: the rewritten task list reads back as {:?}, not {after:?}",
                    path.display(),
                    reread.tasks
                )));
            }
            Err(e) => return Err(e.into()),
        }
        write_atomic(&path, rewritten.as_bytes())?;
        changed.push(Rewritten {
            path,
            before: t.listed.clone(),
            after,
        });
    }
    Ok(changed)
}

/// `text` with its top-level `tasks = [...]` (one line or several) replaced by `tasks`.
fn replace_tasks_line(text: &str, tasks: &[String]) -> Option<String> {
    // Edits come after the header and may quote any text, `tasks = ...` included.
    let header = &text[..text.find("\n[[").map_or(text.len(), |i| i + 1)];
    let start = header.match_indices("tasks").map(|(i, _)| i).find(|&i| {
        (i == 0 || header.as_bytes()[i - 1] == b'\n') && header[i..].starts_with("tasks =")
    })?;
    let open = start + header[start..].find('[')?;
    let close = open + header[open..].find(']')?;
    let list = tasks
        .iter()
        .map(|t| format!("{t:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    Some(format!(
        "{}tasks = [{list}]{}",
        &text[..start],
        &text[close + 1..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_list_is_replaced_in_place() {
        let text = "deficiency = \"C8\"\ntasks = [\"gaia-001\",\n  \"gaia-002\"]\n\n[[edit]]\nfind = '''\ntasks = [1]\n'''\n";
        let out = replace_tasks_line(text, &["gaia-007".into(), "gaia-011".into()]).unwrap();
        assert_eq!(
            out,
            "deficiency = \"C8\"\ntasks = [\"gaia-007\", \"gaia-011\"]\n\n[[edit]]\nfind = '''\ntasks = [1]\n'''\n"
        );
        let empty = replace_tasks_line(text, &[]).unwrap();
        assert!(empty.contains("\ntasks = []\n"));
        assert_eq!(replace_tasks_line("deficiency = \"C8\"\n", &[]), None);
    }

    #[test]
    fn task_lists_take_the_sweep_evidence_and_stay_loadable() {
        let catalog = Catalog::embedded().unwrap();
        let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deficiencies/templates");
        let tmp = tempfile::tempdir().unwrap();
        let name = "C1-no-nudge-cap.toml";
        std::fs::create_dir_all(tmp.path().join("toolcaller")).unwrap();
        std::fs::copy(
            real.join("toolcaller").join(name),
            tmp.path().join("toolcaller").join(name),
        )
        .unwrap();
        let before = template::load(&tmp.path().join("toolcaller").join(name), &catalog).unwrap();
        let swept = |listed: Vec<String>, tried: &[&str], valid: &[&str]| Sweep {
            templates: vec![TemplateSweep {
                agent: "toolcaller".into(),
                deficiency: "C1".into(),
                variant: "no-nudge-cap".into(),
                template: format!("toolcaller/{name}"),
                listed,
                tried: tried.iter().map(|s| s.to_string()).collect(),
                valid: valid.iter().map(|s| s.to_string()).collect(),
                failures: BTreeMap::new(),
                token_only: 0,
            }],
        };
        // Validated on two tasks, one listed task never tried: both kept, in that order.
        let listed = vec!["gaia-001".to_owned(), "gaia-050".to_owned()];
        let sweep = swept(
            listed,
            &["gaia-001", "gaia-002", "gaia-003"],
            &["gaia-002", "gaia-003"],
        );
        let changed = write_task_lists(&sweep, tmp.path(), &catalog).unwrap();
        assert_eq!(changed.len(), 1);
        let after = template::load(&tmp.path().join("toolcaller").join(name), &catalog).unwrap();
        assert_eq!(after.tasks, ["gaia-002", "gaia-003", "gaia-050"]);
        assert_eq!(after.edits, before.edits, "only the task list changes");
        // Validated nowhere: any task.
        let sweep = swept(
            after.tasks.clone(),
            &["gaia-002", "gaia-003", "gaia-050"],
            &[],
        );
        write_task_lists(&sweep, tmp.path(), &catalog).unwrap();
        let none = template::load(&tmp.path().join("toolcaller").join(name), &catalog).unwrap();
        assert!(none.tasks.is_empty());
        // Unchanged evidence writes nothing.
        let sweep = swept(Vec::new(), &["gaia-002"], &[]);
        assert!(write_task_lists(&sweep, tmp.path(), &catalog)
            .unwrap()
            .is_empty());
    }
}
