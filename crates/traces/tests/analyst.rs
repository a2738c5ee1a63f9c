//! The fixtures (six chat logs in Who&When's format written for this project, in
//! tests/fixtures/who-and-when at the repository's root, and a hand-written OTLP/JSON file with
//! GenAI and OpenInference attributes) import and answer the four analyst queries with known
//! answers; labels stay out of everything the Detector sees.

mod common;

use common::{fixture, rows, who_and_when_fixtures};
use traces::{queries, schema, Format, Span, SpanKind, StatusCode, Store};

const TRACE_A: &str = "5b8efff798038103d269b633813fc60c";
const TRACE_B: &str = "0af7651916cd43dd8448eb211c80319c";

fn store_with_everything() -> (tempfile::TempDir, Store, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path().join("t.db")).unwrap();
    let report = store
        .import_file(fixture("otlp_genai_openinference.json"), Format::Auto)
        .unwrap();
    assert_eq!(
        (report.format, report.spans, report.trace_ids.len()),
        (Format::Otlp, 19, 2)
    );
    let (mut chat_ids, mut chat_spans) = (Vec::new(), 0);
    for path in who_and_when_fixtures() {
        let report = store.import_file(&path, Format::Auto).unwrap();
        assert_eq!(report.format, Format::Chatlog, "{}", path.display());
        assert_eq!(report.labels, 1, "{}", path.display());
        chat_spans += report.spans;
        chat_ids.extend(report.trace_ids);
    }
    // One span per turn: 6 + 7 + 8 + 8 (algorithm-generated/1–4) + 21 + 23 (hand-crafted/1–2).
    assert_eq!(chat_spans, 73);
    (dir, store, chat_ids)
}

#[test]
fn otlp_conventions_map_onto_columns() {
    let mut store = Store::open_in_memory().unwrap();
    store
        .import_file(fixture("otlp_genai_openinference.json"), Format::Otlp)
        .unwrap();
    let conn = store.connection();
    let a = rows(
        conn,
        &format!("SELECT framework, task, status, outcome, has_error, error_count, span_count, total_tokens, latency_ns, max_step, root_span_id FROM traces WHERE trace_id = '{TRACE_A}'"),
    );
    assert_eq!(
        a,
        vec![vec![
            "toolcaller",
            "gaia-007",
            "OK",
            "failed",
            "1",
            "2",
            "14",
            "2160",
            "8000000000",
            "7",
            "eee19b7ec3c1b174"
        ]]
    );
    let b = rows(conn, &format!("SELECT framework, task, has_error, total_tokens, latency_ns, max_step FROM traces WHERE trace_id = '{TRACE_B}'"));
    assert_eq!(
        b,
        vec![vec!["research-oi", "NULL", "1", "55", "500000000", "NULL"]]
    );

    let spans = store.spans(TRACE_B).unwrap();
    let llm = spans.iter().find(|s| s.kind == SpanKind::Llm).unwrap();
    assert_eq!(
        (llm.model.as_deref(), llm.input_tokens, llm.output_tokens),
        (Some("gpt-4o-mini"), Some(50), Some(5))
    );
    assert_eq!(
        llm.attributes["metadata"],
        serde_json::json!({"user": "ada", "retries": 2, "cached": false})
    );
    assert_eq!(llm.attributes["tag.tags"], serde_json::json!(["eval", 0.5]));
    let read = spans.iter().find(|s| s.name == "read_file").unwrap();
    assert_eq!(
        (read.kind, read.status),
        (SpanKind::Tool, StatusCode::Error)
    );
    assert_eq!(read.error_type.as_deref(), Some("FileNotFoundError"));
    assert_eq!(
        read.tool_arguments.as_deref(),
        Some("{\"path\": \"notes.txt\"}")
    );
    assert!(spans.iter().any(|s| s.kind == SpanKind::Retriever));

    let calc = store
        .spans(TRACE_A)
        .unwrap()
        .into_iter()
        .find(|s| s.tool_name.as_deref() == Some("calculator"))
        .unwrap();
    assert_eq!(
        calc.tool_arguments.as_deref(),
        Some("{\"expression\": \"1/0\"}")
    );
    assert_eq!(
        (
            calc.code_filepath.as_deref(),
            calc.code_function.as_deref(),
            calc.code_lineno
        ),
        (
            Some("toolcaller/tools.py"),
            Some("ToolRunner.run"),
            Some(41)
        )
    );
    assert_eq!(
        (calc.agent_name.as_deref(), calc.step),
        (Some("toolcaller"), Some(6))
    );
    assert_eq!(calc.error_message.as_deref(), Some("division by zero"));

    // Attributes answer json_extract with quoted dotted keys.
    let models = rows(conn, "SELECT DISTINCT json_extract(attributes, '$.\"gen_ai.request.model\"') FROM spans WHERE kind = 'llm' ORDER BY 1");
    assert_eq!(models, vec![vec!["NULL"], vec!["gpt-4o"]]);
}

#[test]
fn chat_logs_become_turn_spans_with_steps_agents_and_labels() {
    let (_dir, store, chat_ids) = store_with_everything();
    let conn = store.connection();
    assert_eq!(chat_ids.len(), 6);
    // algorithm-generated/1.json: six turns, Spreadsheet_Expert first, its code run at turn 1;
    // hand-crafted logs keep the agent in `role` (Magentic-One's "Orchestrator (thought)" →
    // Orchestrator). hand-crafted/1.json has 21 turns, hand-crafted/2.json 23.
    let first = store.spans(&chat_ids[0]).unwrap();
    assert_eq!(first.len(), 6);
    assert_eq!(
        (first[0].step, first[0].agent_name.as_deref()),
        (Some(0), Some("Spreadsheet_Expert"))
    );
    assert_eq!(first[1].kind, SpanKind::Tool);
    let hand = store.spans(&chat_ids[4]).unwrap();
    assert_eq!(hand.len(), 21);
    assert_eq!(hand[1].agent_name.as_deref(), Some("Orchestrator"));
    assert_eq!(hand[12].agent_name.as_deref(), Some("WebSurfer"));
    assert_eq!(store.spans(&chat_ids[5]).unwrap().len(), 23);

    let labels = store.labels(&chat_ids[4]).unwrap();
    assert_eq!(
        (labels[0].truth.agent.as_deref(), labels[0].truth.step),
        (Some("WebSurfer"), Some(12))
    );
    assert!(labels[0]
        .reason
        .as_deref()
        .unwrap()
        .contains("home-baking recipe site"));
    assert_eq!(labels[0].source["ground_truth"], "Crumb & Anchor");
    let steps: Vec<i64> = chat_ids
        .iter()
        .map(|id| store.labels(id).unwrap()[0].truth.step.unwrap())
        .collect();
    assert_eq!(steps, vec![0, 2, 4, 2, 12, 4]);
    // Every labelled step names a turn of the labelled agent.
    for id in &chat_ids {
        let label = &store.labels(id).unwrap()[0];
        let spans = store.spans(id).unwrap();
        assert_eq!(
            spans[label.truth.step.unwrap() as usize].agent_name,
            label.truth.agent,
            "{id}"
        );
    }
    let tasks = rows(conn, "SELECT COUNT(*) FROM traces WHERE source_format = 'chatlog' AND task IS NOT NULL AND latency_ns IS NULL");
    assert_eq!(tasks, vec![vec!["6"]]);
}

#[test]
fn the_four_analyst_queries_have_known_answers() {
    let (_dir, store, chat_ids) = store_with_everything();
    let conn = store.connection();

    // Error rate by tool: calculator 1/1, read_file 1/1, code_execution (chat logs: two runs in
    // algorithm-generated/1.json, one in 2, two in 3 of which one timed out, none in 4) 1/5,
    // search 1/6 (five GenAI calls with one timeout, one OpenInference call).
    let expected = vec![
        vec!["calculator", "1", "1", "1"],
        vec!["read_file", "1", "1", "1"],
        vec!["code_execution", "5", "1", "0.2"],
        vec!["search", "6", "1", "0.1667"],
    ];
    assert_eq!(rows(conn, queries::ERROR_RATE_BY_TOOL), expected);
    assert_eq!(rows(conn, queries::ERROR_RATE_BY_TOOL_RAW), expected);

    // The slowest traces: only the OTLP traces have times (8 s and 0.5 s).
    let slowest = rows(conn, queries::SLOWEST_TRACES);
    assert_eq!(
        slowest,
        vec![
            vec![TRACE_A, "8000000000", "14", "OK"],
            vec![TRACE_B, "500000000", "5", "OK"]
        ]
    );
    let raw: Vec<Vec<String>> = rows(conn, queries::SLOWEST_TRACES_RAW)
        .into_iter()
        .map(|r| r[..3].to_vec())
        .collect();
    assert_eq!(
        raw,
        slowest.iter().map(|r| r[..3].to_vec()).collect::<Vec<_>>()
    );

    // Five consecutive `search` calls in trace A (LLM spans between them do not break a run).
    let expected = vec![vec![TRACE_A, "search", "5"]];
    assert_eq!(rows(conn, queries::REPEATED_TOOL_RUNS), expected);
    assert_eq!(rows(conn, queries::REPEATED_TOOL_RUNS_RAW), expected);

    // Errors in the last 5 steps: trace A's calculator at step 6 (of 0..=7; the search timeout
    // at step 1 is too early) and the code-execution timeout at step 3 of
    // algorithm-generated/3.json (steps 0..=7). Trace B has no steps.
    let alg3 = &chat_ids[2];
    let mut expected = vec![
        vec![
            TRACE_A.to_string(),
            "6".into(),
            "a00000000000000c".into(),
            "execute_tool calculator".into(),
            "ZeroDivisionError".into(),
        ],
        vec![
            alg3.clone(),
            "3".into(),
            "0000000000000004".into(),
            "code_execution".into(),
            "exitcode 124".into(),
        ],
    ];
    expected.sort();
    assert_eq!(rows(conn, queries::ERRORS_IN_LAST_STEPS), expected);
    assert_eq!(rows(conn, queries::ERRORS_IN_LAST_STEPS_RAW), expected);
}

#[test]
fn discovery_fits_the_budget_hides_labels_and_redacts_secrets() {
    let (_dir, store, chat_ids) = store_with_everything();
    let full = schema::discover(store.connection(), 20_000).unwrap();
    for needle in [
        "traces (8 rows",
        "spans (",
        "trace_tools (",
        "kind TEXT",
        "json_extract(attributes, '$.\"gen_ai.tool.name\"')",
        "spans.kind:",
        "top spans.error_type:",
        "exitcode 124 (1)",
        "top spans.tool_name:",
        "top spans.agent_name:",
        "WebSurfer",
        "gen_ai.operation.name",
    ] {
        assert!(full.contains(needle), "discovery lacks {needle:?}:\n{full}");
    }
    for leak in ["labels", "mistake"] {
        assert!(!full.contains(leak), "discovery leaks {leak:?}:\n{full}");
    }
    let reason = store.labels(&chat_ids[4]).unwrap()[0]
        .reason
        .clone()
        .unwrap();
    assert!(!full.contains(&reason));
    for budget in [300, 1000, 2500] {
        let clipped = schema::discover(store.connection(), budget).unwrap();
        assert!(
            clipped.chars().count() <= budget,
            "{budget}: {}",
            clipped.chars().count()
        );
        assert!(
            clipped.starts_with("## Tables (SQLite)\ntraces ("),
            "{clipped}"
        );
    }
}

#[test]
fn discovery_redacts_secrets_in_sample_rows() {
    let mut store = Store::open_in_memory().unwrap();
    let mut secret = Span::new("secret-trace", "s1", "tool.http", SpanKind::Tool);
    secret.status = StatusCode::Error;
    secret.error_type = Some("HTTPError".into());
    secret.input =
        Some("Authorization: Bearer abcdefghijklmnopqrstuvwxyz123456 for ada@example.org".into());
    secret
        .attributes
        .insert("api_key".into(), "sk-ABCDEFGHIJKLMNOPQRSTUVWX".into());
    store.import_spans([secret], "test").unwrap();
    let text = schema::discover(store.connection(), 20_000).unwrap();
    assert!(
        text.contains("input=Authorization: [REDACTED] for [REDACTED]"),
        "{text}"
    );
    assert!(text.contains("HTTPError (1)"), "{text}");
    for leak in [
        "abcdefghijklmnopqrstuvwxyz123456",
        "ada@example.org",
        "sk-ABCDEF",
    ] {
        assert!(!text.contains(leak), "discovery leaks {leak:?}:\n{text}");
    }
}

#[test]
fn discovery_works_when_the_label_table_is_denied() {
    use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
    let (dir, store, _) = store_with_everything();
    drop(store);
    let reader = Store::open_read_only(dir.path().join("t.db")).unwrap();
    let conn = reader.connection();
    conn.authorizer(Some(|ctx: AuthContext<'_>| match ctx.action {
        AuthAction::Read {
            table_name: "labels",
            ..
        } => Authorization::Deny,
        _ => Authorization::Allow,
    }));
    let text = schema::discover(conn, 8000).unwrap();
    assert!(text.contains("spans ("));
    assert!(
        conn.prepare("SELECT reason FROM labels").is_err(),
        "the authorizer should deny labels"
    );
    for (_, indexed, _) in queries::ALL {
        conn.prepare(indexed).unwrap();
    }
    assert!(
        conn.execute("DELETE FROM spans", []).is_err(),
        "a read-only store must refuse writes"
    );
}

#[test]
fn export_writes_trace_json_and_reimportable_spans_without_labels() {
    let (dir, store, chat_ids) = store_with_everything();
    let out = dir.path().join("export");
    for id in [TRACE_A, TRACE_B, chat_ids[2].as_str()] {
        let files = store.export_trace(id, &out).unwrap();
        let trace: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&files.trace_json).unwrap()).unwrap();
        assert_eq!(trace["trace_id"], id);
        let jsonl = std::fs::read_to_string(&files.spans_jsonl).unwrap();
        assert_eq!(
            jsonl.lines().count() as i64,
            trace["span_count"].as_i64().unwrap()
        );

        // Re-import into a fresh store: the same spans come back.
        let mut fresh = Store::open_in_memory().unwrap();
        fresh.import_file(&files.spans_jsonl, Format::Auto).unwrap();
        assert_eq!(fresh.spans(id).unwrap(), reexported(&store, id));
    }
    let alg3 = store.export_trace(&chat_ids[2], &out).unwrap();
    let trace = std::fs::read_to_string(&alg3.trace_json).unwrap();
    assert!(
        trace.contains("\"tool_name\": \"code_execution\""),
        "{trace}"
    );
    let reason = store.labels(&chat_ids[2]).unwrap()[0]
        .reason
        .clone()
        .unwrap();
    for file in [&alg3.trace_json, &alg3.spans_jsonl] {
        let text = std::fs::read_to_string(file).unwrap();
        assert!(
            !text.contains(&reason) && !text.contains("mistake_") && !text.contains("ground_truth"),
            "{}",
            file.display()
        );
    }
    let err = store.export_trace("nope", &out).unwrap_err().to_string();
    assert_eq!(err, "trace nope is not in the store");
}

/// What a re-import of an exported trace yields: the same spans, with the model's fields now
/// also present as canonical attributes.
fn reexported(store: &Store, id: &str) -> Vec<Span> {
    store
        .spans(id)
        .unwrap()
        .into_iter()
        .map(|mut s| {
            s.attributes = traces::conventions::canonical_attributes(&s);
            s
        })
        .collect()
}

#[test]
fn labels_are_kept_apart_and_need_their_trace() {
    let mut store = Store::open_in_memory().unwrap();
    store
        .import_file(fixture("good_agent_trace.jsonl"), Format::Jsonl)
        .unwrap();
    let mut label = traces::Label::new("1f2e3d4c5b6a79881f2e3d4c5b6a7988");
    label.truth.deficiency_id = Some("P16".into());
    label.truth.component = Some("tools.validation".into());
    label.truth.file = Some("swe/agent.py".into());
    label.truth.function = Some("Agent.step".into());
    label.truth.line_start = Some(3);
    label.truth.line_end = Some(9);
    store.put_label(&label).unwrap();
    let mut back = store.labels(&label.trace_id).unwrap();
    assert_eq!(back.len(), 1);
    back[0].source = label.source.clone();
    assert_eq!(back[0], label);
}
