//! Sandbox cost per episode and throughput: the clean toolcaller agent on GAIA tasks in Docker
//! containers and in the local sandbox (the reference), at concurrency 1, 2 and 4.
//!
//! `cargo bench -p runner --bench episodes` (add `-- --episodes N` to change the batch size).
//! Overhead = from the start of an episode until its trace is collected, minus the agent
//! process's own run time (for containers: the engine's StartedAt..FinishedAt).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use agents::Workspace;
use runner::{plan, run_batch, Backend, Cancel, ImageInputs, Limits, LlmChoice, LlmEndpoint};

struct Figures {
    per_minute: f64,
    overhead_p50: f64,
    overhead_p90: f64,
    agent_p50: f64,
    failures: usize,
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if values.is_empty() {
        return f64::NAN;
    }
    let i = ((values.len() - 1) as f64 * p).round() as usize;
    values[i]
}

async fn measure(
    backend: Arc<Backend>,
    specs: Vec<runner::EpisodeSpec>,
    concurrency: usize,
) -> Figures {
    let n = specs.len();
    let started = Instant::now();
    let report = run_batch(
        backend,
        specs,
        concurrency,
        Cancel::new(),
        indicatif::ProgressBar::hidden(),
    )
    .await;
    let wall = started.elapsed().as_secs_f64();
    let mut overhead = Vec::new();
    let mut agent = Vec::new();
    let mut failures = 0;
    for o in report.outcomes {
        match o {
            Ok(o) => {
                if !o.run.success {
                    failures += 1;
                }
                overhead.push(o.timing.overhead_ms);
                agent.push(o.timing.agent_ms);
            }
            Err(e) => {
                eprintln!("episode error: {e}");
                failures += 1;
            }
        }
    }
    Figures {
        per_minute: n as f64 / wall * 60.0,
        overhead_p50: percentile(&mut overhead, 0.5),
        overhead_p90: percentile(&mut overhead, 0.9),
        agent_p50: percentile(&mut agent, 0.5),
        failures,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let episodes: usize = args
        .iter()
        .position(|a| a == "--episodes")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let workspace = Workspace::open(&root.join("agents")).unwrap();
    let catalog = taxonomy::Catalog::load(&root.join("deficiencies")).unwrap();
    let agent = workspace.agent("toolcaller", &catalog).unwrap();
    let tasks: Vec<_> = workspace
        .suite(&agent)
        .unwrap()
        .into_iter()
        .take(4)
        .collect();
    let out = tempfile::tempdir().unwrap();
    let repo = plan::agent_repo(&agent, None, out.path()).unwrap();
    let endpoint = LlmEndpoint::start(&workspace, &LlmChoice::Scripted)
        .await
        .unwrap();

    let mut backends: Vec<(&str, Arc<Backend>)> = Vec::new();
    match runner::docker::connect().await {
        Ok(_) => {
            let recipe = root.join("infra/base-image.toml");
            let inputs = ImageInputs {
                recipe: &recipe,
                apt_root: Path::new("/etc/apt"),
            };
            let docker = Backend::docker(&inputs, &|m| eprintln!("{m}"))
                .await
                .expect("the docker backend starts");
            backends.push(("docker", Arc::new(docker)));
        }
        Err(e) => eprintln!("no Docker engine ({e}); measuring the local sandbox only"),
    }
    let local = Backend::Local(runner::local::LocalBackend::detect().unwrap());
    eprintln!("{}", local.isolation());
    backends.push(("local", Arc::new(local)));

    println!(
        "{episodes} episodes per cell, toolcaller on {} GAIA tasks, scripted LLM",
        tasks.len()
    );
    println!(
        "{:<8} {:>4} {:>10} {:>14} {:>14} {:>12} {:>9}",
        "backend", "conc", "ep/min", "overhead p50", "overhead p90", "agent p50", "failures"
    );
    let mut table: Vec<(&str, usize, Figures)> = Vec::new();
    for (name, backend) in &backends {
        for concurrency in [1usize, 2, 4] {
            let seeds: Vec<u64> = (0..episodes.div_ceil(tasks.len()) as u64).collect();
            let dir = out.path().join(format!("{name}-{concurrency}"));
            let mut specs = plan::episode_specs(
                &workspace,
                &agent,
                &tasks,
                &seeds,
                &repo,
                &dir,
                endpoint.socket(),
                "pathfinder-scripted",
                &Limits::default(),
            );
            specs.truncate(episodes);
            // One warm-up episode (page cache, image layers) outside the measurement.
            let first = &specs[0];
            let warm = runner::EpisodeSpec::new(
                first.id(),
                agents::run::RunSpec {
                    out_dir: dir.join("warmup"),
                    ..first.run().clone()
                },
                first.llm_socket().to_owned(),
                first.limits().clone(),
            );
            let _ = runner::run_episode(backend, &warm, &Cancel::new()).await;
            let f = measure(backend.clone(), specs, concurrency).await;
            println!(
                "{:<8} {:>4} {:>10.1} {:>11.0} ms {:>11.0} ms {:>9.0} ms {:>9}",
                name,
                concurrency,
                f.per_minute,
                f.overhead_p50,
                f.overhead_p90,
                f.agent_p50,
                f.failures
            );
            table.push((name, concurrency, f));
        }
    }
    if backends.len() == 2 {
        println!("docker / local ratios:");
        for concurrency in [1usize, 2, 4] {
            let get = |n: &str| {
                table
                    .iter()
                    .find(|(b, c, _)| *b == n && *c == concurrency)
                    .map(|(_, _, f)| f)
            };
            if let (Some(d), Some(l)) = (get("docker"), get("local")) {
                println!(
                    "  concurrency {concurrency}: throughput {:.2}x, overhead p50 {:.0} ms vs {:.0} ms (+{:.0} ms)",
                    d.per_minute / l.per_minute,
                    d.overhead_p50,
                    l.overhead_p50,
                    d.overhead_p50 - l.overhead_p50
                );
            }
        }
    }
}
