//! The Docker backend: one fresh container per command of an episode, through bollard against
//! the local engine. No network (network mode `none`; the LLM socket is bind-mounted), read-only
//! root filesystem, the run directory as the only writable mount, memory/CPU/pids limits, a
//! wall-clock deadline, and removal of every container it creates: in the background once its
//! outputs are collected (on every path out of [`DockerBackend::run_job`]), by a drop guard if
//! that future or the removal is dropped, by [`DockerBackend::sweep`] (which waits for pending
//! removals, then removes whatever still carries the batch's label), and, for containers of an
//! orchestrator killed outright, by the next backend's reaping of orphans.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agents::process::ProcessEnd;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType};
use bollard::query_parameters::{
    KillContainerOptions, ListContainersOptions, LogsOptions, RemoveContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use tokio::task::JoinSet;

use crate::cancel::Cancel;
use crate::image::AUDIT_DIR;
use crate::spec::{EpisodeSpec, Job, JobRun, SandboxPaths};

/// Every container the runner creates carries this label (value `1`), so that
/// `docker ps -a --filter label=pathfinder` lists whatever a run left behind.
pub const LABEL_PROJECT: &str = "pathfinder";
/// Every container the runner creates carries this label too (value `1`).
pub const LABEL_RUNNER: &str = "pathfinder.runner";
/// The episode a container belongs to.
pub const LABEL_EPISODE: &str = "pathfinder.episode";
/// The batch (one backend instance) a container belongs to.
pub const LABEL_BATCH: &str = "pathfinder.batch";
/// The process id of the orchestrator that created it (for reaping orphans).
pub const LABEL_OWNER_PID: &str = "pathfinder.owner-pid";
/// Which command of the episode (`agent`, `tests`).
pub const LABEL_ROLE: &str = "pathfinder.role";

/// Container paths.
pub const AGENT_DIR: &str = "/agent";
pub const EPISODE_DIR: &str = "/episode";
pub const CORPUS_DIR: &str = "/corpus";
/// Where an agent's third-party packages are mounted.
const SITE_DIR: &str = "/opt/pathfinder/site";
pub const LLM_SOCKET: &str = "/run/pathfinder/llm.sock";

/// The most bytes of each output stream kept per container.
const MAX_LOG_BYTES: usize = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no Docker engine answers ({0})")]
    Unavailable(String),
}

/// Connects to the local engine (`DOCKER_HOST` or the default socket), negotiates the API
/// version and pings it, within a few seconds.
pub async fn connect() -> Result<Docker, EngineError> {
    let docker = Docker::connect_with_local_defaults()
        .map_err(|e| EngineError::Unavailable(e.to_string()))?;
    let attempt = async {
        let docker = docker.negotiate_version().await?;
        docker.ping().await?;
        Ok::<_, bollard::errors::Error>(docker)
    };
    match tokio::time::timeout(Duration::from_secs(5), attempt).await {
        Ok(Ok(d)) => Ok(d),
        Ok(Err(e)) => Err(EngineError::Unavailable(e.to_string())),
        Err(_) => Err(EngineError::Unavailable("no answer within 5 s".into())),
    }
}

/// Runs episodes' commands in containers of one image.
#[derive(Debug, Clone)]
pub struct DockerBackend {
    docker: Docker,
    image: String,
    batch: String,
    /// `uid:gid` inside the container.
    user: String,
    /// When running as root, the run directory is handed to this uid (the container's user).
    chown_to: Option<u32>,
    /// Removals of finished containers, off the episodes' critical path; [`DockerBackend::sweep`]
    /// waits for them.
    removals: Arc<Mutex<JoinSet<()>>>,
}

/// The unprivileged user agents run as when the orchestrator is root.
const NOBODY: u32 = 65534;

impl DockerBackend {
    /// A backend for `image` (see [`crate::image::ensure_image`]); also removes containers
    /// left by orchestrators that no longer exist.
    pub async fn new(docker: Docker, image: String) -> DockerBackend {
        // SAFETY: getters without preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let (user, chown_to) = if uid == 0 {
            (format!("{NOBODY}:{NOBODY}"), Some(NOBODY))
        } else {
            (format!("{uid}:{gid}"), None)
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let backend = DockerBackend {
            docker,
            image,
            batch: format!("{}-{nanos:x}", std::process::id()),
            user,
            chown_to,
            removals: Arc::default(),
        };
        match backend.reap_orphans().await {
            Ok(0) => {}
            Ok(n) => tracing::warn!("removed {n} containers left by an orchestrator that died"),
            Err(e) => tracing::warn!("cannot list old containers: {e}"),
        }
        backend
    }

    pub fn image(&self) -> &str {
        &self.image
    }

    /// The label value that marks this backend's containers.
    pub fn batch_id(&self) -> &str {
        &self.batch
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    pub fn sandbox_paths(&self, spec: &EpisodeSpec) -> SandboxPaths {
        SandboxPaths {
            repo: AGENT_DIR.into(),
            out_dir: EPISODE_DIR.into(),
            corpus: CORPUS_DIR.into(),
            llm_socket: LLM_SOCKET.into(),
            audit_dir: AUDIT_DIR.into(),
            python_site: spec.run().python_site.as_ref().map(|_| SITE_DIR.into()),
        }
    }

    pub fn isolation(&self) -> String {
        format!(
            "docker container of {} as {} (network none, read-only root, no capabilities)",
            self.image, self.user
        )
    }

    async fn containers_with(
        &self,
        label: &str,
    ) -> Result<Vec<(String, HashMap<String, String>)>, bollard::errors::Error> {
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![label.to_string()],
            )])),
            ..Default::default()
        };
        Ok(self
            .docker
            .list_containers(Some(options))
            .await?
            .into_iter()
            .filter_map(|c| Some((c.id?, c.labels.unwrap_or_default())))
            .collect())
    }

    /// Removes every container of this batch; returns how many it removed.
    pub async fn sweep(&self) -> Result<usize, bollard::errors::Error> {
        let pending = std::mem::take(&mut *self.removals.lock().expect("never poisoned"));
        pending.join_all().await;
        let mut removed = 0;
        for (id, _) in self
            .containers_with(&format!("{LABEL_BATCH}={}", self.batch))
            .await?
        {
            if remove(&self.docker, &id).await.is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes runner containers whose orchestrator process is gone (killed with SIGKILL, a
    /// machine crash): nothing would ever remove them otherwise.
    async fn reap_orphans(&self) -> Result<usize, bollard::errors::Error> {
        let mut removed = 0;
        for (id, labels) in self.containers_with(LABEL_RUNNER).await? {
            let alive = labels
                .get(LABEL_OWNER_PID)
                .and_then(|p| p.parse::<i32>().ok())
                .is_some_and(process_alive);
            if !alive && remove(&self.docker, &id).await.is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    fn container_config(&self, spec: &EpisodeSpec, job: &Job) -> ContainerCreateBody {
        let bind = |source: &Path, target: &str, read_only: bool| Mount {
            target: Some(target.into()),
            source: Some(source.to_string_lossy().into_owned()),
            typ: Some(MountType::BIND),
            read_only: Some(read_only),
            ..Default::default()
        };
        let limits = &spec.limits();
        // A backstop for the case the orchestrator is killed outright and cannot enforce the
        // deadline: the container ends itself a little after it.
        let backstop = (job.timeout + Duration::from_secs(30))
            .as_secs()
            .to_string();
        let mut cmd = vec!["timeout".to_string(), "-s".into(), "KILL".into(), backstop];
        cmd.extend(job.argv.iter().cloned());
        let labels = HashMap::from([
            (LABEL_PROJECT.to_string(), "1".to_string()),
            (LABEL_RUNNER.to_string(), "1".to_string()),
            (LABEL_EPISODE.to_string(), spec.id().to_owned()),
            (LABEL_BATCH.to_string(), self.batch.clone()),
            (LABEL_OWNER_PID.to_string(), std::process::id().to_string()),
            (LABEL_ROLE.to_string(), job.role.to_string()),
        ]);
        ContainerCreateBody {
            image: Some(self.image.clone()),
            cmd: Some(cmd),
            env: Some(job.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            working_dir: Some(job.cwd.to_string_lossy().into_owned()),
            user: Some(self.user.clone()),
            labels: Some(labels),
            network_disabled: Some(true),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                readonly_rootfs: Some(true),
                mounts: Some(
                    [
                        bind(&spec.run().repo_dir, AGENT_DIR, true),
                        bind(&spec.run().corpus_dir, CORPUS_DIR, true),
                        bind(&spec.run().out_dir, EPISODE_DIR, false),
                        bind(spec.llm_socket(), LLM_SOCKET, false),
                    ]
                    .into_iter()
                    .chain(
                        spec.run()
                            .python_site
                            .as_ref()
                            .map(|site| bind(site, SITE_DIR, true)),
                    )
                    .collect(),
                ),
                tmpfs: Some(HashMap::from([(
                    "/tmp".to_string(),
                    format!("rw,nosuid,nodev,size={},mode=1777", limits.tmp_bytes),
                )])),
                memory: Some(limits.memory_bytes as i64),
                memory_swap: Some(limits.memory_bytes as i64),
                nano_cpus: Some((limits.cpus * 1e9) as i64),
                pids_limit: Some(limits.pids as i64),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                init: Some(true),
                log_config: Some(HostConfigLogConfig {
                    typ: Some("json-file".into()),
                    config: Some(HashMap::from([("max-size".to_string(), "8m".to_string())])),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Hands the run directory to the container's user (only when running as root).
    fn chown_out_dir(&self, spec: &EpisodeSpec) -> Result<(), String> {
        let Some(uid) = self.chown_to else {
            return Ok(());
        };
        chown_tree(&spec.run().out_dir, uid).map_err(|e| {
            format!(
                "{}: cannot chown for the container: {e}",
                spec.run().out_dir.display()
            )
        })
    }

    /// Runs `job` in a fresh container and removes it.
    pub async fn run_job(
        &self,
        spec: &EpisodeSpec,
        job: &Job,
        cancel: &Cancel,
    ) -> Result<JobRun, String> {
        self.chown_out_dir(spec)?;
        let config = self.container_config(spec, job);
        let created = self
            .docker
            .create_container(
                None::<bollard::query_parameters::CreateContainerOptions>,
                config,
            )
            .await
            .map_err(|e| format!("cannot create the {} container: {e}", job.role))?;
        let mut guard = ContainerGuard {
            docker: self.docker.clone(),
            id: Some(created.id.clone()),
        };
        let result = self.drive(&created.id, job, cancel).await;
        // The outputs are collected; the container goes in the background (the guard travels
        // with the removal, and the batch's sweep waits for it).
        let docker = self.docker.clone();
        let id = created.id;
        self.removals
            .lock()
            .expect("never poisoned")
            .spawn(async move {
                match remove(&docker, &id).await {
                    Ok(()) => guard.disarm(),
                    Err(e) => {
                        tracing::warn!(
                            "cannot remove container {id}: {e} (the batch sweep retries)"
                        )
                    }
                }
            });
        result
    }

    /// Sends `signal` to the container and waits at most `wait` for it to end (errors are
    /// ignored: it may have ended already, and removal forces the end anyway).
    async fn signal_and_wait(&self, id: &str, signal: &str, wait: Duration) {
        let _ = self
            .docker
            .kill_container(
                id,
                Some(KillContainerOptions {
                    signal: signal.into(),
                }),
            )
            .await;
        let _ = tokio::time::timeout(
            wait,
            self.docker
                .wait_container(id, None::<bollard::query_parameters::WaitContainerOptions>)
                .next(),
        )
        .await;
    }

    async fn drive(&self, id: &str, job: &Job, cancel: &Cancel) -> Result<JobRun, String> {
        self.docker
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| format!("cannot start the {} container: {e}", job.role))?;
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + job.timeout;
        let mut wait = self
            .docker
            .wait_container(id, None::<bollard::query_parameters::WaitContainerOptions>);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let pids_events = pids_events_path(id);
        let mut pids_hits: Option<u64> = None;
        let mut timed_out = false;
        let mut cancelled = false;
        loop {
            tokio::select! {
                _ = wait.next() => break,
                _ = tokio::time::sleep_until(deadline) => { timed_out = true; break; }
                _ = cancel.cancelled() => { cancelled = true; break; }
                _ = tick.tick() => {
                    if let Some(n) = pids_events.as_deref().and_then(read_pids_max_events) {
                        pids_hits = Some(pids_hits.unwrap_or(0).max(n));
                    }
                }
            }
        }
        drop(wait);
        if let Some(n) = pids_events.as_deref().and_then(read_pids_max_events) {
            pids_hits = Some(pids_hits.unwrap_or(0).max(n));
        }
        if timed_out {
            // SIGTERM first (docker-init and `timeout` pass it on), then STOP_GRACE to write
            // the trace before the kill below.
            self.signal_and_wait(id, "TERM", crate::spec::STOP_GRACE)
                .await;
        }
        if timed_out || cancelled {
            // Wait until the engine has recorded the end (bounded: removal forces it anyway).
            self.signal_and_wait(id, "KILL", Duration::from_secs(10))
                .await;
        }
        if cancelled {
            return Ok(JobRun {
                end: ProcessEnd::Signalled(9),
                duration: started.elapsed(),
                oom_killed: false,
                pids_limit_hits: pids_hits,
                cancelled: true,
            });
        }
        let inspect = self
            .docker
            .inspect_container(
                id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .map_err(|e| format!("cannot inspect the {} container: {e}", job.role))?;
        let state = inspect.state.unwrap_or_default();
        let oom_killed = state.oom_killed.unwrap_or(false);
        let code = state.exit_code.unwrap_or(-1) as i32;
        let end = if timed_out {
            ProcessEnd::TimedOut
        } else if oom_killed {
            ProcessEnd::Signalled(libc::SIGKILL)
        } else if (129..160).contains(&code) {
            // docker-init and `timeout` report a signalled child as 128 + signal.
            ProcessEnd::Signalled(code - 128)
        } else {
            ProcessEnd::Exited(code)
        };
        let duration = match (
            state.started_at.as_deref().and_then(engine_time_nanos),
            state.finished_at.as_deref().and_then(engine_time_nanos),
        ) {
            (Some(a), Some(b)) if b >= a => Duration::from_nanos((b - a) as u64),
            _ => started.elapsed(),
        };
        self.save_logs(id, job).await?;
        Ok(JobRun {
            end,
            duration,
            oom_killed,
            pids_limit_hits: pids_hits,
            cancelled: false,
        })
    }

    async fn save_logs(&self, id: &str, job: &Job) -> Result<(), String> {
        let options = LogsOptions {
            stdout: true,
            stderr: true,
            follow: false,
            tail: "all".into(),
            ..Default::default()
        };
        let mut out = Vec::new();
        let mut err = Vec::new();
        let mut logs = self.docker.logs(id, Some(options));
        while let Some(item) = logs.next().await {
            match item {
                Ok(bollard::container::LogOutput::StdOut { message })
                    if out.len() < MAX_LOG_BYTES =>
                {
                    out.extend_from_slice(&message)
                }
                Ok(bollard::container::LogOutput::StdErr { message })
                    if err.len() < MAX_LOG_BYTES =>
                {
                    err.extend_from_slice(&message)
                }
                Ok(_) => {}
                Err(e) => {
                    err.extend_from_slice(
                        format!("\n[runner: the container's log ended early: {e}]\n").as_bytes(),
                    );
                    break;
                }
            }
        }
        append(&job.stdout, &out).map_err(|e| format!("{}: {e}", job.stdout.display()))?;
        append(&job.stderr, &err).map_err(|e| format!("{}: {e}", job.stderr.display()))
    }
}

fn append(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(bytes)
}

async fn remove(docker: &Docker, id: &str) -> Result<(), bollard::errors::Error> {
    let options = RemoveContainerOptions {
        force: true,
        v: true,
        ..Default::default()
    };
    match docker.remove_container(id, Some(options)).await {
        Ok(()) => Ok(()),
        // Already gone is what we wanted.
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes its container when dropped while armed: the episode's future was dropped between
/// creating and removing it (a panic, an aborted task).
struct ContainerGuard {
    docker: Docker,
    id: Option<String>,
}

impl ContainerGuard {
    fn disarm(&mut self) {
        self.id = None;
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let docker = self.docker.clone();
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    if let Err(e) = remove(&docker, &id).await {
                        tracing::warn!("cannot remove container {id}: {e}");
                    }
                });
            }
        }
    }
}

/// Whether `pid` names a live process (a zombie is dead: it only waits to be reaped).
fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let exists = unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM };
    if !exists {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_none_or(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// `chown -R uid:uid` without following symlinks.
fn chown_tree(path: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))?;
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid)?;
        }
    }
    Ok(())
}

/// The container's `pids.events` under the cgroup layouts Docker uses (v1 and v2, cgroupfs
/// and systemd drivers); `None` if none exists (then limit hits are not reported).
fn pids_events_path(id: &str) -> Option<PathBuf> {
    [
        format!("/sys/fs/cgroup/pids/docker/{id}/pids.events"),
        format!("/sys/fs/cgroup/pids/system.slice/docker-{id}.scope/pids.events"),
        format!("/sys/fs/cgroup/system.slice/docker-{id}.scope/pids.events"),
        format!("/sys/fs/cgroup/docker/{id}/pids.events"),
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// The `max N` counter of a `pids.events` file: forks refused at `pids.max`.
pub fn read_pids_max_events(path: &Path) -> Option<u64> {
    parse_pids_events(&std::fs::read_to_string(path).ok()?)
}

pub fn parse_pids_events(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("max ").and_then(|n| n.trim().parse().ok()))
}

/// Engine timestamps (`2026-05-20T10:00:00.123456789Z`) as nanoseconds since the epoch.
pub fn engine_time_nanos(text: &str) -> Option<i128> {
    let (secs, offset_minutes) = agents::history::parse_rfc3339(text).ok()?;
    let frac = text
        .get(19..)
        .and_then(|r| r.strip_prefix('.'))
        .map(|f| {
            f.bytes()
                .take_while(u8::is_ascii_digit)
                .map(|b| (b - b'0') as i128)
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let mut nanos: i128 = 0;
    for i in 0..9 {
        nanos = nanos * 10 + frac.get(i).copied().unwrap_or(0);
    }
    let _ = offset_minutes; // parse_rfc3339 already returns UTC seconds
    Some(secs as i128 * 1_000_000_000 + nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_times_keep_nanoseconds() {
        let a = engine_time_nanos("2026-05-20T10:00:00.123456789Z").unwrap();
        let b = engine_time_nanos("2026-05-20T10:00:01.5Z").unwrap();
        assert_eq!(b - a, 1_376_543_211);
        assert!(engine_time_nanos("0001-01-01T00:00:00Z").is_some());
        assert!(engine_time_nanos("yesterday").is_none());
    }

    #[test]
    fn liveness_of_processes() {
        assert!(process_alive(std::process::id() as i32));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        std::thread::sleep(Duration::from_millis(200));
        // Exited but not yet reaped: a zombie counts as dead.
        assert!(!process_alive(pid));
        child.wait().unwrap();
        assert!(!process_alive(pid));
    }

    #[test]
    fn pids_events_counter() {
        assert_eq!(parse_pids_events("max 81\n"), Some(81));
        assert_eq!(parse_pids_events("max 0"), Some(0));
        assert_eq!(parse_pids_events(""), None);
    }
}
