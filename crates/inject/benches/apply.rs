//! Free-form injection latency: the engine (git2: parse, apply to the tree, commit on a
//! branch, check out, diff back, locate, plus a `python3` syntax check of the edited file)
//! against what a user would otherwise script with the git binary (`git checkout -b`,
//! `git apply --index`, `git commit`), on the materialised toolcaller repository with the
//! P2 fixture's diff. Resetting between iterations is not timed; the engine's python3 checker
//! is started by a first, untimed injection.
//!
//! Run: `cargo bench -p inject --bench apply` (`-- --runs N`, default 30). Without cargo
//! bench's `--bench` flag (e.g. under `cargo test --all-targets`) it does nothing.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use git2::build::CheckoutBuilder;
use git2::{BranchType, Repository};
use inject::{engine, template, Options};
use taxonomy::Catalog;

fn git(repo: &Path, args: &[&str]) {
    let status = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.org")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.org")
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?}");
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let runs: usize = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(30);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let catalog = Catalog::embedded().unwrap();
    let workspace = agents::Workspace::open(&root.join("agents")).unwrap();
    let agent = workspace.agent("toolcaller", &catalog).unwrap();
    let tmp = tempfile::tempdir().unwrap();

    // The diff: the P2 fixture applied once.
    let t = template::load(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/templates/toolcaller/P2-keep-last-fragment.toml"),
        &catalog,
    )
    .unwrap();
    let art = inject::inject_template(
        &agent,
        &t,
        &catalog,
        &tmp.path().join("a"),
        &Options::default(),
    )
    .unwrap();
    let diff = art.injection.diff.clone();
    let diff_file = tmp.path().join("p2.diff");
    std::fs::write(&diff_file, &diff).unwrap();

    let repo_dir = tmp.path().join("repo");
    let m =
        agents::history::materialize(&agent.name, &agent.dir, &agent.series, &repo_dir).unwrap();
    let repo = Repository::open(&repo_dir).unwrap();
    let options = Options::default();

    let mut engine_times = Vec::new();
    for _ in 0..runs + 1 {
        let start = Instant::now();
        let injection =
            engine::apply_diff(&repo, &diff, Some("P2"), &agent.manifest.sites, &options).unwrap();
        engine_times.push(start.elapsed());
        repo.set_head_detached(m.head).unwrap();
        repo.checkout_head(Some(CheckoutBuilder::new().force()))
            .unwrap();
        repo.find_branch(&injection.branch, BranchType::Local)
            .unwrap()
            .delete()
            .unwrap();
    }

    engine_times.remove(0); // the first one started the python3 checker
    let base = m.head.to_string();
    let mut git_times = Vec::new();
    for i in 0..runs {
        let branch = format!("bench-{i}");
        let start = Instant::now();
        git(&repo_dir, &["checkout", "-q", "-b", &branch, &base]);
        git(
            &repo_dir,
            &["apply", "--index", diff_file.to_str().unwrap()],
        );
        git(&repo_dir, &["commit", "-q", "-m", "P2"]);
        git_times.push(start.elapsed());
        git(&repo_dir, &["checkout", "-q", "--detach", &base]);
    }
    let (e, g) = (median(engine_times), median(git_times));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "free-form injection, median of {runs}: engine {:.2} ms (including the syntax check by a kept-warm python3), git CLI {:.2} ms; engine/git = {:.2}",
        ms(e),
        ms(g),
        e.as_secs_f64() / g.as_secs_f64()
    );
}
