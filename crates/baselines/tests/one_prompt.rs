//! The one-prompt baselines on a tiny random model and a small labelled store: every trace
//! gets a verdict the catalog knows (the answer-only grammar), with no tool call, in the
//! store's order, and the same inputs give the same verdicts.

use std::path::Path;

use baselines::{rag, zero_shot};
use eval::metrics::Case;
use model::{DType, Device};
use policy::baseline::BaselineOptions;
use policy::PolicyModel;

/// A synthetic labelled store and its first `n` traces.
fn store(dir: &Path, n: usize) -> (std::path::PathBuf, Vec<eval::store_eval::Labelled>) {
    let db = dir.join("traces.db");
    let built = detect::synthetic::build_store(&db, 1).unwrap();
    let ids: Vec<String> = built.into_iter().take(n).map(|(id, _)| id).collect();
    let labelled = eval::store_eval::labelled_traces(&db, Some(&ids)).unwrap();
    assert_eq!(labelled.len(), n);
    (db, labelled)
}

fn tiny_model(dir: &Path) -> PolicyModel {
    let gguf = dir.join("tiny.gguf");
    model::testing::write_tiny_gguf(&gguf, 8192, 17).unwrap();
    PolicyModel::load(&gguf, DType::F32, &Device::Cpu).unwrap()
}

/// The tiny tokenizer spends one token per byte, so the catalog alone takes ~3,000 tokens.
fn options(max_prompt_tokens: usize) -> BaselineOptions {
    BaselineOptions {
        max_prompt_tokens,
        ..BaselineOptions::default()
    }
}

fn check_verdicts(cases: &[Case], traces: &[eval::store_eval::Labelled]) {
    let catalog = taxonomy::Catalog::embedded().unwrap();
    let seen: Vec<&str> = cases.iter().map(|c| c.trace_id.as_str()).collect();
    let want: Vec<&str> = traces.iter().map(|t| t.trace_id.as_str()).collect();
    assert_eq!(seen, want);
    for c in cases {
        let p = c
            .predicted
            .as_ref()
            .unwrap_or_else(|| panic!("no verdict: {c:?}"));
        assert!(
            p.deficiency_id()
                .is_some_and(|id| catalog.get(id).is_some()),
            "{c:?}"
        );
        assert!(
            p.component()
                .is_some_and(|c| catalog.component(c).is_some()),
            "{c:?}"
        );
        assert_eq!(c.tool_calls, 0, "{c:?}");
    }
}

#[test]
fn zero_shot_gives_every_trace_a_valid_verdict_even_when_the_trace_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (db, traces) = store(dir.path(), 3);
    let pm = tiny_model(dir.path());
    let mut done = 0;
    // 4,200 tokens leave a few hundred bytes of trace: every trace is cut.
    // Each case comes with its one-turn transcript (what the HTML pages show).
    let cases = zero_shot(&db, &traces, pm, &options(4200), |case, t| {
        done += 1;
        assert_eq!(t.policy, "zero-shot");
        assert_eq!(t.investigated_trace, case.trace_id);
        assert_eq!(t.turns.len(), 1, "one prompt, one answer");
    })
    .unwrap();
    assert_eq!(done, 3);
    check_verdicts(&cases, &traces);
    let again = zero_shot(
        &db,
        &traces,
        tiny_model(dir.path()),
        &options(4200),
        |_, _| {},
    )
    .unwrap();
    assert_eq!(
        cases.iter().map(|c| &c.predicted).collect::<Vec<_>>(),
        again.iter().map(|c| &c.predicted).collect::<Vec<_>>(),
        "greedy: the same verdicts again"
    );
}

#[test]
fn rag_gives_every_trace_a_valid_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let (db, traces) = store(dir.path(), 3);
    let embedder_dir = dir.path().join("embedder");
    retrieve::testing::write_tiny_embedder(&embedder_dir).unwrap();
    let embedder = retrieve::Embedder::load(&embedder_dir, &Device::Cpu).unwrap();
    let cases = rag(
        &db,
        &traces,
        tiny_model(dir.path()),
        &embedder,
        &options(6000),
        |_, _| {},
    )
    .unwrap();
    check_verdicts(&cases, &traces);
}

#[test]
fn a_budget_smaller_than_the_fixed_prompt_is_an_error_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (db, traces) = store(dir.path(), 1);
    let err = zero_shot(
        &db,
        &traces,
        tiny_model(dir.path()),
        &options(500),
        |_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("without the trace takes"), "{err}");
}

#[test]
fn the_shared_system_prefix_does_not_change_a_reply() {
    let dir = tempfile::tempdir().unwrap();
    let (db, traces) = store(dir.path(), 2);
    let opts = options(4200);
    let cached = zero_shot(&db, &traces, tiny_model(dir.path()), &opts, |_, _| {}).unwrap();

    // The same detector without the shared prefix: every prompt pre-filled from scratch.
    let pm = tiny_model(dir.path());
    let catalog = taxonomy::Catalog::embedded().unwrap();
    let grammar = std::sync::Arc::new(
        policy::ActionGrammar::new(&pm.tokenizer, &catalog, &policy::baseline::ANSWER_ONLY)
            .unwrap(),
    );
    let opts = BaselineOptions {
        max_answer_tokens: opts.max_answer_tokens.max(grammar.answer_budget(8)),
        ..opts
    };
    let system: std::sync::Arc<str> = policy::baseline::system_prompt(&catalog).into();
    let shared: policy::SharedModel = std::sync::Arc::new(std::sync::Mutex::new(pm));
    let store = traces::Store::open_read_only(&db).unwrap();
    let plain = eval::store_eval::run_policies(
        &db,
        &traces,
        baselines::config(),
        |t| {
            let lines = baselines::render_spans(&store.spans(&t.trace_id).unwrap(), 200);
            Ok(Box::new(policy::baseline::OnePromptDetector::new(
                std::sync::Arc::clone(&shared),
                std::sync::Arc::clone(&grammar),
                opts.clone(),
                "zero-shot",
                std::sync::Arc::clone(&system),
                lines.join("\n"),
            )))
        },
        |_| {},
    )
    .unwrap();
    let replies = |cases: &[Case]| cases.iter().map(|c| c.outcome.clone()).collect::<Vec<_>>();
    assert_eq!(replies(&cached), replies(&plain));
}
