//! The receiver end to end, in process: OTLP/HTTP requests in protobuf and JSON (gzip or
//! not) are acknowledged, stored and diagnosed by the expert Detector with the same verdicts
//! as importing the same spans and investigating them; bad requests are refused with their
//! reason and store nothing; a late span re-opens its trace; verdicts are served as pages and
//! JSON and sent on as gen_ai.evaluation.result events.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use collect::proto::{self, any_value, AnyValue, KeyValue};
use prost::Message;
use serde_json::Value;

#[path = "support/http.rs"]
mod http;

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

fn s(key: &str, value: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(value.into()))
}

/// An agent run as GenAI-instrumented frameworks export it: the agent's span, model calls and
/// tool calls; with `failing`, the tool fails three times on the same arguments.
fn agent_run(trace: u8, failing: bool) -> Vec<proto::Span> {
    let trace_id = vec![trace; 16];
    let id = |n: u8| vec![trace, n, 0, 0, 0, 0, 0, 1];
    let t0 = 1_700_000_000_000_000_000u64 + u64::from(trace) * 1_000_000_000;
    let span =
        |n: u8, parent: Option<u8>, name: &str, attrs: Vec<KeyValue>, error: Option<&str>| {
            proto::Span {
                trace_id: trace_id.clone(),
                span_id: id(n),
                parent_span_id: parent.map(id).unwrap_or_default(),
                name: name.into(),
                kind: 1,
                start_time_unix_nano: t0 + u64::from(n) * 10_000_000,
                end_time_unix_nano: t0
                    + u64::from(n) * 10_000_000
                    + 5_000_000
                    + if n == 0 { 500_000_000 } else { 0 },
                attributes: attrs,
                status: Some(proto::Status {
                    message: error.unwrap_or("").into(),
                    code: if error.is_some() { 2 } else { 0 },
                }),
                ..proto::Span::default()
            }
        };
    let chat = |n: u8| {
        span(
            n,
            Some(0),
            "chat gpt-4o-mini",
            vec![
                s("gen_ai.operation.name", "chat"),
                s("gen_ai.request.model", "gpt-4o-mini"),
                kv("gen_ai.usage.input_tokens", any_value::Value::IntValue(120)),
                kv("gen_ai.usage.output_tokens", any_value::Value::IntValue(30)),
            ],
            None,
        )
    };
    let tool = |n: u8, error: Option<&str>| {
        span(
            n,
            Some(0),
            "execute_tool web_search",
            vec![
                s("gen_ai.operation.name", "execute_tool"),
                s("gen_ai.tool.name", "web_search"),
                s(
                    "gen_ai.tool.call.arguments",
                    "{\"query\": \"population of Lyon\"}",
                ),
            ],
            error,
        )
    };
    let mut spans = vec![chat(1)];
    if failing {
        for n in 2..5 {
            spans.push(tool(
                n,
                Some("TimeoutError: the search backend did not answer in 30 s"),
            ));
        }
    } else {
        spans.push(tool(2, None));
    }
    spans.push(chat(9));
    spans.push(span(
        0,
        None,
        "invoke_agent assistant",
        vec![
            s("gen_ai.operation.name", "invoke_agent"),
            s("gen_ai.agent.name", "assistant"),
        ],
        None,
    ));
    spans
}

fn request_of(spans: Vec<proto::Span>) -> proto::ExportTraceServiceRequest {
    proto::ExportTraceServiceRequest {
        resource_spans: vec![proto::ResourceSpans {
            resource: Some(proto::Resource {
                attributes: vec![s("service.name", "shop-assistant")],
            }),
            scope_spans: vec![proto::ScopeSpans {
                scope: Some(proto::InstrumentationScope {
                    name: "opentelemetry.instrumentation.openai".into(),
                    version: "0.1".into(),
                    attributes: vec![],
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

struct Running {
    collector: Option<collect::Collector>,
    _dir: tempfile::TempDir,
    store: std::path::PathBuf,
}

impl Running {
    fn addr(&self) -> SocketAddr {
        self.collector.as_ref().unwrap().addr()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(c) = self.collector.take() {
            let _ = c.stop();
        }
    }
}

fn expert(store: &Path) -> Box<dyn collect::Diagnose> {
    Box::new(
        collect::DetectorDiagnoser::new(store, detect::Config::default(), "expert", || {
            detect::policies::by_name("expert")
        })
        .unwrap(),
    )
}

fn start(configure: impl FnOnce(&mut collect::Config)) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("live.sqlite");
    let mut config = collect::Config::new(&store);
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.timing.quiet = Duration::from_millis(300);
    config.timing.tick = Duration::from_millis(20);
    config.print_verdicts = false;
    configure(&mut config);
    traces::Store::open(&store).unwrap();
    let collector = collect::Collector::start(config, expert(&store)).unwrap();
    Running {
        collector: Some(collector),
        _dir: dir,
        store,
    }
}

fn post(
    addr: SocketAddr,
    content_type: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> http::Response {
    let mut headers = vec![("Content-Type", content_type)];
    headers.extend_from_slice(extra);
    http::request(addr, "POST", "/v1/traces", &headers, body).unwrap()
}

/// Waits until the receiver has diagnosed `n` traces (with at least `diagnoses` diagnoses of
/// the newest), and returns its verdicts.
fn verdicts(addr: SocketAddr, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let body = http::get(addr, "/api/verdicts").json();
        let list = body["verdicts"].as_array().unwrap().clone();
        if list.len() >= n && body["counts"]["open"] == 0 {
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "only {} verdicts: {body}",
            list.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The expert's verdict on the same spans imported as `traces import` would.
fn imported_verdict(doc: &str, trace_id: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("imported.sqlite");
    traces::Store::open(&db)
        .unwrap()
        .import_text(doc, traces::Format::Otlp, "file", false)
        .unwrap();
    let detector = detect::Detector::new(&db, detect::Config::default(), false).unwrap();
    let transcript = detector
        .investigate(trace_id, detect::policies::by_name("expert").unwrap())
        .unwrap();
    serde_json::to_value(transcript.verdict().unwrap()).unwrap()
}

#[test]
fn protobuf_and_json_requests_are_stored_and_diagnosed_as_an_import_would_be() {
    let running = start(|_| {});
    let addr = running.addr();
    // Trace 1 in protobuf, its spans in two requests (the root last, as spans end).
    let mut run1 = agent_run(1, true);
    let root = run1.pop().unwrap();
    let first = post(
        addr,
        "application/x-protobuf",
        &[],
        &request_of(run1.clone()).encode_to_vec(),
    );
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("content-type"), Some("application/x-protobuf"));
    let response = proto::ExportTraceServiceResponse::decode(first.body.as_slice()).unwrap();
    assert_eq!(response.partial_success, None);
    let second = post(
        addr,
        "application/x-protobuf",
        &[("Content-Encoding", "gzip")],
        &gzip(&request_of(vec![root.clone()]).encode_to_vec()),
    );
    assert_eq!(second.status, 200, "{}", second.text());
    // Trace 2 (healthy) as OTLP/JSON, gzipped.
    let run2 = request_of(agent_run(2, false));
    let json2 = proto::request_to_json(&run2).to_string();
    let third = post(
        addr,
        "application/json",
        &[("Content-Encoding", "gzip")],
        &gzip(json2.as_bytes()),
    );
    assert_eq!(third.status, 200, "{}", third.text());
    assert_eq!(third.json(), serde_json::json!({}));

    let list = verdicts(addr, 2);
    let mut all1 = run1;
    all1.push(root);
    let json1 = proto::request_to_json(&request_of(all1)).to_string();
    for (doc, trace) in [
        (json1, "01010101010101010101010101010101"),
        (json2, "02020202020202020202020202020202"),
    ] {
        let got = list.iter().find(|v| v["trace_id"] == trace).unwrap();
        assert_eq!(got["detector"], "expert");
        assert_eq!(got["framework"], "shop-assistant");
        assert_eq!(
            got["verdict"],
            imported_verdict(&doc, trace),
            "trace {trace}"
        );
    }
    // The failing run is named deficient, the healthy one healthy.
    let label = |t: &str| list.iter().find(|v| v["trace_id"] == t).unwrap()["label"].clone();
    assert_ne!(label("01010101010101010101010101010101"), "none");
    assert_eq!(label("02020202020202020202020202020202"), "none");
    // The stored trace is the whole trace.
    let store = traces::Store::open_read_only(&running.store).unwrap();
    assert_eq!(
        store
            .spans("01010101010101010101010101010101")
            .unwrap()
            .len(),
        6
    );
    assert_eq!(
        store
            .spans("02020202020202020202020202020202")
            .unwrap()
            .len(),
        4
    );
}

#[test]
fn bad_requests_are_refused_with_their_reason_and_store_nothing() {
    let running = start(|c| {
        c.token = Some("s3cret".into());
        c.max_body_bytes = 64 * 1024;
        c.max_decoded_bytes = 256 * 1024;
    });
    let addr = running.addr();
    let auth = ("Authorization", "Bearer s3cret");
    let good = request_of(agent_run(3, false)).encode_to_vec();

    let r = post(
        addr,
        "application/x-protobuf",
        &[("Authorization", "Bearer wrong")],
        &good,
    );
    assert_eq!(r.status, 401);
    assert!(proto::RpcStatus::decode(r.body.as_slice())
        .unwrap()
        .message
        .contains("Bearer"));
    assert_eq!(post(addr, "application/x-protobuf", &[], &good).status, 401);

    let r = post(addr, "text/plain", &[auth], &good);
    assert_eq!(r.status, 415, "{}", r.text());
    let r = post(
        addr,
        "application/x-protobuf",
        &[auth],
        b"\xff\xff\xff not protobuf",
    );
    assert_eq!(r.status, 400);
    assert!(proto::RpcStatus::decode(r.body.as_slice())
        .unwrap()
        .message
        .contains("protobuf"));
    let r = post(addr, "application/json", &[auth], b"{\"resourceSpans\": [");
    assert_eq!(r.status, 400);
    assert!(
        r.json()["message"].as_str().unwrap().contains("not JSON"),
        "{}",
        r.text()
    );
    let r = post(addr, "application/json", &[auth], &vec![b' '; 100 * 1024]);
    assert_eq!(r.status, 413, "{}", r.text());
    let bomb = gzip(&vec![b' '; 1024 * 1024]);
    let r = post(
        addr,
        "application/json",
        &[auth, ("Content-Encoding", "gzip")],
        &bomb,
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.json()["message"]
        .as_str()
        .unwrap()
        .contains("decompresses"));

    // One span with a bad id: the others are kept, the bad one is reported.
    let mut doc = proto::request_to_json(&request_of(agent_run(4, false)));
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["spanId"] = "xyz".into();
    let r = post(
        addr,
        "application/json",
        &[auth],
        doc.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let partial = &r.json()["partialSuccess"];
    assert_eq!(partial["rejectedSpans"], "1");
    assert!(
        partial["errorMessage"]
            .as_str()
            .unwrap()
            .contains("spans[1]: spanId"),
        "{partial}"
    );

    let counts = http::request(addr, "GET", "/api/verdicts", &[auth], b"")
        .unwrap()
        .json()["counts"]
        .clone();
    assert_eq!(
        counts["spans"], 3,
        "only the three good spans of the last request: {counts}"
    );
    assert_eq!(http::get(addr, "/api/verdicts").status, 401);
}

#[test]
fn a_span_after_the_verdict_reopens_the_trace() {
    let running = start(|_| {});
    let addr = running.addr();
    let mut run = agent_run(5, true);
    let late = run.remove(1);
    assert_eq!(
        post(
            addr,
            "application/x-protobuf",
            &[],
            &request_of(run).encode_to_vec()
        )
        .status,
        200
    );
    let first = verdicts(addr, 1);
    assert_eq!(
        (first[0]["spans"].as_i64(), first[0]["diagnoses"].as_i64()),
        (Some(5), Some(1))
    );
    assert_eq!(
        post(
            addr,
            "application/x-protobuf",
            &[],
            &request_of(vec![late]).encode_to_vec()
        )
        .status,
        200
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = verdicts(addr, 1);
        if v[0]["diagnoses"] == 2 {
            assert_eq!(v[0]["spans"], 6);
            break;
        }
        assert!(Instant::now() < deadline, "not re-diagnosed: {v:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let store = traces::Store::open_read_only(&running.store).unwrap();
    assert_eq!(
        store
            .spans("05050505050505050505050505050505")
            .unwrap()
            .len(),
        6
    );
}

#[test]
fn over_the_rate_a_request_is_told_when_to_retry() {
    let running = start(|c| c.max_requests_per_second = Some(1.0));
    let addr = running.addr();
    let body = request_of(agent_run(6, false)).encode_to_vec();
    assert_eq!(post(addr, "application/x-protobuf", &[], &body).status, 200);
    let r = post(addr, "application/x-protobuf", &[], &body);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
}

#[test]
fn verdicts_are_served_as_pages_and_json_and_sent_on_as_evaluation_events() {
    // A stand-in downstream collector: records the body of each POST it receives.
    let downstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down_addr = downstream.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in downstream.incoming() {
            let mut stream = stream.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let n = std::io::Read::read(&mut stream, &mut chunk).unwrap();
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let length: usize = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap();
                    if buf.len() >= end + 4 + length {
                        stream
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                            .unwrap();
                        tx.send(text).unwrap();
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
        }
    });
    let running = start(|c| c.export_to = Some(format!("http://{down_addr}")));
    let addr = running.addr();
    assert_eq!(
        post(
            addr,
            "application/x-protobuf",
            &[],
            &request_of(agent_run(7, true)).encode_to_vec()
        )
        .status,
        200
    );
    let list = verdicts(addr, 1);
    let trace = "07070707070707070707070707070707";
    let label = list[0]["label"].as_str().unwrap().to_string();

    let page = http::get(addr, "/");
    assert_eq!(page.status, 200);
    let html = page.text();
    assert!(
        html.contains(trace) && html.contains("http-equiv=\"refresh\""),
        "{html}"
    );
    let trace_page = http::get(addr, &format!("/traces/{trace}")).text();
    assert!(trace_page.contains("execute_tool web_search"));
    assert!(trace_page.contains(&label));
    let one = http::get(addr, &format!("/api/verdicts/{trace}")).json();
    assert_eq!(one["verdict"]["label"], label.as_str());
    assert!(one["transcript"]["turns"]
        .as_array()
        .is_some_and(|t| !t.is_empty()));
    assert_eq!(http::get(addr, "/traces/ffff").status, 404);

    let sent = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("an evaluation event");
    assert!(sent.starts_with("POST /v1/logs HTTP/1.1"), "{sent}");
    let body: Value = serde_json::from_str(&sent[sent.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    let record = &body["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0];
    assert_eq!(record["eventName"], "gen_ai.evaluation.result");
    assert_eq!(record["traceId"], trace);
    assert_eq!(record["spanId"], "0700000000000001");
    let attrs: Vec<(&str, &Value)> = record["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["key"].as_str().unwrap(), &a["value"]))
        .collect();
    assert!(attrs.contains(&(
        "gen_ai.evaluation.score.label",
        &serde_json::json!({"stringValue": label})
    )));
    assert!(attrs
        .iter()
        .any(|(k, _)| *k == "gen_ai.evaluation.explanation"));
}
