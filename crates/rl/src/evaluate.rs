//! The trainer's two uses of a labelled corpus: held-out evaluation of the learned Detector
//! (greedy, the same scoring as `pathfinder eval`) and the expert's demonstrations on the
//! train split for the supervised warm start.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use detect::policies::ExpertPolicy;
use detect::{Ablations, Config, Detector};
use eval::store_eval::{self, Labelled};
use policy::{
    ActionGrammar, Conversation, DemoAnswer, DetectorOptions, LearnedDetector, SharedModel,
};

use crate::{Result, RlError};

fn eval_err(e: impl std::fmt::Display) -> RlError {
    RlError::Environment(e.to_string())
}

/// The traces of one split of a corpus.
#[derive(Debug, Clone)]
pub struct SplitTraces {
    pub db: PathBuf,
    pub traces: Vec<Labelled>,
}

/// Reads `corpus/splits/SPLIT.jsonl` against `corpus/store.sqlite`; at most `max` traces
/// (0: all). A split lists its records type by type and agent by agent, so a plain prefix of
/// it would hold a few types of one agent; a bounded selection takes the deficiency types in
/// turn, and within a type the agents in turn ([`interleave`]).
/// `split` may join several splits with `+` (`val+test`: the traces of both, in that order).
/// Traces of the frameworks in `except` (their labels' agents) are left out.
pub fn split_traces(
    corpus: &Path,
    split: &str,
    max: usize,
    except: &[String],
) -> Result<SplitTraces> {
    let db = corpus.join("store.sqlite");
    let mut ids = Vec::new();
    for name in split.split('+') {
        ids.extend(
            store_eval::read_split(&corpus.join("splits").join(format!("{name}.jsonl")))
                .map_err(eval_err)?,
        );
    }
    let mut traces = store_eval::labelled_traces(&db, Some(&ids)).map_err(eval_err)?;
    traces.retain(|t| !t.agent.as_ref().is_some_and(|a| except.contains(a)));
    if max > 0 && traces.len() > max {
        traces = interleave(interleave(traces, |t| t.agent.clone()), |t| {
            t.truth.id().to_owned()
        });
        traces.truncate(max);
    }
    if traces.is_empty() {
        return Err(RlError::Environment(format!(
            "{}: the {split} split is empty{}",
            corpus.display(),
            if except.is_empty() {
                String::new()
            } else {
                format!(" without {}", except.join(", "))
            }
        )));
    }
    Ok(SplitTraces { db, traces })
}

/// Every trace of `corpus` (all three splits) whose framework is one of `frameworks`: what a
/// Detector trained without them is judged on there.
pub fn framework_traces(corpus: &Path, frameworks: &[String]) -> Result<SplitTraces> {
    let mut all = split_traces(corpus, "train+val+test", 0, &[])?;
    all.traces
        .retain(|t| t.agent.as_ref().is_some_and(|a| frameworks.contains(a)));
    if all.traces.is_empty() {
        return Err(RlError::Environment(format!(
            "{}: no trace of {} in its splits",
            corpus.display(),
            frameworks.join(", ")
        )));
    }
    Ok(all)
}

/// The id the `i`-th trace of a rekeyed split gets: the shape of the ids the training steps
/// give their live traces (`t` and seven digits), so that the Detector is judged on, and
/// learns from, ids of the one length it copies during PPO.
pub fn short_id(i: usize) -> String {
    format!("t{i:07}")
}

/// Copies `split`'s traces, spans and labels into a fresh store at `db` under [`short_id`]s
/// (each label's `source` keeps the corpus's id as `corpus_trace_id`). Corpus ids are 32 hex
/// digits, which the expert's probes repeat and a small model miscopies; the live traces of a
/// training step are short. The store is built beside `db` and renamed over it, so an
/// interrupted copy leaves no half-written store.
pub fn rekey(split: &SplitTraces, db: &Path) -> Result<SplitTraces> {
    let store_err =
        |path: &Path, e: traces::Error| RlError::Environment(format!("{}: {e}", path.display()));
    let source = traces::Store::open_read_only(&split.db).map_err(|e| store_err(&split.db, e))?;
    let tmp = db.with_extension("sqlite.partial");
    // A store left by an interrupted copy, or by an earlier run.
    remove_store(&tmp)?;
    remove_store(db)?;
    let mut out = Vec::with_capacity(split.traces.len());
    {
        let mut store = traces::Store::open(&tmp).map_err(|e| store_err(&tmp, e))?;
        for (i, t) in split.traces.iter().enumerate() {
            let id = short_id(i);
            let spans = source
                .spans(&t.trace_id)
                .map_err(|e| store_err(&split.db, e))?
                .into_iter()
                .map(|mut s| {
                    s.trace_id.clone_from(&id);
                    s
                });
            store
                .import_spans(spans, &format!("{} {}", split.db.display(), t.trace_id))
                .map_err(|e| store_err(&tmp, e))?;
            for mut label in source
                .labels(&t.trace_id)
                .map_err(|e| store_err(&split.db, e))?
            {
                label.trace_id.clone_from(&id);
                let mut source = match std::mem::take(&mut label.source) {
                    serde_json::Value::Object(o) => o,
                    serde_json::Value::Null => serde_json::Map::new(),
                    other => serde_json::Map::from_iter([("value".to_owned(), other)]),
                };
                source.insert("corpus_trace_id".into(), t.trace_id.clone().into());
                label.source = source.into();
                store.put_label(&label).map_err(|e| store_err(&tmp, e))?;
            }
            out.push(Labelled {
                trace_id: id,
                ..t.clone()
            });
        }
    }
    std::fs::rename(&tmp, db).map_err(|e| RlError::io(db, e))?;
    Ok(SplitTraces {
        db: db.to_path_buf(),
        traces: out,
    })
}

/// Removes the SQLite store at `path` with its WAL files, those that exist.
pub(crate) fn remove_store(path: &Path) -> Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        let p = PathBuf::from(format!("{}{suffix}", path.display()));
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(RlError::io(&p, e)),
        }
    }
    Ok(())
}

/// Reorders traces round-robin over the values of `key` (in order of first appearance),
/// keeping each value's own order: the first N of the result cover every value as evenly as N
/// allows.
pub fn interleave<K: PartialEq>(
    traces: Vec<Labelled>,
    key: impl Fn(&Labelled) -> K,
) -> Vec<Labelled> {
    let mut queues: Vec<(K, std::collections::VecDeque<Labelled>)> = Vec::new();
    for t in traces {
        let k = key(&t);
        match queues.iter_mut().find(|(q, _)| *q == k) {
            Some((_, queue)) => queue.push_back(t),
            None => queues.push((k, [t].into())),
        }
    }
    let mut out = Vec::new();
    while queues.iter().any(|(_, q)| !q.is_empty()) {
        for (_, queue) in &mut queues {
            out.extend(queue.pop_front());
        }
    }
    out
}

/// The Detector's environment configuration for a learned policy: no subagents and no
/// history (the learned grammar has neither), `max_turns` turns.
pub fn learned_config(max_turns: usize) -> Config {
    Config {
        main_max_turns: max_turns,
        ablations: Ablations {
            no_subagents: true,
            no_history: true,
            ..Ablations::default()
        },
        ..Config::default()
    }
}

/// Held-out accuracy of a learned Detector.
#[derive(Debug, Clone, PartialEq)]
pub struct Accuracy {
    /// Over the deficient traces (labelled with a type, not `none`).
    pub detection: f64,
    pub localisation: f64,
    pub avg_tool_calls: f64,
    pub n: usize,
    /// Healthy traces called deficient, over the healthy traces (`None`: the split has none).
    pub false_positive_rate: Option<f64>,
}

/// The trainer's figures of a set of evaluated cases.
pub fn accuracy(cases: &[eval::metrics::Case]) -> Accuracy {
    let deficient: Vec<&eval::metrics::Case> = cases
        .iter()
        .filter(|c| !eval::metrics::healthy(c))
        .collect();
    let n = deficient.len().max(1) as f64;
    let fp: Vec<bool> = cases
        .iter()
        .filter_map(eval::metrics::false_positive)
        .collect();
    Accuracy {
        detection: deficient
            .iter()
            .filter(|c| eval::metrics::detected(c))
            .count() as f64
            / n,
        localisation: deficient
            .iter()
            .filter(|c| eval::metrics::localised(c) == Some(true))
            .count() as f64
            / n,
        avg_tool_calls: cases.iter().map(|c| c.tool_calls as f64).sum::<f64>()
            / cases.len().max(1) as f64,
        n: cases.len(),
        false_positive_rate: (!fp.is_empty())
            .then(|| fp.iter().filter(|f| **f).count() as f64 / fp.len() as f64),
    }
}

/// Investigates every trace of `split` greedily with `options.adapter`.
pub fn evaluate(
    shared: &SharedModel,
    grammar: &Arc<ActionGrammar>,
    options: &DetectorOptions,
    max_turns: usize,
    split: &SplitTraces,
    mut on_done: impl FnMut(&eval::metrics::Case),
) -> Result<Accuracy> {
    let cases = store_eval::run_policies(
        &split.db,
        &split.traces,
        learned_config(max_turns),
        |_| {
            Ok(Box::new(LearnedDetector::new(
                Arc::clone(shared),
                Arc::clone(grammar),
                DetectorOptions {
                    temperature: 0.0,
                    ..options.clone()
                },
            )))
        },
        |c| on_done(c),
    )
    .map_err(eval_err)?;
    Ok(accuracy(&cases))
}

/// Investigates every trace of `split` with the probe battery and the decision head (greedy).
pub fn evaluate_head(
    shared: &SharedModel,
    head: &Arc<policy::decision::DecisionHead>,
    adapter: &str,
    system: &Arc<String>,
    cache: Option<&Path>,
    split: &SplitTraces,
    mut on_done: impl FnMut(&eval::metrics::Case),
) -> Result<Accuracy> {
    let reader = crate::head::reader(shared, adapter, system, cache)?;
    let mut heads = crate::head::FramedHeads::new(Arc::clone(head));
    let cases = store_eval::run_policies(
        &split.db,
        &split.traces,
        learned_config(detect::probes::battery_turns()),
        |t| {
            let head = heads
                .for_framework(t.agent.as_deref())
                .map_err(|e| eval::Error::Detector(e.to_string()))?;
            Ok(crate::head::evaluation_policy(shared, &head, &reader))
        },
        |c| on_done(c),
    )
    .map_err(eval_err)?;
    Ok(accuracy(&cases))
}

/// The expert's investigations of `split`, rewritten as the learned Detector's conversations;
/// with `labels`, each ends in the trace's labelled answer instead of the expert's (a label
/// without a component gives no demonstration).
#[allow(clippy::too_many_arguments)]
pub fn demonstrations(
    shared: &SharedModel,
    grammar: &ActionGrammar,
    split: &SplitTraces,
    max_probes: usize,
    observation_chars: usize,
    labels: bool,
    mut on_done: impl FnMut(usize),
) -> Result<Vec<Conversation>> {
    let detector = Detector::new(split.db.clone(), Config::default(), false).map_err(eval_err)?;
    let mut out = Vec::new();
    for (i, t) in split.traces.iter().enumerate() {
        let answer = match (labels, t.truth.component.as_deref()) {
            (false, _) => DemoAnswer::Expert,
            (true, Some(component)) => DemoAnswer::Label(t.truth.id(), component),
            (true, None) => {
                on_done(i + 1);
                continue;
            }
        };
        let transcript = detector
            .investigate(&t.trace_id, Box::new(ExpertPolicy::new()))
            .map_err(eval_err)?;
        let pm = shared.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = policy::demonstration(
            &pm.tokenizer,
            pm.format,
            grammar,
            &transcript,
            false,
            max_probes,
            observation_chars,
            answer,
        )? {
            out.push(c);
        }
        on_done(i + 1);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(agent: &str, id: &str) -> Labelled {
        Labelled {
            trace_id: id.into(),
            truth: eval::metrics::Truth::deficiency("P1"),
            agent: Some(agent.into()),
        }
    }

    #[test]
    fn rekey_copies_spans_and_labels_under_short_ids() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("corpus.sqlite");
        let long = [
            "0123456789abcdef0123456789abcdef",
            "fedcba9876543210fedcba9876543210",
        ];
        {
            let mut store = traces::Store::open(&db).unwrap();
            for (n, id) in long.iter().enumerate() {
                let mut root = traces::Span::new(*id, "s1", "agent", traces::SpanKind::Agent);
                root.output = Some(format!("answer {n}"));
                let mut call = traces::Span::new(*id, "s2", "search", traces::SpanKind::Tool);
                call.parent_span_id = Some("s1".into());
                call.error_message = Some("HTTP 400".into());
                store.import_spans([root, call], "test").unwrap();
                let mut label = traces::Label::new(*id);
                label.truth.deficiency_id = Some(format!("P{}", n + 1));
                label.source = serde_json::json!({"agent": "a", "episode": n});
                store.put_label(&label).unwrap();
            }
        }
        let split = SplitTraces {
            traces: store_eval::labelled_traces(&db, None).unwrap(),
            db,
        };
        let out = dir.path().join("short.sqlite");
        // A store left by an earlier run is replaced, not added to.
        std::fs::write(&out, b"stale").unwrap();
        let short = rekey(&split, &out).unwrap();
        assert_eq!(short.db, out);
        let ids: Vec<&str> = short.traces.iter().map(|t| t.trace_id.as_str()).collect();
        assert_eq!(ids, ["t0000000", "t0000001"]);
        assert_eq!(short.traces[1].truth.id(), "P2");
        assert_eq!(short.traces[1].agent.as_deref(), Some("a"));

        let store = traces::Store::open_read_only(&out).unwrap();
        assert_eq!(store.trace_ids().unwrap(), ["t0000000", "t0000001"]);
        let spans = store.spans("t0000001").unwrap();
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].output.as_deref(), Some("answer 1"));
        assert_eq!(spans[1].parent_span_id.as_deref(), Some("s1"));
        assert_eq!(spans[1].error_message.as_deref(), Some("HTTP 400"));
        let labels = store.labels("t0000001").unwrap();
        assert_eq!(labels.len(), 1);
        assert_eq!(labels[0].source["corpus_trace_id"], long[1]);
        assert_eq!(labels[0].source["episode"], 1);
        // Labelled traces read from the new store are the ones rekey returned.
        let again = store_eval::labelled_traces(&out, None).unwrap();
        assert_eq!(again.len(), 2);
        assert_eq!(again[0].trace_id, "t0000000");
        assert!(!dir.path().join("short.sqlite.partial").exists());
    }

    #[test]
    fn interleave_takes_agents_in_turn_and_keeps_their_order() {
        let input = vec![
            labelled("a", "a1"),
            labelled("a", "a2"),
            labelled("a", "a3"),
            labelled("b", "b1"),
            labelled("c", "c1"),
            labelled("c", "c2"),
        ];
        let ids: Vec<String> = interleave(input, |t| t.agent.clone())
            .into_iter()
            .map(|t| t.trace_id)
            .collect();
        assert_eq!(ids, ["a1", "b1", "c1", "a2", "c2", "a3"]);
    }

    #[test]
    fn a_bounded_selection_covers_types_first_then_agents() {
        let typed = |ty: &str, agent: &str, id: &str| Labelled {
            truth: eval::metrics::Truth::deficiency(ty),
            ..labelled(agent, id)
        };
        // A split's order: type by type, agent by agent within a type.
        let input = vec![
            typed("P1", "a", "1a1"),
            typed("P1", "a", "1a2"),
            typed("P1", "b", "1b1"),
            typed("P2", "a", "2a1"),
            typed("P3", "b", "3b1"),
            typed("P3", "b", "3b2"),
        ];
        let by_agent = interleave(input, |t| t.agent.clone());
        let ids: Vec<String> = interleave(by_agent, |t| t.truth.id().to_owned())
            .into_iter()
            .map(|t| t.trace_id)
            .collect();
        // Every type before any repeats; within P1 the second pick is the other agent.
        assert_eq!(ids, ["1a1", "3b1", "2a1", "1b1", "3b2", "1a2"]);
    }
}
