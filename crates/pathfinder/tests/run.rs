//! `pathfinder run` end to end: clean agents in a container and in the local sandbox, an
//! interrupted batch that leaves no container behind, and bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn pathfinder() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pathfinder"));
    cmd.current_dir(root());
    cmd
}

/// Whether the Docker tests can run: an engine answers. Where an engine socket exists but
/// does not answer, that is a failure, not a skip.
fn docker_available() -> bool {
    let answers = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !answers {
        assert!(
            !Path::new("/var/run/docker.sock").exists(),
            "/var/run/docker.sock exists but `docker info` fails: the Docker tests must not skip here"
        );
        eprintln!("SKIPPED: no Docker engine on this machine; the Docker backend is untested here");
    }
    answers
}

/// Waits until process `child` has at least `n` containers running, failing if it ends first
/// or `within` passes.
fn await_containers(child: &mut std::process::Child, n: usize, within: Duration) {
    let started = Instant::now();
    while containers_of(child.id()).len() < n {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            if let Some(mut e) = child.stderr.take() {
                std::io::Read::read_to_string(&mut e, &mut stderr).unwrap();
            }
            panic!("the run ended before {n} containers were seen ({status}): {stderr}");
        }
        assert!(
            started.elapsed() < within,
            "{n} containers never started within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends SIGINT to `child` and waits (at most `within`) for it to exit; its status and stderr.
fn interrupt(
    mut child: std::process::Child,
    within: Duration,
) -> (std::process::ExitStatus, String) {
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the interrupted run did not exit within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = child.wait_with_output().unwrap();
    (status, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Containers whose label marks them as created by process `pid`.
fn containers_of(pid: u32) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!("label=pathfinder.owner-pid={pid}"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

fn run_clean(backend: &str) {
    let out = tempfile::tempdir().unwrap();
    let output = pathfinder()
        .args([
            "run",
            "--agent",
            "toolcaller",
            "--task",
            "gaia-001",
            "--backend",
            backend,
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let trace = stdout
        .lines()
        .find_map(|l| l.strip_prefix("trace: "))
        .unwrap_or_else(|| panic!("no trace line in {stdout}"));
    let trace = PathBuf::from(trace);
    assert!(
        trace.starts_with(out.path().canonicalize().unwrap()),
        "{}",
        trace.display()
    );
    assert!(std::fs::read_to_string(&trace)
        .unwrap()
        .contains("\"agent.run\""));
    assert!(
        stdout.contains(&format!("1 episodes on {backend}: 1 succeeded")),
        "{stdout}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["backend"], backend);
    assert_eq!(summary["outcomes"][0]["success"], true);
    assert!(
        stderr.contains("gaia-001") && stderr.contains("success"),
        "{stderr}"
    );
}

#[test]
fn runs_a_clean_agent_in_docker() {
    if docker_available() {
        run_clean("docker");
    }
}

#[test]
fn runs_a_clean_agent_in_the_local_sandbox() {
    run_clean("local");
}

#[test]
fn an_interrupted_batch_leaves_no_container() {
    if !docker_available() {
        return;
    }
    // An injected swe agent that hangs: every episode would run until its timeout.
    let artifact = tempfile::tempdir().unwrap();
    std::fs::create_dir(artifact.path().join("swe")).unwrap();
    std::fs::write(
        artifact.path().join("swe/__main__.py"),
        "import time\ntime.sleep(600)\n",
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut child = pathfinder()
        .args([
            "run", "--agent", "swe", "--task", "swe-001", "--task", "swe-002", "--repeat", "2",
        ])
        .args([
            "--concurrency",
            "3",
            "--backend",
            "docker",
            "--timeout",
            "300",
            "--artifact",
        ])
        .arg(artifact.path())
        .arg("--out")
        .arg(out.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let started = Instant::now();
    await_containers(&mut child, 3, Duration::from_secs(120));
    let (status, stderr) = interrupt(child, Duration::from_secs(60));
    assert!(!status.success());
    eprintln!("--- child stderr after {:?}:\n{stderr}", started.elapsed());
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(stderr.contains("every sandbox was removed"), "{stderr}");
    assert_eq!(
        containers_of(pid),
        Vec::<String>::new(),
        "containers survived the ctrl-C"
    );
}

#[test]
fn bad_input_gets_clear_errors() {
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "run",
                "--agent",
                "nosuch",
                "--task",
                "gaia-001",
                "--backend",
                "local",
            ],
            "no agent \"nosuch\"",
        ),
        (
            &[
                "run",
                "--agent",
                "toolcaller",
                "--task",
                "gaia-001",
                "--llm",
                "ftp://x",
            ],
            "--llm \"ftp://x\"",
        ),
        (
            &[
                "run",
                "--agent",
                "toolcaller",
                "--task",
                "gaia-001",
                "--backend",
                "local",
                "--artifact",
                "/",
            ],
            "not a repository of agent toolcaller",
        ),
        (
            &[
                "run",
                "--agent",
                "toolcaller",
                "--task",
                "gaia-001",
                "--concurrency",
                "0",
            ],
            "--concurrency",
        ),
    ];
    for (args, expected) in cases {
        let output = pathfinder().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// Processes whose command line mentions `marker`.
fn processes_mentioning(marker: &str) -> Vec<String> {
    let out = Command::new("pgrep")
        .args(["-a", "-f", marker])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("pgrep"))
        .map(String::from)
        .collect()
}

#[test]
fn an_interrupted_local_batch_leaves_no_process() {
    let artifact = tempfile::tempdir().unwrap();
    std::fs::create_dir(artifact.path().join("swe")).unwrap();
    std::fs::write(
        artifact.path().join("swe/__main__.py"),
        "import os, time\nif os.fork() == 0:\n    time.sleep(600)\ntime.sleep(600)\n",
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let marker = out
        .path()
        .canonicalize()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let mut child = pathfinder()
        .args([
            "run", "--agent", "swe", "--task", "swe-001", "--task", "swe-002",
        ])
        .args([
            "--concurrency",
            "2",
            "--backend",
            "local",
            "--timeout",
            "300",
            "--artifact",
        ])
        .arg(artifact.path())
        .arg("--out")
        .arg(out.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    // Two agents, each with a forked child.
    while processes_mentioning(&marker).len() < 4 {
        assert!(child.try_wait().unwrap().is_none(), "the batch ended early");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the agents never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, stderr) = interrupt(child, Duration::from_secs(30));
    assert!(stderr.contains("interrupted"), "{stderr}");
    // Killed processes may take a moment to be reaped by the kernel.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_mentioning(&marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "left running: {:?}",
            processes_mentioning(&marker)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn without_an_engine_the_local_sandbox_is_chosen_with_a_notice() {
    let out = tempfile::tempdir().unwrap();
    let output = pathfinder()
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .args([
            "run",
            "--agent",
            "toolcaller",
            "--task",
            "gaia-003",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let notices: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("runner: "))
        .collect();
    assert_eq!(notices.len(), 1, "{stderr}");
    assert!(notices[0].contains("no Docker engine answers"), "{stderr}");
    assert!(
        notices[0].contains("falling back to the local sandbox"),
        "{stderr}"
    );
    assert!(
        stdout.contains("1 episodes on local: 1 succeeded"),
        "{stdout}"
    );
    // Asking for Docker explicitly is an error, not a silent fallback.
    let output = pathfinder()
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .args([
            "run",
            "--agent",
            "toolcaller",
            "--task",
            "gaia-003",
            "--backend",
            "docker",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr)
        .contains("--backend docker: no Docker engine answers"));
}

#[test]
fn an_interrupted_corpus_run_leaves_no_container_and_resumes() {
    if !docker_available() {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let corpus = out.path().join("corpus");
    let args: Vec<String> = [
        "corpus",
        "generate",
        "--agents",
        "toolcaller",
        "--types",
        "P2,P19",
        "--tasks",
        "1",
        "--no-keyword",
        "--templates-dir",
        "crates/inject/tests/fixtures/templates",
        "--backend",
        "docker",
        "-j",
        "2",
        "--out",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([corpus.to_string_lossy().into_owned()])
    .collect();
    let mut child = pathfinder()
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Interrupt while an episode's container runs.
    await_containers(&mut child, 1, Duration::from_secs(180));
    let (status, stderr) = interrupt(child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted: every sandbox removed"),
        "{stderr}"
    );
    // (Only this process's: the other tests of this binary run containers meanwhile.)
    assert_eq!(containers_of(pid), Vec::<String>::new(), "{stderr}");
    assert!(
        !corpus.join("digest").exists(),
        "published although interrupted"
    );

    // The same command resumes and completes.
    let resumed = pathfinder().args(&args).output().unwrap();
    let stdout = String::from_utf8_lossy(&resumed.stdout);
    assert!(
        resumed.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert!(stdout.contains("episodes valid"), "{stdout}");
    assert!(corpus.join("digest").exists());
}
