//! One episode: an agent on a task in a sandbox, from an empty run directory to a judged,
//! recorded outcome. The backend-independent part lives here (its data in `spec`); a backend
//! only runs commands (the agent, then a SWE task's tests) inside its sandbox.

use std::path::Path;
use std::time::{Duration, Instant};

use agents::judge::Judgement;
use agents::process::ProcessEnd;
use agents::run::{self, RunOutcome};
use agents::Task;

use crate::backend::Backend;
use crate::cancel::Cancel;
use crate::spec::{
    agent_command, sandbox_env, Containment, EpisodeError, EpisodeOutcome, EpisodeSpec, Job, Timing,
};

/// Empties an episode directory left by a previous run (one holding `task.json`); refuses
/// to delete anything else.
fn reset_out_dir(id: &str, dir: &Path) -> Result<(), EpisodeError> {
    let err = |reason: String| EpisodeError::Output {
        id: id.to_owned(),
        path: dir.to_owned(),
        reason,
    };
    match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(err(e.to_string())),
        Ok(mut entries) => {
            if entries.next().is_none() {
                return Ok(());
            }
            if !dir.join("task.json").is_file() {
                return Err(err(
                    "exists and does not look like a previous episode; refusing to delete it"
                        .into(),
                ));
            }
            std::fs::remove_dir_all(dir)
                .map_err(|e| err(format!("cannot clear the previous episode: {e}")))
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs one episode on `backend`: prepares the run directory, runs the agent in the sandbox,
/// collects `result.json` and the trace, runs a SWE task's tests in the sandbox, judges, and
/// writes `outcome.json`.
pub async fn run_episode(
    backend: &Backend,
    spec: &EpisodeSpec,
    cancel: &Cancel,
) -> Result<EpisodeOutcome, EpisodeError> {
    let started = Instant::now();
    let id = spec.id().to_owned();
    let run_spec = spec.run().clone();
    reset_out_dir(&id, &spec.run().out_dir)?;
    let layout = {
        let run_spec = run_spec.clone();
        tokio::task::spawn_blocking(move || run::prepare(&run_spec))
            .await
            .map_err(|e| EpisodeError::Sandbox {
                id: id.clone(),
                reason: format!("preparing the run directory panicked: {e}"),
            })?
            .map_err(|source| EpisodeError::Prepare {
                id: id.clone(),
                source,
            })?
    };
    let audit_log = spec.audit_log();
    let _ = std::fs::remove_file(&audit_log);
    let paths = backend.sandbox_paths(spec);
    let command = agent_command(spec, &paths);
    let mut env = sandbox_env(&paths, Path::new("/tmp"));
    env.extend(command.env.iter().cloned());
    let mut argv = vec![command.program.clone()];
    argv.extend(command.args.iter().cloned());
    let job = Job {
        role: "agent",
        argv,
        env: env.clone(),
        cwd: paths.repo.clone(),
        timeout: spec.limits().timeout,
        stdout: layout.stdout.clone(),
        stderr: layout.stderr.clone(),
    };
    if cancel.is_cancelled() {
        return Err(EpisodeError::Cancelled { id });
    }
    let agent = backend
        .run_job(spec, &job, cancel)
        .await
        .map_err(|reason| EpisodeError::Sandbox {
            id: id.clone(),
            reason,
        })?;
    if agent.cancelled {
        return Err(EpisodeError::Cancelled { id });
    }
    let collected = run::collect(&layout, spec.run().task.id());
    let until_collected = started.elapsed();

    let judgement = match &spec.run().task {
        Task::Swe(task) if agent.end == ProcessEnd::Exited(0) && collected.result.is_some() => {
            let tests = Job {
                role: "tests",
                argv: vec!["sh".into(), "-c".into(), task.test_command.clone()],
                env,
                cwd: paths.layout().task_repo(),
                timeout: spec.limits().test_timeout,
                stdout: layout.tests_log.clone(),
                stderr: layout.tests_log.clone(),
            };
            let run = backend
                .run_job(spec, &tests, cancel)
                .await
                .map_err(|reason| EpisodeError::Sandbox {
                    id: id.clone(),
                    reason,
                })?;
            if run.cancelled {
                return Err(EpisodeError::Cancelled { id });
            }
            match run.end {
                ProcessEnd::Exited(0) => Judgement {
                    success: true,
                    reason: format!("`{}` passed", task.test_command),
                },
                other => Judgement {
                    success: false,
                    reason: format!(
                        "`{}` {}: {}",
                        task.test_command,
                        other.describe(),
                        agents::process::tail(&layout.tests_log, 400)
                    ),
                },
            }
        }
        _ => run::judge(&run_spec, &layout, agent.end, &collected),
    };

    let audit = crate::audit::read_records(&audit_log);
    let containment = Containment {
        timed_out: agent.end == ProcessEnd::TimedOut,
        oom_killed: agent.oom_killed,
        out_of_memory: audit.out_of_memory,
        pids_limit_hits: agent.pids_limit_hits,
        network_attempts: audit.network,
        filesystem_attempts: audit.filesystem,
    };
    let run = RunOutcome {
        agent: spec.run().agent.clone(),
        task_id: spec.run().task.id().to_owned(),
        seed: spec.run().seed,
        out_dir: spec.run().out_dir.clone(),
        trace: layout.trace.clone(),
        command: command.shell_line(),
        end: agent.end,
        duration_ms: agent.duration.as_millis() as u64,
        success: judgement.success,
        collected,
        judgement,
    };
    let agent_ms = ms(agent.duration);
    let mut outcome = EpisodeOutcome {
        id: id.clone(),
        backend: backend.name().into(),
        isolation: backend.isolation(),
        run,
        containment,
        limits: spec.limits().clone(),
        timing: Timing {
            until_collected_ms: ms(until_collected),
            agent_ms,
            overhead_ms: (ms(until_collected) - agent_ms).max(0.0),
            total_ms: 0.0,
        },
    };
    outcome.timing.total_ms = ms(started.elapsed());
    let json = serde_json::to_string_pretty(&outcome).expect("an outcome serialises");
    run::write_atomic(&layout.outcome, json.as_bytes()).map_err(|source| {
        EpisodeError::Prepare {
            id: id.clone(),
            source,
        }
    })?;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Limits, SandboxPaths};

    #[test]
    fn containment_describes_what_was_stopped() {
        let limits = Limits {
            timeout: Duration::from_secs(5),
            pids: 64,
            ..Limits::default()
        };
        let none = Containment::default();
        assert!(!none.contained_something());
        assert!(none.describe(&limits).is_empty());
        let c = Containment {
            timed_out: true,
            oom_killed: false,
            out_of_memory: false,
            pids_limit_hits: Some(81),
            network_attempts: vec!["network: socket.connect to ('192.0.2.1', 9)".into()],
            filesystem_attempts: vec!["write to /etc/passwd".into()],
        };
        assert!(c.contained_something());
        assert_eq!(
            c.describe(&limits),
            [
                "ran past its 5 s timeout and was killed",
                "81 process creations refused at the pids limit (64)",
                "blocked network access (network: socket.connect to ('192.0.2.1', 9))",
                "tried to write outside its episode (write to /etc/passwd)",
            ]
        );
        let clauses = c.describe(&limits);
        assert!(Containment::is_timeout_clause(&clauses[0]));
        assert!(!clauses[1..]
            .iter()
            .any(|c| Containment::is_timeout_clause(c)));
    }

    #[test]
    fn only_previous_episodes_are_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let ep = dir.path().join("ep");
        reset_out_dir("e", &ep).unwrap();
        std::fs::create_dir_all(ep.join("work")).unwrap();
        std::fs::write(ep.join("task.json"), "{}").unwrap();
        reset_out_dir("e", &ep).unwrap();
        assert!(!ep.exists());
        let other = dir.path().join("other");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("precious.txt"), "x").unwrap();
        let e = reset_out_dir("e", &other).unwrap_err().to_string();
        assert!(e.contains("refusing to delete"), "{e}");
        assert!(other.join("precious.txt").exists());
    }

    #[test]
    fn sandbox_env_points_the_hook_at_the_episode() {
        let paths = SandboxPaths {
            repo: "/agent".into(),
            out_dir: "/episode".into(),
            corpus: "/corpus".into(),
            llm_socket: "/run/pathfinder/llm.sock".into(),
            audit_dir: "/opt/pathfinder/audit".into(),
            python_site: Some("/opt/pathfinder/site".into()),
        };
        let env: std::collections::HashMap<_, _> =
            sandbox_env(&paths, Path::new("/tmp")).into_iter().collect();
        assert_eq!(
            env["PYTHONPATH"],
            "/opt/pathfinder/audit:/opt/pathfinder/site"
        );
        assert_eq!(env["PATHFINDER_AUDIT_LOG"], "/episode/audit.jsonl");
        assert_eq!(
            env["PATHFINDER_AUDIT_ALLOW_UNIX"],
            "/run/pathfinder/llm.sock"
        );
        assert_eq!(env["PATHFINDER_AUDIT_WRITABLE"], "/episode:/tmp");
        assert_eq!(env["PATHFINDER_AUDIT_READ_ONLY"], "/agent:/corpus");
    }
}
