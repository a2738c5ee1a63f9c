//! `pathfinder eval` end to end: keyword vs expert on a synthetic labelled store, splits and
//! ablations, and the chat-log metrics on the six chat logs in Who&When's format in
//! tests/fixtures/who-and-when.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The expert's report as JSON, with few resamples (the figures' intervals are not checked here).
const EXPERT_AS_JSON: &[&str] = &[
    "eval",
    "--json",
    "--detector",
    "expert",
    "--resamples",
    "50",
];

fn pathfinder() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pathfinder"))
}

fn run_ok(args: &[&str], paths: &[(&str, &Path)]) -> String {
    let mut cmd = pathfinder();
    cmd.args(args);
    for (flag, path) in paths {
        cmd.arg(flag).arg(path);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn figure(report: &Value, name: &str) -> f64 {
    report["summary"][name]["value"]
        .as_f64()
        .unwrap_or_else(|| panic!("no {name} in {report:#}"))
}

#[test]
fn expert_beats_keyword_on_a_synthetic_store_with_intervals() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("traces.db");
    let labels = detect::synthetic::build_store(&db, 1).unwrap();

    let keyword: Value = serde_json::from_str(&run_ok(
        &[
            "eval",
            "--json",
            "--detector",
            "keyword",
            "--resamples",
            "200",
        ],
        &[("--db", &db)],
    ))
    .unwrap();
    let out = dir.path().join("report");
    let expert: Value = serde_json::from_str(&run_ok(
        &[
            "eval",
            "--json",
            "--detector",
            "expert",
            "--resamples",
            "200",
        ],
        &[("--db", &db), ("--out", &out)],
    ))
    .unwrap();
    for report in [&keyword, &expert] {
        assert_eq!(report["summary"]["traces"], labels.len());
        for name in ["detection", "localisation", "tool_calls"] {
            let e = &report["summary"][name];
            let (v, lo, hi) = (
                e["value"].as_f64().unwrap(),
                e["lo"].as_f64().unwrap(),
                e["hi"].as_f64().unwrap(),
            );
            assert!(lo <= v && v <= hi, "{name}: {e}");
        }
        let confusion = report["summary"]["confusion"].as_object().unwrap();
        let counted: u64 = confusion
            .values()
            .flat_map(|row| row.as_object().unwrap().values())
            .map(|c| c.as_u64().unwrap())
            .sum();
        assert_eq!(counted as usize, labels.len());
    }
    let (k, e) = (figure(&keyword, "detection"), figure(&expert, "detection"));
    // Shown with --nocapture: the figures the assertions below compare.
    println!(
        "keyword {:#}\nexpert {:#}",
        keyword["summary"], expert["summary"]
    );
    assert!(e > k, "expert {e} should beat keyword {k}");
    assert!(figure(&expert, "localisation") > figure(&keyword, "localisation"));
    // Keyword answers from one look; the expert investigates.
    assert!(figure(&expert, "tool_calls") > figure(&keyword, "tool_calls"));

    let markdown = std::fs::read_to_string(out.join("report.md")).unwrap();
    for heading in [
        "## Overall (Table 5)",
        "## Detection by category (Table 6)",
        "## Confusion summary",
        "95% CI",
    ] {
        assert!(markdown.contains(heading), "{heading} missing:\n{markdown}");
    }
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(written["summary"], expert["summary"]);
}

#[test]
fn splits_and_ablations_reach_the_detector() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("traces.db");
    let labels = detect::synthetic::build_store(&db, 1).unwrap();
    let split = dir.path().join("test.jsonl");
    let lines: String = labels
        .iter()
        .take(3)
        .map(|(id, _)| format!("{{\"split\": \"test\", \"trace_id\": \"{id}\"}}\n"))
        .collect();
    std::fs::write(&split, lines).unwrap();
    let report: Value = serde_json::from_str(&run_ok(
        &[
            "eval",
            "--json",
            "--detector",
            "expert",
            "--no-sql",
            "--no-shell",
            "--resamples",
            "50",
        ],
        &[("--db", &db), ("--split", &split)],
    ))
    .unwrap();
    assert_eq!(report["summary"]["traces"], 3);
    assert_eq!(
        report["ablations"],
        serde_json::json!(["no-sql", "no-shell"])
    );
    // With neither SQL nor bash the expert cannot run a single query.
    assert_eq!(figure(&report, "tool_calls"), 0.0);

    std::fs::write(&split, "{\"trace_id\": \"not-there\"}\n").unwrap();
    let out = pathfinder()
        .args(["eval", "--db"])
        .arg(&db)
        .arg("--split")
        .arg(&split)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not-there"));
}

/// The six labelled chat logs in Who&When's format that the repository carries
/// (tests/fixtures/who-and-when, written for this project; see its README.md).
fn who_and_when() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/who-and-when");
    assert!(
        dir.is_dir(),
        "the chat-log fixtures are missing: expected them at {}",
        dir.display()
    );
    dir
}

#[test]
fn chatlog_eval_reports_the_three_external_metrics() {
    let dir = who_and_when();
    let stdout = run_ok(&["eval", "--json"], &[("--chatlog", &dir)]);
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["detector"], "first-error");
    let summary = &report["summary"];
    assert_eq!(summary["logs"], 6);
    assert_eq!(summary["tolerance"], 1);
    for name in ["agent", "step_exact", "step_within"] {
        let e = &summary[name];
        assert_eq!(e["n"], 6, "{name}");
        let (v, lo, hi) = (
            e["value"].as_f64().unwrap(),
            e["lo"].as_f64().unwrap(),
            e["hi"].as_f64().unwrap(),
        );
        assert!(lo <= v && v <= hi, "{name}: {e}");
    }
    // Recompute the figures from the per-log answers the report lists.
    let cases = report["cases"].as_array().unwrap();
    let agent_hits = cases
        .iter()
        .filter(|c| c["predicted"]["agent"] == c["truth"]["agent"])
        .count();
    assert_eq!(
        summary["agent"]["value"].as_f64().unwrap(),
        agent_hits as f64 / 6.0
    );
    let within = |k: i64| {
        cases
            .iter()
            .filter(|c| {
                let truth = c["truth"]["step"].as_i64().unwrap();
                c["predicted"]["step"]
                    .as_i64()
                    .is_some_and(|s| (s - truth).abs() <= k)
            })
            .count() as f64
            / 6.0
    };
    assert_eq!(summary["step_exact"]["value"].as_f64().unwrap(), within(0));
    assert_eq!(summary["step_within"]["value"].as_f64().unwrap(), within(1));
    // A wider tolerance never lowers the figure.
    let wide: Value = serde_json::from_str(&run_ok(
        &["eval", "--json", "--tolerance", "20"],
        &[("--chatlog", &dir)],
    ))
    .unwrap();
    assert_eq!(
        wide["summary"]["step_within"]["value"].as_f64().unwrap(),
        within(20)
    );

    let markdown = run_ok(&["eval"], &[("--chatlog", &dir)]);
    for row in [
        "Agent-level accuracy",
        "Step accuracy (exact)",
        "Step accuracy (±1)",
        "`first-error`",
    ] {
        assert!(markdown.contains(row), "{row} missing:\n{markdown}");
    }
}

#[test]
fn the_expert_blames_every_chat_log_with_its_tools() {
    let dir = who_and_when();
    let stdout = run_ok(
        &["eval", "--json", "--detector", "expert"],
        &[("--chatlog", &dir)],
    );
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["detector"], "expert");
    assert_eq!(report["summary"]["logs"], 6);
    // Two detectors: both reports and the paired difference of the second against the first,
    // which is the difference of their figures on the same six logs.
    let both: Value = serde_json::from_str(&run_ok(
        &["eval", "--json", "--detector", "first-error,expert"],
        &[("--chatlog", &dir)],
    ))
    .unwrap();
    let reports = both["reports"].as_array().unwrap();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[1], report);
    let paired = &both["paired"][0];
    assert_eq!(
        (paired["base"].as_str(), paired["other"].as_str()),
        (Some("first-error"), Some("expert"))
    );
    for k in ["agent", "step_exact", "step_within"] {
        let d = paired[k]["value"].as_f64().unwrap();
        let gap = reports[1]["summary"][k]["value"].as_f64().unwrap()
            - reports[0]["summary"][k]["value"].as_f64().unwrap();
        assert!((d - gap).abs() < 1e-9, "{k}: {d} vs {gap}");
    }
    // Every log gets an answer naming one of its own agents at one of its own turns.
    for c in report["cases"].as_array().unwrap() {
        let source = c["source"].as_str().unwrap();
        let log: Value = serde_json::from_str(&std::fs::read_to_string(source).unwrap()).unwrap();
        let history = log["history"].as_array().unwrap();
        let (agent, step) = (
            c["predicted"]["agent"].as_str().expect("an answer"),
            c["predicted"]["step"].as_i64().unwrap(),
        );
        let turn = &history[step as usize];
        let name = turn["name"]
            .as_str()
            .or(turn["role"].as_str())
            .unwrap()
            .split(" (")
            .next()
            .unwrap()
            .replace(' ', "_");
        assert_eq!(agent, name, "{source}: step {step}");
    }
}

#[test]
fn chatlog_refuses_detectors_and_switches_that_do_not_apply() {
    let dir = who_and_when();
    for extra in [&["--detector", "keyword"][..], &["--no-sql"][..]] {
        let out = pathfinder()
            .args(["eval", "--chatlog"])
            .arg(&dir)
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{extra:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("error:"), "{stderr}");
    }
}

#[test]
fn comparison_and_ablation_table_over_one_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("traces.db");
    let labels = detect::synthetic::build_store(&db, 1).unwrap();
    // Five traces keep the 2 detectors × 6 settings quick.
    let split = dir.path().join("test.jsonl");
    let lines: String = labels
        .iter()
        .take(5)
        .map(|(id, _)| format!("{{\"trace_id\": \"{id}\"}}\n"))
        .collect();
    std::fs::write(&split, lines).unwrap();
    let out = dir.path().join("report");
    let markdown = run_ok(
        &[
            "eval",
            "--detector",
            "keyword,expert",
            "--ablation-table",
            "--resamples",
            "200",
        ],
        &[("--db", &db), ("--split", &split), ("--out", &out)],
    );
    // Shown with --nocapture: the Table 5 / Table 7 comparison.
    println!("{markdown}");
    assert!(markdown.starts_with("# Comparison"), "{markdown}");
    assert!(markdown.contains("| expert | no-sql |"), "{markdown}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2 * 6);
    let detection = |detector: &str, off: &[&str]| {
        let run = runs
            .iter()
            .find(|r| r["detector"] == detector && r["ablations"] == serde_json::json!(off))
            .unwrap();
        assert_eq!(run["summary"]["traces"], 5);
        figure(run, "detection")
    };
    assert!(detection("expert", &[]) > detection("keyword", &[]));
    assert!(detection("expert", &["no-sql"]) < detection("expert", &[]));

    let out = pathfinder()
        .args(["eval", "--ablation-table", "--no-sql", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a switch and the table conflict");
    let out = pathfinder()
        .args(["eval", "--detector", "keyword,oracle", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("`oracle`") && stderr.contains("checkpoint:DIR"),
        "{stderr}"
    );
}

#[test]
fn holdout_agent_evaluates_only_that_agents_traces() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("traces.db");
    let mut store = traces::Store::open(&db).unwrap();
    for (i, (id, agent)) in [("P16", "toolcaller"), ("P24", "planner"), ("C1", "planner")]
        .iter()
        .enumerate()
    {
        let trace_id = format!("{:032x}", i + 1);
        let (spans, mut label) = detect::synthetic::scenario(id, &trace_id, i as u64).unwrap();
        store.import_spans(spans, "test").unwrap();
        label.source = serde_json::json!({ "agent": agent });
        store.put_label(&label).unwrap();
    }
    drop(store);
    let report: Value = serde_json::from_str(&run_ok(
        &[
            "eval",
            "--json",
            "--holdout-agent",
            "planner",
            "--resamples",
            "50",
        ],
        &[("--db", &db)],
    ))
    .unwrap();
    assert_eq!(report["summary"]["traces"], 2);
    assert_eq!(report["holdout_agent"], "planner");
    assert_eq!(report["summary"]["per_agent"][0]["agent"], "planner");
    let markdown = run_ok(&["eval", "--resamples", "50"], &[("--db", &db)]);
    assert!(
        markdown.contains("## Detection by agent (Table 8)"),
        "{markdown}"
    );
    let out = pathfinder()
        .args(["eval", "--holdout-agent", "camel", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("planner, toolcaller"),
        "{stderr}"
    );
}

#[test]
fn a_label_file_scores_a_store_without_labels_and_names_what_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let labelled = dir.path().join("labelled.db");
    let built = detect::synthetic::build_store(&labelled, 1).unwrap();
    // The same traces in a store with no labels, as an import from elsewhere would be.
    let bare = dir.path().join("bare.db");
    {
        let source = traces::Store::open_read_only(&labelled).unwrap();
        let mut store = traces::Store::open(&bare).unwrap();
        for (id, _) in &built {
            store
                .import_spans(source.spans(id).unwrap(), "copy")
                .unwrap();
        }
    }
    // Every trace's label in a file, the first one called healthy, and one trace the store
    // does not hold.
    let mut lines: Vec<String> = built
        .iter()
        .enumerate()
        .map(|(i, (id, l))| {
            if i == 0 {
                serde_json::json!({"trace_id": id, "deficiency_id": "none"})
            } else {
                serde_json::json!({"trace_id": id, "deficiency_id": l.truth.deficiency_id,
                    "component": l.truth.component})
            }
            .to_string()
        })
        .collect();
    lines.push(r#"{"trace_id": "not-imported", "deficiency_id": "P3"}"#.into());
    let file = dir.path().join("labels.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let report: Value = serde_json::from_str(&run_ok(
        EXPERT_AS_JSON,
        &[("--db", &bare), ("--labels", &file)],
    ))
    .unwrap();
    assert_eq!(report["summary"]["traces"], built.len());
    assert_eq!(report["summary"]["healthy"], 1);
    assert!(report["summary"]["false_positive_rate"]["value"].is_number());
    assert_eq!(
        report["labels"]["unknown"],
        serde_json::json!(["not-imported"])
    );
    // The markdown names the trace it left out.
    let md = run_ok(
        &["eval", "--detector", "keyword", "--resamples", "50"],
        &[("--db", &bare), ("--labels", &file)],
    );
    assert!(md.contains("not-imported"), "{md}");

    // A malformed file is refused with the line and the reason, and nothing is evaluated.
    std::fs::write(
        &file,
        format!(
            "{}\n{{\"trace_id\": \"x\", \"deficiency_id\": \"Q7\"}}\n",
            lines[1]
        ),
    )
    .unwrap();
    let out = pathfinder()
        .args(["eval", "--detector", "expert", "--db"])
        .arg(&bare)
        .arg("--labels")
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2") && err.contains("Q7"), "{err}");

    // Healthy references: the expert runs without and with them, side by side on the same
    // traces; a reference the store lacks is refused before anything runs.
    std::fs::write(&file, lines.join("\n")).unwrap();
    let refs = dir.path().join("references.jsonl");
    std::fs::write(&refs, format!("{{\"trace_id\": \"{}\"}}\n", built[0].0)).unwrap();
    let report: Value = serde_json::from_str(&run_ok(
        EXPERT_AS_JSON,
        &[
            ("--db", &bare),
            ("--labels", &file),
            ("--references", &refs),
        ],
    ))
    .unwrap();
    let names: Vec<&str> = report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["detector"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["expert", "expert+references"]);
    std::fs::write(&refs, "{\"trace_id\": \"never-imported\"}\n").unwrap();
    let out = pathfinder()
        .args(["eval", "--detector", "expert", "--db"])
        .arg(&bare)
        .arg("--labels")
        .arg(&file)
        .arg("--references")
        .arg(&refs)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("never-imported"), "{err}");
}

#[test]
fn the_two_references_read_a_train_split_and_refuse_a_bad_k() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("traces.db");
    let labels = detect::synthetic::build_store(&db, 3).unwrap();
    // Two seeds of every scenario to read, the third to score.
    let (mut train, mut test) = (String::new(), String::new());
    for (i, (id, _)) in labels.iter().enumerate() {
        let line = format!("{{\"trace_id\": \"{id}\"}}\n");
        if i % 3 == 2 {
            test.push_str(&line);
        } else {
            train.push_str(&line);
        }
    }
    let (train_path, test_path) = (
        dir.path().join("train.jsonl"),
        dir.path().join("test.jsonl"),
    );
    std::fs::write(&train_path, train).unwrap();
    std::fs::write(&test_path, test).unwrap();
    let out = dir.path().join("report");
    run_ok(
        &[
            "eval",
            "--detector",
            "classifier,nearest:k=1",
            "--resamples",
            "50",
        ],
        &[
            ("--db", &db),
            ("--split", &test_path),
            ("--train-split", &train_path),
            ("--out", &out),
        ],
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    let nearest = runs
        .iter()
        .find(|r| r["detector"] == "nearest:k=1")
        .unwrap();
    assert_eq!(
        nearest["summary"]["traces"].as_u64().unwrap() * 3,
        labels.len() as u64
    );
    assert!(figure(nearest, "detection") >= 0.8, "{nearest:#}");

    // A train split that overlaps the scored one would score traces the reference read.
    let out = pathfinder()
        .args(["eval", "--detector", "nearest", "--db"])
        .arg(&db)
        .arg("--split")
        .arg(&train_path)
        .arg("--train-split")
        .arg(&train_path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("in both"),
        "{stderr}"
    );
    let out = pathfinder()
        .args(["eval", "--detector", "nearest:k=0", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("nearest:k=K"),
        "{stderr}"
    );
}
