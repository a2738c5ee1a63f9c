//! The code the Injector changed runs only inside the runner's sandboxes: no source file of
//! the crates that run injected agents (`corpus`, `rl`) may start a process itself or reach the
//! agents crate's unsandboxed run path. They go through `runner::Executor`.
//!
//! A lint over the sources rather than a runtime check, because the point is that no code
//! path exists, including ones no test exercises.

use std::path::{Path, PathBuf};

/// What starts an agent (or anything else) outside the runner.
const FORBIDDEN: &[(&str, &str)] = &[
    ("Command::new", "starts a process"),
    ("process::Command", "starts a process"),
    ("agents::local", "the agents crate's unsandboxed run path"),
    ("run::run(", "the agents crate's unsandboxed run path"),
    ("AgentCommand", "builds an agent's command line to start it"),
    ("run_task(", "the agents crate's unsandboxed run path"),
    ("run_suite(", "the agents crate's unsandboxed run path"),
    ("libc::fork", "starts a process"),
];

/// The crates whose every agent run must be sandboxed.
const GUARDED: &[&str] = &["crates/corpus/src", "crates/rl/src"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `file:line: what` for each forbidden use in `text`; comment lines are not code.
fn violations(file: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        for (needle, what) in FORBIDDEN {
            if code.contains(needle) {
                found.push(format!("{file}:{}: `{needle}` {what}", i + 1));
            }
        }
    }
    found
}

#[test]
fn the_lint_sees_a_process_started_outside_the_runner() {
    let bad = "fn f() {\n    // Command::new in a comment is fine\n    let _ = std::process::Command::new(\"python3\");\n    agents::run::run(&spec)?;\n}\n";
    assert_eq!(
        violations("x.rs", bad),
        [
            "x.rs:3: `Command::new` starts a process",
            "x.rs:3: `process::Command` starts a process",
            "x.rs:4: `run::run(` the agents crate's unsandboxed run path",
        ]
    );
}

#[test]
fn corpus_and_rl_start_agents_only_through_the_runner() {
    let root = root();
    let mut files = Vec::new();
    for dir in GUARDED {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 20, "the guarded sources were not found");
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let name = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        found.extend(violations(&name, &text));
    }
    assert!(
        found.is_empty(),
        "processes started outside the runner:\n{}",
        found.join("\n")
    );
}
