//! The four clean agents run in containers (and in the local sandbox), succeed on a task of
//! their suite, and their traces import into the trace store.

mod common;

use std::path::Path;
use std::sync::Arc;

use agents::Workspace;
use runner::{plan, run_batch, Backend, Cancel, LlmChoice, LlmEndpoint};

const AGENTS: [(&str, &str); 4] = [
    ("toolcaller", "gaia-001"),
    ("roleplay", "gaia-002"),
    ("swe", "swe-001"),
    ("research", "gaia-003"),
];

async fn run_all(backend: Backend) {
    let root = common::repo_root();
    let workspace = Workspace::open(&root.join("agents")).unwrap();
    let catalog = taxonomy::Catalog::load(&root.join("deficiencies")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let endpoint = LlmEndpoint::start(&workspace, &LlmChoice::Scripted)
        .await
        .unwrap();
    let mut specs = Vec::new();
    for (name, task_id) in AGENTS {
        let agent = workspace.agent(name, &catalog).unwrap();
        let task = workspace.task(&agent, task_id).unwrap();
        let agent_out = out.path().join(name);
        let repo = plan::agent_repo(&agent, None, &agent_out).unwrap();
        specs.extend(plan::episode_specs(
            &workspace,
            &agent,
            &[task],
            &[7],
            &repo,
            &agent_out,
            endpoint.socket(),
            "pathfinder-scripted",
            &runner::Limits::default(),
        ));
    }
    let backend = Arc::new(backend);
    let report = run_batch(
        backend.clone(),
        specs,
        2,
        Cancel::new(),
        indicatif::ProgressBar::hidden(),
    )
    .await;
    assert!(!report.interrupted);
    assert_eq!(report.swept, 0);
    let mut store = traces::Store::open(out.path().join("traces.db")).unwrap();
    for result in report.outcomes {
        let o = result.unwrap();
        eprintln!("{}", o.summary());
        assert!(
            o.run.success,
            "{}\n{}",
            o.summary(),
            agents::process::tail(&o.run.out_dir.join("agent.stderr"), 2000)
        );
        assert!(
            o.run.collected.trace_problems.is_empty(),
            "{:?}",
            o.run.collected.trace_problems
        );
        assert!(!o.containment.contained_something(), "{:?}", o.containment);
        let imported = store
            .import_file(&o.run.trace, traces::Format::Jsonl)
            .unwrap();
        eprintln!("  imported: {imported:?}");
        let ids = store.trace_ids().unwrap();
        assert!(!ids.is_empty());
        // The run directory keeps the outcome next to the trace.
        assert!(Path::new(&o.run.out_dir).join("outcome.json").is_file());
    }
    let n: i64 = store
        .connection()
        .query_row("SELECT COUNT(DISTINCT trace_id) FROM spans", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(n, 4, "one trace per agent in the store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clean_agents_run_in_docker_and_their_traces_import() {
    let _mounts = common::MOUNTS.lock().await;
    let Some(backend) = common::docker_backend().await else {
        return;
    };
    run_all(backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clean_agents_run_in_the_local_sandbox() {
    let _mounts = common::MOUNTS.lock().await;
    run_all(Backend::Local(
        runner::local::LocalBackend::detect().unwrap(),
    ))
    .await;
}

/// With the model behind HTTP (a TCP port), containers still get no network: the runner
/// forwards a mounted Unix socket to the port.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_http_endpoint_is_reached_through_a_socket_forwarder() {
    let _mounts = common::MOUNTS.lock().await;
    let Some(backend) = common::docker_backend().await else {
        return;
    };
    let root = common::repo_root();
    let workspace = Workspace::open(&root.join("agents")).unwrap();
    let catalog = taxonomy::Catalog::load(&root.join("deficiencies")).unwrap();
    let server = llmserve::BackgroundServer::start(
        llmserve::ServerConfig::new(llmserve::Listen::loopback(0)),
        Arc::new(llmserve::ScriptedBackend::new(llmserve::ScriptStore::new(
            workspace.scripts_dir(),
        ))),
    )
    .unwrap();
    assert!(server.url().starts_with("http://127.0.0.1:"));
    let endpoint = LlmEndpoint::start(&workspace, &LlmChoice::parse(server.url()).unwrap())
        .await
        .unwrap();
    let agent = workspace.agent("toolcaller", &catalog).unwrap();
    let task = workspace.task(&agent, "gaia-004").unwrap();
    let out = tempfile::tempdir().unwrap();
    let repo = plan::agent_repo(&agent, None, out.path()).unwrap();
    let specs = plan::episode_specs(
        &workspace,
        &agent,
        &[task],
        &[3],
        &repo,
        out.path(),
        endpoint.socket(),
        "pathfinder-scripted",
        &runner::Limits::default(),
    );
    let o = runner::run_episode(&backend, &specs[0], &Cancel::new())
        .await
        .unwrap();
    assert!(o.run.success, "{}", o.summary());
    assert!(
        o.containment.network_attempts.is_empty(),
        "{:?}",
        o.containment
    );
    assert_eq!(backend.sweep().await, 0);
    let left = runner::docker::connect()
        .await
        .unwrap()
        .list_containers(Some(bollard::query_parameters::ListContainersOptions {
            all: true,
            filters: Some(std::collections::HashMap::from([(
                "label".to_string(),
                vec![format!("pathfinder.episode={}", specs[0].id())],
            )])),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert!(left.is_empty(), "the episode's container was not removed");
}
