//! The same corpus whichever way it is made: a whole run with one episode at a time on a busy
//! CPU, and the same plan in two shards with two at a time, interrupted and resumed, then
//! merged, give one digest and one store of labels. Runs the real toolcaller agent in the
//! local sandbox with the project's templates of types that race: a deadline against parallel
//! tool calls, an unlocked update and a deadlock, killed at the limit learnt from its clean run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agents::Workspace;
use corpus::{generate, Finish, GenerateOptions, Shard};
use taxonomy::Catalog;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn options(jobs: usize, shard: Option<Shard>, max_episodes: Option<usize>) -> GenerateOptions {
    GenerateOptions {
        agents: vec!["toolcaller".into()],
        // A deadline raced against parallel tool calls (C20), an unlocked update (P21) and a
        // deadlock (P22): the types whose traces vary with timing and load.
        types: vec!["C20".into(), "P21".into(), "P22".into()],
        tasks: 2,
        seed: 5,
        holdout_agent: None,
        templates_dir: root().join("deficiencies/templates"),
        keyword: true,
        python: "python3".into(),
        timeout: Duration::from_secs(60),
        max_episodes,
        llm: None,
        isolation: runner::ExecutorOptions {
            backend: runner::BackendChoice::Local,
            recipe: root().join("infra/base-image.toml"),
            jobs,
            ..runner::ExecutorOptions::default()
        },
        shard,
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// A label as a reader trains on it: (deficiency, split, step, agent).
type Label = (Option<String>, String, Option<i64>, Option<String>);

/// The labels of every trace in a corpus's store, sorted, without the trace ids the agents
/// make up.
fn labels(dir: &Path) -> Vec<Label> {
    let store = traces::Store::open(dir.join("store.sqlite")).unwrap();
    let mut out: Vec<_> = store
        .trace_ids()
        .unwrap()
        .iter()
        .flat_map(|id| store.labels(id).unwrap())
        .map(|l| {
            (
                l.truth.deficiency_id,
                l.source["split"].as_str().unwrap_or_default().to_owned(),
                l.truth.step,
                l.truth.agent,
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn one_digest_for_any_job_count_load_or_sharding() {
    let workspace = Workspace::open(&root().join("agents")).unwrap();
    let catalog = Catalog::embedded().unwrap();
    let tmp = tempfile::tempdir().unwrap();

    // The whole plan, one episode at a time, while two threads keep both cores busy.
    let whole = tmp.path().join("whole");
    let busy = AtomicBool::new(true);
    let finish = std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                let mut x = 0u64;
                while busy.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            });
        }
        let finish = generate(
            &workspace,
            &catalog,
            &options(1, None, None),
            &whole,
            |_, _, _| {},
        );
        busy.store(false, Ordering::Relaxed);
        finish.unwrap()
    });
    let Finish::Complete(report) = finish else {
        panic!("not complete")
    };
    assert!(report.episodes >= 4, "{report:?}");
    assert!(report.valid >= 1, "{report:?}");
    // The deadlocks were killed at the limit learnt from their clean runs, not at --timeout.
    // (A deadlocked run leaves no root span, so P22 fails the trace check: read the manifests.)
    let deadlocks: Vec<serde_json::Value> = std::fs::read_dir(whole.join("episodes"))
        .unwrap()
        .map(|e| read(&e.unwrap().path().join("manifest.json")))
        .map(|m| serde_json::from_str(&m).unwrap())
        .filter(|m: &serde_json::Value| m["deficiency"] == "P22")
        .collect();
    assert!(!deadlocks.is_empty(), "a deadlock in the plan");
    for r in &deadlocks {
        assert_eq!(r["injected"]["end"], "ran past its time limit", "{r}");
        // Ten times the clean run, 10 s at least: well short of the minute even on a slow,
        // busy machine.
        let clause = r["injected"]["contained"][0].as_str().unwrap_or_default();
        let limit: f64 = clause
            .strip_prefix("ran past its ")
            .and_then(|c| c.strip_suffix(" s timeout and was killed"))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no timeout clause: {r}"));
        assert!((10.0..60.0).contains(&limit), "{r}");
    }

    // Shard 1/2 stopped after one episode (a kill between episodes), shard 2/2 whole.
    let first = tmp.path().join("1-of-2");
    let second = tmp.path().join("2-of-2");
    let one = Shard { index: 1, count: 2 };
    let two = Shard { index: 2, count: 2 };
    let stopped = generate(
        &workspace,
        &catalog,
        &options(2, Some(one), Some(1)),
        &first,
        |_, _, _| {},
    )
    .unwrap();
    assert!(matches!(stopped, Finish::Interrupted { completed: 1, .. }));
    let done = generate(
        &workspace,
        &catalog,
        &options(2, Some(two), None),
        &second,
        |_, _, _| {},
    )
    .unwrap();
    let Finish::Shard { episodes, of, .. } = done else {
        panic!("{done:?}")
    };
    assert!(episodes > 0 && episodes < of, "both parts hold episodes");
    assert!(!second.join("digest").exists(), "a shard publishes nothing");

    // An incomplete shard is refused by name, and nothing is written.
    let merged = tmp.path().join("merged");
    let err = corpus::merge(&[first.clone(), second.clone()], &merged, |_, _| {}).unwrap_err();
    assert!(
        err.to_string().contains("1-of-2") && err.to_string().contains("incomplete"),
        "{err}"
    );
    assert!(!merged.exists());
    // So is a missing part.
    let err = corpus::merge(std::slice::from_ref(&second), &merged, |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("1/2"), "{err}");

    // Resumed: the episode already done is found, not redone.
    let mut seen = 0;
    let resumed = generate(
        &workspace,
        &catalog,
        &options(2, Some(one), None),
        &first,
        |_, _, _| seen += 1,
    )
    .unwrap();
    assert!(matches!(resumed, Finish::Shard { .. }));
    assert_eq!(seen + episodes, of);

    // Merged in either order: the whole run's digest, labels and plan.
    let merged_report =
        corpus::merge(&[second.clone(), first.clone()], &merged, |_, _| {}).unwrap();
    // A differing corpus is shown episode by episode before any count is compared: which
    // manifest changed says which race the plan's types lost.
    if read(&whole.join("digest")) != read(&merged.join("digest")) {
        let mut diff = String::new();
        for entry in std::fs::read_dir(whole.join("episodes")).unwrap() {
            let name = entry.unwrap().file_name();
            let a = read(&whole.join("episodes").join(&name).join("manifest.json"));
            let b = read(&merged.join("episodes").join(&name).join("manifest.json"));
            if a != b {
                diff.push_str(&format!("--- {name:?} whole:\n{a}\n--- merged:\n{b}\n"));
            }
        }
        panic!("the merged shards are another corpus than the whole run:\n{diff}");
    }
    assert_eq!(merged_report.valid, report.valid);
    assert_eq!(labels(&whole), labels(&merged));
    assert_eq!(
        read(&whole.join("plan.json")),
        read(&merged.join("plan.json"))
    );
    assert_eq!(
        read(&whole.join("healthy.jsonl")).lines().count(),
        read(&merged.join("healthy.jsonl")).lines().count()
    );

    // Merging again into the finished corpus redoes nothing and gives the same digest.
    let again = corpus::merge(&[first, second], &merged, |_, _| {}).unwrap();
    assert_eq!(again.digest, merged_report.digest);
}
