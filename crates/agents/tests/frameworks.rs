//! The agents on real frameworks from pinned wheels — AG2 (`agents/ag2/ag2.lock`) and Pydantic
//! AI (`agents/pydantic-ai/pydantic-ai.lock`) — vendored by `pathfinder agents vendor --agent
//! NAME` (.ci/test runs it for both).

use std::path::{Path, PathBuf};

use agents::vendor::{Lock, SITE_DIR};
use agents::Workspace;
use taxonomy::Catalog;

fn agents_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../agents")
}

/// The materialised repository of `name` holds the framework and the harness (`present`), and
/// neither the installed dependencies nor the agent's manifest and lock.
fn holds_the_framework_and_the_harness_only(name: &str, lock_file: &str, present: &[&str]) {
    let workspace = Workspace::open(&agents_dir()).unwrap();
    let agent = workspace
        .agent(name, &Catalog::embedded().unwrap())
        .unwrap_or_else(|e| panic!("agents/{name} is not vendored: {e}"));
    let lock = Lock::load(&agent.dir.join(lock_file)).unwrap();
    assert!(lock.problems(&agent.dir, name).is_empty());
    let out = tempfile::tempdir().unwrap();
    let repo = out.path().join("repo");
    let m = agents::materialize(&agent.name, &agent.dir, &agent.series, &repo).unwrap();
    assert!(m.fix_commits.is_empty());
    for file in present {
        assert!(repo.join(file).is_file(), "{name}: {file} missing");
    }
    for absent in [SITE_DIR, ".wheels", lock_file, "agent.toml"] {
        assert!(
            !repo.join(absent).exists(),
            "{name}: {absent} is in the repository"
        );
    }
    let git = git2::Repository::open(&repo).unwrap();
    let head = git.head().unwrap().peel_to_tree().unwrap();
    assert!(
        head.get_path(Path::new(present[1])).is_ok(),
        "{name}: not committed"
    );
    assert_eq!(
        agent.python_site(),
        Some(agent.dir.join(SITE_DIR)),
        "{name}: runs get the installed dependencies"
    );
}

/// The harness's own Python tests, with the vendored dependencies on the path.
fn harness_unit_tests_pass(name: &str) {
    let dir = agents_dir().join(name);
    let out = std::process::Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests", "-t", "."])
        .current_dir(&dir)
        .env("PYTHONPATH", dir.join(SITE_DIR))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}: {stderr}");
    assert!(stderr.contains("OK"), "{name}: {stderr}");
}

#[test]
fn ag2_repository_holds_the_framework_and_the_harness_only() {
    holds_the_framework_and_the_harness_only(
        "ag2",
        "ag2.lock",
        &[
            "autogen/__init__.py",
            "autogen/oai/client.py",
            "autogen/agentchat/conversable_agent.py",
            "ag2_tasks/__main__.py",
        ],
    );
}

#[test]
fn pydantic_ai_repository_holds_the_framework_and_the_harness_only() {
    holds_the_framework_and_the_harness_only(
        "pydantic-ai",
        "pydantic-ai.lock",
        &[
            "pydantic_ai/__init__.py",
            "pydantic_ai/agent/__init__.py",
            "pydantic_ai_tasks/__main__.py",
        ],
    );
}

#[test]
fn ag2_harness_unit_tests_pass() {
    harness_unit_tests_pass("ag2");
}

#[test]
fn pydantic_ai_harness_unit_tests_pass() {
    harness_unit_tests_pass("pydantic-ai");
}
