//! A template sweep end to end on the real toolcaller agent with the inject crate's fixture
//! templates: every template on every task it is given, listed tasks first, the evidence in
//! `sweep.json`, and a resumed or widened sweep that runs nothing twice.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agents::Workspace;
use corpus::sweep::{plan_sweep, sweep, Sweep};
use corpus::GenerateOptions;
use taxonomy::Catalog;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn sweeps_every_template_over_its_tasks_and_resumes() {
    let workspace = Workspace::open(&root().join("agents")).unwrap();
    let catalog = Catalog::embedded().unwrap();
    let options = GenerateOptions {
        agents: vec!["toolcaller".into()],
        types: vec!["P2".into(), "P24".into()],
        tasks: 2,
        seed: 0,
        holdout_agent: None,
        templates_dir: root().join("crates/inject/tests/fixtures/templates"),
        keyword: false,
        python: "python3".into(),
        timeout: Duration::from_secs(60),
        max_episodes: None,
        llm: None,
        isolation: runner::ExecutorOptions {
            recipe: root().join("infra/base-image.toml"),
            ..runner::ExecutorOptions::default()
        },
        shard: None,
    };
    let plan = plan_sweep(&workspace, &catalog, &options, None).unwrap();
    let ids: Vec<&str> = plan.episodes.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "toolcaller.P2.keep-last-fragment.gaia-001",
            "toolcaller.P2.keep-last-fragment.gaia-002",
            // The template's listed task comes first.
            "toolcaller.P24.strict-corpus-decoding.gaia-010",
            "toolcaller.P24.strict-corpus-decoding.gaia-001",
        ]
    );
    let only = [("toolcaller".to_owned(), "P24".to_owned())].into();
    let narrowed = plan_sweep(&workspace, &catalog, &options, Some(&only)).unwrap();
    assert_eq!(narrowed.episodes.len(), 2);

    let tmp = tempfile::tempdir().unwrap();
    let mut ran = 0;
    let result = sweep(
        &workspace,
        &catalog,
        &options,
        None,
        tmp.path(),
        |_, _, _| ran += 1,
    )
    .unwrap();
    assert_eq!(ran, 4);
    assert_eq!(result.templates.len(), 2);
    let p2 = &result.templates[0];
    assert_eq!(p2.template, "toolcaller/P2-keep-last-fragment.toml");
    assert_eq!(p2.tried, ["gaia-001", "gaia-002"]);
    assert_eq!(
        p2.valid.len() + p2.failures.values().sum::<usize>(),
        2,
        "every episode is valid or failed by one check: {p2:?}"
    );
    assert!(
        !p2.valid.is_empty(),
        "a streamed fragment lost shows on any task: {p2:?}"
    );
    let written: Sweep =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("sweep.json")).unwrap())
            .unwrap();
    assert_eq!(written, result);

    let again = sweep(
        &workspace,
        &catalog,
        &options,
        None,
        tmp.path(),
        |_, _, _| {},
    )
    .unwrap();
    assert_eq!(again, result, "a resumed sweep reads its manifests back");
    // Widened to a third task: only the two new episodes run.
    let wider = GenerateOptions {
        tasks: 3,
        ..options.clone()
    };
    let before: Vec<_> = std::fs::read_dir(tmp.path().join("episodes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let stamp = |p: &PathBuf| {
        std::fs::metadata(p.join("manifest.json"))
            .unwrap()
            .modified()
            .unwrap()
    };
    let stamps: Vec<_> = before.iter().map(stamp).collect();
    let widened = sweep(&workspace, &catalog, &wider, None, tmp.path(), |_, _, _| {}).unwrap();
    assert_eq!(widened.totals().0, 6);
    assert_eq!(
        before.iter().map(stamp).collect::<Vec<_>>(),
        stamps,
        "nothing re-run"
    );
    let other = GenerateOptions {
        seed: 1,
        ..options.clone()
    };
    let err = sweep(&workspace, &catalog, &other, None, tmp.path(), |_, _, _| {}).unwrap_err();
    assert!(err.to_string().contains("other settings"), "{err}");
}
