//! End-to-end tests on the real toolcaller agent: materialisation, a run through the scripted
//! server, determinism, and the agent's own Python unit tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use agents::local::{self, LocalOptions};
use agents::{Agent, Workspace};
use serde_json::Value;
use taxonomy::Catalog;

fn agents_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../agents")
}

fn toolcaller() -> (Workspace, Agent) {
    let workspace = Workspace::open(&agents_dir()).unwrap();
    let catalog = Catalog::embedded().unwrap();
    let agent = workspace.agent("toolcaller", &catalog).unwrap();
    (workspace, agent)
}

/// Files of the agent's final tree: everything but agent.toml, history/ and caches.
fn final_tree_files(dir: &Path) -> HashMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut HashMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if rel == "agent.toml"
                || rel == "history"
                || name == "__pycache__"
                || name.ends_with(".pyc")
            {
                continue;
            }
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = HashMap::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn materialised_history_has_the_fix_commits_and_the_final_tree() {
    let (_, agent) = toolcaller();
    assert!(
        agent.series.commits.len() >= 3,
        "toolcaller needs 3-5 fix commits"
    );
    let tmp = tempfile::tempdir().unwrap();
    let m = local::materialize(&agent, &tmp.path().join("repo")).unwrap();
    let repo = git2::Repository::open(&m.repo_dir).unwrap();

    let mut walk = repo.revwalk().unwrap();
    walk.push_head().unwrap();
    walk.set_sorting(git2::Sort::TOPOLOGICAL | git2::Sort::REVERSE)
        .unwrap();
    let summaries: Vec<String> = walk
        .map(|oid| {
            let commit = repo.find_commit(oid.unwrap()).unwrap();
            commit.summary().unwrap().unwrap_or_default().to_owned()
        })
        .collect();
    let mut expected = vec!["Initial import of toolcaller".to_owned()];
    expected.extend(
        agent
            .series
            .commits
            .iter()
            .map(|(c, _)| c.message.lines().next().unwrap().to_owned()),
    );
    assert_eq!(summaries, expected);

    // HEAD's tree holds exactly the agent's final files, byte for byte.
    let head_tree = repo.head().unwrap().peel_to_tree().unwrap();
    let mut in_tree = HashMap::new();
    head_tree
        .walk(git2::TreeWalkMode::PreOrder, |root, entry| {
            if entry.kind() == Some(git2::ObjectType::Blob) {
                let blob = repo.find_blob(entry.id()).unwrap();
                in_tree.insert(
                    format!("{root}{}", entry.name().unwrap()),
                    blob.content().to_vec(),
                );
            }
            git2::TreeWalkResult::Ok
        })
        .unwrap();
    let on_disk = final_tree_files(&agent.dir);
    assert_eq!(in_tree.len(), on_disk.len());
    for (path, bytes) in &on_disk {
        assert_eq!(in_tree.get(path), Some(bytes), "{path} differs");
    }

    // Every fix really changed the code, and the initial import lacks what the fixes added.
    let initial = repo.find_commit(m.initial_commit).unwrap();
    let base = initial.tree().unwrap();
    let read = |tree: &git2::Tree, path: &str| {
        let blob = tree
            .get_path(Path::new(path))
            .unwrap()
            .to_object(&repo)
            .unwrap();
        String::from_utf8(blob.peel_to_blob().unwrap().content().to_vec()).unwrap()
    };
    assert!(!read(&base, "toolcaller/tools/base.py").contains("def validate_arguments"));
    assert!(read(&head_tree, "toolcaller/tools/base.py").contains("def validate_arguments"));
    assert!(!read(&base, "toolcaller/llm.py").contains("class RetryPolicy"));
    for (oid, _) in &m.fix_commits {
        let c = repo.find_commit(*oid).unwrap();
        assert_ne!(c.tree_id(), c.parent(0).unwrap().tree_id());
    }
}

#[test]
fn manifest_covers_the_vocabulary_that_makes_sense() {
    let (_, agent) = toolcaller();
    let covered = agent.manifest.covered_components();
    // A single agent has no roles, delegation, planning or aggregation; everything else is here.
    for absent in [
        "multiagent.roles",
        "multiagent.aggregation",
        "orchestrator.delegation",
        "orchestrator.planning",
    ] {
        assert!(!covered.contains(absent));
    }
    let catalog = Catalog::embedded().unwrap();
    assert_eq!(covered.len(), catalog.components().len() - 4, "{covered:?}");
}

fn normalised_trace(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut ids: HashMap<String, usize> = HashMap::new();
    let mut spans: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for span in &spans {
        let n = ids.len();
        ids.entry(span["span_id"].as_str().unwrap().to_owned())
            .or_insert(n);
    }
    for span in &mut spans {
        let obj = span.as_object_mut().unwrap();
        for key in ["trace_id", "start_time_unix_nano", "end_time_unix_nano"] {
            obj.remove(key);
        }
        for key in ["span_id", "parent_span_id"] {
            let id = obj[key].as_str().map(|s| ids[s]);
            obj.insert(key.into(), serde_json::json!(id));
        }
    }
    spans
}

#[test]
fn one_task_through_the_scripted_server_and_same_seed_same_trace() {
    let (workspace, agent) = toolcaller();
    // gaia-017 has parallel tool calls in two steps: the hardest case for ordering.
    let task = workspace.task(&agent, "gaia-017").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let options = LocalOptions::default();
    let first = local::run_task(
        &workspace,
        &agent,
        &task,
        42,
        &tmp.path().join("a"),
        &options,
    )
    .unwrap();
    assert!(first.success, "{:?}", first.judgement);
    assert_eq!(first.collected.trace_problems, Vec::<String>::new());
    // outcome.json reads back as the outcome the run returned.
    let written = agents::RunOutcome::read(&first.out_dir.join("outcome.json")).unwrap();
    assert_eq!(written, first);
    assert!(
        first.collected.spans >= 10,
        "{} spans",
        first.collected.spans
    );
    let spans = normalised_trace(&first.trace);
    let root = spans.iter().find(|s| s["name"] == "agent.run").unwrap();
    assert_eq!(root["attributes"]["pathfinder.outcome"], "completed");
    assert_eq!(root["attributes"]["pathfinder.answer"], "55");
    assert!(spans.iter().all(|s| s["status"]["code"] != "ERROR"));
    let tools: Vec<&str> = spans
        .iter()
        .filter(|s| s["kind"] == "tool")
        .map(|s| s["attributes"]["code.function"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        [
            "Search.run",
            "Search.run",
            "ReadFile.run",
            "ReadFile.run",
            "Calculator.run"
        ]
    );

    let second = local::run_task(
        &workspace,
        &agent,
        &task,
        42,
        &tmp.path().join("b"),
        &options,
    )
    .unwrap();
    assert_eq!(
        normalised_trace(&first.trace),
        normalised_trace(&second.trace)
    );
}

/// Every clean agent solves every task of its suite with the scripted model playing its
/// scripts as written: the departures that make injected runs differ (`llmserve::departure`)
/// never fire on a clean agent's requests.
#[test]
fn clean_scripts_play_as_written() {
    let workspace = Workspace::open(&agents_dir()).unwrap();
    let endpoint = local::Endpoint::start(&workspace, &local::Llm::Scripted).unwrap();
    let options = LocalOptions {
        llm: local::Llm::External(endpoint.url().to_owned()),
        ..LocalOptions::default()
    };
    let tmp = tempfile::tempdir().unwrap();
    let catalog = Catalog::embedded().unwrap();
    for name in [
        "toolcaller",
        "research",
        "roleplay",
        "swe",
        "ag2",
        "pydantic-ai",
    ] {
        let agent = workspace.agent(name, &catalog).unwrap();
        let report = local::run_suite(
            &workspace,
            &agent,
            0,
            &tmp.path().join(&agent.name),
            &options,
            |_, _, _| {},
        )
        .unwrap();
        assert_eq!(
            report.succeeded, report.total,
            "{}: clean runs that failed",
            agent.name
        );
    }
    assert_eq!(endpoint.departures(), Vec::<String>::new());
}

#[test]
fn python_unit_tests_pass() {
    let dir = agents_dir().join("toolcaller");
    let out = std::process::Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests", "-t", "."])
        .current_dir(&dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("OK"), "{stderr}");
}
