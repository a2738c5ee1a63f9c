//! One run written two ways — our agents' JSON Lines, and an OTLP export under OpenInference's
//! conventions with another framework's span names, service, module paths, tool and agent
//! names and a wrapper span — reads the same through the store's `events` view, and the
//! probes a learned reader reads give the same digests. A learned Detector's features are a
//! function of those digests, so its answer cannot tell the two apart.

use std::path::Path;

use detect::probes::{self, ProbeResult};
use detect::sql::{SqlLimits, SqlTool};
use serde_json::{json, Value};
use traces::import::Format;

const TRACE: &str = "0123456789abcdef0123456789abcdef";

/// The run in the agents' contract format: an agent turn, a model call, a tool call that times
/// out, a second model call, a tool call that succeeds, a final model call.
fn contract_jsonl() -> String {
    let span = |id: &str,
                parent: Option<&str>,
                name: &str,
                kind: &str,
                (start, end): (i64, i64),
                error: Option<(&str, &str)>,
                attrs: Value| {
        let mut a = attrs;
        a["code.filepath"] = json!("toolcaller/toolcaller/agent.py");
        a["code.function"] = json!("toolcaller.agent.Agent.step");
        a["gen_ai.agent.name"] = json!("researcher");
        if let Some((ty, _)) = error {
            a["error.type"] = json!(ty);
        }
        json!({
            "trace_id": TRACE,
            "span_id": id,
            "parent_span_id": parent,
            "name": name,
            "kind": kind,
            "start_time_unix_nano": start,
            "end_time_unix_nano": end,
            "status": match error {
                Some((_, message)) => json!({"code": "ERROR", "message": message}),
                None => json!({"code": "OK", "message": ""}),
            },
            "attributes": a,
        })
        .to_string()
    };
    [
        span("00000000000000a0", None, "agent.run", "agent", (1_000, 9_000), None, json!({})),
        span(
            "00000000000000a1",
            Some("00000000000000a0"),
            "llm.chat",
            "llm",
            (1_100, 1_500),
            None,
            json!({"gen_ai.usage.input_tokens": 812, "gen_ai.usage.output_tokens": 14, "output.value": "search for it", "gen_ai.response.finish_reasons": ["tool_calls"]}),
        ),
        span(
            "00000000000000a2",
            Some("00000000000000a0"),
            "tool.search",
            "tool",
            (1_600, 2_000),
            Some(("asyncio.exceptions.TimeoutError", "toolcaller.tools.search timed out after 30 s")),
            json!({"gen_ai.tool.name": "search", "gen_ai.tool.call.arguments": "{\"query\": \"tallest tower\"}"}),
        ),
        span(
            "00000000000000a3",
            Some("00000000000000a0"),
            "llm.chat",
            "llm",
            (2_100, 2_500),
            None,
            json!({"gen_ai.usage.input_tokens": 901, "gen_ai.usage.output_tokens": 12, "output.value": "read the notes", "gen_ai.response.finish_reasons": ["tool_calls"]}),
        ),
        span(
            "00000000000000a4",
            Some("00000000000000a0"),
            "tool.read_file",
            "tool",
            (2_600, 3_000),
            None,
            json!({"gen_ai.tool.name": "read_file", "gen_ai.tool.call.arguments": "{\"path\": \"notes.txt\"}", "output.value": "330 m"}),
        ),
        span(
            "00000000000000a5",
            Some("00000000000000a0"),
            "llm.chat",
            "llm",
            (3_100, 3_500),
            None,
            json!({"gen_ai.usage.input_tokens": 960, "gen_ai.usage.output_tokens": 9, "output.value": "330 m", "gen_ai.response.finish_reasons": ["stop"]}),
        ),
    ]
    .join("\n")
}

fn attr(key: &str, value: Value) -> Value {
    let v = match value {
        Value::String(s) => json!({"stringValue": s}),
        Value::Number(n) if n.is_i64() => json!({"intValue": n.to_string()}),
        other => json!({"stringValue": other.to_string()}),
    };
    json!({"key": key, "value": v})
}

/// The same run as another framework exports it: OpenInference span kinds, token counts and
/// finish reasons, its own span names, service, module paths and agent name, an exception
/// event instead of `error.type`, status left unset on success, and a workflow span wrapped
/// around the turn.
fn openinference_otlp(prefix: &str, service: &str, module: &str) -> String {
    let code = |attrs: &mut Vec<Value>| {
        attrs.push(attr(
            "code.filepath",
            json!(format!("/srv/{module}/{module}/runner.py")),
        ));
        attrs.push(attr(
            "code.function",
            json!(format!("{module}.runner.Runner.execute")),
        ));
    };
    let span = |id: &str,
                parent: &str,
                name: &str,
                kind: &str,
                (start, end): (i64, i64),
                mut attrs: Vec<Value>,
                error: Option<(&str, &str)>| {
        attrs.push(attr("openinference.span.kind", json!(kind)));
        attrs.push(attr("agent.name", json!("Analyst")));
        code(&mut attrs);
        let events = match error {
            Some((ty, message)) => json!([{
                "name": "exception",
                "timeUnixNano": end.to_string(),
                "attributes": [attr("exception.type", json!(ty)), attr("exception.message", json!(message))]
            }]),
            None => json!([]),
        };
        json!({
            "traceId": TRACE,
            "spanId": id,
            "parentSpanId": parent,
            "name": format!("{prefix}{name}"),
            "kind": 1,
            "startTimeUnixNano": start.to_string(),
            "endTimeUnixNano": end.to_string(),
            "attributes": attrs,
            "events": events,
            "status": match error {
                Some((_, message)) => json!({"code": 2, "message": message}),
                None => json!({}),
            },
        })
    };
    let spans = vec![
        span(
            "00000000000000f0",
            "",
            "workflow",
            "CHAIN",
            (900, 9_100),
            vec![],
            None,
        ),
        span(
            "00000000000000a0",
            "00000000000000f0",
            "Agent",
            "AGENT",
            (1_000, 9_000),
            vec![],
            None,
        ),
        span(
            "00000000000000a1",
            "00000000000000a0",
            "ChatCompletion",
            "LLM",
            (1_100, 1_500),
            vec![
                attr("llm.token_count.prompt", json!(812)),
                attr("llm.token_count.completion", json!(14)),
                attr("output.value", json!("search for it")),
                attr("llm.finish_reason", json!("tool_calls")),
            ],
            None,
        ),
        span(
            "00000000000000a2",
            "00000000000000a0",
            "search",
            "TOOL",
            (1_600, 2_000),
            vec![
                attr("tool.name", json!("search")),
                attr("input.value", json!("{\"query\": \"tallest tower\"}")),
            ],
            Some((
                "TimeoutError",
                &format!("{module}.tools.search timed out after 30 s"),
            )),
        ),
        span(
            "00000000000000a3",
            "00000000000000a0",
            "ChatCompletion",
            "LLM",
            (2_100, 2_500),
            vec![
                attr("llm.token_count.prompt", json!(901)),
                attr("llm.token_count.completion", json!(12)),
                attr("output.value", json!("read the notes")),
                attr("llm.finish_reason", json!("tool_calls")),
            ],
            None,
        ),
        span(
            "00000000000000a4",
            "00000000000000a0",
            "read_file",
            "TOOL",
            (2_600, 3_000),
            vec![
                attr("tool.name", json!("read_file")),
                attr("input.value", json!("{\"path\": \"notes.txt\"}")),
                attr("output.value", json!("330 m")),
            ],
            None,
        ),
        span(
            "00000000000000a5",
            "00000000000000a0",
            "ChatCompletion",
            "LLM",
            (3_100, 3_500),
            vec![
                attr("llm.token_count.prompt", json!(960)),
                attr("llm.token_count.completion", json!(9)),
                attr("output.value", json!("330 m")),
                attr("llm.finish_reason", json!("stop")),
            ],
            None,
        ),
    ];
    json!({"resourceSpans": [{
        "resource": {"attributes": [attr("service.name", json!(service)), attr("telemetry.sdk.version", json!("9.9.9"))]},
        "scopeSpans": [{"scope": {"name": format!("{module}.instrumentation"), "version": "3.1"}, "spans": spans}]
    }]})
    .to_string()
}

/// A store holding `text` as its one trace, and the Detector's SQL tool on it.
fn store_of(dir: &Path, name: &str, text: &str, format: Format) -> SqlTool {
    let file = dir.join(name);
    std::fs::write(&file, text).unwrap();
    let db = dir.join(format!("{name}.sqlite"));
    let mut store = traces::Store::open(&db).unwrap();
    store.import_file(&file, format).unwrap();
    drop(store);
    SqlTool::open(&db, SqlLimits::default()).unwrap()
}

/// The feature probes' digests.
fn features(sql: &SqlTool) -> Vec<ProbeResult> {
    probes::run_battery(sql, TRACE)
        .into_iter()
        .filter(|r| probes::is_feature(r.probe))
        .collect()
}

/// The events that are the agent's work (not a framework's wrappers), in order.
fn work_events(sql: &SqlTool) -> String {
    sql.run(&format!(
        "SELECT event, error_family, error_type, arguments_valid, is_error, input_tokens, output_tokens, result, reply \
         FROM events WHERE trace_id = '{TRACE}' AND event NOT IN ('workflow', 'other') ORDER BY seq"
    ))
    .unwrap()
}

#[test]
fn one_run_written_two_ways_gives_one_event_view_and_one_digest() {
    let dir = tempfile::tempdir().unwrap();
    let ours = store_of(dir.path(), "ours.jsonl", &contract_jsonl(), Format::Jsonl);
    let theirs = store_of(
        dir.path(),
        "theirs.json",
        &openinference_otlp("acme.", "acme-support-bot", "acme_agents"),
        Format::Otlp,
    );
    let events = work_events(&ours);
    assert_eq!(events, work_events(&theirs));
    let failed_tool = ["tool_call", "timeout", "TimeoutError", "1", "1"];
    assert!(
        events
            .lines()
            .any(|l| l.split_whitespace().take(5).eq(failed_tool)),
        "{events}"
    );
    assert!(events.contains("llm_call"), "{events}");
    let (a, b) = (features(&ours), features(&theirs));
    assert_eq!(
        a.len(),
        probes::LIBRARY.iter().filter(|p| p.feature).count()
    );
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x, y, "probe {} differs", x.probe);
    }
    // The digests still say what happened.
    let text = probes::battery_text(&a);
    assert!(
        text.contains("error timeout TimeoutError on tool_call tool1 x1: search timed out"),
        "{text}"
    );
    assert!(text.contains("flag timeout 1"), "{text}");
    assert!(text.contains("tool tool2 calls 1 run 1"), "{text}");
    assert!(text.contains("then tool_call_failed llm_call x1"), "{text}");
    for word in [
        "acme",
        "researcher",
        "Analyst",
        "toolcaller",
        "srv",
        "read_file",
        "ChatCompletion",
    ] {
        assert!(!text.contains(word), "{word} in {text}");
    }
}

#[test]
fn renaming_a_frameworks_spans_service_and_modules_changes_no_feature() {
    let dir = tempfile::tempdir().unwrap();
    let one = store_of(
        dir.path(),
        "one.json",
        &openinference_otlp("acme.", "acme-support-bot", "acme_agents"),
        Format::Otlp,
    );
    let other = store_of(
        dir.path(),
        "other.json",
        &openinference_otlp("io.globex.agents/", "globex-prod-eu-3", "globex"),
        Format::Otlp,
    );
    assert_eq!(features(&one), features(&other));
    // Code locations name the framework's modules: they serve localisation, not the features.
    assert!(!probes::is_feature("code"));
}

#[test]
fn scrubbing_keeps_words_and_drops_paths_modules_and_ids() {
    assert_eq!(
        probes::scrub("error x: /srv/app/tools.py line 3 in pydantic_ai.tools.Tool failed"),
        "error x: <path> line 3 in Tool failed"
    );
    assert_eq!(
        probes::scrub("request 3f2a9c1e-1b2c-4d5e-8f90-1234567890ab and 9f86d081884c7d65 done"),
        "request <id> and <id> done"
    );
    assert_eq!(
        probes::scrub("llm calls 4 input tokens 874..1305"),
        "llm calls 4 input tokens 874..1305"
    );
}
