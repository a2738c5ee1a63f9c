//! End-to-end tests of the HTTP surface over a Unix socket and TCP, with a plain HTTP/1.1
//! client written against std, the way the Python agents talk to the server.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use llmserve::{BackgroundServer, Listen, ScriptStore, ScriptedBackend, ServerConfig};
use serde_json::{json, Value};

const SCRIPT: &str = r#"{
  "agent": "toolcaller", "task": "gaia-001",
  "conversations": {"main": [
    {"content": null, "tool_calls": [{"name": "search", "arguments": {"query": "tallest tower"}}]},
    {"content": "{\"answer\": \"330 m\"}"}
  ]}
}"#;

fn scripts() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("toolcaller")).unwrap();
    std::fs::write(dir.path().join("toolcaller/gaia-001.json"), SCRIPT).unwrap();
    dir
}

fn start(listen: Listen, scripts: &Path) -> BackgroundServer {
    let backend = Arc::new(ScriptedBackend::new(ScriptStore::new(scripts)));
    BackgroundServer::start(ServerConfig::new(listen), backend).unwrap()
}

/// One HTTP/1.1 exchange with `Connection: close`; returns (status, headers, body).
fn exchange(
    url: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    let mut raw = Vec::new();
    if let Some(path) = url.strip_prefix("unix:") {
        let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        s.read_to_end(&mut raw).unwrap();
    } else {
        let addr = url.strip_prefix("http://").unwrap();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        s.read_to_end(&mut raw).unwrap();
    }
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut body = raw[split + 4..].to_vec();
    let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, head, body)
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&data[..line_end]).unwrap().trim(), 16)
                .unwrap();
        data = &data[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

fn chat(url: &str, body: &Value, key: Option<&str>) -> (u16, String, Vec<u8>) {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(k) = key {
        headers.push(("X-Pathfinder-Script", k));
    }
    exchange(
        url,
        "POST",
        "/v1/chat/completions",
        &headers,
        body.to_string().as_bytes(),
    )
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "search", "description": "Search the corpus.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}])
}

#[test]
fn non_streaming_plays_the_script_over_a_unix_socket() {
    let dir = scripts();
    let sock = dir.path().join("llm.sock");
    let server = start(Listen::Unix(sock.clone()), dir.path());
    assert_eq!(server.url(), format!("unix:{}", sock.display()));

    let first = json!({"model": "pathfinder-scripted", "seed": 3, "tools": tools(),
        "messages": [{"role": "user", "content": "How tall? Reply {\"answer\": \"...\"}."}]});
    let (status, _, body) = chat(server.url(), &first, Some("toolcaller/gaia-001/main"));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "search");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"query": "tallest tower"}));
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 10);

    let second = json!({"model": "pathfinder-scripted", "seed": 3, "tools": tools(), "messages": [
        {"role": "user", "content": "How tall? Reply {\"answer\": \"...\"}."},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "The tower is 330 m."}]});
    let (status, _, body) = chat(server.url(), &second, Some("toolcaller/gaia-001/main"));
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.contains("{\"answer\": \"330 m\"}"), "{content}");
    drop(server);
    assert!(!sock.exists(), "the socket file is removed on shutdown");
}

#[test]
fn streaming_over_tcp_reassembles_and_reports_usage() {
    let dir = scripts();
    let server = start(Listen::loopback(0), dir.path());
    let req = json!({"model": "m", "seed": 11, "stream": true, "tools": tools(),
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "How tall? Reply {\"answer\": \"...\"}."}]});
    let (status, head, body) = chat(server.url(), &req, Some("toolcaller/gaia-001/main"));
    assert_eq!(status, 200);
    assert!(head.to_ascii_lowercase().contains("text/event-stream"));
    let text = String::from_utf8(body).unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"));
    let mut args = String::new();
    let mut usage = None;
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(line).unwrap();
        if v["usage"].is_object() {
            usage = Some(v["usage"].clone());
        }
        if let Some(a) = v
            .pointer("/choices/0/delta/tool_calls/0/function/arguments")
            .and_then(Value::as_str)
        {
            args.push_str(a);
        }
    }
    assert_eq!(
        serde_json::from_str::<Value>(&args).unwrap(),
        json!({"query": "tallest tower"})
    );
    assert!(usage.unwrap()["completion_tokens"].as_u64().unwrap() > 0);
    // Same seed, same bytes apart from the creation time.
    let strip = |t: &str| {
        t.lines()
            .map(|l| {
                let v: Option<Value> = l
                    .strip_prefix("data: ")
                    .and_then(|d| serde_json::from_str(d).ok());
                v.map(|mut v| {
                    v["created"] = json!(0);
                    v.to_string()
                })
                .unwrap_or_else(|| l.to_owned())
            })
            .collect::<Vec<_>>()
    };
    let (_, _, again) = chat(server.url(), &req, Some("toolcaller/gaia-001/main"));
    assert_eq!(strip(&text), strip(&String::from_utf8(again).unwrap()));
}

#[test]
fn streaming_max_tokens_ends_with_length() {
    let dir = scripts();
    let server = start(Listen::loopback(0), dir.path());
    let req = json!({"model": "m", "stream": true, "max_tokens": 3, "tools": tools(),
        "messages": [{"role": "user", "content": "How tall? Reply {\"answer\": \"...\"}."}]});
    let (status, _, body) = chat(server.url(), &req, Some("toolcaller/gaia-001/main"));
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
}

#[test]
fn errors_have_openai_shape() {
    let dir = scripts();
    let server = start(Listen::loopback(0), dir.path());
    let url = server.url().to_owned();
    let key = Some("toolcaller/gaia-001/main");
    let msgs = json!([{"role": "user", "content": "q"}]);

    let (status, _, body) = exchange(&url, "POST", "/v1/chat/completions", &[], b"{\"model\": ");
    assert_eq!(status, 400);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("column"));

    let (status, _, body) = chat(
        &url,
        &json!({"model": "m", "messages": msgs, "temperature": 3}),
        key,
    );
    assert_eq!(status, 400);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"]["param"],
        "temperature"
    );

    let (status, _, body) = chat(&url, &json!({"model": "m", "messages": msgs}), None);
    assert_eq!(status, 400);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"]["code"],
        "missing_script_header"
    );

    let (status, _, body) = chat(
        &url,
        &json!({"model": "m", "messages": msgs}),
        Some("toolcaller/gaia-404/main"),
    );
    assert_eq!(status, 404);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"]["code"],
        "script_not_found"
    );

    let long = "lorem ipsum ".repeat(9000);
    let (status, _, body) = chat(
        &url,
        &json!({"model": "m", "messages": [{"role": "user", "content": long}]}),
        key,
    );
    assert_eq!(status, 400);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"]["code"],
        "context_length_exceeded"
    );

    let (status, _, _) = exchange(&url, "GET", "/v2/nothing", &[], b"");
    assert_eq!(status, 404);
    let (status, _, _) = exchange(&url, "GET", "/v1/chat/completions", &[], b"");
    assert_eq!(status, 405);
}

#[test]
fn body_limit_is_enforced() {
    let dir = scripts();
    let backend = Arc::new(ScriptedBackend::new(ScriptStore::new(dir.path())));
    let mut config = ServerConfig::new(Listen::loopback(0));
    config.body_limit = 1024;
    let server = BackgroundServer::start(config, backend).unwrap();
    let big = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(4096)}]});
    let (status, _, body) = chat(server.url(), &big, Some("toolcaller/gaia-001/main"));
    assert_eq!(status, 413);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"]["code"],
        "request_too_large"
    );
}

#[test]
fn models_and_health() {
    let dir = scripts();
    let server = start(Listen::loopback(0), dir.path());
    let (status, _, body) = exchange(server.url(), "GET", "/v1/models", &[], b"");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["data"][0]["id"], "pathfinder-scripted");
    let (status, _, body) = exchange(server.url(), "GET", "/health", &[], b"");
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["backend"],
        "scripted"
    );
}

const FAULTY: &str = r#"{
  "agent": "toolcaller", "task": "gaia-002",
  "conversations": {"main": [
    {"content": "first", "provider_fault": {"status": 503, "attempts": 2}},
    {"content": "second", "provider_fault": {"cut_stream": true}}
  ]}
}"#;

#[test]
fn provider_faults_are_met_by_the_first_attempts_of_each_run() {
    let dir = scripts();
    std::fs::write(dir.path().join("toolcaller/gaia-002.json"), FAULTY).unwrap();
    let server = start(Listen::loopback(0), dir.path());
    let first = json!({"model": "m", "messages": [{"role": "user", "content": "Go"}]});
    let status = |key: &str| chat(server.url(), &first, Some(key)).0;
    // Two failing attempts, then the step plays; a second run meets the fault afresh.
    for run in ["toolcaller/gaia-002@r1/main", "toolcaller/gaia-002@r2/main"] {
        assert_eq!(status(run), 503);
        assert_eq!(status(run), 503);
        assert_eq!(status(run), 200);
        assert_eq!(status(run), 200);
    }
    let (_, _, body) = chat(server.url(), &first, Some("toolcaller/gaia-002@r3/main"));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["type"], "server_error");

    // `cut_stream` breaks a streamed reply once (no finish reason, no [DONE]); a
    // non-streamed request for the same step is served whole and does not count.
    let second = |stream: bool| {
        json!({"model": "m", "stream": stream, "messages": [
            {"role": "user", "content": "Go"}, {"role": "assistant", "content": "first"},
            {"role": "user", "content": "Again"}]})
    };
    let key = Some("toolcaller/gaia-002@r4/main");
    let (status, _, body) = chat(server.url(), &second(false), key);
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "second");
    let (_, _, cut) = chat(server.url(), &second(true), key);
    let cut = String::from_utf8(cut).unwrap();
    assert!(
        !cut.contains("[DONE]") && !cut.contains("finish_reason\":\"stop"),
        "{cut}"
    );
    let (_, _, whole) = chat(server.url(), &second(true), key);
    let whole = String::from_utf8(whole).unwrap();
    assert!(whole.trim_end().ends_with("data: [DONE]"), "{whole}");
}

#[test]
fn a_step_plays_its_reaction_when_the_error_does_not_say_what_went_wrong() {
    let dir = scripts();
    std::fs::write(
        dir.path().join("toolcaller/gaia-003.json"),
        r#"{"agent": "toolcaller", "task": "gaia-003", "conversations": {"main": [
            {"content": null, "tool_calls": [{"name": "search", "arguments": {"query": "towr"}}]},
            {"content": "corrected", "unless_observation_mentions":
              {"any_of": ["towr"], "play": {"content": "blind retry"}}}]}}"#,
    )
    .unwrap();
    let server = start(Listen::loopback(0), dir.path());
    let after = |error: &str| {
        let req = json!({"model": "m", "tools": tools(), "messages": [
            {"role": "user", "content": "How tall?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "search", "arguments": "{\"query\": \"towr\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": error}]});
        let (_, _, body) = chat(server.url(), &req, Some("toolcaller/gaia-003/main"));
        let v: Value = serde_json::from_slice(&body).unwrap();
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(after("Error: no document matches 'towr'"), "corrected");
    assert_eq!(after("Error: search failed"), "blind retry");
}
