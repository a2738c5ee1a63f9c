//! The containment monitor: a Python audit hook (`sitecustomize`) that records every attempt
//! an episode's Python processes make to reach the network other than the LLM socket or to
//! write outside the episode's directory and `/tmp`, and the parser of what it recorded. The sandbox is what blocks; this is what lets a run report it.

use std::path::Path;

/// The hook's source, baked into the base image and written beside local episodes.
pub const SITECUSTOMIZE: &str = include_str!("sitecustomize.py");

/// The most recorded attempts reported per episode.
pub const MAX_REPORTED: usize = 20;

/// Reads an episode's audit log: one line per attempt, deduplicated, at most [`MAX_REPORTED`].
/// A missing log means nothing was recorded; malformed lines (an agent may write there too)
/// are reported as such rather than trusted.
pub fn read_log(path: &Path) -> Vec<String> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut out: Vec<String> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let entry = match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v) => match (
                v.get("kind").and_then(|k| k.as_str()),
                v.get("detail").and_then(|d| d.as_str()),
            ) {
                (Some(kind), Some(detail)) => format!("{kind}: {detail}"),
                _ => format!("line {}: unrecognised audit record", i + 1),
            },
            Err(_) => format!("line {}: unreadable audit record", i + 1),
        };
        if !out.contains(&entry) {
            out.push(entry);
        }
        if out.len() >= MAX_REPORTED {
            break;
        }
    }
    out
}

/// What an episode's audit log says, by kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Records {
    /// Attempts to reach anything but the LLM socket (`network: …`), and lines that could not
    /// be read as records (an agent may write there too; reported, not trusted).
    pub network: Vec<String>,
    /// Writes outside the episode's directory and `/tmp`, without the `filesystem: ` prefix.
    pub filesystem: Vec<String>,
    /// A process ended on a `MemoryError`.
    pub out_of_memory: bool,
}

/// [`read_log`] sorted by kind.
pub fn read_records(path: &Path) -> Records {
    let mut records = Records::default();
    for record in read_log(path) {
        if let Some(what) = record.strip_prefix("filesystem: ") {
            records.filesystem.push(what.to_owned());
        } else if record.starts_with("memory: ") {
            records.out_of_memory = true;
        } else {
            records.network.push(record);
        }
    }
    records
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_records_outside_connections_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("sitecustomize.py"), SITECUSTOMIZE).unwrap();
        let log = dir.path().join("audit.jsonl");
        let allowed = dir.path().join("llm.sock");
        let script = format!(
            "import socket\n\
             l = socket.socket(socket.AF_UNIX); l.bind({allowed:?}); l.listen(1)\n\
             s = socket.socket(socket.AF_UNIX); s.connect({allowed:?})\n\
             t = socket.socket(); t.settimeout(0.2)\n\
             try:\n    t.connect(('192.0.2.1', 9))\nexcept OSError:\n    pass\n",
            allowed = allowed.to_str().unwrap()
        );
        let status = std::process::Command::new("python3")
            .arg("-c")
            .arg(&script)
            .env("PYTHONPATH", dir.path())
            .env("PATHFINDER_AUDIT_LOG", &log)
            .env("PATHFINDER_AUDIT_ALLOW_UNIX", &allowed)
            .status()
            .unwrap();
        assert!(status.success());
        let got = read_log(&log);
        assert_eq!(
            got,
            ["network: socket.connect to ('192.0.2.1', 9)"],
            "{got:?}"
        );
    }

    #[test]
    fn malformed_lines_are_flagged() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("a.jsonl");
        std::fs::write(&log, "{\"kind\":\"network\",\"detail\":\"x\"}\n{\"kind\":\"network\",\"detail\":\"x\"}\ngarbage\n").unwrap();
        assert_eq!(
            read_log(&log),
            ["network: x", "line 3: unreadable audit record"]
        );
        assert!(read_log(&dir.path().join("missing")).is_empty());
    }

    #[test]
    fn hook_records_writes_outside_the_episode_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("sitecustomize.py"), SITECUSTOMIZE).unwrap();
        let episode = dir.path().join("episode");
        std::fs::create_dir_all(episode.join("work")).unwrap();
        let log = episode.join("audit.jsonl");
        let outside = dir.path().join("outside.txt");
        let repo = episode.join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        let script = format!(
            "import os\n\
             open({inside:?}, 'w').write('ok')\n\
             open({outside:?}, 'a').write('x')\n\
             open({outside:?}).read()\n\
             os.remove({outside:?})\n\
             os.open(os.devnull, os.O_WRONLY)\n\
             open({planted:?}, 'w').write('x')\n\
             os.symlink({readable:?}, {link_inside:?})\n\
             os.symlink({inside:?}, {link_outside:?})\n",
            inside = episode.join("work/answer.txt").to_str().unwrap(),
            readable = repo.join("planted.py").to_str().unwrap(),
            link_inside = episode.join("work/link").to_str().unwrap(),
            link_outside = dir.path().join("link").to_str().unwrap(),
            outside = outside.to_str().unwrap(),
            planted = repo.join("planted.py").to_str().unwrap(),
        );
        let status = std::process::Command::new("python3")
            .arg("-c")
            .arg(&script)
            .env("PYTHONPATH", dir.path())
            .env("PATHFINDER_AUDIT_LOG", &log)
            .env("PATHFINDER_AUDIT_WRITABLE", &episode)
            .env("PATHFINDER_AUDIT_READ_ONLY", &repo)
            .status()
            .unwrap();
        assert!(status.success());
        let o = outside.to_str().unwrap();
        assert_eq!(
            read_log(&log),
            [
                format!("filesystem: write to {o}"),
                format!("filesystem: remove of {o}"),
                format!("filesystem: write to {}", repo.join("planted.py").display()),
                // A link names what it points at; only where the link is made is written.
                format!(
                    "filesystem: symlink of {}",
                    dir.path().join("link").display()
                ),
            ]
        );
        let records = read_records(&log);
        assert_eq!(records.filesystem[0], format!("write to {o}"));
        assert_eq!(records.filesystem.len(), 4);
        assert!(records.network.is_empty() && !records.out_of_memory);
    }
}
