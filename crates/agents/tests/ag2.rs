//! The AG2 agent: a real framework from pinned wheels (`agents/ag2/ag2.lock`), vendored by
//! `pathfinder agents vendor --agent ag2` (.ci/test runs it).

use std::path::{Path, PathBuf};

use agents::vendor::{Lock, SITE_DIR};
use agents::Workspace;
use taxonomy::Catalog;

fn agents_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../agents")
}

#[test]
fn the_repository_holds_the_framework_and_the_harness_only() {
    let workspace = Workspace::open(&agents_dir()).unwrap();
    let agent = workspace
        .agent("ag2", &Catalog::embedded().unwrap())
        .expect("agents/ag2 is vendored");
    let lock = Lock::load(&agent.dir.join("ag2.lock")).unwrap();
    assert!(lock.problems(&agent.dir, "ag2").is_empty());
    let out = tempfile::tempdir().unwrap();
    let repo = out.path().join("repo");
    let m = agents::materialize(&agent.name, &agent.dir, &agent.series, &repo).unwrap();
    assert!(m.fix_commits.is_empty());
    for present in [
        "autogen/__init__.py",
        "autogen/agentchat/conversable_agent.py",
        "ag2_tasks/__main__.py",
    ] {
        assert!(repo.join(present).is_file(), "{present} missing");
    }
    for absent in [SITE_DIR, ".wheels", "ag2.lock", "agent.toml"] {
        assert!(!repo.join(absent).exists(), "{absent} is in the repository");
    }
    let git = git2::Repository::open(&repo).unwrap();
    let head = git.head().unwrap().peel_to_tree().unwrap();
    assert!(head.get_path(Path::new("autogen/oai/client.py")).is_ok());
    assert_eq!(
        agent.python_site(),
        Some(agent.dir.join(SITE_DIR)),
        "runs get the installed dependencies"
    );
}

#[test]
fn harness_unit_tests_pass() {
    let dir = agents_dir().join("ag2");
    let out = std::process::Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests", "-t", "."])
        .current_dir(&dir)
        .env("PYTHONPATH", dir.join(SITE_DIR))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("OK"), "{stderr}");
}
