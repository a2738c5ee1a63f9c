//! Runs a Detector policy over every labelled trace of a store (or of a split) and turns each
//! episode into a [`Case`]. The store is opened read-only; labels are read here, outside the
//! episode, and only to score the answer.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use detect::{Ablations, Action, Config, Detector, Transcript, Verdict};

use crate::error::{Error, Result};
use crate::metrics::{Case, Prediction, Truth};

/// The non-learned detectors a store can be evaluated with.
pub const DETECTORS: &[&str] = &["keyword", "expert"];

/// A trace to evaluate and its ground truth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labelled {
    pub trace_id: String,
    pub truth: Truth,
    /// `source.agent` of the label: the agent that produced the trace.
    pub agent: Option<String>,
}

/// The traces of `store` whose labels name a deficiency type, in import order (the first such
/// label of a trace counts). With `only`, just those ids, which must all be labelled.
pub fn labelled_traces(db: &Path, only: Option<&[String]>) -> Result<Vec<Labelled>> {
    let store_err = |source| Error::Store {
        path: db.to_path_buf(),
        cause: Box::new(source),
    };
    let store = traces::Store::open_read_only(db).map_err(store_err)?;
    let ids = match only {
        Some(ids) => {
            let known: HashSet<String> =
                store.trace_ids().map_err(store_err)?.into_iter().collect();
            if let Some(missing) = ids.iter().find(|id| !known.contains(*id)) {
                return Err(Error::Nothing {
                    path: db.to_path_buf(),
                    reason: format!("the split names trace {missing}, which is not in the store"),
                });
            }
            ids.to_vec()
        }
        None => store.trace_ids().map_err(store_err)?,
    };
    let mut out = Vec::new();
    for trace_id in ids {
        let labels = store.labels(&trace_id).map_err(store_err)?;
        let Some(label) = labels.into_iter().find(|l| l.deficiency_id.is_some()) else {
            if only.is_some() {
                return Err(Error::Nothing {
                    path: db.to_path_buf(),
                    reason: format!("trace {trace_id} of the split has no deficiency label"),
                });
            }
            continue;
        };
        let agent = label
            .source
            .get("agent")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string);
        out.push(Labelled {
            agent,
            trace_id,
            truth: Truth {
                deficiency_id: label.deficiency_id.unwrap_or_default(),
                component: label.component,
                file: label.file,
                function: label.function,
            },
        });
    }
    Ok(out)
}

/// Trace ids of a split file: JSON Lines with a string `trace_id` per record, as the corpus
/// generator writes `splits/{train,val,test}.jsonl`. Blank lines are skipped.
pub fn read_split(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|cause| Error::Io {
        path: path.to_path_buf(),
        cause,
    })?;
    let bad = |line: usize, reason: String| Error::Split {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let mut ids = Vec::new();
    let mut seen = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(i + 1, format!("not JSON: {e}")))?;
        let id = value
            .get("trace_id")
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad(i + 1, "missing `trace_id` (a non-empty string)".into()))?;
        if !seen.insert(id.to_string()) {
            return Err(bad(i + 1, format!("trace {id} is listed twice")));
        }
        ids.push(id.to_string());
    }
    Ok(ids)
}

/// Only the traces produced by `agent` (Table 8: a detector evaluated on the agent it was
/// trained without). An error when there are none, naming the agents there are.
pub fn held_out(traces: Vec<Labelled>, agent: &str, db: &Path) -> Result<Vec<Labelled>> {
    let known: std::collections::BTreeSet<String> =
        traces.iter().filter_map(|t| t.agent.clone()).collect();
    let chosen: Vec<Labelled> = traces
        .into_iter()
        .filter(|t| t.agent.as_deref() == Some(agent))
        .collect();
    if chosen.is_empty() {
        return Err(Error::Nothing {
            path: db.to_path_buf(),
            reason: if known.is_empty() {
                format!(
                    "no label names the agent that produced its trace, so none is from `{agent}`"
                )
            } else {
                format!(
                    "no labelled trace comes from agent `{agent}`; agents in the store: {}",
                    known.into_iter().collect::<Vec<_>>().join(", ")
                )
            },
        });
    }
    Ok(chosen)
}

/// SQL and bash calls of an episode, its subagents' included (the paper's "tool calls").
pub fn tool_calls(transcript: &Transcript) -> usize {
    transcript
        .turns
        .iter()
        .map(|turn| {
            let own = matches!(turn.action, Some(Action::Sql { .. } | Action::Bash { .. }));
            usize::from(own) + turn.subagents.iter().map(tool_calls).sum::<usize>()
        })
        .sum()
}

/// What an evaluation run needs besides the traces.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub detector: String,
    pub ablations: Ablations,
}

/// Investigates each trace with a fresh policy and scores the verdict. `on_done` is called
/// after each trace (for progress). A Detector error (store, sandbox) stops the run: counting
/// it as a miss would report the environment's failure as the detector's.
pub fn run(
    db: &Path,
    traces: &[Labelled],
    options: &RunOptions,
    mut on_done: impl FnMut(&Case),
) -> Result<Vec<Case>> {
    run_transcribed(db, traces, options, |case, _| on_done(case))
}

/// [`run`], handing `on_done` each episode's transcript too (for pages that show the
/// investigation).
pub fn run_transcribed(
    db: &Path,
    traces: &[Labelled],
    options: &RunOptions,
    on_done: impl FnMut(&Case, &Transcript),
) -> Result<Vec<Case>> {
    if !DETECTORS.contains(&options.detector.as_str()) {
        return Err(Error::Detector(format!(
            "unknown detector `{}`; expected one of {}",
            options.detector,
            DETECTORS.join(", ")
        )));
    }
    let config = Config {
        ablations: options.ablations,
        ..Config::default()
    };
    run_policies_transcribed(
        db,
        traces,
        config,
        |_| detect::policies::by_name(&options.detector).map_err(Error::Detector),
        on_done,
    )
}

/// [`run`] with any policy: `make_policy` builds a fresh one for each trace (a learned
/// Detector, say). The same scoring as for the built-in detectors.
pub fn run_policies(
    db: &Path,
    traces: &[Labelled],
    config: Config,
    make_policy: impl FnMut(&Labelled) -> Result<Box<dyn detect::Policy>>,
    mut on_done: impl FnMut(&Case),
) -> Result<Vec<Case>> {
    run_policies_transcribed(db, traces, config, make_policy, |case, _| on_done(case))
}

/// [`run_policies`], handing `on_done` each episode's transcript too.
pub fn run_policies_transcribed(
    db: &Path,
    traces: &[Labelled],
    config: Config,
    mut make_policy: impl FnMut(&Labelled) -> Result<Box<dyn detect::Policy>>,
    mut on_done: impl FnMut(&Case, &Transcript),
) -> Result<Vec<Case>> {
    let detector = Detector::new(PathBuf::from(db), config, false)
        .map_err(|e| Error::Detector(format!("starting the detector: {e}")))?;
    let mut cases = Vec::with_capacity(traces.len());
    for t in traces {
        let policy = make_policy(t)?;
        let transcript = detector
            .investigate(&t.trace_id, policy)
            .map_err(|source| Error::Detect {
                trace_id: t.trace_id.clone(),
                cause: Box::new(source),
            })?;
        let case = case_of(t, &transcript);
        on_done(&case, &transcript);
        cases.push(case);
    }
    Ok(cases)
}

/// Scores one investigation of `t`.
pub fn case_of(t: &Labelled, transcript: &Transcript) -> Case {
    let predicted = match transcript.verdict() {
        Some(Verdict::Deficiency {
            deficiency_id,
            component,
            ..
        }) => Some(Prediction {
            deficiency_id: deficiency_id.clone(),
            component: component.clone(),
            file: None,
            function: None,
        }),
        _ => None,
    };
    Case {
        trace_id: t.trace_id.clone(),
        truth: t.truth.clone(),
        predicted,
        tool_calls: tool_calls(transcript),
        agent: t.agent.clone(),
        outcome: transcript.outcome.describe(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_files_are_read_and_bad_lines_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("test.jsonl");
        std::fs::write(
            &path,
            "{\"trace_id\": \"a\", \"split\": \"test\"}\n\n{\"trace_id\": \"b\"}\n",
        )
        .unwrap();
        assert_eq!(read_split(&path).unwrap(), vec!["a", "b"]);
        std::fs::write(&path, "{\"trace_id\": \"a\"}\n{\"id\": 3}\n").unwrap();
        let err = read_split(&path).unwrap_err().to_string();
        assert!(err.contains("line 2") && err.contains("trace_id"), "{err}");
        std::fs::write(&path, "{\"trace_id\": \"a\"}\n{\"trace_id\": \"a\"}\n").unwrap();
        let err = read_split(&path).unwrap_err().to_string();
        assert!(err.contains("line 2") && err.contains("twice"), "{err}");
    }

    #[test]
    fn labelled_traces_come_from_the_store_and_splits_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("s.sqlite");
        let built = detect::synthetic::build_store(&db, 1).unwrap();
        let all = labelled_traces(&db, None).unwrap();
        assert_eq!(all.len(), built.len());
        assert_eq!(
            all[0].truth.deficiency_id,
            built[0].1.deficiency_id.clone().unwrap()
        );
        let one = vec![built[1].0.clone()];
        assert_eq!(labelled_traces(&db, Some(&one)).unwrap().len(), 1);
        let err = labelled_traces(&db, Some(&["nope".to_string()])).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn held_out_keeps_one_agents_traces() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("s.sqlite");
        let mut store = traces::Store::open(&db).unwrap();
        for (i, agent) in ["toolcaller", "planner", "toolcaller"].iter().enumerate() {
            let id = format!("{:032x}", i + 1);
            let (spans, mut label) = detect::synthetic::scenario("P16", &id, i as u64).unwrap();
            store.import_spans(spans, "test").unwrap();
            label.source = serde_json::json!({ "agent": agent });
            store.put_label(&label).unwrap();
        }
        drop(store);
        let all = labelled_traces(&db, None).unwrap();
        let kept = held_out(all.clone(), "toolcaller", &db).unwrap();
        assert_eq!(kept.len(), 2);
        let err = held_out(all, "camel", &db).unwrap_err().to_string();
        assert!(
            err.contains("camel") && err.contains("planner, toolcaller"),
            "{err}"
        );
    }
}
