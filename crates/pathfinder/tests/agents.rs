//! End-to-end tests of `pathfinder serve` and `pathfinder agents`, including the suite test
//! that reports toolcaller's success rate on its GAIA suite with the scripted backend.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn pathfinder(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pathfinder"))
        .args(args)
        .current_dir(root())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn toolcaller_solves_at_least_90_percent_of_its_suite() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("suite");
    let (ok, stdout, stderr) = pathfinder(&[
        "agents",
        "suite",
        "--agent",
        "toolcaller",
        "--seed",
        "7",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stdout}\n{stderr}");
    // "toolcaller: 28/28 tasks solved (100.0%), seed 7; runs in …"
    let line = stdout.lines().find(|l| l.contains("tasks solved")).unwrap();
    let counts = line.split_whitespace().nth(1).unwrap();
    let (solved, total) = counts.split_once('/').unwrap();
    let (solved, total): (f64, f64) = (solved.parse().unwrap(), total.parse().unwrap());
    assert!(
        total >= 20.0,
        "the GAIA suite has at least 20 tasks: {line}"
    );
    let rate = solved / total;
    println!(
        "toolcaller suite success rate: {solved}/{total} = {:.1}%",
        100.0 * rate
    );
    assert!(rate >= 0.9, "{line}\n{stdout}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["succeeded"].as_f64().unwrap(), solved);
    // Every run left a trace that follows the contract.
    for outcome in summary["outcomes"].as_array().unwrap() {
        assert_eq!(
            outcome["trace_problems"],
            serde_json::json!([]),
            "{}",
            outcome["task_id"]
        );
    }
}

#[test]
fn run_prints_where_the_trace_went_and_the_verdict() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let (ok, stdout, stderr) = pathfinder(&[
        "agents",
        "run",
        "--agent",
        "toolcaller",
        "--task",
        "gaia-005",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("trace: {}", out.join("trace.jsonl").display())),
        "{stdout}"
    );
    assert!(stdout.contains("gaia-005: SUCCESS"), "{stdout}");
    // A second run into the same directory needs --force.
    let (ok, _, stderr) = pathfinder(&[
        "agents",
        "run",
        "--agent",
        "toolcaller",
        "--task",
        "gaia-005",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!ok && stderr.contains("--force"), "{stderr}");
    let (ok, _, stderr) = pathfinder(&[
        "agents",
        "run",
        "--agent",
        "toolcaller",
        "--task",
        "gaia-999",
    ]);
    assert!(!ok && stderr.contains("gaia-999"), "{stderr}");
}

#[test]
fn list_and_materialize() {
    let (ok, stdout, stderr) = pathfinder(&["agents", "list"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("toolcaller") && l.contains("gaia")),
        "{stdout}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("repo");
    let (ok, stdout, stderr) = pathfinder(&[
        "agents",
        "materialize",
        "--agent",
        "toolcaller",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("fix commits"), "{stdout}");
    assert!(out.join(".git").is_dir() && out.join("toolcaller/__main__.py").is_file());
    assert!(!out.join("agent.toml").exists());
}

#[test]
fn serve_model_backend_says_it_is_not_available() {
    let (ok, _, stderr) = pathfinder(&["serve", "--backend", "model", "--port", "0"]);
    assert!(!ok);
    assert!(
        stderr.contains("the model backend needs crates/model, not yet available"),
        "{stderr}"
    );
}

#[test]
fn serve_answers_on_a_unix_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("llm.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pathfinder"))
        .args(["serve", "--unix", sock.to_str().unwrap()])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap());
    lines.read_line(&mut first).unwrap();
    assert_eq!(
        first.trim(),
        format!("listening on unix:{}", sock.display())
    );
    let mut stream = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\"backend\":\"scripted\""), "{response}");
}
