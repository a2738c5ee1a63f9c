//! The learned blamer through the commands: `train` fits it on the corpus's multi-agent logs and
//! saves it with the Detector's adapter; `eval --chatlog … --detector checkpoint:DIR` and
//! `detect --policy checkpoint:DIR` on a chat log blame with it. On synthetic three-agent runs
//! and a tiny random model: these test the commands, not what the blamer is worth
//! (BENCHMARKS.md measures that).

#[path = "support/warm.rs"]
#[allow(dead_code)]
mod warm;
use warm::{ok, pathfinder, warm_started_blaming};

#[test]
fn a_checkpoints_blame_head_blames_chat_logs_in_eval_and_detect() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, checkpoint) = warm_started_blaming(dir.path(), "", &[], 30);
    assert!(checkpoint
        .join("detector")
        .join(policy::blame_head::FILE)
        .is_file());
    let logs = dir.path().join("logs");
    ok(
        pathfinder()
            .args(["corpus", "chatlogs", "--corpus"])
            .arg(dir.path().join("corpus"))
            .arg("--out")
            .arg(&logs)
            .args(["--split", "test"])
            .output()
            .unwrap(),
        "corpus chatlogs",
    );
    let detector = format!("first-error,checkpoint:{}", checkpoint.display());
    let (stdout, _) = ok(
        pathfinder()
            .args(["eval", "--json", "--detector", &detector, "--chatlog"])
            .arg(&logs)
            .output()
            .unwrap(),
        "eval --chatlog",
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let learned = &report["reports"][1];
    assert_eq!(learned["summary"]["logs"], 5, "{learned}");
    // The head learnt the runs' rule (the turn that wrote the failing code) from 20 train logs.
    assert_eq!(learned["summary"]["step_exact"]["value"], 1.0, "{learned}");
    assert_eq!(learned["summary"]["agent"]["value"], 1.0, "{learned}");
    for case in learned["cases"].as_array().unwrap() {
        let evidence = case["predicted"]["evidence"].as_str().unwrap();
        assert!(evidence.contains("learned blame head"), "{case}");
    }

    // `detect` on one of those logs, imported into a store of the user's.
    let db = dir.path().join("user.sqlite");
    let log = std::fs::read_dir(&logs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    ok(
        pathfinder()
            .args(["traces", "import", "--db"])
            .arg(&db)
            .arg(&log)
            .output()
            .unwrap(),
        "traces import",
    );
    let trace: String = traces::Store::open_read_only(&db)
        .unwrap()
        .connection()
        .query_row("SELECT trace_id FROM traces", [], |r| r.get(0))
        .unwrap();
    let (stdout, _) = ok(
        pathfinder()
            .args(["detect", "--db"])
            .arg(&db)
            .args(["--trace", &trace, "--transcript", "--policy"])
            .arg(format!("checkpoint:{}", checkpoint.display()))
            .output()
            .unwrap(),
        "detect",
    );
    assert!(
        stdout.contains("answer: agent Coder step")
            && stdout.contains("learned blame head's choice"),
        "{stdout}"
    );
}
