//! `pathfinder taxonomy` as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn pathfinder(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pathfinder"))
        .args(args)
        .output()
        .expect("run pathfinder")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn repo_catalog() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deficiencies")
}

#[test]
fn list_json_has_fifty_complete_entries() {
    let out = pathfinder(&["taxonomy", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let entries: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(entries.len(), 50);
    for entry in &entries {
        let id = entry["id"].as_str().unwrap();
        for field in [
            "id",
            "name",
            "category",
            "family",
            "manifestation",
            "mechanism",
            "trace_signature",
        ] {
            let value = entry[field].as_str().unwrap_or_default();
            assert!(!value.trim().is_empty(), "{id}: `{field}` is empty");
        }
        assert!(
            !entry["components"].as_array().unwrap().is_empty(),
            "{id}: no components"
        );
        if id.starts_with('P') {
            assert!(
                entry["source_framework"].is_string(),
                "{id}: no source framework"
            );
        }
    }
}

#[test]
fn list_filters_by_category() {
    let out = pathfinder(&["taxonomy", "list", "--category", "tool schema conflicts"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ids: Vec<String> = stdout(&out)
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["P15", "P16", "P17", "P18", "P19"]);

    let out = pathfinder(&["taxonomy", "list", "--category", "Nonsense"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unknown category `Nonsense`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn show_prints_an_entry_readably() {
    let out = pathfinder(&["taxonomy", "show", "P16"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("P16 — $ref cycles in nested tool schemas cause infinite loop"),
        "{text}"
    );
    for heading in [
        "category        Tool Schema Conflicts",
        "source          SWE-agent",
        "Mechanism",
        "Trace signature",
        "tools.schema",
    ] {
        assert!(text.contains(heading), "missing {heading:?} in\n{text}");
    }

    let out = pathfinder(&["taxonomy", "show", "P99"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no deficiency type `P99`"));
}

#[test]
fn validate_accepts_the_repository_catalog() {
    let dir = repo_catalog();
    let out = pathfinder(&["taxonomy", "validate", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("valid — 50 deficiency types (27 production, 23 conceptual)"));
}

#[test]
fn validate_rejects_a_broken_catalog_with_a_precise_message() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog");
    std::fs::create_dir(&catalog).unwrap();
    std::fs::copy(
        repo_catalog().join("components.toml"),
        dir.path().join("components.toml"),
    )
    .unwrap();
    for entry in std::fs::read_dir(repo_catalog().join("catalog")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, catalog.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::remove_file(catalog.join("P27.toml")).unwrap();
    std::fs::copy(catalog.join("C1.toml"), catalog.join("C1-again.toml")).unwrap();

    let out = pathfinder(&["taxonomy", "validate", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("missing deficiency type: P27"), "{err}");
    assert!(err.contains("field `id`: duplicate id `C1`"), "{err}");
    assert!(err.contains("C1-again.toml"), "{err}");
}
