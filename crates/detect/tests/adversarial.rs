//! Runs the adversarial corpus (tests/adversarial/*.toml, see its README) against the tools
//! exactly as the Detector calls them, and checks after every file that the store's bytes are
//! unchanged and no sandboxed process is left behind.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use detect::env::{render_run, Actor, Status};
use detect::shell::{Pipeline, Stage};
use detect::{Action, Config, Detector};
use regex::Regex;
use serde::Deserialize;
use sha2::{Digest, Sha256};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    tool: String,
    #[serde(default)]
    input: Option<String>,
    #[serde(default)]
    stages: Option<Vec<Vec<String>>>,
    expect: String,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    absent: Option<String>,
    #[serde(default)]
    creates: Option<String>,
}

#[derive(Debug, Deserialize)]
struct File {
    case: Vec<Case>,
}

fn fingerprint(store: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for suffix in ["", "-wal", "-journal"] {
        let path = PathBuf::from(format!("{}{suffix}", store.display()));
        let digest = match std::fs::read(&path) {
            Ok(bytes) => format!("{:x}", Sha256::digest(&bytes)),
            Err(_) => "absent".to_string(),
        };
        out.push((path.display().to_string(), digest));
    }
    out
}

/// Processes running under the sandbox's uid range (200000..600000).
fn sandbox_processes() -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|u| u.parse::<u32>().ok());
        if uid.is_some_and(|u| (200_000..600_000).contains(&u)) {
            found.push(status.lines().next().unwrap_or("?").to_string());
        }
    }
    found
}

#[test]
fn adversarial_corpus_is_refused_or_contained() {
    let dir = tempfile::tempdir().unwrap();
    let store_path = dir.path().join("traces.db");
    {
        let mut store = traces::Store::open(&store_path).unwrap();
        let (spans, mut label) =
            detect::synthetic::scenario("P2", "0123456789abcdef0123456789abcdef", 1).unwrap();
        store.import_spans(spans, "adversarial").unwrap();
        label.reason = Some("SECRET-LABEL: the answer is P2".into());
        store.put_label(&label).unwrap();
    }
    let mut config = Config::default();
    config.sandbox.wall = Duration::from_secs(1);
    config.sandbox.cpu_seconds = 1;
    config.sql.wall = Duration::from_millis(300);
    let detector = Detector::new(&store_path, config, false).unwrap();
    let inv = detector
        .prepare("0123456789abcdef0123456789abcdef")
        .unwrap();
    let episode = inv.episode_dir().to_path_buf();
    std::os::unix::fs::symlink("/etc/passwd", episode.join("passwd-link")).unwrap();
    std::os::unix::fs::symlink("..", episode.join("up-link")).unwrap();
    std::os::unix::fs::symlink(&store_path, episode.join("store-link")).unwrap();
    let tools = Arc::clone(&inv).tools(Actor::Main).unwrap();
    let sandbox = inv
        .sandbox()
        .expect("the sandbox must be available in CI")
        .clone();
    // Taken with the read-only connections open: in WAL mode, opening one creates an empty
    // `-wal` file (no frames); the database's own bytes are what must never change.
    let before = fingerprint(&store_path);

    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/adversarial");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    let mut total = 0;
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let parsed: File =
            toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for case in parsed.case {
            total += 1;
            let where_ = format!(
                "{}: {}",
                file.file_name().unwrap().to_string_lossy(),
                case.name
            );
            if let Some(path) = &case.creates {
                let _ = std::fs::remove_file(path);
            }
            let input = case
                .input
                .as_deref()
                .map(|i| i.replace("{STORE}", &store_path.display().to_string()));
            let obs = match (case.tool.as_str(), input) {
                ("sql", Some(query)) => tools.execute(&Action::Sql { query }),
                ("bash", Some(pipeline)) => tools.execute(&Action::Bash { pipeline }),
                ("sandbox", None) => {
                    let stages = case
                        .stages
                        .clone()
                        .unwrap_or_else(|| panic!("{where_}: sandbox cases need stages"));
                    let pipeline = Pipeline {
                        stages: stages
                            .iter()
                            .map(|s| Stage {
                                program: s[0].clone(),
                                args: s[1..].to_vec(),
                            })
                            .collect(),
                    };
                    let out = sandbox
                        .run(&stages)
                        .unwrap_or_else(|e| panic!("{where_}: {e}"));
                    render_run(&out, &pipeline, sandbox.limits())
                }
                _ => {
                    panic!("{where_}: tool must be sql or bash with input, or sandbox with stages")
                }
            };
            let mut problems = Vec::new();
            match case.expect.as_str() {
                "refused" if obs.status == Status::Ok => {
                    problems.push("expected a refusal, the call went through".to_string())
                }
                "refused" | "contained" => {}
                other => panic!("{where_}: expect must be refused or contained, not {other}"),
            }
            if let Some(m) = &case.message {
                if !Regex::new(m).unwrap().is_match(&obs.text) {
                    problems.push(format!("observation does not match /{m}/"));
                }
            }
            if let Some(a) = &case.absent {
                if Regex::new(a).unwrap().is_match(&obs.text) {
                    problems.push(format!("observation leaks /{a}/"));
                }
            }
            if let Some(path) = &case.creates {
                if Path::new(path).exists() {
                    problems.push(format!("{path} was created on the host"));
                }
            }
            if !problems.is_empty() {
                let shown: String = obs.text.chars().take(400).collect();
                failures.push(format!(
                    "{where_}: {} [{:?}] {shown}",
                    problems.join("; "),
                    obs.status
                ));
            }
        }
        assert_eq!(
            fingerprint(&store_path),
            before,
            "{}: the store's bytes changed",
            file.display()
        );
        let mut left = sandbox_processes();
        for _ in 0..40 {
            if left.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            left = sandbox_processes();
        }
        assert!(
            left.is_empty(),
            "{}: sandbox processes left running: {left:?}",
            file.display()
        );
    }
    assert!(
        total >= 60,
        "the corpus has {total} cases; at least 60 are required"
    );
    assert!(
        failures.is_empty(),
        "{} of {total} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(
        std::fs::read_dir(&episode).unwrap().count(),
        5,
        "the episode directory changed"
    );
}
