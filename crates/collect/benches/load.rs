//! Load on the receiver, on this machine: how many spans a second it acknowledges with none
//! lost, how fast the expert diagnoses ended traces, and how long from a trace's last span to
//! its verdict at a steady rate below that — against the offline path a user has without it
//! (the same spans written as OTLP/JSON files and loaded by the importer `traces import`
//! uses), in the same run.
//!
//! `cargo bench -p collect --bench load [-- --seconds S --senders N --spans-per-trace K]`
//! prints a Markdown table (BENCHMARKS.md, "The OTLP receiver").

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use collect::proto::{self, any_value, AnyValue, KeyValue};
use prost::Message;

#[path = "../tests/support/http.rs"]
mod http;

fn s(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
    }
}

/// An agent run of `spans` spans (the root last): model and tool calls with prompt-sized
/// inputs and outputs, about 1 KB a span, one tool call in six failing.
fn agent_run(trace: u64, spans: usize) -> Vec<proto::Span> {
    let trace_id = [trace.to_be_bytes(), 7u64.to_be_bytes()].concat();
    let id = |n: usize| ((trace << 16) + n as u64 + 1).to_be_bytes().to_vec();
    let t0 = 1_700_000_000_000_000_000u64 + trace * 10_000_000_000;
    let prompt = "You are a careful research assistant. Answer with a number. ".repeat(8);
    let mut out = Vec::with_capacity(spans);
    for n in 1..spans {
        let tool = n % 2 == 0;
        let failing = tool && n % 6 == 0;
        let mut attributes = if tool {
            vec![
                s("gen_ai.operation.name", "execute_tool"),
                s("gen_ai.tool.name", "table_lookup"),
                s(
                    "gen_ai.tool.call.arguments",
                    &format!("{{\"table\": \"census\", \"row\": {n}}}"),
                ),
                s("output.value", &"row values: 1871, 14560, 0.42; ".repeat(6)),
            ]
        } else {
            vec![
                s("gen_ai.operation.name", "chat"),
                s("gen_ai.request.model", "qwen2.5-7b-instruct"),
                s("input.value", &prompt),
                s(
                    "output.value",
                    "I will look the figure up in the census table.",
                ),
            ]
        };
        attributes.push(s("code.filepath", "agent/loop.py"));
        out.push(proto::Span {
            trace_id: trace_id.clone(),
            span_id: id(n),
            parent_span_id: id(0),
            name: if tool {
                "execute_tool table_lookup".into()
            } else {
                "chat qwen2.5-7b-instruct".into()
            },
            kind: if tool { 1 } else { 3 },
            start_time_unix_nano: t0 + n as u64 * 1_000_000,
            end_time_unix_nano: t0 + n as u64 * 1_000_000 + 500_000,
            attributes,
            status: Some(proto::Status {
                message: if failing {
                    "KeyError: 'census'".into()
                } else {
                    String::new()
                },
                code: if failing { 2 } else { 0 },
            }),
            ..proto::Span::default()
        });
    }
    out.push(proto::Span {
        trace_id,
        span_id: id(0),
        name: "invoke_agent researcher".into(),
        start_time_unix_nano: t0,
        end_time_unix_nano: t0 + spans as u64 * 1_000_000,
        attributes: vec![
            s("gen_ai.operation.name", "invoke_agent"),
            s("gen_ai.agent.name", "researcher"),
        ],
        ..proto::Span::default()
    });
    out
}

fn request(spans: Vec<proto::Span>) -> proto::ExportTraceServiceRequest {
    proto::ExportTraceServiceRequest {
        resource_spans: vec![proto::ResourceSpans {
            resource: Some(proto::Resource {
                attributes: vec![s("service.name", "load")],
            }),
            scope_spans: vec![proto::ScopeSpans {
                scope: None,
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

struct Args {
    seconds: f64,
    senders: usize,
    spans_per_trace: usize,
}

fn args() -> Args {
    let mut a = Args {
        seconds: 20.0,
        senders: 4,
        spans_per_trace: 16,
    };
    let argv: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < argv.len() {
        let value = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--seconds" => a.seconds = value.parse().expect("--seconds S"),
            "--senders" => a.senders = value.parse().expect("--senders N"),
            "--spans-per-trace" => a.spans_per_trace = value.parse().expect("--spans-per-trace K"),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

fn start(dir: &Path, quiet_ms: u64) -> collect::Collector {
    let store = dir.join("live.sqlite");
    traces::Store::open(&store).unwrap();
    let mut config = collect::Config::new(&store);
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.timing.quiet = Duration::from_millis(quiet_ms);
    config.timing.tick = Duration::from_millis(20);
    config.print_verdicts = false;
    let expert =
        collect::DetectorDiagnoser::new(&store, detect::Config::default(), "expert", || {
            detect::policies::by_name("expert")
        })
        .unwrap();
    collect::Collector::start(config, Box::new(expert)).unwrap()
}

fn counts(addr: std::net::SocketAddr) -> serde_json::Value {
    http::get(addr, "/api/verdicts?limit=100000").json()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let a = args();
    println!(
        "# The OTLP receiver under load ({} senders, {}-span traces, {} s; {} CPUs)\n",
        a.senders,
        a.spans_per_trace,
        a.seconds,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    // 1. Ingestion: senders post whole traces (16 spans a request, as a batch span processor
    //    would) as fast as they are acknowledged.
    let dir = tempfile::tempdir().unwrap();
    let collector = start(dir.path(), 500);
    let addr = collector.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let sent_spans = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let senders: Vec<_> = (0..a.senders)
        .map(|k| {
            let (stop, sent_spans) = (Arc::clone(&stop), Arc::clone(&sent_spans));
            let spans = a.spans_per_trace;
            std::thread::spawn(move || {
                let mut retried = 0usize;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let body = request(agent_run(k as u64 * 1_000_000 + n, spans)).encode_to_vec();
                    loop {
                        let r = http::request(
                            addr,
                            "POST",
                            "/v1/traces",
                            &[("Content-Type", "application/x-protobuf")],
                            &body,
                        )
                        .expect("the receiver answers");
                        match r.status {
                            200 => break,
                            429 | 503 => {
                                retried += 1;
                                std::thread::sleep(Duration::from_millis(50));
                            }
                            other => panic!("refused: {other} {}", r.text()),
                        }
                    }
                    sent_spans.fetch_add(spans, Ordering::Relaxed);
                }
                retried
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(a.seconds));
    stop.store(true, Ordering::Relaxed);
    let retried: usize = senders.into_iter().map(|s| s.join().unwrap()).sum();
    let ingest_s = started.elapsed().as_secs_f64();
    let acknowledged = sent_spans.load(Ordering::Relaxed);
    let c = counts(addr);
    let received = c["counts"]["spans"].as_u64().unwrap() as usize;
    let traces = c["counts"]["traces"].as_u64().unwrap() as usize;
    assert_eq!(
        received, acknowledged,
        "spans acknowledged but not in the inbox"
    );

    // 2. Diagnosis: the finisher works off the backlog of ended traces (it was already
    //    diagnosing while the senders sent); its rate over `seconds`, then the receiver stops
    //    (what is left stays in the inbox, as a restart would find it).
    let diagnosed_before = c["counts"]["diagnosed"].as_u64().unwrap() as usize;
    std::thread::sleep(Duration::from_secs_f64(a.seconds));
    let diagnosed_after = counts(addr)["counts"]["diagnosed"].as_u64().unwrap() as usize;
    let diagnosis_rate = (diagnosed_after - diagnosed_before) as f64 / a.seconds;
    let stored: i64 = traces::Store::open_read_only(dir.path().join("live.sqlite"))
        .unwrap()
        .connection()
        .query_row("SELECT COUNT(*) FROM spans", [], |r| r.get(0))
        .unwrap();
    assert!(stored as usize <= acknowledged);
    collector.stop().unwrap();

    // 3. The offline path on the same spans: OTLP/JSON files loaded by the store's importer.
    let files = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for n in 1..=traces as u64 {
        let doc = proto::request_to_json(&request(agent_run(n, a.spans_per_trace)));
        let path = files.path().join(format!("{n}.json"));
        std::fs::write(&path, doc.to_string()).unwrap();
        paths.push(path);
    }
    let mut offline = traces::Store::open(files.path().join("offline.sqlite")).unwrap();
    let importing = Instant::now();
    let results = offline.import_files(
        &paths,
        traces::Format::Otlp,
        &traces::ImportOptions::default(),
        2,
        |_, _| {},
    );
    let import_s = importing.elapsed().as_secs_f64();
    let offline_spans: usize = results.iter().map(|r| r.as_ref().unwrap().spans).sum();

    // 4. Latency at a steady rate below the diagnosis rate: one trace every `gap`.
    let dir = tempfile::tempdir().unwrap();
    let quiet_ms = 500;
    let collector = start(dir.path(), quiet_ms);
    let addr = collector.addr();
    let rate = (diagnosis_rate * 0.5).clamp(0.5, 20.0);
    let gap = Duration::from_secs_f64(1.0 / rate);
    let steady = ((a.seconds * rate) as usize).max(20);
    for n in 0..steady {
        let body = request(agent_run(9_000_000 + n as u64, a.spans_per_trace)).encode_to_vec();
        let r = http::request(
            addr,
            "POST",
            "/v1/traces",
            &[("Content-Type", "application/x-protobuf")],
            &body,
        )
        .unwrap();
        assert_eq!(r.status, 200);
        std::thread::sleep(gap);
    }
    let list = loop {
        let c = counts(addr);
        if c["counts"]["open"] == 0 && c["counts"]["diagnosed"].as_u64().unwrap() as usize == steady
        {
            break c["verdicts"].as_array().unwrap().clone();
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut latency: Vec<f64> = list
        .iter()
        .map(|v| (v["diagnosed_ms"].as_i64().unwrap() - v["last_span_ms"].as_i64().unwrap()) as f64)
        .collect();
    latency.sort_by(f64::total_cmp);
    collector.stop().unwrap();

    let ingest_rate = acknowledged as f64 / ingest_s;
    let offline_rate = offline_spans as f64 / import_s;
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| spans acknowledged / durable in the inbox / lost | {acknowledged} / {received} / {} |",
        acknowledged - received
    );
    println!("| ingestion, spans/s acknowledged ({} requests retried after 429/503) | {ingest_rate:.0} |", retried);
    println!("| offline reference: the same spans as OTLP/JSON files through the importer, spans/s | {offline_rate:.0} |");
    println!(
        "| ingestion / offline import | {:.2}x |",
        ingest_rate / offline_rate
    );
    println!(
        "| expert diagnosis (store + investigate + record), traces/s over {} s of the backlog ({diagnosed_after} of {traces} traces diagnosed, {stored} spans in the store) | {diagnosis_rate:.1} |",
        a.seconds
    );
    println!(
        "| last span to verdict at {rate:.1} traces/s ({steady} traces, quiet period {quiet_ms} ms included): p50 / p99 ms | {:.0} / {:.0} |",
        percentile(&latency, 0.5),
        percentile(&latency, 0.99)
    );
}
