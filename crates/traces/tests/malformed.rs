//! Every malformed-input case: the error names where and why, and a rejected file leaves the
//! store exactly as it was. Repairs (clipping, orphans, exact duplicates) are reported.

mod common;

use common::{fixture, snapshot};
use traces::{Format, ImportOptions, Store};

/// A store that already holds the OTLP fixture, so "unchanged" is a real claim.
fn populated() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path().join("t.db")).unwrap();
    store
        .import_file(fixture("otlp_genai_openinference.json"), Format::Otlp)
        .unwrap();
    (dir, store)
}

/// Imports `name`, expects an error containing every `needles`, and checks nothing changed.
fn rejected(name: &str, format: Format, needles: &[&str]) -> String {
    let (_dir, mut store) = populated();
    let before = snapshot(&store);
    let err = store
        .import_file(fixture(name), format)
        .unwrap_err()
        .to_string();
    assert!(err.contains(name), "error does not name the file: {err}");
    for needle in needles {
        assert!(err.contains(needle), "error lacks {needle:?}: {err}");
    }
    assert_eq!(
        snapshot(&store),
        before,
        "store changed after rejecting {name}"
    );
    err
}

#[test]
fn non_utf8_bytes_are_rejected_with_their_offset() {
    let bytes = std::fs::read(fixture("non_utf8.jsonl")).unwrap();
    let offset = bytes.iter().position(|&b| b == 0xe9).unwrap();
    let err = rejected(
        "non_utf8.jsonl",
        Format::Auto,
        &["invalid UTF-8", "0xe9", "(line 2)"],
    );
    assert!(err.contains(&format!("byte {offset} ")), "{err}");
}

#[test]
fn deep_nesting_is_rejected_not_overflowed() {
    rejected(
        "deep_nesting.jsonl",
        Format::Jsonl,
        &["line 2", "recursion limit", "deeper than 128"],
    );
}

#[test]
fn parent_cycles_are_rejected_naming_the_cycle() {
    rejected(
        "parent_cycle.jsonl",
        Format::Jsonl,
        &[
            "parent cycle in trace 1f2e3d4c5b6a79881f2e3d4c5b6a7988",
            "00000000000000a1 → 00000000000000a3 → 00000000000000a2 → 00000000000000a1",
        ],
    );
}

#[test]
fn duplicate_span_ids_with_different_content_are_rejected() {
    rejected(
        "duplicate_span_id.jsonl",
        Format::Jsonl,
        &[
            "line 3",
            "duplicate span id 00000000000000a1",
            "first at line 2",
        ],
    );
}

#[test]
fn a_bad_line_late_in_a_file_commits_nothing_of_it() {
    rejected(
        "truncated.jsonl",
        Format::Jsonl,
        &["line 3, column 60", "EOF while parsing"],
    );
}

#[test]
fn otlp_base64_ids_are_rejected_with_their_json_path() {
    rejected(
        "otlp_base64_ids.json",
        Format::Auto,
        &[
            "resourceSpans[0].scopeSpans[0].spans[0].traceId",
            "32 hex digits",
            "not base64",
        ],
    );
}

#[test]
fn otlp_any_value_with_two_fields_is_rejected() {
    rejected(
        "otlp_bad_anyvalue.json",
        Format::Otlp,
        &["spans[0].attributes[0].value", "exactly one of its fields"],
    );
}

#[test]
fn chat_log_turn_without_role_is_rejected() {
    rejected(
        "chatlog_missing_role.json",
        Format::Chatlog,
        &["history[1].role: missing or not a string"],
    );
}

#[test]
fn chat_log_with_unparseable_mistake_step_is_rejected() {
    rejected(
        "chatlog_bad_step.json",
        Format::Auto,
        &["mistake_step", "non-negative step index", "\"second\""],
    );
}

#[test]
fn importing_a_trace_twice_is_rejected_whole() {
    let (_dir, mut store) = populated();
    let before = snapshot(&store);
    let err = store
        .import_file(fixture("otlp_genai_openinference.json"), Format::Otlp)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "trace 5b8efff798038103d269b633813fc60c is already in the store (imported from"
        ) && err.contains("nothing of this input was imported"),
        "{err}"
    );
    assert_eq!(snapshot(&store), before);
}

#[test]
fn undetectable_formats_ask_for_an_explicit_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("list.json");
    std::fs::write(&path, "[1, 2, 3]").unwrap();
    let mut store = Store::open(dir.path().join("t.db")).unwrap();
    let err = store
        .import_file(&path, Format::Auto)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot detect the format") && err.contains("--format"),
        "{err}"
    );
    assert!(store.trace_ids().unwrap().is_empty());
}

#[test]
fn missing_parents_and_exact_duplicates_are_repaired_and_reported() {
    let (_dir, mut store) = populated();
    let report = store
        .import_file(fixture("missing_parent.jsonl"), Format::Jsonl)
        .unwrap();
    assert_eq!(report.spans, 2);
    assert!(
        report.warnings.iter().any(|w| w.starts_with(
            "line 3: dropped an exact duplicate of span 00000000000000a5 (first at line 2)"
        )),
        "{:?}",
        report.warnings
    );
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("names parent 00000000000000ff, which is not in trace")),
        "{:?}",
        report.warnings
    );
    let spans = store.spans("1f2e3d4c5b6a79881f2e3d4c5b6a7988").unwrap();
    let orphan = spans
        .iter()
        .find(|s| s.span_id == "00000000000000a5")
        .unwrap();
    assert_eq!(orphan.parent_span_id, None);
    assert_eq!(
        orphan.attributes["pathfinder.import.missing_parent_span_id"],
        "00000000000000ff"
    );
}

#[test]
fn attributes_of_ten_megabytes_are_clipped_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let big = "x".repeat(10 * 1024 * 1024);
    let line = serde_json::json!({"trace_id": "77777777777777777777777777777777", "span_id": "0000000000000001",
        "name": "llm.chat", "kind": "llm", "start_time_unix_nano": 1, "end_time_unix_nano": 2,
        "status": {"code": "OK"}, "attributes": {"input.value": big, "gen_ai.request.model": "m"}});
    let path = dir.path().join("big.jsonl");
    std::fs::write(&path, format!("{line}\n")).unwrap();
    let mut store = Store::open(dir.path().join("t.db")).unwrap();
    let report = store.import_file(&path, Format::Jsonl).unwrap();
    let limit = ImportOptions::default().max_value_bytes;
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    assert!(
        report.warnings[0].starts_with(&format!(
            "line 1: clipped to {limit} bytes: input, attribute `input.value`"
        )),
        "{:?}",
        report.warnings
    );
    let span = &store.spans("77777777777777777777777777777777").unwrap()[0];
    let stored = span.attributes["input.value"].as_str().unwrap();
    assert!(
        stored.len() < limit + 64
            && stored.ends_with(&format!("…[clipped {} bytes]", big.len() - limit))
    );
    assert_eq!(span.input.as_deref(), Some(stored));
    assert_eq!(span.model.as_deref(), Some("m"));
}

#[test]
fn in_memory_spans_are_validated_like_files() {
    let mut store = Store::open_in_memory().unwrap();
    let mut a = traces::Span::new("t", "a", "x", traces::SpanKind::Tool);
    a.parent_span_id = Some("a".into());
    let err = store
        .import_spans([a], "episode-9")
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "episode-9: span #0: parent cycle in trace t: span a is its own parent"
    );
    assert!(store.trace_ids().unwrap().is_empty());
}

#[test]
fn a_file_of_one_trace_imports_under_the_id_the_caller_chose_and_two_traces_are_refused() {
    let (dir, mut store) = populated();
    let good = fixture("good_agent_trace.jsonl");
    let text = std::fs::read_to_string(&good).unwrap();
    let report = store
        .import_file_as(&good, Format::Jsonl, "t0000001")
        .unwrap();
    assert_eq!(report.trace_ids, vec!["t0000001".to_owned()]);
    let spans = store.spans("t0000001").unwrap();
    assert_eq!(
        spans.len(),
        text.lines().filter(|l| !l.trim().is_empty()).count()
    );
    assert!(spans.iter().all(|s| s.trace_id == "t0000001"));
    // The file itself is left as it was, and its own id is still free.
    assert_eq!(std::fs::read_to_string(&good).unwrap(), text);
    store.import_file(&good, Format::Jsonl).unwrap();

    // Spans of two traces in one file would merge into one: refused, naming the file, with
    // nothing of it imported.
    let two = dir.path().join("two.jsonl");
    let other = text.replace(
        "1f2e3d4c5b6a79881f2e3d4c5b6a7988",
        "2f2e3d4c5b6a79881f2e3d4c5b6a7988",
    );
    std::fs::write(&two, format!("{text}{other}")).unwrap();
    let before = snapshot(&store);
    let err = store
        .import_file_as(&two, Format::Jsonl, "t0000002")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("two.jsonl") && err.contains("2 traces"),
        "{err}"
    );
    assert_eq!(snapshot(&store), before);
}
