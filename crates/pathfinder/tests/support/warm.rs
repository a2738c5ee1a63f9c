//! A warm-started checkpoint on a tiny model and the synthetic corpus, for the tests of the
//! commands that take a checkpoint (`calibrate`, `eval`, `detect`, `collect`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn pathfinder() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pathfinder"))
}

pub fn ok(out: Output, what: &str) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what} failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

/// A synthetic corpus whose traces come from two frameworks (alternate scenarios), a whole-
/// choice run configuration on a tiny model, and that run's warm-started checkpoint.
pub fn warm_started(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    warm_started_with(dir, "", &[])
}

/// [`warm_started`] with `head` added to the configuration's `[head]` table and `train_args`
/// added to `pathfinder train`'s.
pub fn warm_started_with(
    dir: &Path,
    head: &str,
    train_args: &[&str],
) -> (PathBuf, PathBuf, PathBuf) {
    warm_started_blaming(dir, head, train_args, 0)
}

/// [`warm_started_with`] on a corpus with `blame_logs` labelled three-agent runs added
/// (`rl::testing::add_blame_logs`) and, when there are any, the blame head trained.
pub fn warm_started_blaming(
    dir: &Path,
    head: &str,
    train_args: &[&str],
    blame_logs: usize,
) -> (PathBuf, PathBuf, PathBuf) {
    let corpus = dir.join("corpus");
    rl::testing::synthetic_corpus(&corpus).unwrap();
    if blame_logs > 0 {
        rl::testing::add_blame_logs(&corpus, blame_logs).unwrap();
    }
    let blame = if blame_logs > 0 {
        "[blame]\nenabled = true\nepochs = 100"
    } else {
        ""
    };
    let db = corpus.join("store.sqlite");
    let store = traces::Store::open(&db).unwrap();
    store
        .connection()
        .execute_batch(
            "UPDATE labels SET source = json_set(source, '$.agent', \
             CASE WHEN label_id % 2 = 0 THEN 'alpha' ELSE 'beta' END)",
        )
        .unwrap();
    drop(store);
    let gguf = dir.join("tiny.gguf");
    model::testing::write_tiny_gguf(&gguf, 8192, 17).unwrap();
    let config = dir.join("run.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[model]
path = "{}"
[lora]
rank = 2
alpha = 4.0
[run]
seed = 5
steps = 1
agents = ["toolcaller"]
injections_per_step = 1
[detector]
decision = "head"
[head]
max_epochs = 40
patience = 10
{head}
{blame}
[eval]
corpus = "{}"
split = "val+test"
"#,
            gguf.display(),
            corpus.display()
        ),
    )
    .unwrap();
    let runs = dir.join("runs");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    ok(
        pathfinder()
            .args(["train", "--sft", "--run", "r", "--root"])
            .arg(&root)
            .arg("--config")
            .arg(&config)
            .arg("--runs-dir")
            .arg(&runs)
            .args(train_args)
            .output()
            .unwrap(),
        "train --sft",
    );
    (db, config, runs.join("r").join("step-0"))
}
