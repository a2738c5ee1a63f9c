//! Data-parallel `pathfinder train` over MPI (the `mpi` feature; Open MPI's `mpirun`): two
//! ranks taking two steps end with the weights one process reaches on the same global batch,
//! agree with each other (the checkpoint's cross-rank fingerprint check), and their checkpoint
//! resumes in a single process to the same final weights as a run that was never split.
#![cfg(feature = "mpi")]

#[path = "support/checkpoint.rs"]
mod checkpoint;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn config(dir: &Path) -> PathBuf {
    config_with(dir, "", "corpus = \"\"")
}

/// The test's configuration with `detector` lines added and `eval` lines instead.
fn config_with(dir: &Path, detector: &str, eval: &str) -> PathBuf {
    let gguf = dir.join("tiny.gguf");
    model::testing::write_tiny_gguf(&gguf, 8192, 17).unwrap();
    // Three injections a step: the ranks' shares are uneven (2 + 1); two healthy clean runs
    // a step are chosen over both ranks' episodes.
    let text = format!(
        r#"
[model]
path = "{}"
[lora]
rank = 2
alpha = 4.0
[run]
seed = 5
steps = 3
agents = ["toolcaller", "roleplay"]
injections_per_step = 3
healthy_per_step = 2
[detector]
max_turns = 2
max_action_tokens = 24
observation_chars = 120
samples_per_trace = 2
{detector}
[eval]
{eval}
"#,
        gguf.display()
    );
    let path = dir.join("run.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn train_args(config: &Path, runs: &Path, name: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    [
        "train",
        "--root",
        root.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--runs-dir",
        runs.to_str().unwrap(),
        "--run",
        name,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn ok(out: Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// Every tensor of each checkpoint file within f32 summation-order tolerance of the other's.
fn assert_close(a: &Path, b: &Path) {
    for f in checkpoint::TRAINED_FILES {
        let (x, y) = (
            checkpoint::tensors(&a.join(f)),
            checkpoint::tensors(&b.join(f)),
        );
        assert_eq!(x.len(), y.len(), "{f}");
        let mut moved = 0.0f64;
        for ((name, u), (_, v)) in x.iter().zip(&y) {
            for (p, q) in u.iter().zip(v) {
                let scale = p.abs().max(q.abs()).max(1e-3);
                assert!(
                    (p - q).abs() / scale < 1e-3,
                    "{f} {name}: {p} against {q} ({} vs {})",
                    a.display(),
                    b.display()
                );
                moved += p.abs();
            }
        }
        assert!(
            moved > 0.0,
            "{f} is all zeros: the comparison proves nothing"
        );
    }
}

#[test]
fn two_ranks_train_as_one_process_and_resume_in_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let runs = dir.path().join("runs");
    let bin = env!("CARGO_BIN_EXE_pathfinder");

    // One process, three steps: the reference.
    ok(
        Command::new(bin)
            .args(train_args(&config, &runs, "one"))
            .output()
            .unwrap(),
        "the single-process run",
    );

    // Two ranks, two steps.
    let stderr = ok(
        Command::new("mpirun")
            .args(["-n", "2", "--oversubscribe", "--allow-run-as-root"])
            .args(["-x", "PATHFINDER_LOG=info", bin])
            .args(train_args(&config, &runs, "two"))
            .args(["--max-steps", "2"])
            .output()
            .unwrap(),
        "mpirun -n 2",
    );
    // Checkpoints 0, 1 and 2, each after the ranks' fingerprints were gathered and agreed.
    assert_eq!(
        stderr.matches("every rank holds the same weights").count(),
        3,
        "the ranks' weights were not compared at every checkpoint:\n{stderr}"
    );
    assert!(runs.join("two/step-2/state.json").exists());
    assert!(!runs.join("two/step-3").exists());
    // Both ranks investigated: rank 1's episodes ran under its own live directory.
    assert!(runs.join("two/live/rank-1/stores/step-2.sqlite").exists());
    assert_close(&runs.join("one/step-2"), &runs.join("two/step-2"));
    let lines = |run: &str| {
        std::fs::read_to_string(runs.join(run).join("metrics.jsonl"))
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!(
        lines("two"),
        2,
        "rank 0 alone writes the metrics, a line a step"
    );

    // The two-rank checkpoint resumes in one process.
    ok(
        Command::new(bin)
            .args(train_args(&config, &runs, "two"))
            .arg("--resume")
            .output()
            .unwrap(),
        "the one-process resume",
    );
    assert_close(&runs.join("one/step-3"), &runs.join("two/step-3"));
    let metric = |run: &str, key: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(runs.join(run).join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()[key].clone())
            .collect()
    };
    for key in ["valid_injections", "investigations", "healthy_investigated"] {
        assert_eq!(metric("one", key), metric("two", key), "{key} per step");
    }
}

/// All numbers of a JSON value, in document order.
fn numbers(v: &serde_json::Value, out: &mut Vec<f64>) {
    match v {
        serde_json::Value::Number(n) => out.push(n.as_f64().unwrap()),
        serde_json::Value::Array(a) => a.iter().for_each(|x| numbers(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| numbers(x, out)),
        _ => {}
    }
}

fn head_numbers(path: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    numbers(&serde_json::from_str(&text).unwrap(), &mut out);
    out
}

/// The CPU default's whole-choice Detector over MPI: the train split's features are read in
/// shares and gathered, the held-out evaluation is split and gathered, and the decision head
/// two ranks train is the one a single process trains.
#[test]
fn two_ranks_warm_start_evaluate_and_train_the_decision_head_as_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus");
    rl::testing::synthetic_corpus(&corpus).unwrap();
    let config = config_with(
        dir.path(),
        "decision = \"head\"",
        &format!(
            "corpus = \"{}\"\nsplit = \"val+test\"\n[head]\nmax_epochs = 60\npatience = 20\nreplay = 6",
            corpus.display()
        ),
    );
    let runs = dir.path().join("runs");
    let bin = env!("CARGO_BIN_EXE_pathfinder");
    let args = |name: &str| {
        let mut a = train_args(&config, &runs, name);
        a.extend(["--max-steps".into(), "2".into()]);
        a
    };
    ok(
        Command::new(bin).args(args("one")).output().unwrap(),
        "one process",
    );
    ok(
        Command::new("mpirun")
            .args(["-n", "2", "--oversubscribe", "--allow-run-as-root", bin])
            .args(args("two"))
            .output()
            .unwrap(),
        "mpirun -n 2",
    );
    for step in ["step-0", "step-2"] {
        let file = |run: &str| {
            runs.join(run)
                .join(step)
                .join("detector")
                .join("decision_head.json")
        };
        let (a, b) = (head_numbers(&file("one")), head_numbers(&file("two")));
        assert_eq!(a.len(), b.len());
        for (p, q) in a.iter().zip(&b) {
            assert!(
                (p - q).abs() <= 1e-4 * p.abs().max(q.abs()).max(1.0),
                "{step}: decision head {p} against {q}"
            );
        }
    }
    // The held-out evaluation after the warm start: every val and test trace, once.
    let eval = |run: &str| -> Vec<(u64, u64)> {
        std::fs::read_to_string(runs.join(run).join("eval.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (v["step"].as_u64().unwrap(), v["n"].as_u64().unwrap())
            })
            .collect()
    };
    assert_eq!(eval("one"), eval("two"));
    let cases = |run: &str| -> Vec<String> {
        let mut ids: Vec<String> = std::fs::read_to_string(runs.join(run).join("eval-cases.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                format!("{} {} {}", v["step"], v["trace_id"], v["predicted"])
            })
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(
        cases("one"),
        cases("two"),
        "the same verdicts on the same traces"
    );
}

/// A rank that fails ends the job (MPI_Abort) instead of leaving the others waiting in the
/// next collective: rank 1 is given a repository without agents.
#[test]
fn one_ranks_error_ends_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let runs = dir.path().join("runs");
    let bin = env!("CARGO_BIN_EXE_pathfinder");
    let good = train_args(&config, &runs, "broken");
    let mut bad = good.clone();
    let root = bad.iter().position(|a| a == "--root").unwrap() + 1;
    bad[root] = dir.path().join("no-repository").display().to_string();
    let mut child = Command::new("mpirun")
        .args(["--allow-run-as-root", "-n", "1", bin])
        .args(&good)
        .args([":", "-n", "1", bin])
        .args(&bad)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > std::time::Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("the job still runs 120 s after rank 1 failed: rank 0 was left waiting");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("rank 1:") && stderr.contains("no-repository"),
        "{stderr}"
    );
}
