//! Runs a Detector policy over every labelled trace of a store (or of a split) and turns each
//! episode into a [`Case`]. The store is opened read-only; labels are read here, outside the
//! episode, and only to score the answer.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use detect::{Ablations, Action, Config, Detector, Transcript, Verdict};

use crate::error::{Error, Result};
use crate::metrics::{Case, Truth};

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
        let Some(label) = labels.into_iter().find(|l| l.truth.deficiency_id.is_some()) else {
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
            truth: label.truth,
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

/// Labels given beside a store rather than in it (`pathfinder eval --labels`), for traces
/// imported from anywhere: the traces to evaluate, and what the file named that the store
/// does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalLabels {
    /// The labelled traces the store holds, in the file's order.
    pub traces: Vec<Labelled>,
    /// Trace ids the file labels that are not in the store (listed in the report, not
    /// silently dropped).
    pub unknown: Vec<String>,
    /// Labels naming the step (scored as step localisation) and the agent (kept for the record:
    /// no detector of a store answers with an agent yet) where the failure shows.
    pub with_step: usize,
    pub with_agent: usize,
}

/// One line of a label file.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LabelLine {
    trace_id: String,
    deficiency_id: String,
    #[serde(default)]
    component: Option<String>,
    #[serde(default)]
    file: Option<String>,
    #[serde(default)]
    function: Option<String>,
    #[serde(default)]
    step: Option<i64>,
    #[serde(default)]
    agent: Option<String>,
}

/// Reads a label file: JSON Lines with `trace_id` and `deficiency_id` (a catalog id or
/// `none` for a healthy trace) and optionally `component`, `file`, `function`, `step` and
/// `agent`. A malformed line, an unknown type or a trace labelled twice is refused with its
/// line; labels of traces the store lacks are returned in [`ExternalLabels::unknown`]. With
/// `only` (a split), just those traces are kept.
pub fn read_labels(
    path: &Path,
    db: &Path,
    catalog: &taxonomy::Catalog,
    only: Option<&[String]>,
) -> Result<ExternalLabels> {
    let text = std::fs::read_to_string(path).map_err(|cause| Error::Io {
        path: path.to_path_buf(),
        cause,
    })?;
    let bad = |line: usize, reason: String| Error::Labels {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let store_err = |source| Error::Store {
        path: db.to_path_buf(),
        cause: Box::new(source),
    };
    let known: HashSet<String> = traces::Store::open_read_only(db)
        .and_then(|s| s.trace_ids())
        .map_err(store_err)?
        .into_iter()
        .collect();
    let only: Option<HashSet<&str>> = only.map(|ids| ids.iter().map(String::as_str).collect());
    let mut out = ExternalLabels {
        traces: Vec::new(),
        unknown: Vec::new(),
        with_step: 0,
        with_agent: 0,
    };
    let mut seen = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let l: LabelLine = serde_json::from_str(line).map_err(|e| bad(i + 1, e.to_string()))?;
        if l.trace_id.is_empty() {
            return Err(bad(i + 1, "`trace_id` is empty".into()));
        }
        let deficiency_id = if l.deficiency_id.eq_ignore_ascii_case(taxonomy::NONE) {
            taxonomy::NONE.to_owned()
        } else {
            catalog
                .get(&l.deficiency_id)
                .map(|d| d.id.clone())
                .ok_or_else(|| {
                    bad(
                        i + 1,
                        format!(
                            "`deficiency_id` {:?} is neither a catalog id (P1-P27, C1-C23) nor `none`",
                            l.deficiency_id
                        ),
                    )
                })?
        };
        if deficiency_id == taxonomy::NONE
            && (l.component.is_some() || l.file.is_some() || l.function.is_some())
        {
            return Err(bad(
                i + 1,
                "a healthy trace (`none`) has no component, file or function".into(),
            ));
        }
        if let Some(c) = l.component.as_deref() {
            if catalog.component(c).is_none() {
                return Err(bad(
                    i + 1,
                    format!("`component` {c:?} is not in the catalog's component vocabulary"),
                ));
            }
        }
        if l.step.is_some_and(|s| s < 0) {
            return Err(bad(i + 1, "`step` must be 0 or more".into()));
        }
        if !seen.insert(l.trace_id.clone()) {
            return Err(bad(
                i + 1,
                format!("trace {} is labelled twice", l.trace_id),
            ));
        }
        if only
            .as_ref()
            .is_some_and(|o| !o.contains(l.trace_id.as_str()))
        {
            continue;
        }
        if !known.contains(&l.trace_id) {
            out.unknown.push(l.trace_id);
            continue;
        }
        out.with_step += usize::from(l.step.is_some());
        out.with_agent += usize::from(l.agent.is_some());
        out.traces.push(Labelled {
            trace_id: l.trace_id,
            truth: Truth {
                deficiency_id: Some(deficiency_id),
                component: l.component,
                file: l.file,
                function: l.function,
                step: l.step,
                agent: l.agent,
                ..Truth::default()
            },
            agent: None,
        });
    }
    if out.traces.is_empty() {
        return Err(Error::Nothing {
            path: path.to_path_buf(),
            reason: if out.unknown.is_empty() {
                "the file labels no trace".into()
            } else {
                format!(
                    "none of its {} labelled traces is in {} (first: {})",
                    out.unknown.len(),
                    db.display(),
                    out.unknown[0]
                )
            },
        });
    }
    Ok(out)
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
    /// Healthy runs the detector may compare with ([`detect::Config::references`]).
    pub references: Option<std::sync::Arc<detect::References>>,
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
        references: options.references.clone(),
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
    let store_err = |source| Error::Store {
        path: db.to_path_buf(),
        cause: Box::new(source),
    };
    let store = traces::Store::open_read_only(db).map_err(store_err)?;
    let mut cases = Vec::with_capacity(traces.len());
    for t in traces {
        let policy = make_policy(t)?;
        let transcript = detector
            .investigate(&t.trace_id, policy)
            .map_err(|source| Error::Detect {
                trace_id: t.trace_id.clone(),
                cause: Box::new(source),
            })?;
        let mut case = case_of(t, &transcript);
        // The agent an answered step blames: the agent of that step's spans.
        if let Some(step) = case.predicted.as_ref().and_then(Verdict::step) {
            case.answered_agent = store.agent_at_step(&t.trace_id, step).map_err(store_err)?;
        }
        on_done(&case, &transcript);
        cases.push(case);
    }
    Ok(cases)
}

/// Scores one investigation of `t`.
pub fn case_of(t: &Labelled, transcript: &Transcript) -> Case {
    // Blame answers are scored by the chat-log evaluation, not here.
    let predicted = transcript.deficiency_verdict().cloned();
    Case {
        trace_id: t.trace_id.clone(),
        truth: t.truth.clone(),
        predicted,
        answered_agent: None,
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
        assert_eq!(all[0].truth.deficiency_id, built[0].1.truth.deficiency_id);
        let one = vec![built[1].0.clone()];
        assert_eq!(labelled_traces(&db, Some(&one)).unwrap().len(), 1);
        let err = labelled_traces(&db, Some(&["nope".to_string()])).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn label_files_label_any_store_and_refuse_bad_lines_by_number() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("s.sqlite");
        let built = detect::synthetic::build_store(&db, 1).unwrap();
        let (a, b) = (built[0].0.clone(), built[1].0.clone());
        let catalog = taxonomy::Catalog::embedded().unwrap();
        let path = dir.path().join("labels.jsonl");
        let write = |lines: &[String]| std::fs::write(&path, lines.join("\n")).unwrap();
        // The file's labels, not the store's: `a` is called healthy, `b` P16 at a component,
        // and a third trace the store lacks is listed, not dropped.
        write(&[
            format!("{{\"trace_id\": \"{a}\", \"deficiency_id\": \"NONE\"}}"),
            String::new(),
            format!(
                "{{\"trace_id\": \"{b}\", \"deficiency_id\": \"p16\", \"component\": \"tools.schema\", \"step\": 3, \"agent\": \"planner\"}}"
            ),
            "{\"trace_id\": \"elsewhere\", \"deficiency_id\": \"C3\"}".into(),
        ]);
        let read = read_labels(&path, &db, &catalog, None).unwrap();
        assert_eq!(read.traces.len(), 2);
        assert_eq!(read.traces[0].trace_id, a);
        assert_eq!(read.traces[0].truth.id(), taxonomy::NONE);
        assert_eq!(read.traces[1].truth.id(), "P16");
        assert_eq!(
            read.traces[1].truth.component.as_deref(),
            Some("tools.schema")
        );
        assert_eq!(read.unknown, vec!["elsewhere"]);
        assert_eq!((read.with_step, read.with_agent), (1, 1));
        // A split keeps its traces only.
        let only = read_labels(&path, &db, &catalog, Some(std::slice::from_ref(&b))).unwrap();
        assert_eq!(only.traces.len(), 1);
        assert!(only.unknown.is_empty());
        // Bad lines, each refused with its number and reason.
        let ok = format!("{{\"trace_id\": \"{a}\", \"deficiency_id\": \"P1\"}}");
        for (line, needle) in [
            ("not json".to_string(), "line 2"),
            (format!("{{\"trace_id\": \"{b}\"}}"), "deficiency_id"),
            (format!("{{\"trace_id\": \"{b}\", \"deficiency_id\": \"P99\"}}"), "P99"),
            (format!("{{\"trace_id\": \"{b}\", \"deficiency_id\": \"P1\", \"typo\": 1}}"), "typo"),
            (format!("{{\"trace_id\": \"{b}\", \"deficiency_id\": \"none\", \"file\": \"x.py\"}}"), "healthy"),
            (format!("{{\"trace_id\": \"{b}\", \"deficiency_id\": \"P1\", \"component\": \"nowhere\"}}"), "nowhere"),
            (format!("{{\"trace_id\": \"{b}\", \"deficiency_id\": \"P1\", \"step\": -1}}"), "step"),
            (ok.clone(), "twice"),
        ] {
            write(&[ok.clone(), line]);
            let err = read_labels(&path, &db, &catalog, None).unwrap_err().to_string();
            assert!(err.contains("line 2") && err.contains(needle), "{needle}: {err}");
        }
        // Nothing the store holds: an error that says so.
        write(&["{\"trace_id\": \"elsewhere\", \"deficiency_id\": \"C3\"}".into()]);
        let err = read_labels(&path, &db, &catalog, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("elsewhere"), "{err}");
    }

    /// A framework that maps onto none of our components and records no code locations: the
    /// importer takes the failing tool's location from its exception's stack trace, the expert
    /// answers with it, and code localisation credits it against the label's file and function.
    #[test]
    fn foreign_traces_are_localised_to_the_code_their_exceptions_name() {
        let dir = tempfile::tempdir().unwrap();
        let trace = "5b8aa5a2d2c872e8321cf37308d69df2";
        let stack = "Traceback (most recent call last):\n  File \"/venv/lib/python3.11/site-packages/fw/tools.py\", line 80, in call\n    return fn(**args)\n  File \"/tmp/run/app/tools.py\", line 97, in read_file\n    lines = path.read_text(encoding='utf-8')\n  File \"/usr/lib/python3.11/pathlib.py\", line 1059, in read_text\nUnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9";
        let span = |id: &str,
                    parent: Option<&str>,
                    name: &str,
                    start: u64,
                    attrs: serde_json::Value,
                    failed: bool| {
            let mut s = serde_json::json!({
                "traceId": trace, "spanId": id, "name": name,
                "startTimeUnixNano": (start * 1_000_000).to_string(),
                "endTimeUnixNano": ((start + 1) * 1_000_000).to_string(),
                "attributes": attrs,
            });
            if let Some(p) = parent {
                s["parentSpanId"] = p.into();
            }
            if failed {
                s["status"] = serde_json::json!({"code": 2, "message": "UnicodeDecodeError"});
                s["events"] = serde_json::json!([{"name": "exception", "timeUnixNano": "1",
                    "attributes": [
                        {"key": "exception.type", "value": {"stringValue": "UnicodeDecodeError"}},
                        {"key": "exception.message", "value": {"stringValue": "'utf-8' codec can't decode byte 0xe9"}},
                        {"key": "exception.stacktrace", "value": {"stringValue": stack}}]}]);
            }
            s
        };
        let kv = |k: &str, v: &str| serde_json::json!({"key": k, "value": {"stringValue": v}});
        let doc = serde_json::json!({"resourceSpans": [{"scopeSpans": [{"spans": [
            span("00000000000000a1", None, "invoke_agent app", 0,
                 serde_json::json!([kv("gen_ai.operation.name", "invoke_agent")]), true),
            span("00000000000000a2", Some("00000000000000a1"), "chat model", 1,
                 serde_json::json!([kv("gen_ai.operation.name", "chat"), kv("gen_ai.request.model", "m")]), false),
            span("00000000000000a3", Some("00000000000000a1"), "execute_tool read_file", 2,
                 serde_json::json!([kv("gen_ai.operation.name", "execute_tool"), kv("gen_ai.tool.name", "read_file"),
                                    kv("gen_ai.tool.call.arguments", "{\"path\": \"notes.md\"}")]), true),
        ]}]}]});
        let otlp = dir.path().join("run.json");
        std::fs::write(&otlp, doc.to_string()).unwrap();
        let db = dir.path().join("s.sqlite");
        traces::Store::open(&db)
            .unwrap()
            .import_file(&otlp, traces::Format::Otlp)
            .unwrap();
        let labels = dir.path().join("labels.jsonl");
        std::fs::write(
            &labels,
            format!("{{\"trace_id\": \"{trace}\", \"deficiency_id\": \"P24\", \"component\": \"parsing.encoding\", \"file\": \"app/tools.py\", \"function\": \"read_file\"}}\n"),
        )
        .unwrap();
        let catalog = taxonomy::Catalog::embedded().unwrap();
        let read = read_labels(&labels, &db, &catalog, None).unwrap();
        let options = RunOptions {
            detector: "expert".into(),
            ablations: Ablations::default(),
            references: None,
        };
        let cases = run(&db, &read.traces, &options, |_| {}).unwrap();
        let at = cases[0].predicted.as_ref().and_then(Verdict::location);
        let at = at.expect("a verdict naming a location");
        assert_eq!(at.file.as_deref(), Some("/tmp/run/app/tools.py"));
        assert_eq!(at.function.as_deref(), Some("read_file"));
        assert_eq!(crate::metrics::code_localised(&cases[0]), Some(true));
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
