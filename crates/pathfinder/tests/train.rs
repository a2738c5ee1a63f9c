//! `pathfinder train` end to end with a tiny random model on real agents: a run killed with
//! SIGKILL in the middle of a step and resumed ends with the same adapters as an uninterrupted
//! run; a bad configuration is refused naming the file and the field.

#[path = "support/checkpoint.rs"]
mod checkpoint;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn pathfinder() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pathfinder"));
    c.arg("train")
        .arg("--root")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    c
}

fn config(dir: &Path) -> PathBuf {
    let gguf = dir.join("tiny.gguf");
    model::testing::write_tiny_gguf(&gguf, 8192, 17).unwrap();
    let text = format!(
        r#"
[model]
path = "{}"
[lora]
rank = 2
alpha = 4.0
[run]
seed = 9
steps = 3
agents = ["toolcaller", "roleplay"]
injections_per_step = 2
[detector]
max_turns = 2
max_action_tokens = 24
observation_chars = 120
[eval]
corpus = ""
"#,
        gguf.display()
    );
    let path = dir.join("run.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn train(config: &Path, runs: &Path, name: &str, extra: &[&str]) -> std::process::Output {
    pathfinder()
        .arg("--config")
        .arg(config)
        .arg("--runs-dir")
        .arg(runs)
        .arg("--run")
        .arg(name)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn a_killed_run_resumes_to_the_same_adapters_as_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let runs = dir.path().join("runs");

    let whole = train(&config, &runs, "whole", &[]);
    assert!(
        whole.status.success(),
        "{}",
        String::from_utf8_lossy(&whole.stderr)
    );
    let stdout = String::from_utf8_lossy(&whole.stdout);
    assert!(stdout.contains("run: "), "{stdout}");

    // Start again, kill it (SIGKILL) once step 1 is checkpointed and step 2 is under way.
    let mut child = pathfinder()
        .arg("--config")
        .arg(&config)
        .arg("--runs-dir")
        .arg(&runs)
        .arg("--run")
        .arg("killed")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let killed = runs.join("killed");
    let deadline = Instant::now() + Duration::from_secs(300);
    while !killed.join("step-1/state.json").exists() {
        assert!(Instant::now() < deadline, "step 1 was never checkpointed");
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !killed.join("step-3").exists(),
        "the run finished before it was killed; the test proves nothing"
    );

    let resumed = train(&config, &runs, "killed", &["--resume"]);
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    for f in checkpoint::TRAINED_FILES {
        let a = checkpoint::tensors(&runs.join("whole/step-3").join(f));
        let b = checkpoint::tensors(&runs.join("killed/step-3").join(f));
        assert_eq!(a, b, "{f} differs after kill and resume");
    }
    let steps = |run: &str| {
        std::fs::read_to_string(runs.join(run).join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        steps("killed"),
        steps("whole"),
        "one metrics line per step, none twice"
    );

    // Starting over in a directory with checkpoints is refused.
    let again = train(&config, &runs, "whole", &[]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--resume"));

    // The report of both runs: Markdown with Table 9, a chart per logged metric, a comparison.
    let report = Command::new(env!("CARGO_BIN_EXE_pathfinder"))
        .args(["report", "whole", "killed", "--runs-dir"])
        .arg(&runs)
        .output()
        .unwrap();
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let md = std::fs::read_to_string(runs.join("whole/report/report.md")).unwrap();
    assert!(md.contains("Training dynamics (Table 9)"), "{md}");
    assert_eq!(md.matches("\n| 3 |").count(), 1, "one row for step 3: {md}");
    for png in ["reward.png", "kl.png", "diversity.png", "query_depth.png"] {
        let bytes = std::fs::read(runs.join("killed/report").join(png)).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "{png} is not a PNG");
        assert!(md.contains(&format!("]({png})")), "{png} not linked: {md}");
    }
    assert!(runs.join("report/comparison.md").exists());
    let missing = Command::new(env!("CARGO_BIN_EXE_pathfinder"))
        .args(["report", "nope", "--runs-dir"])
        .arg(&runs)
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("run nope"));
}

#[test]
fn a_misspelt_field_is_refused_with_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[model]\npath = \"x.gguf\"\n[run]\nseed = 0\nsteps = 1\nagents = [\"swe\"]\ninjections_per_step = 1\n[ppo]\nclip_range = 0.2\n",
    )
    .unwrap();
    let out = train(&path, &dir.path().join("runs"), "r", &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("clip_range"),
        "{err}"
    );
    assert!(!dir.path().join("runs/r/step-0").exists());
}
