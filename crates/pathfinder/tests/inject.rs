//! `pathfinder inject` end to end, with the inject crate's fixture templates.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn pathfinder(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pathfinder"))
        .args(args)
        .current_dir(root())
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const FIXTURES: &str = "crates/inject/tests/fixtures/templates";

#[test]
fn coverage_prints_the_table_and_checks_templates() {
    let out = pathfinder(&["inject", "coverage", "--templates-dir", FIXTURES, "--check"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let p2 = stdout.lines().find(|l| l.starts_with("P2 ")).unwrap();
    assert_eq!(p2.matches('✓').count(), 1, "{p2}");
    assert!(
        stdout.contains("3 templates; 3/300 (type, agent) cells covered"),
        "{stdout}"
    );
    assert!(stdout.contains("empty for swe (50)"), "{stdout}");
    assert!(
        stdout.contains("check: 3/3 templates apply cleanly"),
        "{stdout}"
    );
}

#[test]
fn one_injection_by_hand_and_as_a_diff() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bug");
    let out_s = out.to_str().unwrap();
    let run = pathfinder(&[
        "inject",
        "--templates-dir",
        FIXTURES,
        "--agent",
        "toolcaller",
        "--type",
        "p19",
        "--site",
        "toolcaller/schema.py:validate",
        "--out",
        out_s,
    ]);
    let (stdout, stderr) = text(&run);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("P19-no-items-check (removal)"), "{stdout}");
    assert!(
        stdout.contains("in validate [tools.validation]"),
        "{stdout}"
    );
    for file in [
        "deficiency_inject.diff",
        "deficiency_type",
        "trace_signature",
        "location.json",
        "injection.json",
        "repo/.git",
    ] {
        assert!(out.join(file).exists(), "{file}");
    }

    // The same diff as a free-form injection.
    let diff = out.join("deficiency_inject.diff");
    let out2 = tmp.path().join("bug2");
    let run = pathfinder(&[
        "inject",
        "apply-diff",
        "--agent",
        "toolcaller",
        "--diff",
        diff.to_str().unwrap(),
        "--type",
        "P19",
        "--out",
        out2.to_str().unwrap(),
        "--json",
    ]);
    let (stdout, stderr) = text(&run);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["injection"]["strategy"], "freeform");
    assert_eq!(json["injection"]["location"]["function"], "validate");

    // A diff for another agent's file does not apply.
    let bad = tmp.path().join("bad.diff");
    std::fs::write(
        &bad,
        std::fs::read_to_string(&diff)
            .unwrap()
            .replace("toolcaller/schema.py", "toolcaller/nothing.py"),
    )
    .unwrap();
    let run = pathfinder(&[
        "inject",
        "apply-diff",
        "--agent",
        "toolcaller",
        "--diff",
        bad.to_str().unwrap(),
        "--out",
        tmp.path().join("bug3").to_str().unwrap(),
    ]);
    let (_, stderr) = text(&run);
    assert!(!run.status.success());
    assert!(
        stderr.contains("diff rejected: does not apply: toolcaller/nothing.py: no such file"),
        "{stderr}"
    );
    assert!(!tmp.path().join("bug3").exists());
}

#[test]
fn clear_errors_for_bad_requests() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x");
    let run = pathfinder(&[
        "inject",
        "--templates-dir",
        FIXTURES,
        "--agent",
        "toolcaller",
        "--type",
        "P2",
        "--variant",
        "nope",
        "--out",
        out.to_str().unwrap(),
    ]);
    let (_, stderr) = text(&run);
    assert!(!run.status.success());
    assert!(
        stderr.contains("no template for P2 on toolcaller"),
        "{stderr}"
    );
    assert!(stderr.contains("with variant \"nope\""), "{stderr}");

    let run = pathfinder(&["inject", "--agent", "toolcaller"]);
    let (_, stderr) = text(&run);
    assert!(!run.status.success());
    assert!(
        stderr.contains("give --agent, --type and --out"),
        "{stderr}"
    );

    let run = pathfinder(&[
        "inject",
        "--agent",
        "nobody",
        "--type",
        "P2",
        "--out",
        out.to_str().unwrap(),
    ]);
    let (_, stderr) = text(&run);
    assert!(!run.status.success());
    assert!(stderr.contains("no agent \"nobody\""), "{stderr}");
}

#[test]
fn corpus_generate_interrupts_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("corpus");
    let args = [
        "corpus",
        "generate",
        "--agents",
        "toolcaller",
        "--types",
        "p2,P19",
        "--tasks",
        "1",
        "--seed",
        "5",
        "--no-keyword",
        "--templates-dir",
        FIXTURES,
        "--out",
        out.to_str().unwrap(),
    ];
    let mut first: Vec<&str> = args.to_vec();
    first.extend(["--max-episodes", "1"]);
    let run = pathfinder(&first);
    let (stdout, stderr) = text(&run);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 episodes complete, 1 remaining"),
        "{stdout}"
    );
    let run = pathfinder(&args);
    let (stdout, stderr) = text(&run);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("episodes valid"), "{stdout}");
    assert!(stdout.contains("  P2   1/1 valid"), "{stdout}");
    for file in [
        "store.sqlite",
        "corpus.jsonl",
        "splits/train.jsonl",
        "report.json",
        "digest",
    ] {
        assert!(out.join(file).exists(), "{file}");
    }
    // The blame set: toolcaller is one agent, so every record is accounted for and none written.
    let records = std::fs::read_to_string(out.join("corpus.jsonl"))
        .unwrap()
        .lines()
        .count();
    let logs = tmp.path().join("logs");
    let run = pathfinder(&[
        "corpus",
        "chatlogs",
        "--corpus",
        out.to_str().unwrap(),
        "--out",
        logs.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&run);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    // "N chat logs written to DIR; left out: A …, B …, C …" (DIR may hold digits).
    let (written, rest) = stdout
        .split_once(" chat logs written")
        .expect("the count line");
    let (_, left_out) = rest.split_once("left out:").expect("what was left out");
    let numbers: Vec<usize> = left_out
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(written.trim(), "0", "{stdout}");
    assert_eq!(numbers.len(), 3, "{stdout}");
    assert_eq!(numbers.iter().sum::<usize>(), records, "{stdout}");
    assert!(logs.is_dir());

    let mut bad: Vec<&str> = args.to_vec();
    bad[5] = "P99";
    let run = pathfinder(&bad);
    let (_, stderr) = text(&run);
    assert!(!run.status.success());
    assert!(stderr.contains("\"P99\" is not a catalog id"), "{stderr}");
}
