//! `pathfinder collect` as a user runs it: real agent runs sent by OpenTelemetry's Python SDK
//! and OTLP/HTTP exporter are stored and diagnosed with the verdicts `traces import` +
//! `detect` give on the same spans; a SIGKILL mid-stream loses no acknowledged span and every
//! trace that finished is diagnosed after a restart; the live page works in headless Chromium.
//!
//! Needs the SDK in target/otlp-python (`.ci/setup` installs it from
//! tests/otlp/requirements.txt) and, for the page, Debian's `chromium`. Without them the tests
//! fail and say so.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[path = "../../collect/tests/support/http.rs"]
mod http;

#[path = "support/cdp.rs"]
#[allow(dead_code)]
mod cdp;

#[path = "support/warm.rs"]
#[allow(dead_code)]
mod warm;

fn pathfinder() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pathfinder"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn check(out: std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A running `pathfinder collect` and the address it printed.
struct Receiver {
    child: Child,
    addr: SocketAddr,
}

impl Receiver {
    fn start(db: &Path, extra: &[&str]) -> Receiver {
        let mut child = pathfinder()
            .args([
                "collect",
                "--listen",
                "127.0.0.1:0",
                "--quiet-ms",
                "400",
                "--db",
            ])
            .arg(db)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("a line from collect").unwrap();
        let addr = first
            .strip_prefix("listening on http://")
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {first:?}"))
            .parse()
            .unwrap();
        // Keep reading (and echoing) its verdict lines so the pipe never fills.
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                eprintln!("collect: {line}");
            }
        });
        Receiver { child, addr }
    }

    /// Waits until every trace received has a verdict and there are at least `n`.
    fn verdicts(&self, n: usize, within: Duration) -> Vec<Value> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(r) = http::request(self.addr, "GET", "/api/verdicts?limit=10000", &[], b"") {
                let body = r.json();
                let list = body["verdicts"].as_array().unwrap().clone();
                if list.len() >= n && body["counts"]["open"] == 0 {
                    return list;
                }
                assert!(
                    Instant::now() < deadline,
                    "waiting for {n} verdicts: {body}"
                );
            }
            assert!(Instant::now() < deadline, "the receiver does not answer");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn terminate(mut self) {
        unsafe_kill(self.child.id(), "TERM");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "collect exited with {status} on SIGTERM");
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unsafe_kill(pid: u32, signal: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// Runs `pathfinder run` and returns the traces it wrote.
fn agent_traces(args: &[&str], out: &Path) -> Vec<PathBuf> {
    let stdout = check(
        pathfinder()
            .args(["run", "--backend", "local", "--out"])
            .arg(out)
            .args(args)
            .current_dir(repo())
            .output()
            .unwrap(),
    );
    let traces: Vec<PathBuf> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("trace: "))
        .map(PathBuf::from)
        .collect();
    assert!(!traces.is_empty(), "no trace line in {stdout}");
    traces
}

fn python_sdk() -> PathBuf {
    let site = repo().join("target/otlp-python");
    assert!(
        site.join("opentelemetry/exporter/otlp/proto/http").is_dir(),
        "{}: the OpenTelemetry Python SDK is not installed; run .ci/setup",
        site.display()
    );
    site
}

#[test]
fn a_real_sdk_exporter_sends_agent_runs_and_every_verdict_matches_import_and_detect() {
    let site = python_sdk();
    let dir = tempfile::tempdir().unwrap();
    // Real runs of a target agent: two clean, two with a deficiency planted.
    let mut runs = agent_traces(
        &[
            "--agent",
            "toolcaller",
            "--task",
            "gaia-001",
            "--task",
            "gaia-002",
        ],
        &dir.path().join("clean"),
    );
    for planted in ["P2", "P13"] {
        let bug = dir.path().join(planted);
        check(
            pathfinder()
                .args([
                    "inject",
                    "--agent",
                    "toolcaller",
                    "--type",
                    planted,
                    "--out",
                ])
                .arg(&bug)
                .current_dir(repo())
                .output()
                .unwrap(),
        );
        runs.extend(agent_traces(
            &[
                "--agent",
                "toolcaller",
                "--task",
                "gaia-003",
                "--artifact",
                bug.join("repo").to_str().unwrap(),
            ],
            &dir.path().join(format!("run-{planted}")),
        ));
    }

    let live = dir.path().join("live.sqlite");
    let receiver = Receiver::start(&live, &[]);
    let replayed = dir.path().join("replayed.json");
    let out = Command::new("python3")
        .arg(repo().join("crates/pathfinder/tests/otlp/replay.py"))
        .args([
            "--gzip",
            "--endpoint",
            &format!("http://{}/v1/traces", receiver.addr),
        ])
        .arg("--json-out")
        .arg(&replayed)
        .args(&runs)
        .env("PYTHONPATH", &site)
        .output()
        .unwrap();
    let sent = check(out);
    let ids: Vec<String> = sent
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), runs.len(), "{sent}");
    let verdicts = receiver.verdicts(ids.len(), Duration::from_secs(180));
    assert_eq!(verdicts.len(), ids.len());

    // The same spans, as the SDK encoded them, through `traces import` and `detect`.
    let imported = dir.path().join("imported.sqlite");
    check(
        pathfinder()
            .args(["traces", "import", "--db"])
            .arg(&imported)
            .arg(&replayed)
            .output()
            .unwrap(),
    );
    let live_store = traces::Store::open_read_only(&live).unwrap();
    let imported_store = traces::Store::open_read_only(&imported).unwrap();
    let mut labels = Vec::new();
    for id in &ids {
        let v = verdicts
            .iter()
            .find(|v| v["trace_id"] == id.as_str())
            .unwrap();
        let answer = check(
            pathfinder()
                .args(["detect", "--policy", "expert", "--trace", id, "--db"])
                .arg(&imported)
                .output()
                .unwrap(),
        );
        assert_eq!(
            v["explanation"].as_str().unwrap(),
            answer.trim(),
            "trace {id}"
        );
        assert_eq!(
            live_store.spans(id).unwrap(),
            imported_store.spans(id).unwrap(),
            "trace {id}: the stored spans differ"
        );
        labels.push(v["label"].as_str().unwrap().to_string());
    }
    eprintln!("verdicts: {labels:?}");
    assert!(labels.iter().any(|l| l == "none"), "{labels:?}");
    assert!(labels.iter().any(|l| l != "none"), "{labels:?}");
    receiver.terminate();
}

/// One trace as OTLP/JSON: `spans` children and, when `root`, the root span.
fn trace_doc(trace: usize, spans: usize, root: bool) -> (Value, Vec<(String, String)>) {
    let trace_id = format!("{trace:032x}");
    let mut list = Vec::new();
    let mut ids = Vec::new();
    let t0 = 1_700_000_000_000_000_000u64 + trace as u64 * 1_000_000_000;
    for k in 0..spans {
        let span_id = format!("{:016x}", (trace << 8) + k + 1);
        list.push(json!({"traceId": trace_id, "spanId": span_id, "parentSpanId": format!("{:016x}", trace << 8),
            "name": "execute_tool lookup", "startTimeUnixNano": (t0 + k as u64 * 1000).to_string(),
            "endTimeUnixNano": (t0 + k as u64 * 1000 + 500).to_string(),
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                           {"key": "gen_ai.tool.name", "value": {"stringValue": "lookup"}}]}));
        ids.push((trace_id.clone(), span_id));
    }
    if root {
        let span_id = format!("{:016x}", trace << 8);
        list.push(json!({"traceId": trace_id, "spanId": span_id, "name": "invoke_agent helper",
            "startTimeUnixNano": t0.to_string(), "endTimeUnixNano": (t0 + 1_000_000).to_string(),
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}}]}));
        ids.push((trace_id, span_id));
    }
    let doc = json!({"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "load"}}]},
        "scopeSpans": [{"scope": {"name": "test"}, "spans": list}]}]});
    (doc, ids)
}

#[test]
fn sigkill_mid_stream_loses_no_acknowledged_span_and_every_finished_trace_is_diagnosed() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live.sqlite");
    let receiver = Receiver::start(&live, &[]);
    let addr = receiver.addr;
    // Four senders, each sending traces as two requests (children, then the root), until the
    // receiver is killed under them.
    let senders: Vec<_> = (0..4)
        .map(|s| {
            std::thread::spawn(move || {
                let mut acknowledged = Vec::new();
                for n in 0.. {
                    let trace = s * 100_000 + n + 1;
                    for root in [false, true] {
                        let (doc, ids) = trace_doc(trace, if root { 0 } else { 6 }, root);
                        let body = doc.to_string();
                        match http::request(
                            addr,
                            "POST",
                            "/v1/traces",
                            &[("Content-Type", "application/json")],
                            body.as_bytes(),
                        ) {
                            Ok(r) if r.status == 200 => acknowledged.extend(ids),
                            Ok(r) => panic!("refused: {} {}", r.status, r.text()),
                            // The receiver is gone: whatever was not answered was not acknowledged.
                            Err(_) => return acknowledged,
                        }
                    }
                }
                acknowledged
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(800));
    let mut receiver = receiver;
    receiver.child.kill().unwrap(); // SIGKILL
    receiver.child.wait().unwrap();
    let acknowledged: Vec<(String, String)> = senders
        .into_iter()
        .flat_map(|s| s.join().unwrap())
        .collect();
    drop(receiver);
    assert!(
        acknowledged.len() > 50,
        "only {} spans were sent before the kill",
        acknowledged.len()
    );

    // Restarted on the same store and inbox, it diagnoses every trace, rootless ones too.
    let receiver = Receiver::start(&live, &["--max-wait-s", "1"]);
    let mut traces: Vec<&String> = acknowledged.iter().map(|(t, _)| t).collect();
    traces.sort();
    traces.dedup();
    let verdicts = receiver.verdicts(traces.len(), Duration::from_secs(300));
    let diagnosed: std::collections::HashSet<&str> = verdicts
        .iter()
        .map(|v| v["trace_id"].as_str().unwrap())
        .collect();
    let store = traces::Store::open_read_only(&live).unwrap();
    let mut missing = Vec::new();
    for (trace, span) in &acknowledged {
        let found: i64 = store
            .connection()
            .query_row(
                "SELECT COUNT(*) FROM spans WHERE trace_id = ?1 AND span_id = ?2",
                [trace, span],
                |r| r.get(0),
            )
            .unwrap();
        if found != 1 {
            missing.push((trace, span));
        }
    }
    assert!(
        missing.is_empty(),
        "{} acknowledged spans lost: {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    for trace in &traces {
        assert!(
            diagnosed.contains(trace.as_str()),
            "trace {trace} was never diagnosed"
        );
    }
    eprintln!(
        "{} spans of {} traces acknowledged before SIGKILL; all stored and diagnosed after the restart",
        acknowledged.len(),
        traces.len()
    );
    receiver.terminate();
}

#[test]
fn the_live_page_lists_verdicts_and_opens_each_investigation_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(&dir.path().join("live.sqlite"), &[]);
    for trace in 1..=3 {
        let (doc, _) = trace_doc(trace, 3, true);
        let r = http::request(
            receiver.addr,
            "POST",
            "/v1/traces",
            &[("Content-Type", "application/json")],
            doc.to_string().as_bytes(),
        )
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    receiver.verdicts(3, Duration::from_secs(60));
    let mut browser = cdp::Browser::launch(&dir.path().join("profile"));
    let page = browser.open(&format!("http://{}/", receiver.addr));
    assert_eq!(page.foreign_requests(), Vec::<String>::new());
    let rows = browser.eval("document.querySelectorAll('table.index tbody tr').length");
    assert_eq!(rows, json!(3));
    let heading = browser.eval("document.querySelector('h1').textContent");
    assert!(
        heading.as_str().unwrap().contains("3 traces diagnosed"),
        "{heading}"
    );
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser");
    std::fs::create_dir_all(&shots).unwrap();
    browser.screenshot(&shots.join("live.png"));
    let href = browser.eval("document.querySelector('table.index tbody tr a').href");
    let trace_page = browser.open(href.as_str().unwrap());
    assert_eq!(trace_page.foreign_requests(), Vec::<String>::new());
    let seen = browser.eval(
        "(function(){return {spans: document.querySelectorAll('ul.tree li.span').length,\
         verdicts: Array.prototype.map.call(document.querySelectorAll('.card.verdict > h3'), function(h){return h.textContent;})};})()",
    );
    assert_eq!(seen["spans"], json!(4), "{seen}");
    assert_eq!(seen["verdicts"], json!(["expert"]), "{seen}");
    browser.close();
    receiver.terminate();
}

/// A stored trace as one OTLP/JSON request: its spans from `traces export` (the agents' JSON
/// Lines), under new hex ids, with each span's kind as OpenInference names it.
fn as_otlp(db: &Path, trace: &str, trace_hex: &str, dir: &Path) -> String {
    let exported = traces::Store::open_read_only(db)
        .unwrap()
        .export_trace(trace, dir)
        .unwrap();
    let lines = std::fs::read_to_string(exported.spans_jsonl).unwrap();
    let spans: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: std::collections::HashMap<String, String> = spans
        .iter()
        .enumerate()
        .map(|(i, s)| {
            (
                s["span_id"].as_str().unwrap().to_string(),
                format!("{:016x}", i + 1),
            )
        })
        .collect();
    let any = |v: &Value| match v {
        Value::String(s) => json!({"stringValue": s}),
        Value::Bool(b) => json!({"boolValue": b}),
        Value::Number(n) if n.is_i64() => json!({"intValue": n.to_string()}),
        Value::Number(n) => json!({"doubleValue": n}),
        other => json!({"stringValue": other.to_string()}),
    };
    let otlp: Vec<Value> = spans
        .iter()
        .map(|s| {
            let mut attributes: Vec<Value> = s["attributes"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| json!({"key": k, "value": any(v)})).collect())
                .unwrap_or_default();
            let kind = s["kind"].as_str().unwrap_or("other").to_ascii_uppercase();
            attributes.push(json!({"key": "openinference.span.kind", "value": {"stringValue": kind}}));
            let mut span = json!({
                "traceId": trace_hex,
                "spanId": ids[s["span_id"].as_str().unwrap()],
                "name": s["name"],
                "startTimeUnixNano": s["start_time_unix_nano"].to_string(),
                "endTimeUnixNano": s["end_time_unix_nano"].to_string(),
                "status": {"code": match s["status"]["code"].as_str() { Some("ERROR") => 2, Some("OK") => 1, _ => 0 },
                           "message": s["status"]["message"]},
                "attributes": attributes,
            });
            if let Some(parent) = s["parent_span_id"].as_str().and_then(|p| ids.get(p)) {
                span["parentSpanId"] = json!(parent);
            }
            span
        })
        .collect();
    json!({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"scope": {"name": "test"}, "spans": otlp}]}]})
        .to_string()
}

#[test]
fn a_trained_checkpoint_diagnoses_what_it_receives_as_detect_does() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _, checkpoint) = warm::warm_started(dir.path());
    let ids: Vec<String> = traces::Store::open_read_only(&db)
        .unwrap()
        .trace_ids()
        .unwrap();
    let live = dir.path().join("live.sqlite");
    let receiver = Receiver::start(&live, &["--checkpoint", checkpoint.to_str().unwrap()]);
    let mut sent = Vec::new();
    for (i, id) in ids.iter().take(3).enumerate() {
        let hex = format!("{:032x}", 0xc0ffee00 + i);
        let doc = as_otlp(&db, id, &hex, &dir.path().join(format!("export-{i}")));
        let r = http::request(
            receiver.addr,
            "POST",
            "/v1/traces",
            &[("Content-Type", "application/json")],
            doc.as_bytes(),
        )
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let file = dir.path().join(format!("sent-{i}.json"));
        std::fs::write(&file, &doc).unwrap();
        sent.push((hex, file));
    }
    let verdicts = receiver.verdicts(sent.len(), Duration::from_secs(300));
    let imported = dir.path().join("imported.sqlite");
    for (hex, file) in &sent {
        check(
            pathfinder()
                .args(["traces", "import", "--db"])
                .arg(&imported)
                .arg(file)
                .output()
                .unwrap(),
        );
        let answer = check(
            pathfinder()
                .args(["detect", "--trace", hex, "--db"])
                .arg(&imported)
                .arg("--policy")
                .arg(format!("checkpoint:{}", checkpoint.display()))
                .output()
                .unwrap(),
        );
        let v = verdicts
            .iter()
            .find(|v| v["trace_id"] == hex.as_str())
            .unwrap();
        assert!(
            v["detector"].as_str().unwrap().starts_with("checkpoint:"),
            "{v}"
        );
        assert_eq!(
            v["explanation"].as_str().unwrap(),
            answer.trim(),
            "trace {hex}"
        );
    }
    receiver.terminate();
}
