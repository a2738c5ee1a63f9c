//! Spawning a child with a wall-clock limit.
//!
//! The child runs in its own process group so that a timeout kills everything it started
//! (an agent's test runs, a shell), not just the direct child.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum ProcessEnd {
    Exited(i32),
    Signalled(i32),
    TimedOut,
}

impl ProcessEnd {
    pub fn describe(self) -> String {
        match self {
            ProcessEnd::Exited(code) => format!("exited with status {code}"),
            ProcessEnd::Signalled(sig) => format!("was killed by signal {sig}"),
            ProcessEnd::TimedOut => "ran past its time limit and was killed".into(),
        }
    }
}

/// A finished process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub end: ProcessEnd,
    pub duration: Duration,
}

/// Runs `cmd` with stdin closed and stdout/stderr appended to the given files (which may be
/// the same), killing its whole process group after `timeout`.
pub fn run_with_timeout(
    mut cmd: Command,
    timeout: Duration,
    stdout: &Path,
    stderr: &Path,
) -> std::io::Result<Finished> {
    let open = |p: &Path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
    };
    let out = open(stdout)?;
    let err = if stderr == stdout {
        out.try_clone()?
    } else {
        open(stderr)?
    };
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let started = Instant::now();
    let mut child = cmd.spawn()?;
    let pid = child.id() as i32;
    let mut sleep = Duration::from_millis(2);
    loop {
        if let Some(status) = child.try_wait()? {
            let end = match (status.code(), status.signal()) {
                (Some(code), _) => ProcessEnd::Exited(code),
                (None, Some(sig)) => ProcessEnd::Signalled(sig),
                (None, None) => ProcessEnd::Exited(-1),
            };
            // Leave nothing of the group behind (background grandchildren).
            kill_group(pid);
            return Ok(Finished {
                end,
                duration: started.elapsed(),
            });
        }
        if started.elapsed() >= timeout {
            // SIGTERM first, so the agent can close its trace (every agent turns SIGTERM into
            // an exception that unwinds through the tracer); whatever is left is killed.
            signal_group(pid, libc::SIGTERM);
            let grace = Instant::now();
            while grace.elapsed() < TERMINATION_GRACE {
                if child.try_wait()?.is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            kill_group(pid);
            let _ = child.wait();
            return Ok(Finished {
                end: ProcessEnd::TimedOut,
                duration: started.elapsed(),
            });
        }
        std::thread::sleep(sleep);
        sleep = (sleep * 2).min(Duration::from_millis(25));
    }
}

/// How long a timed-out agent has between SIGTERM and SIGKILL to write its trace.
const TERMINATION_GRACE: Duration = Duration::from_secs(3);

fn kill_group(pgid: i32) {
    signal_group(pgid, libc::SIGKILL);
}

fn signal_group(pgid: i32, signal: libc::c_int) {
    // SAFETY: kill(2) with a negative pid signals the process group we created for the child;
    // it has no memory-safety preconditions.
    unsafe {
        libc::kill(-pgid, signal);
    }
}

/// The last `max_chars` characters of a text file (lossy), for error messages.
pub fn tail(path: &Path, max_chars: usize) -> String {
    let text = std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let chars: Vec<char> = text.trim_end().chars().collect();
    let start = chars.len().saturating_sub(max_chars);
    let mut out: String = chars[start..].iter().collect();
    if start > 0 {
        out.insert(0, '…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_and_timeouts() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let mut ok = Command::new("sh");
        ok.args(["-c", "echo hello; exit 3"]);
        let f = run_with_timeout(ok, Duration::from_secs(10), &log, &log).unwrap();
        assert_eq!(f.end, ProcessEnd::Exited(3));
        assert_eq!(tail(&log, 100), "hello");

        let mut slow = Command::new("sh");
        slow.args(["-c", "sleep 5 & sleep 5"]);
        let f = run_with_timeout(slow, Duration::from_millis(200), &log, &log).unwrap();
        assert_eq!(f.end, ProcessEnd::TimedOut);
        assert!(f.duration < Duration::from_secs(3));
    }

    #[test]
    fn a_timed_out_child_may_clean_up_and_a_stubborn_one_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let flushed = dir.path().join("flushed");
        let mut polite = Command::new("sh");
        polite.args([
            "-c",
            &format!(
                "trap 'echo done > {}; exit 0' TERM; while :; do sleep 0.05; done",
                flushed.display()
            ),
        ]);
        let f = run_with_timeout(polite, Duration::from_millis(200), &log, &log).unwrap();
        assert_eq!(f.end, ProcessEnd::TimedOut);
        assert_eq!(std::fs::read_to_string(&flushed).unwrap().trim(), "done");

        let mut stubborn = Command::new("sh");
        stubborn.args(["-c", "trap '' TERM; while :; do sleep 0.05; done"]);
        let f = run_with_timeout(stubborn, Duration::from_millis(200), &log, &log).unwrap();
        assert_eq!(f.end, ProcessEnd::TimedOut);
        assert!(f.duration >= TERMINATION_GRACE);
        assert!(f.duration < TERMINATION_GRACE + Duration::from_secs(2));
    }
}
