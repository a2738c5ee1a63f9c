//! Hostile injections, planted through the Injector's free-form diff path into the real
//! toolcaller agent and run by the corpus's episode runner on each backend: code that writes
//! outside its episode, opens a network connection, forks without bound, allocates without
//! bound, or ignores SIGTERM and never ends. Each is contained, its manifest says what was
//! contained, nothing of it is left running or stored in the engine, and the next episode of
//! the same run goes on as usual.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agents::Workspace;
use corpus::{EpisodeRunner, GenerateOptions, Manifest, Planned};
use runner::{BackendChoice, ExecutorOptions};
use taxonomy::Catalog;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

const ANCHOR: &str = "from .tracing import Tracer\n";

/// Python run at import of the agent's entry module, before it does anything else.
const HOSTILE: [(&str, &str); 5] = [
    (
        "write-outside",
        "import os as _os\n\
         for _p in ('/etc/pathfinder-hostile', _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), 'planted.txt')):\n    \
             try:\n        open(_p, 'w').write('planted')\n    except OSError:\n        pass\n",
    ),
    (
        "network",
        "import socket as _socket\n\
         try:\n    _socket.create_connection(('192.0.2.10', 80), timeout=2)\nexcept OSError:\n    pass\n",
    ),
    (
        "fork-bomb",
        "import os as _os\n\
         while True:\n    try:\n        _os.fork()\n    except OSError:\n        pass\n",
    ),
    (
        "memory-bomb",
        "_hog = []\nwhile True:\n    _hog.append(b'x' * (64 << 20))\n",
    ),
    (
        "ignores-sigterm",
        "import signal as _signal, time as _time\n\
         _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)\n\
         while True:\n    _time.sleep(0.2)\n",
    ),
];

/// A unified diff inserting `code` after the entry module's imports.
fn diff_inserting(clean_main: &str, code: &str) -> String {
    let at = clean_main
        .find(ANCHOR)
        .expect("the entry module imports its tracer");
    let line = clean_main[..at].matches('\n').count() + 1;
    let added: Vec<String> = code.lines().map(|l| format!("+{l}")).collect();
    format!(
        "diff --git a/toolcaller/__main__.py b/toolcaller/__main__.py\n\
         --- a/toolcaller/__main__.py\n\
         +++ b/toolcaller/__main__.py\n\
         @@ -{line},1 +{line},{} @@\n {}{}\n",
        1 + added.len(),
        ANCHOR,
        added.join("\n")
    )
}

fn options(backend: BackendChoice) -> GenerateOptions {
    GenerateOptions {
        agents: vec!["toolcaller".into()],
        types: vec!["P2".into()],
        tasks: 1,
        seed: 0,
        holdout_agent: None,
        templates_dir: root().join("crates/inject/tests/fixtures/templates"),
        keyword: false,
        python: "python3".into(),
        timeout: Duration::from_secs(8),
        max_episodes: None,
        llm: None,
        isolation: ExecutorOptions {
            backend,
            recipe: root().join("infra/base-image.toml"),
            jobs: 2,
            ..ExecutorOptions::default()
        },
        shard: None,
    }
}

fn planned(variant: &str) -> Planned {
    Planned {
        id: format!("toolcaller.P2.{variant}.gaia-001"),
        agent: "toolcaller".into(),
        deficiency: "P2".into(),
        variant: variant.into(),
        task: "gaia-001".into(),
    }
}

/// Processes whose command line or working directory names `path`.
fn processes_under(path: &Path) -> Vec<String> {
    let needle = path.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        let cwd = std::fs::read_link(entry.path().join("cwd"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        if cmdline.contains(&needle) || cwd.contains(&needle) {
            found.push(format!("{pid}: {cmdline}"));
        }
    }
    found
}

fn injected(m: &Manifest) -> &corpus::RunSummary {
    m.injected
        .as_ref()
        .unwrap_or_else(|| panic!("{}: not run: {:?}", m.id, m.validation))
}

fn has(m: &Manifest, clause: &str) -> bool {
    injected(m).contained.iter().any(|c| c.contains(clause))
}

/// Runs every hostile injection and then an ordinary one on `backend`; returns the runner's
/// output directory.
fn hostile_run(backend: BackendChoice, forks_counted: impl Fn(&EpisodeRunner) -> bool) -> PathBuf {
    let workspace = Workspace::open(&root().join("agents")).unwrap();
    let catalog = Catalog::embedded().unwrap();
    let agent = workspace.agent("toolcaller", &catalog).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let clean = scratch.path().join("clean");
    agents::history::materialize(&agent.name, &agent.dir, &agent.series, &clean).unwrap();
    let clean_main = std::fs::read_to_string(clean.join("toolcaller/__main__.py")).unwrap();

    let out = scratch.keep().join("corpus");
    let runner = EpisodeRunner::new(&workspace, &catalog, &options(backend), &out).unwrap();
    eprintln!("{}", runner.executor().backend().isolation());
    let counted = forks_counted(&runner);
    let mut manifests = Vec::new();
    for (variant, code) in HOSTILE {
        if variant == "fork-bomb" && !counted {
            eprintln!("SKIPPED (fork-bomb): no pids cgroup here; a fork bomb would not be counted");
            continue;
        }
        let m = runner
            .run_diff(&planned(variant), &diff_inserting(&clean_main, code))
            .unwrap_or_else(|e| panic!("{variant}: {e}"));
        eprintln!("{variant}: {:?}", injected(&m).contained);
        manifests.push((variant, m));
    }
    for (variant, m) in &manifests {
        let summary = injected(m);
        match *variant {
            "write-outside" => {
                assert!(
                    has(
                        m,
                        "tried to write outside its episode (write to /etc/pathfinder-hostile)"
                    ),
                    "{summary:?}"
                );
                assert!(has(m, "planted.txt"), "{summary:?}");
                assert!(!Path::new("/etc/pathfinder-hostile").exists());
                let artifact_repo = out
                    .join("episodes")
                    .join(corpus::episode_dir_name(&m.id))
                    .join("artifact/repo");
                assert!(
                    !artifact_repo.join("toolcaller/planted.txt").exists(),
                    "the read-only repository was written"
                );
                // Refused, the agent goes on and answers.
                assert_eq!(summary.end, "exited with status 0", "{summary:?}");
            }
            "network" => {
                assert!(
                    has(
                        m,
                        "blocked network access (network: socket.connect to ('192.0.2.10', 80))"
                    ),
                    "{summary:?}"
                );
            }
            "fork-bomb" => {
                assert!(has(m, "refused at the pids limit"), "{summary:?}");
                assert!(has(m, "ran past its 8 s timeout"), "{summary:?}");
            }
            "memory-bomb" => {
                assert!(
                    has(m, "killed at its memory limit")
                        || has(m, "ran out of memory at its limit"),
                    "{summary:?}"
                );
            }
            "ignores-sigterm" => {
                assert!(
                    has(m, "ran past its 8 s timeout and was killed"),
                    "{summary:?}"
                );
                assert_eq!(summary.end, "ran past its time limit");
            }
            other => unreachable!("{other}"),
        }
        assert!(
            !m.validation.valid,
            "{}: a contained run is no labelled trace",
            m.id
        );
    }
    // The run goes on: an ordinary template episode after them runs, uncontained.
    let ordinary = Planned {
        id: "toolcaller.P2.keep-last-fragment.gaia-001".into(),
        variant: "keep-last-fragment".into(),
        ..planned("")
    };
    let m = runner.run(&ordinary).unwrap();
    assert!(injected(&m).contained.is_empty(), "{:?}", injected(&m));
    assert!(m.clean.contained.is_empty(), "{:?}", m.clean);
    assert!(m.clean.success, "{:?}", m.clean);
    drop(runner);
    let left = processes_under(&out);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    out
}

/// Containers carrying the project's label, whatever run made them.
fn labelled_containers() -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            "label=pathfinder",
            "--format",
            "{{.ID}} {{.Labels}}",
        ])
        .output()
        .expect("the docker client runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn hostile_injections_are_contained_on_both_backends() {
    let engine =
        std::env::var_os("DOCKER_HOST").is_some() || Path::new("/var/run/docker.sock").exists();
    if engine {
        let out = hostile_run(BackendChoice::Docker, |_| true);
        assert_eq!(
            labelled_containers(),
            Vec::<String>::new(),
            "containers left behind"
        );
        let _ = std::fs::remove_dir_all(out.parent().unwrap());
    } else {
        eprintln!("SKIPPED (docker): no Docker engine on this machine");
    }
    let out = hostile_run(BackendChoice::Local, |r| {
        r.executor().backend().isolation().contains("pids cgroup")
    });
    let _ = std::fs::remove_dir_all(out.parent().unwrap());
}
