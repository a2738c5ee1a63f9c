//! End-to-end: `pathfinder traces import | schema | export` on the crate's fixtures and the
//! chat logs in Who&When's format in tests/fixtures/who-and-when (written for this project).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn pathfinder(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pathfinder"))
        .args(args)
        .output()
        .expect("run pathfinder")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../traces/tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

/// The six chat logs of tests/fixtures/who-and-when, sorted by path.
fn chat_logs() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/who-and-when");
    let mut files: Vec<PathBuf> = ["algorithm-generated", "hand-crafted"]
        .iter()
        .flat_map(|set| {
            std::fs::read_dir(dir.join(set))
                .unwrap_or_else(|e| panic!("{}: {e}", dir.join(set).display()))
                .map(|e| e.unwrap().path())
        })
        .collect();
    files.sort();
    files.iter().map(|p| p.display().to_string()).collect()
}

#[test]
fn import_schema_export_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("traces.db").display().to_string();
    let mut args = vec!["traces", "import", "--db", db.as_str()];
    let otlp = fixture("otlp_genai_openinference.json");
    args.push(&otlp);
    let chat_logs = chat_logs();
    assert_eq!(chat_logs.len(), 6, "{chat_logs:?}");
    args.extend(chat_logs.iter().map(String::as_str));
    let out = pathfinder(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("(otlp): 2 traces, 19 spans, 0 labels"),
        "{stdout}"
    );
    assert!(stdout.contains("7 of 7 files imported"), "{stdout}");
    // 19 OTLP spans and one span per chat turn: 6 + 7 + 8 + 8 (algorithm-generated/1–4) and
    // 21 + 23 (hand-crafted/1–2) = 73; one label per chat log.
    assert!(
        stdout.contains(": 8 traces, 92 spans, 6 labels"),
        "{stdout}"
    );

    let out = pathfinder(&["traces", "schema", "--db", &db, "--budget", "3000"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let schema = text(&out.stdout);
    assert!(
        schema.starts_with("## Tables (SQLite)\ntraces (8 rows"),
        "{schema}"
    );
    assert!(schema.chars().count() <= 3000);
    assert!(!schema.contains("labels"), "{schema}");

    let export = dir.path().join("export").display().to_string();
    let out = pathfinder(&[
        "traces",
        "export",
        "--db",
        &db,
        "--trace",
        "5b8efff798038103d269b633813fc60c",
        "--out",
        &export,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    let json_path = Path::new(&export).join("5b8efff798038103d269b633813fc60c.json");
    let jsonl_path = Path::new(&export).join("5b8efff798038103d269b633813fc60c.spans.jsonl");
    assert!(
        listed.contains(&json_path.display().to_string()),
        "{listed}"
    );
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(trace["span_count"], 14);
    assert_eq!(
        std::fs::read_to_string(&jsonl_path)
            .unwrap()
            .lines()
            .count(),
        14
    );

    // The exported spans are the agents' JSON Lines: they import into a new store as they are.
    let db2 = dir.path().join("again.db").display().to_string();
    let jsonl = jsonl_path.display().to_string();
    let out = pathfinder(&[
        "traces", "import", "--db", &db2, "--format", "jsonl", &jsonl,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("1 traces, 14 spans"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn rejected_files_are_reported_and_fail_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("traces.db").display().to_string();
    let good = fixture("good_agent_trace.jsonl");
    let bad = fixture("parent_cycle.jsonl");
    let out = pathfinder(&[
        "traces", "import", "--db", &db, "--format", "jsonl", &bad, &good,
    ]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("parent_cycle.jsonl: line 2: parent cycle in trace"),
        "{stderr}"
    );
    assert!(stderr.contains("1 of 2 files were rejected"), "{stderr}");
    assert!(
        text(&out.stdout).contains("1 of 2 files imported"),
        "{}",
        text(&out.stdout)
    );

    // Importing the good file again is refused as a duplicate trace.
    let out = pathfinder(&["traces", "import", "--db", &db, &good]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is already in the store"),
        "{}",
        text(&out.stderr)
    );

    let out = pathfinder(&[
        "traces",
        "export",
        "--db",
        &db,
        "--trace",
        "missing",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("trace missing is not in the store"),
        "{}",
        text(&out.stderr)
    );

    let out = pathfinder(&[
        "traces",
        "schema",
        "--db",
        dir.path().join("nope.db").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("nope.db"),
        "{}",
        text(&out.stderr)
    );
}
