//! End to end over the four target agents, as a user drives them through the CLI: each clean
//! agent solves at least 90% of its suite against the scripted backend, every span of every
//! run imports into the trace store with a component location, and a second run with the same
//! seed leaves the same traces apart from ids and timestamps.
//!
//! Registered as a test of the `pathfinder` crate (see its Cargo.toml), so that
//! `CARGO_BIN_EXE_pathfinder` is the binary under test.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn pathfinder(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pathfinder"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run pathfinder");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "pathfinder {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs the agent's whole suite and returns (solved, total, trace files by task).
fn suite(agent: &str, seed: u64, out: &Path) -> (u32, u32, Vec<(String, PathBuf)>) {
    let seed = seed.to_string();
    let stdout = pathfinder(&[
        "agents",
        "suite",
        "--agent",
        agent,
        "--seed",
        &seed,
        "--out",
        out.to_str().unwrap(),
    ]);
    let line = stdout
        .lines()
        .find(|l| l.contains("tasks solved"))
        .unwrap_or_else(|| panic!("no summary line in\n{stdout}"));
    let (solved, total) = line
        .split_whitespace()
        .nth(1)
        .unwrap()
        .split_once('/')
        .unwrap();
    let mut traces: Vec<(String, PathBuf)> = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("trace.jsonl").is_file())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                p.join("trace.jsonl"),
            )
        })
        .collect();
    traces.sort();
    (solved.parse().unwrap(), total.parse().unwrap(), traces)
}

/// A trace with ids replaced by their order of appearance and timestamps removed.
/// The spans of a trace without what differs between two runs of the same script: ids, times,
/// and the run's directory (a tool error's stack trace names the files of the run's copy of
/// the agent).
fn normalised(path: &Path, run_dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap()
        .replace(run_dir.to_str().unwrap(), "RUN_DIR");
    let mut spans: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut ids: HashMap<String, usize> = HashMap::new();
    for span in &spans {
        let n = ids.len();
        ids.entry(span["span_id"].as_str().unwrap().to_owned())
            .or_insert(n);
    }
    for span in &mut spans {
        let obj = span.as_object_mut().unwrap();
        for key in ["trace_id", "start_time_unix_nano", "end_time_unix_nano"] {
            obj.remove(key);
        }
        for key in ["span_id", "parent_span_id"] {
            let id = obj
                .get(key)
                .and_then(Value::as_str)
                .map(|s| ids.get(s).copied());
            obj.insert(key.into(), serde_json::json!(id));
        }
    }
    spans
}

fn check_agent(agent: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (solved, total, first) = suite(agent, 3, &tmp.path().join("first"));
    println!("{agent}: {solved}/{total} tasks solved with the scripted backend (seed 3)");
    assert!(total >= 10, "{agent}'s suite has only {total} tasks");
    assert!(
        f64::from(solved) >= 0.9 * f64::from(total),
        "{agent} solved {solved}/{total}, below 90%"
    );
    assert_eq!(first.len(), total as usize, "every run leaves a trace");

    // Every trace imports, and every span in the store carries its code location.
    let db = tmp.path().join("traces.db");
    let mut args = vec![
        "traces",
        "import",
        "--db",
        db.to_str().unwrap(),
        "--format",
        "jsonl",
    ];
    args.extend(first.iter().map(|(_, p)| p.to_str().unwrap()));
    pathfinder(&args);
    let store = traces::Store::open(&db).unwrap();
    let conn = store.connection();
    let (traces, spans, unlocated): (i64, i64, i64) = conn
        .query_row(
            "SELECT (SELECT COUNT(*) FROM traces), COUNT(*),
                    SUM(code_filepath IS NULL OR code_function IS NULL OR code_lineno IS NULL)
             FROM spans",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(traces, i64::from(total));
    assert!(spans > traces, "{agent}: only {spans} spans");
    assert_eq!(
        unlocated, 0,
        "{agent}: {unlocated} of {spans} spans lack a code location"
    );
    let foreign: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM spans WHERE code_filepath NOT LIKE ?1 || '/%'",
            [agent],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        foreign, 0,
        "{agent}: spans located outside the agent's package"
    );

    // Same seed, same traces (ids and timestamps aside).
    let (_, _, second) = suite(agent, 3, &tmp.path().join("second"));
    assert_eq!(first.len(), second.len());
    for ((task, a), (_, b)) in first.iter().zip(&second) {
        assert_eq!(
            normalised(a, &tmp.path().join("first")),
            normalised(b, &tmp.path().join("second")),
            "{agent}/{task}: traces differ between runs"
        );
    }
}

#[test]
fn toolcaller_suite_traces_and_determinism() {
    check_agent("toolcaller");
}

#[test]
fn roleplay_suite_traces_and_determinism() {
    check_agent("roleplay");
}

#[test]
fn swe_suite_traces_and_determinism() {
    check_agent("swe");
}

#[test]
fn research_suite_traces_and_determinism() {
    check_agent("research");
}

/// The agents' own Python unit tests (standard-library `unittest`).
#[test]
fn agents_python_unit_tests_pass() {
    for agent in ["toolcaller", "roleplay", "swe", "research"] {
        let out = Command::new("python3")
            .args(["-m", "unittest", "discover", "-s", "tests", "-t", "."])
            .current_dir(root().join("agents").join(agent))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .expect("run python3");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{agent}: python unit tests failed:\n{stderr}"
        );
        let ran = stderr
            .lines()
            .find(|l| l.starts_with("Ran "))
            .unwrap_or("Ran ? tests");
        println!("{agent}: {ran}");
    }
}
