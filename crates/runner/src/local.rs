//! The local backend, for machines without a Docker engine: the same episode contract in a
//! sandboxed subprocess. Namespaces through bubblewrap where it works (no network, read-only
//! root, private `/tmp`, own pid namespace), else `unshare` (no network, own pid namespace),
//! else none; a pids cgroup where one is writable, else `RLIMIT_NPROC`; rlimits for memory
//! (address space), file size and core dumps; the wall-clock deadline kills the whole process
//! group and every process left in the cgroup.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use agents::process::ProcessEnd;

use crate::cancel::Cancel;
use crate::spec::{EpisodeSpec, Job, JobRun, SandboxPaths};

/// Which namespaces wrap the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespaces {
    Bubblewrap(PathBuf),
    Unshare(PathBuf),
    None,
}

#[derive(Debug)]
pub struct LocalBackend {
    namespaces: Namespaces,
    /// A writable pids-controller hierarchy (`/sys/fs/cgroup/pids` or a v2 root).
    pids_cgroup: Option<PathBuf>,
    is_root: bool,
    /// Holds `sitecustomize.py` (the audit hook).
    hook_dir: tempfile::TempDir,
    host_path: String,
}

fn find(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn works(program: &Path, args: &[&str]) -> bool {
    std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Probes whether a pids cgroup can be created under `root`.
fn writable_pids_cgroup(root: &Path) -> bool {
    let probe = root.join(format!("pathfinder-probe-{}", std::process::id()));
    let ok = std::fs::create_dir(&probe).is_ok() && probe.join("pids.max").exists();
    let _ = std::fs::remove_dir(&probe);
    ok
}

impl LocalBackend {
    /// Detects the strongest isolation this machine allows.
    pub fn detect() -> std::io::Result<LocalBackend> {
        let bwrap_args = [
            "--unshare-all",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
            "true",
        ];
        let namespaces = match find("bwrap") {
            Some(b) if works(&b, &bwrap_args) => Namespaces::Bubblewrap(b),
            _ => match find("unshare") {
                Some(u)
                    if works(
                        &u,
                        &[
                            "--net",
                            "--pid",
                            "--fork",
                            "--kill-child",
                            "--mount-proc",
                            "true",
                        ],
                    ) =>
                {
                    Namespaces::Unshare(u)
                }
                _ => Namespaces::None,
            },
        };
        let pids_cgroup = [
            PathBuf::from("/sys/fs/cgroup/pids"),
            PathBuf::from("/sys/fs/cgroup"),
        ]
        .into_iter()
        .find(|root| writable_pids_cgroup(root));
        LocalBackend::with(namespaces, pids_cgroup)
    }

    /// A backend with the given mechanisms (tests pin them).
    pub fn with(
        namespaces: Namespaces,
        pids_cgroup: Option<PathBuf>,
    ) -> std::io::Result<LocalBackend> {
        let hook_dir = tempfile::Builder::new().prefix("pf-audit-").tempdir()?;
        std::fs::write(
            hook_dir.path().join("sitecustomize.py"),
            crate::audit::SITECUSTOMIZE,
        )?;
        Ok(LocalBackend {
            namespaces,
            pids_cgroup,
            // SAFETY: no preconditions.
            is_root: unsafe { libc::geteuid() } == 0,
            hook_dir,
            host_path: std::env::var("PATH")
                .unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
        })
    }

    pub fn namespaces(&self) -> &Namespaces {
        &self.namespaces
    }

    pub fn sandbox_paths(&self, spec: &EpisodeSpec) -> SandboxPaths {
        SandboxPaths {
            repo: spec.run().repo_dir.clone(),
            out_dir: spec.run().out_dir.clone(),
            corpus: spec.run().corpus_dir.clone(),
            llm_socket: spec.llm_socket().to_owned(),
            audit_dir: self.hook_dir.path().to_owned(),
            python_site: spec.run().python_site.clone(),
        }
    }

    /// The one-line notice of what isolation applies.
    pub fn isolation(&self) -> String {
        let ns = match &self.namespaces {
            Namespaces::Bubblewrap(_) => {
                "bubblewrap (no network, read-only root, private /tmp, own pid namespace)"
            }
            Namespaces::Unshare(_) => {
                "unshare (no network, own pid namespace; the filesystem is NOT read-only)"
            }
            Namespaces::None => "no namespaces (network and filesystem are NOT isolated)",
        };
        let pids = match (&self.pids_cgroup, self.is_root) {
            (Some(_), _) => "pids cgroup",
            (None, false) => "RLIMIT_NPROC (counts all of this user's processes)",
            (None, true) => "no pids limit (root without a writable pids cgroup)",
        };
        format!("local sandbox: {ns}; {pids}; rlimits on address space, file size, core dumps; no CPU share limit")
    }

    fn command(&self, spec: &EpisodeSpec, job: &Job) -> tokio::process::Command {
        let mut argv: Vec<String> = Vec::new();
        let s = |p: &Path| p.to_string_lossy().into_owned();
        match &self.namespaces {
            Namespaces::Bubblewrap(bwrap) => {
                argv.push(s(bwrap));
                argv.extend(
                    [
                        "--unshare-all",
                        "--die-with-parent",
                        "--new-session",
                        "--cap-drop",
                        "ALL",
                        "--ro-bind",
                        "/",
                        "/",
                    ]
                    .map(String::from),
                );
                argv.extend(
                    ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"].map(String::from),
                );
                // After the private /tmp, so that episode paths under /tmp stay visible.
                let ro = [
                    &spec.run().repo_dir,
                    &spec.run().corpus_dir,
                    &self.hook_dir.path().to_owned(),
                ];
                for p in ro.into_iter().chain(&spec.run().python_site) {
                    argv.extend(["--ro-bind".into(), s(p), s(p)]);
                }
                argv.extend([
                    "--bind".into(),
                    s(&spec.run().out_dir),
                    s(&spec.run().out_dir),
                ]);
                argv.extend(["--bind".into(), s(spec.llm_socket()), s(spec.llm_socket())]);
                argv.extend(["--chdir".into(), s(&job.cwd), "--".into()]);
            }
            Namespaces::Unshare(unshare) => {
                argv.push(s(unshare));
                if !self.is_root {
                    argv.push("--map-root-user".into());
                }
                argv.extend(
                    [
                        "--net",
                        "--pid",
                        "--fork",
                        "--kill-child",
                        "--mount-proc",
                        "--",
                    ]
                    .map(String::from),
                );
            }
            Namespaces::None => {}
        }
        argv.extend(job.argv.iter().cloned());
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]).current_dir(&job.cwd).env_clear();
        for (k, v) in &job.env {
            if k == "PATH" {
                cmd.env(k, &self.host_path);
            } else {
                cmd.env(k, v);
            }
        }
        cmd
    }

    pub async fn run_job(
        &self,
        spec: &EpisodeSpec,
        job: &Job,
        cancel: &Cancel,
    ) -> Result<JobRun, String> {
        let open = |p: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| format!("{}: {e}", p.display()))
        };
        let out = open(&job.stdout)?;
        let err = if job.stderr == job.stdout {
            out.try_clone().map_err(|e| e.to_string())?
        } else {
            open(&job.stderr)?
        };
        let cgroup = match &self.pids_cgroup {
            Some(root) => Some(Cgroup::create(
                root,
                spec.id(),
                job.role,
                spec.limits().pids,
            )?),
            None => None,
        };
        let mut cmd = self.command(spec, job);
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(true);
        let limits = Rlimits {
            address_space: spec.limits().memory_bytes,
            file_size: 1 << 30,
            nproc: (cgroup.is_none() && !self.is_root).then_some(spec.limits().pids as u64),
            cgroup_procs: cgroup.as_ref().map(|c| c.procs.as_raw_fd()),
        };
        // SAFETY: the closure only makes async-signal-safe system calls (setrlimit, prctl,
        // write) on values prepared before the fork.
        unsafe {
            cmd.pre_exec(move || limits.apply());
        }
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", job.argv[0]))?;
        let pgid = child.id().map(|p| p as i32);
        let mut timed_out = false;
        let mut cancelled = false;
        let status = tokio::select! {
            s = child.wait() => Some(s.map_err(|e| e.to_string())?),
            _ = tokio::time::sleep(job.timeout) => { timed_out = true; None }
            _ = cancel.cancelled() => { cancelled = true; None }
        };
        let duration = started.elapsed();
        if timed_out {
            // SIGTERM first, then STOP_GRACE to write the trace. With a cgroup, to every
            // process in it but the outermost (bubblewrap: its end would take its pid
            // namespace down with SIGKILL before the agent had written anything); without
            // one, to the process group.
            match (&cgroup, pgid) {
                (Some(c), _) => c.signal_all_but(libc::SIGTERM, pgid),
                // SAFETY: signalling the process group we created for the child.
                (None, Some(pgid)) => unsafe {
                    libc::kill(-pgid, libc::SIGTERM);
                },
                (None, None) => {}
            }
            let _ = tokio::time::timeout(crate::spec::STOP_GRACE, child.wait()).await;
        }
        // Leave nothing behind: the process group, then whatever is still in the cgroup.
        if let Some(pgid) = pgid {
            // SAFETY: signalling the process group we created for the child.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        if status.is_none() {
            let _ = child.kill().await;
        }
        let pids_limit_hits = cgroup.as_ref().and_then(|c| c.max_events());
        if let Some(c) = cgroup {
            c.destroy().await;
        }
        let end = match status {
            None => ProcessEnd::TimedOut,
            Some(status) => {
                use std::os::unix::process::ExitStatusExt;
                match (status.code(), status.signal()) {
                    (Some(code), _) => ProcessEnd::Exited(code),
                    (None, Some(sig)) => ProcessEnd::Signalled(sig),
                    (None, None) => ProcessEnd::Exited(-1),
                }
            }
        };
        Ok(JobRun {
            end: if timed_out { ProcessEnd::TimedOut } else { end },
            duration,
            // RLIMIT_AS makes allocations fail instead of killing; a MemoryError shows in the
            // agent's own output.
            oom_killed: false,
            pids_limit_hits,
            cancelled,
        })
    }
}

/// rlimits and the cgroup join, applied in the child between fork and exec.
#[derive(Debug, Clone, Copy)]
struct Rlimits {
    address_space: u64,
    file_size: u64,
    nproc: Option<u64>,
    cgroup_procs: Option<i32>,
}

impl Rlimits {
    fn apply(&self) -> std::io::Result<()> {
        let set = |resource, value: u64| {
            let lim = libc::rlimit {
                rlim_cur: value as libc::rlim_t,
                rlim_max: value as libc::rlim_t,
            };
            // SAFETY: setrlimit with a valid pointer to a local.
            if unsafe { libc::setrlimit(resource, &lim) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        };
        if let Some(fd) = self.cgroup_procs {
            // "0" moves the writing process (cgroup v1 and v2).
            // SAFETY: write(2) of a static buffer to a descriptor opened by the parent.
            if unsafe { libc::write(fd, b"0\n".as_ptr().cast(), 2) } != 2 {
                return Err(std::io::Error::last_os_error());
            }
        }
        set(libc::RLIMIT_AS, self.address_space)?;
        set(libc::RLIMIT_FSIZE, self.file_size)?;
        set(libc::RLIMIT_CORE, 0)?;
        if let Some(n) = self.nproc {
            set(libc::RLIMIT_NPROC, n)?;
        }
        // SAFETY: prctl with integer arguments; the child dies with the orchestrator.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        }
        Ok(())
    }
}

/// A pids cgroup for one command.
struct Cgroup {
    dir: PathBuf,
    procs: OwnedFd,
}

impl Cgroup {
    fn create(root: &Path, episode: &str, role: &str, pids: u32) -> Result<Cgroup, String> {
        let safe: String = episode
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let dir = root.join(format!("pathfinder-{}-{safe}-{role}", std::process::id()));
        let err = |e: std::io::Error| format!("{}: {e}", dir.display());
        if dir.exists() {
            let _ = std::fs::remove_dir(&dir);
        }
        std::fs::create_dir(&dir).map_err(err)?;
        std::fs::write(dir.join("pids.max"), pids.to_string()).map_err(err)?;
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))
            .map_err(err)?;
        Ok(Cgroup {
            dir,
            procs: procs.into(),
        })
    }

    fn max_events(&self) -> Option<u64> {
        crate::docker::read_pids_max_events(&self.dir.join("pids.events"))
    }

    /// Sends `signal` to every process in the cgroup but `spare`.
    fn signal_all_but(&self, signal: libc::c_int, spare: Option<i32>) {
        let pids = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        let pids = pids.lines().filter_map(|l| l.trim().parse::<i32>().ok());
        for pid in pids.filter(|p| Some(*p) != spare) {
            // SAFETY: signalling processes of the cgroup we created.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    /// Kills what is left in the cgroup and removes it.
    async fn destroy(self) {
        for _ in 0..50 {
            let pids = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            let pids: Vec<i32> = pids.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if pids.is_empty() && std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            for pid in pids {
                // SAFETY: signalling processes of the cgroup we created.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tracing::warn!("cannot remove cgroup {}", self.dir.display());
    }
}
