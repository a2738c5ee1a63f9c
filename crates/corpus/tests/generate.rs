//! Corpus generation end to end on the real toolcaller agent with the inject crate's fixture
//! templates: validation records, the labelled store, and resume after an interruption.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agents::Workspace;
use corpus::{generate, Finish, GenerateOptions, Manifest};
use taxonomy::Catalog;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn options(max_episodes: Option<usize>) -> GenerateOptions {
    options_on(max_episodes, runner::BackendChoice::Auto)
}

fn options_on(max_episodes: Option<usize>, backend: runner::BackendChoice) -> GenerateOptions {
    GenerateOptions {
        agents: vec!["toolcaller".into()],
        types: vec!["P2".into(), "P24".into()],
        tasks: 1,
        seed: 3,
        holdout_agent: None,
        templates_dir: root().join("crates/inject/tests/fixtures/templates"),
        keyword: true,
        python: "python3".into(),
        timeout: Duration::from_secs(60),
        max_episodes,
        llm: None,
        isolation: runner::ExecutorOptions {
            backend,
            recipe: root().join("infra/base-image.toml"),
            ..runner::ExecutorOptions::default()
        },
        shard: None,
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn generates_validates_labels_and_resumes_to_the_same_corpus() {
    let workspace = Workspace::open(&root().join("agents")).unwrap();
    let catalog = Catalog::embedded().unwrap();
    let tmp = tempfile::tempdir().unwrap();

    // Uninterrupted.
    let a = tmp.path().join("a");
    let Finish::Complete(report) =
        generate(&workspace, &catalog, &options(None), &a, |_, _, _| {}).unwrap()
    else {
        panic!("not complete")
    };
    assert_eq!(report.episodes, 2);
    assert_eq!(report.per_type["P2"].valid, 1, "{report:?}");
    assert_eq!(report.per_type["P24"].failures.get("manifests"), Some(&1));

    let p2_dir = std::fs::read_dir(a.join("episodes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let m: Manifest = serde_json::from_str(&read(&p.join("manifest.json"))).unwrap();
            m.deficiency == "P2"
        })
        .unwrap();
    // Episode directories are opaque: the injected agent runs inside them.
    let name = p2_dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(!name.contains("P2") && name.len() == 16, "{name}");
    let m: Manifest = serde_json::from_str(&read(&p2_dir.join("manifest.json"))).unwrap();
    assert_eq!(name, corpus::episode_dir_name(&m.id));
    let v = &m.validation;
    assert!(v.valid && v.applies.passed);
    assert!(v.runs.as_ref().unwrap().passed);
    assert!(v.traces.as_ref().unwrap().passed);
    let diff = v.feature_diff.as_ref().unwrap();
    assert!(
        !diff.errors.is_empty(),
        "P2 makes tool calls fail: {diff:?}"
    );
    let nt = v.non_trivial.as_ref().unwrap();
    assert!(nt.keyword_available, "{}", nt.detail);
    assert!(nt.keyword_answer.is_some());
    assert!(m
        .diff
        .contains("slot[\"arguments\"] = [function[\"arguments\"]]"));
    assert_eq!(m.location.as_ref().unwrap().file, "toolcaller/llm.py");
    assert!(p2_dir.join("artifact/deficiency_type").exists());

    // The store holds the valid episode's trace with its label, and one healthy trace (the
    // clean run of its task, about one for every four valid injections), and nothing else.
    let store = traces::Store::open(a.join("store.sqlite")).unwrap();
    let ids = store.trace_ids().unwrap();
    assert_eq!(ids.len(), 2);
    let mut labels: Vec<_> = ids
        .iter()
        .flat_map(|id| store.labels(id).unwrap())
        .collect();
    labels.sort_by_key(|l| l.truth.deficiency_id.clone());
    assert_eq!(
        labels[1].truth.deficiency_id.as_deref(),
        Some(taxonomy::NONE)
    );
    assert_eq!(labels[1].truth.component, None);
    assert_eq!(labels[1].source["healthy"], true);
    assert_eq!(read(&a.join("healthy.jsonl")).lines().count(), 1);
    assert_eq!(labels[0].truth.deficiency_id.as_deref(), Some("P2"));
    assert_eq!(
        labels[0].truth.component.as_deref(),
        Some("llm_client.stream")
    );
    assert_eq!(
        labels[0].truth.function.as_deref(),
        Some("StreamAssembler.feed")
    );
    assert_eq!(read(&a.join("corpus.jsonl")).lines().count(), 1);
    // Where it shows: P2 cuts streamed tool-call arguments, so the run departs from the clean
    // one at a span of an agent step, and the record and the label say which.
    let record: serde_json::Value =
        serde_json::from_str(read(&a.join("corpus.jsonl")).lines().next().unwrap()).unwrap();
    let departure = &record["departure"];
    assert!(departure["span"].is_string(), "{record}");
    assert_eq!(
        labels[0].truth.step,
        departure["step"].as_i64(),
        "{departure}"
    );
    assert!(labels[0].truth.step.is_some(), "{departure}");
    assert_eq!(labels[0].source["departure"], *departure);
    assert_eq!(
        labels[1].truth.step, None,
        "a healthy trace departs nowhere"
    );
    let split_lines: usize = ["train", "val", "test"]
        .iter()
        .map(|s| read(&a.join(format!("splits/{s}.jsonl"))).lines().count())
        .sum();
    assert_eq!(split_lines, 2);
    // The Parquet export holds the injected record (healthy traces are in healthy.jsonl).
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let parquet_rows = |p: &Path| {
        let file = std::fs::File::open(p).unwrap();
        SerializedFileReader::new(file)
            .unwrap()
            .metadata()
            .file_metadata()
            .num_rows()
    };
    assert_eq!(parquet_rows(&a.join("corpus.parquet")), 1);
    let split_rows: i64 = ["train", "val", "test"]
        .iter()
        .map(|s| parquet_rows(&a.join(format!("splits/{s}.parquet"))))
        .sum();
    assert_eq!(split_rows, 1);

    // Interrupted after one episode, then killed in the middle of the next (a directory
    // without a manifest and a half-built store), then resumed. The first part runs in the
    // local sandbox and the rest on the default backend (Docker where an engine answers):
    // the backend is no part of the corpus, which comes out the same.
    let b = tmp.path().join("b");
    let first = generate(
        &workspace,
        &catalog,
        &options_on(Some(1), runner::BackendChoice::Local),
        &b,
        |_, _, _| {},
    )
    .unwrap();
    assert!(matches!(
        first,
        Finish::Interrupted {
            completed: 1,
            remaining: 1
        }
    ));
    assert!(!b.join("digest").exists());
    let plan: serde_json::Value = serde_json::from_str(&read(&b.join("plan.json"))).unwrap();
    let second_id = plan["episodes"][1]["id"].as_str().unwrap();
    let partial = b.join("episodes").join(corpus::episode_dir_name(second_id));
    std::fs::create_dir_all(partial.join("run")).unwrap();
    std::fs::write(partial.join("run/trace.jsonl"), "{\"half\": ").unwrap();
    std::fs::write(b.join(".store.sqlite.partial"), "garbage").unwrap();
    let mut seen = Vec::new();
    let resumed = generate(&workspace, &catalog, &options(None), &b, |done, _, m| {
        seen.push((done, m.id.clone()))
    })
    .unwrap();
    assert!(matches!(resumed, Finish::Complete(_)));
    assert_eq!(
        seen.len(),
        2,
        "the completed episode is reported, not redone"
    );
    if read(&a.join("digest")) != read(&b.join("digest")) {
        // Say which episode differs, so a flaky feature can be found from the CI log.
        let mut report = String::new();
        for entry in std::fs::read_dir(a.join("episodes")).unwrap() {
            let name = entry.unwrap().file_name();
            let ma = read(&a.join("episodes").join(&name).join("manifest.json"));
            let mb = read(&b.join("episodes").join(&name).join("manifest.json"));
            if ma != mb {
                report.push_str(&format!(
                    "--- {name:?}, uninterrupted:\n{ma}\n--- resumed:\n{mb}\n"
                ));
            }
        }
        panic!("an interrupted and resumed run gave another corpus:\n{report}");
    }

    // Other options in the same directory are refused.
    let mut other = options(None);
    other.seed = 4;
    let err = generate(&workspace, &catalog, &other, &b, |_, _, _| {}).unwrap_err();
    assert!(err.to_string().contains("other options"), "{err}");
}

#[test]
fn a_model_written_diff_runs_like_the_template_it_rewrites_and_garbage_is_rejected() {
    let workspace = Workspace::open(&root().join("agents")).unwrap();
    let catalog = Catalog::embedded().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let runner =
        corpus::EpisodeRunner::new(&workspace, &catalog, &options(None), tmp.path()).unwrap();
    let plan = corpus::plan(&workspace, &catalog, &options(None)).unwrap();
    let ep = plan
        .episodes
        .iter()
        .find(|e| e.deficiency == "P2")
        .unwrap()
        .clone();
    let templated = runner.run(&ep).unwrap();
    assert!(templated.validation.applies.passed, "{templated:?}");
    assert!(!templated.diff.is_empty());

    // The same change, proposed as a free-form diff.
    let free = corpus::Planned {
        id: format!("{}.free", ep.id),
        ..ep.clone()
    };
    let m = runner.run_diff(&free, &templated.diff).unwrap();
    assert_eq!(m.strategy, "free-form");
    assert!(m.validation.applies.passed, "{:?}", m.validation);
    assert_eq!(m.validation.valid, templated.validation.valid);
    assert_eq!(
        m.injected.as_ref().map(|r| &r.features),
        templated.injected.as_ref().map(|r| &r.features)
    );

    // Not a diff at all: refused with the engine's reason, nothing run.
    let junk = corpus::Planned {
        id: format!("{}.junk", ep.id),
        ..ep
    };
    let m = runner
        .run_diff(&junk, "sql: SELECT 1 -- not a patch")
        .unwrap();
    assert!(!m.validation.applies.passed && !m.validation.valid);
    assert!(m.injected.is_none());
}
