//! `pathfinder detect` end to end on a store of synthetic traces with known deficiencies.

use std::process::Command;

fn pathfinder() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pathfinder"))
}

fn store() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    Vec<(String, traces::Label)>,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("traces.db");
    let labels = detect::synthetic::build_store(&path, 1).unwrap();
    (dir, path, labels)
}

#[test]
fn expert_names_the_planted_deficiency_and_saves_the_episode() {
    let (dir, db, labels) = store();
    let (trace, _) = labels
        .iter()
        .find(|(_, l)| l.truth.deficiency_id.as_deref() == Some("P16"))
        .unwrap();
    let episodes = dir.path().join("episodes.db");
    let json = dir.path().join("t.json");
    let out = pathfinder()
        .args(["detect", "--db"])
        .arg(&db)
        .args([
            "--trace",
            trace,
            "--policy",
            "expert",
            "--transcript",
            "--transcript-json",
        ])
        .arg(&json)
        .arg("--save-episode")
        .arg(&episodes)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The type, the component, where it first shows (the step of the first error), evidence.
    let last = stdout.lines().last().unwrap();
    assert!(
        last.starts_with("P16 tools.schema @step ") && last.contains(" | "),
        "{stdout}"
    );
    assert!(stdout.contains("> sql: SELECT"), "{stdout}");
    let t: detect::Transcript =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let store = traces::Store::open_read_only(&episodes).unwrap();
    assert_eq!(
        detect::Transcript::from_spans(&store.spans(&t.episode_id).unwrap()).unwrap(),
        t
    );
}

#[test]
fn tool_prints_observations_and_refusals_exit_non_zero() {
    let (_dir, db, labels) = store();
    let trace = &labels[0].0;
    let out = pathfinder()
        .args(["detect", "tool", "--db"])
        .arg(&db)
        .args([
            "--trace",
            trace,
            "--sql",
            "SELECT kind, COUNT(*) AS n FROM spans GROUP BY kind ORDER BY kind",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("kind"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let out = pathfinder()
        .args(["detect", "tool", "--db"])
        .arg(&db)
        .args([
            "--trace",
            trace,
            "--bash",
            "jq -r .name spans.jsonl | sort | uniq -c",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("agent.run"));

    for (flag, call, reason) in [
        (
            "--sql",
            "SELECT * FROM labels",
            "`labels` table is not readable",
        ),
        ("--bash", "cat spans.jsonl > /tmp/x", "redirection"),
    ] {
        let out = pathfinder()
            .args(["detect", "tool", "--db"])
            .arg(&db)
            .args(["--trace", trace, flag, call])
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(reason),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn unknown_trace_and_missing_arguments_are_clear_errors() {
    let (_dir, db, _) = store();
    let out = pathfinder()
        .args(["detect", "--db"])
        .arg(&db)
        .args(["--trace", "nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("trace nope is not in the store"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = pathfinder()
        .args(["detect", "--policy", "keyword"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--db PATH and --trace ID"));
}
