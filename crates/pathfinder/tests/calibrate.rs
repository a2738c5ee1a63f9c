//! A checkpoint's operating point set on healthy runs (`pathfinder calibrate`), and the
//! commands that use it saying so; leave-one-framework-out evaluation (`eval --leave-out`).
//! On the synthetic corpus and a tiny random model: these test the commands, not what a
//! calibration is worth (BENCHMARKS.md measures that).

use std::path::Path;

#[path = "support/warm.rs"]
#[allow(dead_code)]
mod warm;
use warm::{ok, pathfinder, warm_started, warm_started_with};

fn split_ids(db: &Path, split: &str) -> Vec<String> {
    std::fs::read_to_string(db.with_file_name("splits").join(format!("{split}.jsonl")))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["trace_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[test]
fn calibrate_saves_a_threshold_that_eval_and_detect_name() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _, checkpoint) = warm_started(dir.path());
    let healthy = split_ids(&db, "train")[..6].join(",");
    let (stdout, _) = ok(
        pathfinder()
            .args(["calibrate", "--db"])
            .arg(&db)
            .args([
                "--healthy",
                &healthy,
                "--name",
                "my-framework",
                "--checkpoint",
            ])
            .arg(&checkpoint)
            .output()
            .unwrap(),
        "calibrate",
    );
    assert!(
        stdout.contains("calibration `my-framework`: 6 healthy runs"),
        "{stdout}"
    );
    // Six runs cannot bound the rate at 5%: the calibration says what it bounds.
    assert!(
        stdout.contains("at most 14.3%") && stdout.contains("19 or more"),
        "{stdout}"
    );
    let saved: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(checkpoint.join("calibration.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(saved["healthy_scores"].as_array().unwrap().len(), 6);
    // Runs of unknown health can only set a frame, and this head reads inputs as they are.
    let out = pathfinder()
        .args(["calibrate", "--db"])
        .arg(&db)
        .args(["--unlabelled", "all", "--checkpoint"])
        .arg(&checkpoint)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("can only set a framed head's frame"),
        "{stderr}"
    );

    let split = db.with_file_name("splits").join("test.jsonl");
    let eval = |calibration: Option<&str>| {
        let mut c = pathfinder();
        c.args(["eval", "--db"])
            .arg(&db)
            .arg("--split")
            .arg(&split)
            .arg("--detector")
            .arg(format!("checkpoint:{}", checkpoint.display()))
            .arg("--json");
        if let Some(cal) = calibration {
            c.args(["--calibration", cal]);
        }
        let (stdout, _) = ok(c.output().unwrap(), "eval");
        let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        report["detector"].as_str().unwrap().to_owned()
    };
    assert!(eval(None).contains("(calibration `my-framework`, 6 healthy runs)"));
    assert!(eval(Some("none")).contains("(no calibration)"));

    let trace = &split_ids(&db, "test")[0];
    let out = pathfinder()
        .args(["detect", "--db"])
        .arg(&db)
        .args(["--trace", trace, "--policy"])
        .arg(format!("checkpoint:{}", checkpoint.display()))
        .output()
        .unwrap();
    let (stdout, stderr) = ok(out, "detect");
    assert!(stderr.contains("calibration `my-framework`"), "{stderr}");
    assert!(
        stdout.contains("against calibration `my-framework`"),
        "{stdout}"
    );

    // Bad input: an unknown trace, no trace at all, a calibration on a token-decoding policy.
    let refused = |args: &[&str]| {
        let out = pathfinder()
            .args(["calibrate", "--db"])
            .arg(&db)
            .arg("--checkpoint")
            .arg(&checkpoint)
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(refused(&["--healthy", "no-such-trace"]).contains("holds no trace no-such-trace"));
    assert!(refused(&["--healthy", " , "]).contains("names no trace"));
    let out = pathfinder()
        .args(["detect", "--db"])
        .arg(&db)
        .args(["--trace", trace, "--calibration", "none"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn a_framed_checkpoint_trains_without_a_framework_and_reads_it_through_a_calibrations_frame() {
    let dir = tempfile::tempdir().unwrap();
    // Trained on `alpha` alone; `beta` is left out and evaluated whole.
    let (db, _, checkpoint) = warm_started_with(
        dir.path(),
        "frame = \"framework\"",
        &["--leave-out", "beta"],
    );
    let head: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(checkpoint.join("detector/decision_head.json")).unwrap(),
    )
    .unwrap();
    let frames: Vec<&String> = head["frames"].as_object().unwrap().keys().collect();
    assert_eq!(frames, ["alpha"]);
    let run = checkpoint.parent().unwrap();
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(config.contains("leave_out = [\"beta\"]"), "{config}");
    let left_out = std::fs::read_to_string(run.join("eval-left-out.jsonl")).unwrap();
    let line: serde_json::Value = serde_json::from_str(left_out.lines().next().unwrap()).unwrap();
    assert_eq!(line["split"], "left out: beta");
    // Every beta trace of every split, and none of alpha's in the held-out split.
    let beta = |split: &str| {
        let store = traces::Store::open_read_only(&db).unwrap();
        split_ids(&db, split)
            .iter()
            .filter(|id| {
                store
                    .connection()
                    .query_row(
                        "SELECT json_extract(source, '$.agent') FROM labels WHERE trace_id = ?1",
                        [id.as_str()],
                        |r| r.get::<_, String>(0),
                    )
                    .unwrap()
                    == "beta"
            })
            .count()
    };
    assert_eq!(
        line["n"].as_u64().unwrap() as usize,
        beta("train") + beta("val") + beta("test")
    );
    let held_out = std::fs::read_to_string(run.join("eval.jsonl")).unwrap();
    let line: serde_json::Value = serde_json::from_str(held_out.lines().next().unwrap()).unwrap();
    assert_eq!(
        line["n"].as_u64().unwrap() as usize,
        split_ids(&db, "val").len() + split_ids(&db, "test").len() - beta("val") - beta("test")
    );

    // Without a calibration `detect` reads a trace through its best guess, and says so.
    let trace = &split_ids(&db, "test")[0];
    let detect = || {
        ok(
            pathfinder()
                .args(["detect", "--db"])
                .arg(&db)
                .args(["--trace", trace, "--policy"])
                .arg(format!("checkpoint:{}", checkpoint.display()))
                .output()
                .unwrap(),
            "detect",
        )
    };
    let (_, stderr) = detect();
    assert!(
        stderr.contains("the median of 1 training frameworks' frames"),
        "{stderr}"
    );
    // A calibration over the user's runs carries their median as the frame, and then it is
    // the one used.
    let healthy = split_ids(&db, "test")[..5].join(",");
    let (stdout, _) = ok(
        pathfinder()
            .args(["calibrate", "--db"])
            .arg(&db)
            .args(["--healthy", &healthy, "--name", "beta-runs", "--checkpoint"])
            .arg(&checkpoint)
            .output()
            .unwrap(),
        "calibrate",
    );
    assert!(
        stdout.contains("relative to their typical input"),
        "{stdout}"
    );
    let saved: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(checkpoint.join("calibration.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(saved["frame"]["traces"], 5);
    assert_eq!(
        saved["frame"]["centre"].as_array().unwrap().len(),
        head["type_model"]["dim"].as_u64().unwrap() as usize
    );
    let (_, stderr) = detect();
    assert!(!stderr.contains("training frameworks' frames"), "{stderr}");
    assert!(stderr.contains("calibration `beta-runs`"), "{stderr}");

    // Without labels: the frame over every run in the store, and no threshold.
    let unlabelled = dir.path().join("unlabelled.json");
    let (stdout, _) = ok(
        pathfinder()
            .args(["calibrate", "--db"])
            .arg(&db)
            .args(["--unlabelled", "all", "--name", "my-store", "--checkpoint"])
            .arg(&checkpoint)
            .arg("--out")
            .arg(&unlabelled)
            .output()
            .unwrap(),
        "calibrate --unlabelled",
    );
    assert!(stdout.contains("runs of unknown health"), "{stdout}");
    assert!(
        stdout.contains("false positives are not bounded"),
        "{stdout}"
    );
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&unlabelled).unwrap()).unwrap();
    assert_eq!(saved["runs"], "unlabelled");
    let stored = traces::Store::open_read_only(&db)
        .unwrap()
        .connection()
        .query_row("SELECT count(*) FROM traces", [], |r| r.get::<_, i64>(0))
        .unwrap();
    assert_eq!(saved["frame"]["traces"].as_i64().unwrap(), stored);
    let (stdout, stderr) = ok(
        pathfinder()
            .args(["detect", "--db"])
            .arg(&db)
            .args(["--trace", trace, "--policy"])
            .arg(format!("checkpoint:{}", checkpoint.display()))
            .arg("--calibration")
            .arg(&unlabelled)
            .output()
            .unwrap(),
        "detect --calibration unlabelled",
    );
    assert!(!stderr.contains("training frameworks' frames"), "{stderr}");
    assert!(
        format!("{stdout}{stderr}").contains("calibration `my-store`"),
        "{stdout}{stderr}"
    );
    // Both: the frame over every run in the store, the threshold on the healthy runs read
    // through it.
    let both = dir.path().join("both.json");
    let (stdout, _) = ok(
        pathfinder()
            .args(["calibrate", "--db"])
            .arg(&db)
            .args(["--unlabelled", "all", "--healthy", &healthy, "--checkpoint"])
            .arg(&checkpoint)
            .arg("--out")
            .arg(&both)
            .output()
            .unwrap(),
        "calibrate --unlabelled --healthy",
    );
    assert!(
        stdout.contains("threshold on the 5 healthy runs"),
        "{stdout}"
    );
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&both).unwrap()).unwrap();
    assert!(saved.get("runs").is_none(), "healthy runs: {saved}");
    assert_eq!(saved["frame"]["traces"].as_i64().unwrap(), stored);
    assert_eq!(saved["healthy_scores"].as_array().unwrap().len(), 5);
    // A rate to hold needs healthy runs.
    let out = pathfinder()
        .args(["calibrate", "--db"])
        .arg(&db)
        .args(["--unlabelled", "all", "--alpha", "0.1", "--checkpoint"])
        .arg(&checkpoint)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn leave_out_scores_each_framework_with_detectors_fitted_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let (db, config, _) = warm_started(dir.path());
    let train = db.with_file_name("splits").join("train.jsonl");
    let (stdout, _) = ok(
        pathfinder()
            .args(["eval", "--db"])
            .arg(&db)
            .arg("--train-split")
            .arg(&train)
            .args(["--leave-out", "all", "--json", "--detector"])
            .arg(format!(
                "keyword,classifier,nearest:k=3,warm-start:{}",
                config.display()
            ))
            .arg("--feature-cache")
            .arg(dir.path().join("features"))
            .output()
            .unwrap(),
        "eval --leave-out all",
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let rows = report["rows"].as_array().unwrap();
    // Two frameworks by four detectors.
    assert_eq!(rows.len(), 8, "{stdout}");
    let train_ids = split_ids(&db, "train").len();
    for row in rows {
        let fitted = row["detector"] != "keyword";
        // A fitted detector read only the other framework's train traces.
        assert_eq!(row["train"].as_u64().unwrap() > 0, fitted, "{row}");
        assert!(
            (row["train"].as_u64().unwrap() as usize) < train_ids,
            "{row}"
        );
        assert!(row["detection"]["n"].as_u64().unwrap() > 0, "{row}");
        assert!(row["in_distribution"]["n"].as_u64().unwrap() > 0, "{row}");
        assert_eq!(
            row["unfamiliar"].is_object(),
            row["detector"].as_str().unwrap().starts_with("warm-start"),
            "{row}"
        );
    }
    assert_eq!(report["means"].as_array().unwrap().len(), 4);
    assert!(rows.iter().all(|r| r.get("frame").is_none()), "{stdout}");
    // The later detectors against the first, on the same left-out traces.
    let paired = report["paired"].as_array().unwrap();
    assert_eq!(paired.len(), 3, "{stdout}");
    for p in paired {
        assert_eq!(p["against"], "keyword", "{p}");
        assert!(p["type_difference"]["n"].as_u64().unwrap() > 0, "{p}");
        let (lo, hi) = (
            p["type_difference"]["lo"].as_f64().unwrap(),
            p["type_difference"]["hi"].as_f64().unwrap(),
        );
        assert!(
            lo <= p["type_difference"]["value"].as_f64().unwrap() && lo <= hi,
            "{p}"
        );
        // The category named, paired over the same deficient traces.
        assert_eq!(
            p["category_difference"]["n"], p["type_difference"]["n"],
            "{p}"
        );
    }

    // The same head framed: each framework read relative to its own traces' median, and the
    // report says so; --head-inputs writes what the head read, a line per trace.
    let framed = dir.path().join("framed.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &framed,
        text.replace("[head]\n", "[head]\nframe = \"framework\"\n"),
    )
    .unwrap();
    let inputs = dir.path().join("inputs.jsonl");
    let (stdout, _) = ok(
        pathfinder()
            .args(["eval", "--db"])
            .arg(&db)
            .arg("--train-split")
            .arg(&train)
            .args(["--leave-out", "all", "--detector"])
            .arg(format!("warm-start:{}", framed.display()))
            .arg("--feature-cache")
            .arg(dir.path().join("features"))
            .arg("--head-inputs")
            .arg(&inputs)
            .output()
            .unwrap(),
        "eval --leave-out all with a framed head",
    );
    assert!(stdout.contains("Framed heads"), "{stdout}");
    assert!(
        stdout.contains("median of the left-out framework's traces"),
        "{stdout}"
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&inputs)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!lines.is_empty());
    let width = lines[0]["input"].as_array().unwrap().len();
    for l in &lines {
        assert_eq!(l["input"].as_array().unwrap().len(), width, "{l}");
        assert!(l["lines"].as_array().is_some_and(|a| !a.is_empty()), "{l}");
        assert!(
            l["framework"].is_string() && l["deficiency_id"].is_string(),
            "{l}"
        );
    }
    let in_train = lines.iter().filter(|l| l["train"] == true).count();
    assert!(in_train > 0 && in_train <= split_ids(&db, "train").len());
    // A framework the store does not hold, and a fixed checkpoint, are refused by name.
    let out = pathfinder()
        .args(["eval", "--db"])
        .arg(&db)
        .arg("--train-split")
        .arg(&train)
        .args(["--leave-out", "gamma"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("frameworks: alpha, beta"), "{stderr}");
}
