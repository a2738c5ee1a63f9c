//! Publishing a corpus from its manifests: splits, the labelled trace store, healthy traces,
//! JSON Lines and Parquet exports, the report and the digest — each written under a temporary
//! name and renamed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::confusability::Confusability;
use crate::error::{io, CorpusError};
use crate::files::{hex, to_json, write_atomic};
use crate::injection::{episode_dir_name, Manifest};
use crate::planning::{stable_hash, Plan, Uncovered};
pub use crate::record::Record;
use crate::validate;

/// Pass rates and failures.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub episodes: usize,
    pub valid: usize,
    pub pass_rate: f64,
    /// Per type: (episodes, valid, failures by check).
    pub per_type: BTreeMap<String, TypeReport>,
    pub uncovered: Vec<Uncovered>,
    pub splits: BTreeMap<String, usize>,
    /// Valid episodes the keyword baseline named correctly / ran on.
    pub keyword_named: usize,
    pub keyword_ran: usize,
    /// Whether types planted in the same agent on the same task leave traces that differ.
    #[serde(default)]
    pub confusability: Confusability,
    pub digest: String,
    /// What the sandboxes cost, per backend that ran some of the corpus's runs (a resumed
    /// corpus may have used two). Timings, so outside the digest.
    #[serde(default)]
    pub sandbox: Vec<SandboxCost>,
}

/// The runs one backend made and its overhead per run: from the start of a run until its
/// trace was collected, less the agent's own run time (`runner::Timing`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SandboxCost {
    pub backend: String,
    pub runs: usize,
    pub overhead_p50_ms: f64,
    pub overhead_p90_ms: f64,
    pub agent_p50_ms: f64,
}

/// The sandbox costs of the corpus's clean and injected runs, read from their outcome files
/// (runs made before episodes ran in the runner have none and are not counted).
fn sandbox_costs(out: &Path, manifests: &[Manifest]) -> Vec<SandboxCost> {
    let mut runs: Vec<PathBuf> = manifests
        .iter()
        .filter(|m| m.injected.is_some())
        .map(|m| {
            out.join("episodes")
                .join(episode_dir_name(&m.id))
                .join("run")
        })
        .collect();
    let clean: BTreeSet<(&str, &str)> = manifests
        .iter()
        .map(|m| (m.agent.as_str(), m.task.as_str()))
        .collect();
    runs.extend(
        clean
            .into_iter()
            .map(|(agent, task)| out.join("clean").join(agent).join("runs").join(task)),
    );
    let mut by_backend: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for dir in runs {
        if let Ok(o) = runner::EpisodeOutcome::read(&dir.join("outcome.json")) {
            let (overhead, agent) = by_backend.entry(o.backend).or_default();
            overhead.push(o.timing.overhead_ms);
            agent.push(o.timing.agent_ms);
        }
    }
    let quantile = |xs: &mut Vec<f64>, q: f64| {
        xs.sort_by(f64::total_cmp);
        xs.get(((xs.len() - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    by_backend
        .into_iter()
        .map(|(backend, (mut overhead, mut agent))| SandboxCost {
            backend,
            runs: overhead.len(),
            overhead_p50_ms: quantile(&mut overhead, 0.5),
            overhead_p90_ms: quantile(&mut overhead, 0.9),
            agent_p50_ms: quantile(&mut agent, 0.5),
        })
        .collect()
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TypeReport {
    pub episodes: usize,
    pub valid: usize,
    pub failures: BTreeMap<String, usize>,
    /// Episodes whose injected run differed from the clean run in token counts alone.
    #[serde(default)]
    pub token_only: usize,
    /// Valid episodes by kind of difference ([`validate::manifestation_classes`]).
    #[serde(default)]
    pub classes: BTreeMap<String, usize>,
}

/// Assigns splits: per type, the valid episodes in seeded order get 70/15/15 (rounded);
/// the holdout agent's episodes all go to test.
pub fn assign_splits(
    manifests: &[&Manifest],
    seed: u64,
    holdout: Option<&str>,
) -> BTreeMap<String, String> {
    let mut by_type: BTreeMap<&str, Vec<&Manifest>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for m in manifests {
        if Some(m.agent.as_str()) == holdout {
            out.insert(m.id.clone(), "test".to_owned());
        } else {
            by_type.entry(&m.deficiency).or_default().push(m);
        }
    }
    let seed = seed.to_string();
    for (_, mut ms) in by_type {
        ms.sort_by_key(|m| (stable_hash(&[&seed, "split", &m.id]), m.id.clone()));
        let n = ms.len();
        let n_train = (n as f64 * 0.70).round() as usize;
        let n_val = ((n as f64 * 0.15).round() as usize).min(n - n_train);
        for (i, m) in ms.iter().enumerate() {
            let split = if i < n_train {
                "train"
            } else if i < n_train + n_val {
                "val"
            } else {
                "test"
            };
            out.insert(m.id.clone(), split.to_owned());
        }
    }
    out
}

/// What the corpus digest covers of one record: the episode's labels and verdicts, which the
/// same command and seed reproduce on any machine, under any load and any `--jobs`.
///
/// In: the episode (id, agent, task, type, variant, strategy, template, seed), the diff, its
/// location and commit, each run's end, success and containment, every check's verdict, the
/// manifestation classes, the keyword baseline's answer, and the split.
/// Out: the trace path and the agents' trace ids; check details (they quote process output and
/// paths); the timeout clause of `contained` (it repeats `end` with the limit in seconds, a
/// run-time knob learnt from the clean run's duration); and the runs' measured features and
/// their per-feature diff — counts of errors, spans and tokens that a deficiency racing
/// against a clock or another thread (a deadline computed wrongly, an unlocked update) varies
/// from run to run, and whose classes the verdicts keep. [`features_canonical`] hashes those
/// measurements for the ledger, so two corpora can still be compared on them.
fn canonical(m: &Manifest, split: &str) -> String {
    let mut v = serde_json::to_value(m).expect("serialises");
    if let Some(o) = v.as_object_mut() {
        o.remove("trace");
        o.insert("split".into(), Value::String(split.into()));
        for run in ["clean", "injected"] {
            if let Some(r) = o.get_mut(run).and_then(Value::as_object_mut) {
                r.remove("features");
                if let Some(Value::Array(clauses)) = r.get_mut("contained") {
                    clauses.retain(|c| {
                        !c.as_str()
                            .is_some_and(runner::Containment::is_timeout_clause)
                    });
                }
            }
        }
        if let Some(val) = o.get_mut("validation").and_then(Value::as_object_mut) {
            val.remove("feature_diff");
            for check in ["applies", "runs", "traces", "manifests"] {
                if let Some(c) = val.get_mut(check).and_then(Value::as_object_mut) {
                    c.remove("detail");
                }
            }
            if let Some(nt) = val.get_mut("non_trivial").and_then(Value::as_object_mut) {
                nt.remove("detail");
            }
        }
    }
    serde_json::to_string(&v).expect("serialises")
}

/// The runs' measured features, which the digest leaves out ([`canonical`]): hashed per
/// episode in the ledger beside the digest's part.
fn features_canonical(m: &Manifest) -> String {
    serde_json::to_string(&(&m.clean.features, m.injected.as_ref().map(|r| &r.features)))
        .expect("serialises")
}

/// Builds the store, the exports, the report and the digest from the manifests.
pub(crate) fn publish(
    out: &Path,
    plan: &Plan,
    manifests: &[Manifest],
) -> Result<Report, CorpusError> {
    let valid: Vec<&Manifest> = manifests.iter().filter(|m| m.validation.valid).collect();
    let splits = assign_splits(
        &valid,
        plan.options.seed,
        plan.options.holdout_agent.as_deref(),
    );

    // The store, rebuilt from scratch and renamed into place.
    let store_path = out.join("store.sqlite");
    let staging = out.join(".store.sqlite.partial");
    for p in [&staging, &staging.with_extension("partial-journal")] {
        if p.exists() {
            std::fs::remove_file(p).map_err(io(p))?;
        }
    }
    let store_err = |source| CorpusError::Store {
        path: store_path.clone(),
        source,
    };
    let mut store = traces::Store::open(&staging).map_err(store_err)?;
    // The clean runs, read back in the store's span order to find each departure.
    let mut clean_spans = CleanSpans::new(out).map_err(store_err)?;
    let mut records = Vec::new();
    let mut healthy_records: Vec<HealthyRecord> = Vec::new();
    for m in &valid {
        let trace = out.join(m.trace.as_deref().unwrap_or_default());
        let report = store
            .import_file(&trace, traces::Format::Jsonl)
            .map_err(store_err)?;
        let trace_id = report.trace_ids.first().cloned().unwrap_or_default();
        let split = splits[&m.id].clone();
        let loc = m.location.clone();
        let mut label = traces::Label::new(&trace_id);
        label.truth.deficiency_id = Some(m.deficiency.clone());
        label.truth.component = loc.as_ref().and_then(|l| l.component.clone());
        label.truth.file = loc.as_ref().map(|l| l.file.clone());
        label.truth.function = loc.as_ref().and_then(|l| l.function.clone());
        label.truth.line_start = loc.as_ref().map(|l| l.line_start as i64);
        label.truth.line_end = loc.as_ref().map(|l| l.line_end as i64);
        let injected = store.spans(&trace_id).map_err(store_err)?;
        let departure = crate::clean_twin::first_departure(
            clean_spans.get(&m.agent, &m.task).map_err(store_err)?,
            &injected,
        );
        label.truth.step = departure.as_ref().and_then(|d| d.step);
        label.truth.agent = departure.as_ref().and_then(|d| d.agent.clone());
        label.source = serde_json::json!({
            "episode": m.id, "agent": m.agent, "task": m.task, "variant": m.variant,
            "strategy": m.strategy, "split": split,
            "departure": departure,
        });
        store.put_label(&label).map_err(store_err)?;
        records.push(Record {
            split,
            trace_id,
            manifest: (*m).clone(),
            departure,
        });
    }
    let healthy = healthy_runs(out, plan, manifests, valid.len());
    for h in &healthy {
        let report = store
            .import_file(out.join(&h.trace), traces::Format::Jsonl)
            .map_err(store_err)?;
        let trace_id = report.trace_ids.first().cloned().unwrap_or_default();
        let mut label = traces::Label::new(&trace_id);
        label.truth.deficiency_id = Some(taxonomy::NONE.into());
        label.source = serde_json::json!({
            "agent": h.agent, "task": h.task, "healthy": true, "split": h.split,
        });
        store.put_label(&label).map_err(store_err)?;
        healthy_records.push(HealthyRecord {
            trace_id,
            ..h.clone()
        });
    }
    drop(store);
    std::fs::rename(&staging, &store_path).map_err(io(&store_path))?;

    let line = |r: &Record| serde_json::to_string(r).expect("serialises") + "\n";
    write_atomic(
        &out.join("corpus.jsonl"),
        records.iter().map(line).collect::<String>().as_bytes(),
    )?;
    let splits_dir = out.join("splits");
    std::fs::create_dir_all(&splits_dir).map_err(io(&splits_dir))?;
    let mut split_counts = BTreeMap::new();
    let healthy_line = |r: &HealthyRecord| serde_json::to_string(r).expect("serialises") + "\n";
    write_atomic(
        &out.join("healthy.jsonl"),
        healthy_records
            .iter()
            .map(healthy_line)
            .collect::<String>()
            .as_bytes(),
    )?;
    for name in ["train", "val", "test"] {
        let chosen: Vec<&Record> = records.iter().filter(|r| r.split == name).collect();
        let chosen_healthy: Vec<&HealthyRecord> =
            healthy_records.iter().filter(|r| r.split == name).collect();
        split_counts.insert(name.to_owned(), chosen.len());
        split_counts.insert(format!("{name}_healthy"), chosen_healthy.len());
        // A split lists every labelled trace of it: the injected records, then the healthy.
        write_atomic(
            &splits_dir.join(format!("{name}.jsonl")),
            chosen
                .iter()
                .copied()
                .map(line)
                .chain(chosen_healthy.iter().copied().map(healthy_line))
                .collect::<String>()
                .as_bytes(),
        )?;
        crate::parquet::write(&splits_dir.join(format!("{name}.parquet")), &chosen)?;
    }
    crate::parquet::write(
        &out.join("corpus.parquet"),
        &records.iter().collect::<Vec<_>>(),
    )?;
    let ledger: String = manifests
        .iter()
        .map(|m| {
            let digest = hex(&Sha256::digest(canonical(m, "").as_bytes()));
            let features = hex(&Sha256::digest(features_canonical(m).as_bytes()));
            serde_json::json!({"episode": m.id, "valid": m.validation.valid, "manifest_sha256": digest, "features_sha256": features})
                .to_string()
                + "\n"
        })
        .collect();
    write_atomic(&out.join("ledger.jsonl"), ledger.as_bytes())?;

    let mut digest = Sha256::new();
    for r in &records {
        digest.update(canonical(&r.manifest, &r.split).as_bytes());
        digest.update(b"\n");
    }
    for h in &healthy_records {
        digest.update(format!("healthy {} {} {}\n", h.agent, h.task, h.split).as_bytes());
    }
    let digest = hex(&digest.finalize());
    write_atomic(&out.join("digest"), format!("{digest}\n").as_bytes())?;

    let mut per_type: BTreeMap<String, TypeReport> = BTreeMap::new();
    for m in manifests {
        let t = per_type.entry(m.deficiency.clone()).or_default();
        t.episodes += 1;
        if validate::token_only(&m.validation.classes) {
            t.token_only += 1;
        }
        match m.validation.failure() {
            None => {
                t.valid += 1;
                for class in &m.validation.classes {
                    *t.classes.entry(class.clone()).or_insert(0) += 1;
                }
            }
            Some(check) => *t.failures.entry(check.to_owned()).or_insert(0) += 1,
        }
    }
    let keyword_ran = valid
        .iter()
        .filter(|m| {
            m.validation
                .non_trivial
                .as_ref()
                .is_some_and(|n| n.keyword_available)
        })
        .count();
    let keyword_named = valid
        .iter()
        .filter(|m| {
            m.validation
                .non_trivial
                .as_ref()
                .and_then(|n| n.keyword_names_it)
                == Some(true)
        })
        .count();
    let report = Report {
        episodes: manifests.len(),
        valid: valid.len(),
        pass_rate: if manifests.is_empty() {
            0.0
        } else {
            valid.len() as f64 / manifests.len() as f64
        },
        per_type,
        uncovered: plan.uncovered.clone(),
        splits: split_counts,
        keyword_named,
        keyword_ran,
        confusability: Confusability::of(valid.iter().filter_map(|m| {
            let injected = m.injected.as_ref()?;
            Some((
                m.agent.as_str(),
                m.task.as_str(),
                m.deficiency.as_str(),
                &injected.features,
            ))
        })),
        digest,
        sandbox: sandbox_costs(out, manifests),
    };
    write_atomic(&out.join("report.json"), to_json(&report).as_bytes())?;
    Ok(report)
}

/// The clean runs' spans in `seq` order, each read once through a scratch store.
struct CleanSpans<'a> {
    out: &'a Path,
    scratch: traces::Store,
    read: BTreeMap<(String, String), Vec<traces::Span>>,
}

impl<'a> CleanSpans<'a> {
    fn new(out: &'a Path) -> traces::Result<CleanSpans<'a>> {
        Ok(CleanSpans {
            out,
            scratch: traces::Store::open_in_memory()?,
            read: BTreeMap::new(),
        })
    }

    /// The spans of `agent`'s clean run of `task` (none when it left no trace).
    fn get(&mut self, agent: &str, task: &str) -> traces::Result<&[traces::Span]> {
        let key = (agent.to_owned(), task.to_owned());
        if !self.read.contains_key(&key) {
            let path = self.out.join(clean_trace_path(agent, task));
            let spans = if path.is_file() {
                let report = self.scratch.import_file(&path, traces::Format::Jsonl)?;
                let mut spans = Vec::new();
                for id in &report.trace_ids {
                    spans.extend(self.scratch.spans(id)?);
                }
                spans
            } else {
                Vec::new()
            };
            self.read.insert(key.clone(), spans);
        }
        Ok(&self.read[&key])
    }
}

/// Where the clean run of `agent`'s `task` leaves its trace, relative to OUT.
pub fn clean_trace_path(agent: &str, task: &str) -> String {
    format!("clean/{agent}/runs/{task}/trace.jsonl")
}

/// A clean run published as a healthy trace (`healthy.jsonl`, and in the split files).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HealthyRecord {
    pub split: String,
    pub trace_id: String,
    pub agent: String,
    pub task: String,
    /// Always true: tells a split file's healthy lines from its injected records.
    pub healthy: bool,
    /// The clean run's trace, relative to OUT.
    pub trace: String,
}

/// One healthy trace for about every four valid injections (a fifth of the corpus, as many as
/// there are clean runs): the clean runs of the planned (agent, task) pairs that succeeded and
/// left a trace, in seeded order. A user's own runs are mostly healthy; a corpus with few
/// healthy traces teaches a reader to call anything unfamiliar deficient.
/// Each goes to a split by the same seeded order (70/15/15; a held-out agent's all to test).
fn healthy_runs(
    out: &Path,
    plan: &Plan,
    manifests: &[Manifest],
    valid: usize,
) -> Vec<HealthyRecord> {
    let seed = plan.options.seed.to_string();
    let mut pairs: Vec<(&str, &str)> = manifests
        .iter()
        .filter(|m| m.clean.success)
        .map(|m| (m.agent.as_str(), m.task.as_str()))
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    pairs.retain(|(agent, task)| out.join(clean_trace_path(agent, task)).is_file());
    pairs.sort_by_key(|(agent, task)| stable_hash(&[&seed, "healthy", agent, task]));
    pairs.truncate(valid.div_ceil(4));
    pairs
        .iter()
        .enumerate()
        .map(|(i, (agent, task))| {
            let split = if plan.options.holdout_agent.as_deref() == Some(agent) {
                "test"
            } else {
                match i % 20 {
                    0..=13 => "train",
                    14..=16 => "val",
                    _ => "test",
                }
            };
            HealthyRecord {
                split: split.into(),
                trace_id: String::new(),
                agent: agent.to_string(),
                task: task.to_string(),
                healthy: true,
                trace: clean_trace_path(agent, task),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::TraceFeatures;
    use crate::injection::RunSummary;
    use crate::validate::Validation;

    fn manifest(id: &str, agent: &str, ty: &str) -> Manifest {
        let v = Validation::not_applied(String::new());
        Manifest {
            id: id.into(),
            agent: agent.into(),
            task: "t".into(),
            deficiency: ty.into(),
            variant: "v".into(),
            strategy: "template".into(),
            template: String::new(),
            seed: 0,
            diff: String::new(),
            location: None,
            commit: None,
            clean: RunSummary {
                end: String::new(),
                success: true,
                features: TraceFeatures::default(),
                contained: Vec::new(),
            },
            injected: None,
            validation: v,
            trace: None,
        }
    }

    #[test]
    fn splits_are_stratified_seeded_and_honour_the_holdout() {
        let ms: Vec<Manifest> = (0..20)
            .map(|i| {
                manifest(
                    &format!("e{i}"),
                    if i % 4 == 0 { "h" } else { "a" },
                    if i < 10 { "P1" } else { "C1" },
                )
            })
            .collect();
        let refs: Vec<&Manifest> = ms.iter().collect();
        let s = assign_splits(&refs, 7, Some("h"));
        assert_eq!(s.len(), 20);
        for m in &ms {
            if m.agent == "h" {
                assert_eq!(s[&m.id], "test");
            }
        }
        // P1 has 7 non-holdout episodes: 5 train, 1 val, 1 test.
        let count = |ty: &str, split: &str| {
            ms.iter()
                .filter(|m| m.deficiency == ty && m.agent != "h" && s[&m.id] == split)
                .count()
        };
        assert_eq!(
            (
                count("P1", "train"),
                count("P1", "val"),
                count("P1", "test")
            ),
            (5, 1, 1)
        );
        assert_eq!(s, assign_splits(&refs, 7, Some("h")));
        assert_ne!(s, assign_splits(&refs, 8, Some("h")));
    }
}
