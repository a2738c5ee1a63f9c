//! The trainer's two uses of a labelled corpus: held-out evaluation of the learned Detector
//! (greedy, the same scoring as `pathfinder eval`) and the expert's demonstrations on the
//! train split for the supervised warm start.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use detect::policies::ExpertPolicy;
use detect::{Ablations, Config, Detector};
use eval::store_eval::{self, Labelled};
use policy::{ActionGrammar, Conversation, DetectorOptions, LearnedDetector, SharedModel};

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
/// (0: all). A split lists its records agent by agent, so a plain prefix of it would hold one
/// agent's traces only; a bounded selection takes the agents in turn instead ([`interleave`]).
pub fn split_traces(corpus: &Path, split: &str, max: usize) -> Result<SplitTraces> {
    let db = corpus.join("store.sqlite");
    let ids = store_eval::read_split(&corpus.join("splits").join(format!("{split}.jsonl")))
        .map_err(eval_err)?;
    let mut traces = store_eval::labelled_traces(&db, Some(&ids)).map_err(eval_err)?;
    if max > 0 && traces.len() > max {
        traces = interleave(traces);
        traces.truncate(max);
    }
    if traces.is_empty() {
        return Err(RlError::Environment(format!(
            "{}: the {split} split is empty",
            corpus.display()
        )));
    }
    Ok(SplitTraces { db, traces })
}

/// Reorders traces round-robin over their agents (in order of first appearance), keeping each
/// agent's own order: the first N of the result cover every agent as evenly as N allows.
pub fn interleave(traces: Vec<Labelled>) -> Vec<Labelled> {
    let mut queues: Vec<(Option<String>, std::collections::VecDeque<Labelled>)> = Vec::new();
    for t in traces {
        match queues.iter_mut().find(|(agent, _)| *agent == t.agent) {
            Some((_, queue)) => queue.push_back(t),
            None => queues.push((t.agent.clone(), [t].into())),
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
    pub detection: f64,
    pub localisation: f64,
    pub avg_tool_calls: f64,
    pub n: usize,
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
    let n = cases.len().max(1) as f64;
    Ok(Accuracy {
        detection: cases.iter().filter(|c| eval::metrics::detected(c)).count() as f64 / n,
        localisation: cases
            .iter()
            .filter(|c| eval::metrics::localised(c) == Some(true))
            .count() as f64
            / n,
        avg_tool_calls: cases.iter().map(|c| c.tool_calls as f64).sum::<f64>() / n,
        n: cases.len(),
    })
}

/// The expert's investigations of `split`, rewritten as the learned Detector's conversations.
#[allow(clippy::too_many_arguments)]
pub fn demonstrations(
    shared: &SharedModel,
    grammar: &ActionGrammar,
    split: &SplitTraces,
    max_probes: usize,
    observation_chars: usize,
    mut on_done: impl FnMut(usize),
) -> Result<Vec<Conversation>> {
    let detector = Detector::new(split.db.clone(), Config::default(), false).map_err(eval_err)?;
    let mut out = Vec::new();
    for (i, t) in split.traces.iter().enumerate() {
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
            truth: eval::metrics::Truth {
                deficiency_id: "P1".into(),
                component: None,
                file: None,
                function: None,
            },
            agent: Some(agent.into()),
        }
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
        let ids: Vec<String> = interleave(input).into_iter().map(|t| t.trace_id).collect();
        assert_eq!(ids, ["a1", "b1", "c1", "a2", "c2", "a3"]);
    }
}
