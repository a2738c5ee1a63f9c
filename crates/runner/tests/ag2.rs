//! AG2, a real third-party framework vendored from its pinned wheels, solves every task of its
//! suite clean in containers with no network (and in the local sandbox): its two-agent tool
//! chats, group chats and sequential chats, traced through AG2's own OpenTelemetry
//! instrumentation into the trace contract. Needs `pathfinder agents vendor --agent ag2`
//! (.ci/test runs it).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use agents::Workspace;
use runner::{plan, run_batch, Backend, Cancel, LlmChoice, LlmEndpoint};
use serde_json::Value;

async fn whole_suite(backend: Backend) {
    let root = common::repo_root();
    let workspace = Workspace::open(&root.join("agents")).unwrap();
    let catalog = taxonomy::Catalog::load(&root.join("deficiencies")).unwrap();
    let agent = workspace
        .agent("ag2", &catalog)
        .expect("agents/ag2 loads (vendored by `pathfinder agents vendor --agent ag2`)");
    let tasks = workspace.suite(&agent).unwrap();
    let out = tempfile::tempdir().unwrap();
    let endpoint = LlmEndpoint::start(&workspace, &LlmChoice::Scripted)
        .await
        .unwrap();
    let repo = plan::agent_repo(&agent, None, out.path()).unwrap();
    let specs = plan::episode_specs(
        &workspace,
        &agent,
        &tasks,
        &[0],
        &repo,
        out.path(),
        endpoint.socket(),
        "pathfinder-scripted",
        &runner::Limits::default(),
    );
    assert!(
        specs[0].run().python_site.is_some(),
        "AG2's dependencies are mounted"
    );
    let report = run_batch(
        Arc::new(backend),
        specs,
        2,
        Cancel::new(),
        indicatif::ProgressBar::hidden(),
    )
    .await;
    assert!(!report.interrupted);
    assert_eq!(report.swept, 0);
    let mut patterns = BTreeSet::new();
    let mut span_names = BTreeSet::new();
    let mut store = traces::Store::open(out.path().join("traces.db")).unwrap();
    for result in report.outcomes {
        let o = result.unwrap();
        assert!(
            o.run.success,
            "{}\n{}",
            o.summary(),
            agents::process::tail(&o.run.out_dir.join("agent.stderr"), 3000)
        );
        assert!(
            o.run.collected.trace_problems.is_empty(),
            "{}: {:?}",
            o.summary(),
            o.run.collected.trace_problems
        );
        // No network attempt (no tokeniser or telemetry download), no write outside the
        // episode: the framework runs offline as vendored.
        assert!(
            !o.containment.contained_something(),
            "{}: {:?}",
            o.summary(),
            o.containment
        );
        store
            .import_file(&o.run.trace, traces::Format::Jsonl)
            .unwrap();
        let text = std::fs::read_to_string(&o.run.trace).unwrap();
        for line in text.lines() {
            let span: Value = serde_json::from_str(line).unwrap();
            let attrs = &span["attributes"];
            span_names.insert(
                span["name"]
                    .as_str()
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap()
                    .to_owned(),
            );
            if span["name"] == "agent.run" {
                patterns.insert(attrs["ag2.pattern"].as_str().unwrap().to_owned());
                assert_eq!(attrs["pathfinder.framework"], "ag2");
            }
            if attrs["ag2.span.type"] == "llm" || attrs["ag2.span.type"] == "tool" {
                // Located in AG2's own code, from the stack.
                let file = attrs["code.filepath"].as_str().unwrap();
                assert!(file.starts_with("autogen/"), "{file}: {span}");
            }
        }
    }
    assert_eq!(
        patterns,
        BTreeSet::from(["group_chat".into(), "sequential".into(), "tool_chat".into()])
    );
    for name in [
        "agent.run",
        "chat",
        "execute_tool",
        "invoke_agent",
        "conversation",
        "speaker_selection",
        "agent.initiate_chats",
    ] {
        assert!(
            span_names.contains(name),
            "no {name} span in {span_names:?}"
        );
    }
    let n: i64 = store
        .connection()
        .query_row("SELECT COUNT(DISTINCT trace_id) FROM spans", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(n as usize, tasks.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ag2_solves_its_suite_in_containers_with_no_network() {
    let _mounts = common::MOUNTS.lock().await;
    let Some(backend) = common::docker_backend().await else {
        return;
    };
    whole_suite(backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ag2_solves_its_suite_in_the_local_sandbox() {
    let _mounts = common::MOUNTS.lock().await;
    whole_suite(Backend::Local(
        runner::local::LocalBackend::detect().unwrap(),
    ))
    .await;
}
