//! Fixtures for tests of the trainer, here and in the crates above it.

use std::collections::BTreeMap;
use std::path::Path;

use crate::{Result, RlError};

/// A small labelled corpus in `dir` (the layout `corpus generate` writes, without episodes):
/// the detector's synthetic scenarios three times over in `store.sqlite`, two repeats of each
/// in the train split, the third in val (even scenarios) or test (odd ones).
pub fn synthetic_corpus(dir: &Path) -> Result<()> {
    let splits_dir = dir.join("splits");
    std::fs::create_dir_all(&splits_dir).map_err(|e| RlError::io(&splits_dir, e))?;
    let labels = detect::synthetic::build_store(&dir.join("store.sqlite"), 3)
        .map_err(|e| RlError::Environment(e.to_string()))?;
    let mut splits: BTreeMap<&str, String> = BTreeMap::new();
    for (i, (trace_id, _)) in labels.iter().enumerate() {
        let (scenario, repeat) = (i / 3, i % 3);
        let split = match (repeat, scenario % 2) {
            (0 | 1, _) => "train",
            (_, 0) => "val",
            _ => "test",
        };
        splits
            .entry(split)
            .or_default()
            .push_str(&format!("{{\"trace_id\": \"{trace_id}\"}}\n"));
    }
    for (split, text) in splits {
        let path = splits_dir.join(format!("{split}.jsonl"));
        std::fs::write(&path, text).map_err(|e| RlError::io(&path, e))?;
    }
    let records = dir.join("corpus.jsonl");
    std::fs::write(&records, "").map_err(|e| RlError::io(&records, e))
}

/// Adds `n` labelled three-agent runs to the corpus in `dir` (after [`synthetic_corpus`]): each
/// a planner's turn, then a coder whose code a tool executes and a checker, twice; one of the
/// two executions fails, and the record's departure is the coder turn that wrote its code
/// (the first execution in even runs, the second in odd ones). Two runs in three go to the
/// train split, the rest alternate between val and test. `corpus chatlogs` makes a blame log
/// of each.
pub fn add_blame_logs(dir: &Path, n: usize) -> Result<()> {
    use traces::{Span, SpanKind, StatusCode};
    let db = dir.join("store.sqlite");
    let mut store = traces::Store::open(&db)
        .map_err(|e| RlError::Environment(format!("{}: {e}", db.display())))?;
    let mut lines = String::new();
    for k in 0..n {
        let trace_id = format!("{:032x}", 0xb1a3_e000_u64 + k as u64);
        let fails_first = k % 2 == 0;
        let turn = |i: usize, kind: SpanKind, agent: &str, text: &str| {
            let mut s = Span::new(&trace_id, format!("{:016x}", i + 1), "turn", kind);
            s.parent_span_id = (i > 0).then(|| format!("{:016x}", 1));
            s.agent_name = Some(agent.into());
            s.output = Some(text.into());
            s.start_time_ns = Some(1_000 * i as i64);
            s.end_time_ns = Some(1_000 * i as i64 + 500);
            s
        };
        let exec = |i: usize, fails: bool, args: &str, out: &str| {
            let mut s = turn(i, SpanKind::Tool, "Coder", out);
            s.tool_name = Some("calculator".into());
            s.tool_arguments = Some(args.into());
            if fails {
                s.status = StatusCode::Error;
                s.error_type = Some("ValueError".into());
                s.error_message = Some("bad operand".into());
            }
            s
        };
        let mut root = turn(0, SpanKind::Agent, "Planner", "");
        root.input = Some(format!(
            "Question {k}: what is twice the sum of 12 and {k}?"
        ));
        let spans = vec![
            root,
            turn(
                1,
                SpanKind::Llm,
                "Planner",
                "Plan: the coder adds, then doubles.",
            ),
            turn(2, SpanKind::Llm, "Coder", &format!("add(12, {k})")),
            exec(3, fails_first, &format!("12+{k}"), &format!("{}", 12 + k)),
            turn(4, SpanKind::Llm, "Checker", "The sum looks right."),
            turn(5, SpanKind::Llm, "Coder", "double the sum"),
            exec(6, !fails_first, "sum*2", &format!("{}", 2 * (12 + k))),
            turn(
                7,
                SpanKind::Llm,
                "Checker",
                &format!("Final answer: {}", 2 * (12 + k)),
            ),
        ];
        let departure = if fails_first { 2 } else { 5 };
        store
            .import_spans(spans, "synthetic-blame")
            .map_err(|e| RlError::Environment(e.to_string()))?;
        let clean = corpus::RunSummary {
            end: "answer".into(),
            success: true,
            features: Default::default(),
            contained: Vec::new(),
        };
        let record = corpus::record::Record {
            split: match k % 6 {
                2 => "val",
                5 => "test",
                _ => "train",
            }
            .into(),
            trace_id: trace_id.clone(),
            manifest: corpus::Manifest {
                id: format!("blame-{k}"),
                agent: "trio".into(),
                task: format!("trio-{k:03}"),
                deficiency: "P3".into(),
                variant: "v".into(),
                strategy: "template".into(),
                template: "trio/P3-v.toml".into(),
                seed: k as u64,
                diff: String::new(),
                location: None,
                commit: None,
                clean: clean.clone(),
                injected: Some(clean),
                validation: corpus::Validation::not_applied(String::new()),
                trace: None,
            },
            departure: Some(corpus::clean_twin::Departure {
                seq: departure,
                span: format!("{:016x}", departure + 1),
                step: None,
                agent: Some("Coder".into()),
                by: "behaviour".into(),
            }),
        };
        lines
            .push_str(&serde_json::to_string(&record).map_err(|e| RlError::Sample(e.to_string()))?);
        lines.push('\n');
    }
    let path = dir.join("corpus.jsonl");
    let mut text = std::fs::read_to_string(&path).unwrap_or_default();
    text.push_str(&lines);
    std::fs::write(&path, text).map_err(|e| RlError::io(&path, e))
}
