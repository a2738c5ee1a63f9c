//! Runs a pipeline of programs inside bubblewrap sandboxes, one per program, connected by pipes
//! this process creates (no shell anywhere).
//!
//! Each program sees only: the shared libraries (`/usr/lib`, `/usr/lib64`, read-only), its own
//! binary at `/usr/bin/NAME` (no other program and no `/bin/sh`, so awk's `system()`, its
//! command pipes and sed's `e` command have nothing to run), the episode directory read-only
//! at `/episode` (its working directory), a private size-limited tmpfs at `/tmp`, and a minimal
//! `/dev`. It runs in new user, mount, network, PID, IPC, UTS and cgroup namespaces (no network
//! at all), under an unprivileged uid of its own when this process is root (so
//! `RLIMIT_NPROC` binds), with rlimits on CPU time, address space, processes and file size, in
//! one process group this process kills on the wall-clock limit or when the output cap is hit.
//!
//! There is no fallback: without a working `bwrap` every run fails with
//! [`SandboxError::Unavailable`].

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Where the episode directory appears inside the sandbox.
pub const EPISODE_MOUNT: &str = "/episode";

/// Resource limits of one pipeline run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxLimits {
    /// RLIMIT_CPU of each program, seconds.
    pub cpu_seconds: u64,
    /// RLIMIT_AS of each program, bytes.
    pub memory_bytes: u64,
    /// RLIMIT_NPROC: processes of the sandbox uid, bwrap's own included (three per program).
    pub processes: u64,
    /// RLIMIT_FSIZE: the largest file a program may write (only its private /tmp is writable).
    pub file_bytes: u64,
    /// Size of each program's private /tmp.
    pub tmp_bytes: u64,
    /// The whole pipeline is killed after this long.
    pub wall: Duration,
    /// Stdout kept; one byte more than this means the output was cut and the pipeline killed.
    pub stdout_bytes: usize,
    /// Stderr kept (the rest is drained and dropped).
    pub stderr_bytes: usize,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            cpu_seconds: 5,
            memory_bytes: 1 << 30,
            processes: 48,
            file_bytes: 16 << 20,
            tmp_bytes: 16 << 20,
            wall: Duration::from_secs(5),
            stdout_bytes: 1 << 20,
            stderr_bytes: 4096,
        }
    }
}

/// Why a pipeline could not be run at all.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// bubblewrap is missing or cannot create namespaces here; nothing runs unsandboxed.
    #[error("the shell sandbox is unavailable: {0}")]
    Unavailable(String),
    #[error("`{0}` is not installed on this machine (looked in /usr/bin and /bin){1}")]
    MissingProgram(String, &'static str),
    #[error("episode directory {path}: {reason}")]
    EpisodeDir { path: PathBuf, reason: String },
    #[error("cannot start the sandbox: {0}")]
    Spawn(#[source] std::io::Error),
}

/// How one program of the pipeline ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// Killed by this process (timeout or output cap).
    Killed,
}

/// What a pipeline run produced.
#[derive(Debug, Clone)]
pub struct RunOutput {
    pub stdout: Vec<u8>,
    /// Stdout went past [`SandboxLimits::stdout_bytes`]; the pipeline was killed there.
    pub stdout_cut: bool,
    pub stderr: Vec<u8>,
    pub exits: Vec<Exit>,
    pub timed_out: bool,
    pub elapsed: Duration,
}

/// A sandbox bound to one episode directory.
#[derive(Debug, Clone)]
pub struct Sandbox {
    bwrap: PathBuf,
    episode_dir: PathBuf,
    limits: SandboxLimits,
    has_lib64: bool,
}

/// Path of bwrap and whether a probe run succeeded, checked once per process.
static PROBE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
static PROGRAMS: OnceLock<BTreeMap<String, Option<PathBuf>>> = OnceLock::new();
static RUN_COUNTER: AtomicU32 = AtomicU32::new(0);

/// The host binary that runs as `name` (awk is GNU awk: the tool relies on its `--sandbox`).
pub fn resolve_program(name: &str) -> Option<PathBuf> {
    let table = PROGRAMS.get_or_init(|| {
        crate::shell::ALLOWED_PROGRAMS
            .iter()
            .map(|&p| {
                let host = if p == "awk" { "gawk" } else { p };
                let found = ["/usr/bin", "/bin"]
                    .iter()
                    .map(|d| Path::new(d).join(host))
                    .find(|path| path.is_file())
                    .and_then(|path| path.canonicalize().ok());
                (p.to_string(), found)
            })
            .collect()
    });
    table.get(name).cloned().flatten()
}

impl Sandbox {
    /// A sandbox over `episode_dir` (made world-readable here, since the sandbox runs as an
    /// unprivileged uid). Fails when bubblewrap is missing or cannot create namespaces.
    pub fn new(episode_dir: &Path, limits: SandboxLimits) -> Result<Sandbox, SandboxError> {
        let bwrap = probe()?;
        let episode_dir = episode_dir
            .canonicalize()
            .map_err(|e| SandboxError::EpisodeDir {
                path: episode_dir.to_path_buf(),
                reason: e.to_string(),
            })?;
        open_up(&episode_dir)?;
        Ok(Sandbox {
            bwrap,
            episode_dir,
            limits,
            has_lib64: Path::new("/usr/lib64").is_dir(),
        })
    }

    pub fn limits(&self) -> &SandboxLimits {
        &self.limits
    }

    /// Changes the stdout cap (each role sees a different amount of output).
    pub fn set_stdout_bytes(&mut self, bytes: usize) {
        self.limits.stdout_bytes = bytes;
    }

    pub fn episode_dir(&self) -> &Path {
        &self.episode_dir
    }

    /// Runs `stages` (each `[program, args…]`, program an allowlisted name) connected by pipes.
    /// Applies no argument rules of its own: that is the parser's job; this layer contains
    /// whatever the programs do.
    pub fn run(&self, stages: &[Vec<String>]) -> Result<RunOutput, SandboxError> {
        let started = Instant::now();
        let uid = sandbox_uid();
        let mut children: Vec<Child> = Vec::with_capacity(stages.len());
        let (stderr_read, stderr_write) = pipe().map_err(SandboxError::Spawn)?;
        let mut previous_stdout: Option<std::process::ChildStdout> = None;
        let mut pgid: Option<i32> = None;
        let kill_all = |children: &mut Vec<Child>, pgid: Option<i32>| {
            if let Some(g) = pgid {
                // SAFETY: killpg only sends a signal; the group is ours (created below).
                unsafe { libc::killpg(g, libc::SIGKILL) };
            }
            for c in children.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        };
        for (i, argv) in stages.iter().enumerate() {
            let name = argv.first().map(String::as_str).unwrap_or("");
            let host = match resolve_program(name) {
                Some(p) => p,
                None => {
                    kill_all(&mut children, pgid);
                    let hint = if name == "awk" {
                        "; the awk tool needs GNU awk: apt-get install gawk"
                    } else {
                        ""
                    };
                    return Err(SandboxError::MissingProgram(name.to_string(), hint));
                }
            };
            let mut cmd = Command::new(&self.bwrap);
            cmd.args(self.bwrap_args(name, &host))
                .arg("--")
                .arg(format!("/usr/bin/{name}"))
                .args(&argv[1..]);
            cmd.env_clear();
            cmd.stdin(match previous_stdout.take() {
                Some(out) => Stdio::from(out),
                None => Stdio::null(),
            });
            cmd.stdout(Stdio::piped());
            cmd.stderr(Stdio::from(
                stderr_write.try_clone().map_err(SandboxError::Spawn)?,
            ));
            cmd.process_group(pgid.unwrap_or(0));
            if let Some(uid) = uid {
                cmd.uid(uid).gid(uid);
            }
            let limits = self.limits;
            let nproc = if uid.is_some() {
                Some(limits.processes)
            } else {
                None
            };
            // SAFETY: the closure only calls async-signal-safe setrlimit.
            unsafe {
                cmd.pre_exec(move || {
                    set_limit(libc::RLIMIT_CPU, limits.cpu_seconds)?;
                    set_limit(libc::RLIMIT_AS, limits.memory_bytes)?;
                    set_limit(libc::RLIMIT_FSIZE, limits.file_bytes)?;
                    set_limit(libc::RLIMIT_CORE, 0)?;
                    if let Some(n) = nproc {
                        set_limit(libc::RLIMIT_NPROC, n)?;
                    }
                    Ok(())
                });
            }
            match cmd.spawn() {
                Ok(mut child) => {
                    if pgid.is_none() {
                        pgid = Some(child.id() as i32);
                    }
                    previous_stdout = child.stdout.take();
                    children.push(child);
                }
                Err(err) => {
                    kill_all(&mut children, pgid);
                    return Err(SandboxError::Spawn(err));
                }
            }
            let _ = i;
        }
        drop(stderr_write);
        let stdout = previous_stdout.expect("at least one stage");
        let cut = Arc::new(AtomicBool::new(false));
        let cap = self.limits.stdout_bytes;
        let stdout_reader = {
            let cut = Arc::clone(&cut);
            std::thread::spawn(move || read_capped(stdout, cap, Some((&*cut, pgid))))
        };
        let stderr_cap = self.limits.stderr_bytes;
        let stderr_reader = std::thread::spawn(move || {
            read_capped(std::fs::File::from(stderr_read), stderr_cap, None)
        });

        let deadline = started + self.limits.wall;
        let mut exits: Vec<Option<Exit>> = vec![None; children.len()];
        let mut timed_out = false;
        let mut pause = Duration::from_micros(50);
        loop {
            for (slot, child) in exits.iter_mut().zip(children.iter_mut()) {
                if slot.is_none() {
                    if let Ok(Some(status)) = child.try_wait() {
                        *slot = Some(match (status.code(), status.signal()) {
                            (Some(code), _) => Exit::Code(code),
                            (None, Some(sig)) => Exit::Signal(sig),
                            (None, None) => Exit::Killed,
                        });
                    }
                }
            }
            if exits.iter().all(Option::is_some) {
                break;
            }
            if Instant::now() >= deadline {
                timed_out = true;
                kill_all(&mut children, pgid);
                for slot in exits.iter_mut().filter(|s| s.is_none()) {
                    *slot = Some(Exit::Killed);
                }
                break;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
        let stdout = stdout_reader.join().unwrap_or_default();
        let stderr = stderr_reader.join().unwrap_or_default();
        let stdout_cut = cut.load(Ordering::SeqCst);
        let mut exits: Vec<Exit> = exits
            .into_iter()
            .map(|e| e.unwrap_or(Exit::Killed))
            .collect();
        if stdout_cut {
            // Programs killed because the output was cut did not fail on their own.
            for e in exits.iter_mut() {
                if matches!(e, Exit::Signal(libc::SIGKILL) | Exit::Code(137)) {
                    *e = Exit::Killed;
                }
            }
        }
        Ok(RunOutput {
            stdout,
            stdout_cut,
            stderr,
            exits,
            timed_out,
            elapsed: started.elapsed(),
        })
    }

    fn bwrap_args(&self, name: &str, host: &Path) -> Vec<String> {
        let mut a: Vec<String> = Vec::with_capacity(48);
        let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
        push(&[
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--as-pid-1",
        ]);
        push(&["--hostname", "sandbox", "--clearenv"]);
        push(&[
            "--setenv", "PATH", "/usr/bin", "--setenv", "LC_ALL", "C", "--setenv", "HOME", "/tmp",
            "--setenv", "TMPDIR", "/tmp",
        ]);
        push(&[
            "--ro-bind",
            "/usr/lib",
            "/usr/lib",
            "--symlink",
            "usr/lib",
            "/lib",
        ]);
        if self.has_lib64 {
            push(&[
                "--ro-bind",
                "/usr/lib64",
                "/usr/lib64",
                "--symlink",
                "usr/lib64",
                "/lib64",
            ]);
        }
        push(&["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]);
        let inside = format!("/usr/bin/{name}");
        a.extend(["--ro-bind".to_string(), host.display().to_string(), inside]);
        let tmp_size = self.limits.tmp_bytes.to_string();
        let episode = self.episode_dir.display().to_string();
        let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
        push(&["--dev", "/dev", "--size", &tmp_size, "--tmpfs", "/tmp"]);
        push(&[
            "--ro-bind",
            &episode,
            EPISODE_MOUNT,
            "--chdir",
            EPISODE_MOUNT,
        ]);
        a
    }
}

/// Checks once that bwrap exists and can build the sandbox this module uses.
fn probe() -> Result<PathBuf, SandboxError> {
    PROBE
        .get_or_init(|| {
            let bwrap = ["/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap"]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
                .ok_or_else(|| "bubblewrap (bwrap) is not installed; install it with `apt-get install bubblewrap`".to_string())?;
            let dir = tempfile::Builder::new()
                .prefix("pathfinder-sandbox-probe")
                .tempdir()
                .map_err(|e| format!("cannot create a probe directory: {e}"))?;
            open_up(dir.path()).map_err(|e| e.to_string())?;
            let sandbox = Sandbox {
                bwrap: bwrap.clone(),
                episode_dir: dir.path().to_path_buf(),
                limits: SandboxLimits::default(),
                has_lib64: Path::new("/usr/lib64").is_dir(),
            };
            let out = sandbox
                .run(&[vec!["cat".to_string(), "/dev/null".to_string()]])
                .map_err(|e| format!("cannot start {}: {e}", bwrap.display()))?;
            if out.exits != [Exit::Code(0)] {
                return Err(format!(
                    "{} cannot create its namespaces here ({:?}): {}; the shell tool never runs unsandboxed",
                    bwrap.display(),
                    out.exits,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(bwrap)
        })
        .clone()
        .map_err(SandboxError::Unavailable)
}

/// A fresh unprivileged uid per run when this process is root (so RLIMIT_NPROC counts only
/// this pipeline's processes); `None` when already unprivileged.
fn sandbox_uid() -> Option<u32> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let n = RUN_COUNTER.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    Some(200_000 + (pid.wrapping_mul(7919).wrapping_add(n) % 400_000))
}

/// The sandbox uid must be able to read the episode files: directory 0755, files 0644.
fn open_up(dir: &Path) -> Result<(), SandboxError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |e: std::io::Error| SandboxError::EpisodeDir {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(err)?;
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let entry = entry.map_err(err)?;
        let meta = entry.path().symlink_metadata().map_err(err)?;
        if meta.is_file() {
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o644))
                .map_err(err)?;
        }
    }
    Ok(())
}

fn set_limit(resource: libc::__rlimit_resource_t, value: u64) -> std::io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: plain syscall with a valid pointer.
    if unsafe { libc::setrlimit(resource, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn pipe() -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills two fds on success; we own them from here.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

/// Reads up to `cap + 1` bytes; keeps `cap`. When `on_cut` is given, passing the cap marks the
/// output cut and kills the process group (the pipeline would otherwise block on a full pipe).
/// Without it, the rest is drained and dropped.
fn read_capped(
    mut source: impl Read,
    cap: usize,
    on_cut: Option<(&AtomicBool, Option<i32>)>,
) -> Vec<u8> {
    let mut kept = Vec::with_capacity(cap.min(64 * 1024));
    let mut buf = [0u8; 64 * 1024];
    loop {
        match source.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                if n > room {
                    if let Some((cut, pgid)) = on_cut {
                        cut.store(true, Ordering::SeqCst);
                        if let Some(g) = pgid {
                            // SAFETY: signal to our own process group.
                            unsafe { libc::killpg(g, libc::SIGKILL) };
                        }
                        break;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    kept
}
