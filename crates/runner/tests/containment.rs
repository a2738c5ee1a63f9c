//! Hostile agents are contained, and the run reports it — on both backends. Docker tests run
//! wherever an engine socket exists (they fail, never skip, if it does not answer) and skip
//! with a message elsewhere.

mod common;

use std::time::Duration;

use agents::process::ProcessEnd;
use runner::{run_episode, Backend, Cancel, EpisodeOutcome};

use common::{tight_limits, Scratch};

async fn episode(backend: &Backend, scratch: &Scratch, package: &str) -> EpisodeOutcome {
    let spec = scratch.spec(package, tight_limits());
    run_episode(backend, &spec, &Cancel::new())
        .await
        .unwrap_or_else(|e| panic!("{package}: {e}"))
}

fn assert_network_contained(o: &EpisodeOutcome) {
    assert_eq!(o.run.end, ProcessEnd::Exited(0), "{}", o.summary());
    let answer = &o
        .run
        .collected
        .result
        .as_ref()
        .expect("the agent wrote a result")
        .answer;
    assert!(!answer.contains("connected"), "{answer}");
    assert!(answer.contains("blocked 192.0.2.10:80"), "{answer}");
    assert!(
        o.containment
            .network_attempts
            .iter()
            .any(|a| a.contains("('192.0.2.10', 80)")),
        "{:?}",
        o.containment
    );
    assert!(o
        .containment
        .network_attempts
        .iter()
        .any(|a| a.contains("example.com")));
    assert!(
        o.summary().contains("blocked network access"),
        "{}",
        o.summary()
    );
    assert!(!o.run.success);
}

fn assert_timeout_contained(o: &EpisodeOutcome) {
    assert_eq!(o.run.end, ProcessEnd::TimedOut, "{}", o.summary());
    assert!(o.containment.timed_out);
    assert!(o.run.duration_ms < 15_000, "{}", o.run.duration_ms);
    assert!(
        o.summary()
            .contains("ran past its 4 s timeout and was killed"),
        "{}",
        o.summary()
    );
    // It was asked to stop before it was killed: the trace it writes on SIGTERM is collected.
    assert_eq!(o.run.collected.spans, 1, "{}", o.summary());
}

fn assert_forks_contained(o: &EpisodeOutcome) {
    assert_eq!(o.run.end, ProcessEnd::TimedOut, "{}", o.summary());
    let hits = o
        .containment
        .pids_limit_hits
        .expect("the backend counts refused forks");
    assert!(hits > 0, "{:?}", o.containment);
    assert!(
        o.summary().contains("refused at the pids limit (32)"),
        "{}",
        o.summary()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn docker_contains_hostile_agents() {
    let _mounts = common::MOUNTS.lock().await;
    let Some(backend) = common::docker_backend().await else {
        return;
    };
    let scratch = Scratch::new().await;
    let (net, slow, fork, mem) = tokio::join!(
        episode(&backend, &scratch, "net_agent"),
        episode(&backend, &scratch, "slow_agent"),
        episode(&backend, &scratch, "fork_agent"),
        episode(&backend, &scratch, "mem_agent"),
    );
    for o in [&net, &slow, &fork, &mem] {
        eprintln!("{}\n  timing {:?}", o.summary(), o.timing);
    }
    assert_network_contained(&net);
    assert_timeout_contained(&slow);
    assert_forks_contained(&fork);
    // Over its memory limit the container is killed by the kernel.
    assert!(mem.containment.oom_killed, "{}", mem.summary());
    assert!(
        mem.summary()
            .contains("killed at its memory limit (256 MiB)"),
        "{}",
        mem.summary()
    );
    assert_eq!(
        backend.sweep().await,
        0,
        "every episode removed its own container"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_sandbox_contains_hostile_agents() {
    let _mounts = common::MOUNTS.lock().await;
    let backend = Backend::Local(runner::local::LocalBackend::detect().unwrap());
    eprintln!("{}", backend.isolation());
    let scratch = Scratch::new().await;
    let slow = episode(&backend, &scratch, "slow_agent").await;
    assert_timeout_contained(&slow);
    let local = match &backend {
        Backend::Local(l) => l,
        Backend::Docker(_) => unreachable!(),
    };
    if matches!(local.namespaces(), runner::local::Namespaces::None) {
        eprintln!(
            "SKIPPED (network, forks): this machine allows no namespaces for the local sandbox"
        );
        return;
    }
    assert_network_contained(&episode(&backend, &scratch, "net_agent").await);
    if backend.isolation().contains("pids cgroup") {
        assert_forks_contained(&episode(&backend, &scratch, "fork_agent").await);
    } else {
        eprintln!("SKIPPED (forks): no pids cgroup here; a fork bomb would not be counted");
    }
    let mem = episode(&backend, &scratch, "mem_agent").await;
    let answer = &mem.run.collected.result.as_ref().expect("a result").answer;
    assert!(answer.starts_with("MemoryError"), "{answer}");
    let _ = Duration::from_secs(0);
}
