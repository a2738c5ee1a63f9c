//! Agents built on a third-party framework: its wheels pinned in a lock file, fetched with
//! `pip download`, checked against their SHA-256, and unpacked on the host.
//!
//! An agent such as `agents/ag2` holds only its manifest, its task harness and a lock file.
//! [`vendor`] makes the rest:
//! - the framework's own packages (the lock's `vendor` entries, e.g. `autogen`) are unpacked
//!   into the agent directory, so they become part of the agent's git repository and the
//!   Injector edits them like any other code;
//! - every other wheel (the framework's dependencies) is installed into `AGENT/.site`, which the
//!   runner mounts read-only into each sandbox and puts on `PYTHONPATH`. It is never part of
//!   the repository.
//!
//! Nothing is fetched at run time: the sandbox has no network, and a missing or stale
//! `.site` is a manifest problem that names the command to run.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Installed dependencies of a vendored agent, relative to its directory.
pub const SITE_DIR: &str = ".site";
/// Downloaded wheels, relative to the agent directory (a cache; never in the repository).
pub const WHEEL_DIR: &str = ".wheels";
/// Inside [`SITE_DIR`]: the SHA-256 of the lock file the site was built from.
const STAMP: &str = "pathfinder-lock.sha256";

#[derive(Debug, thiserror::Error)]
pub enum VendorError {
    #[error("{path}: cannot read the lock file")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Lock { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("`{command}` failed ({status}): {stderr}")]
    Pip {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("{wheel}: SHA-256 is {actual}, the lock says {expected}; the download is not the pinned wheel")]
    Hash {
        wheel: String,
        expected: String,
        actual: String,
    },
}

/// `agent.toml`'s `[python]` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonDeps {
    /// The lock file, relative to the agent directory.
    pub lock: String,
}

/// A parsed lock file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    /// The interpreter the wheels are for, e.g. `3.11` (the image's and the host's).
    pub python: String,
    /// Platform tags `pip download --platform` accepts, e.g. `manylinux2014_x86_64`.
    pub platforms: Vec<String>,
    #[serde(rename = "wheel")]
    pub wheels: Vec<LockedWheel>,
    #[serde(skip)]
    pub path: PathBuf,
    /// SHA-256 of the lock file's text: what a built `.site` records.
    #[serde(skip)]
    pub digest: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedWheel {
    /// The wheel's file name, e.g. `ag2-0.14.0-py3-none-any.whl`.
    pub file: String,
    pub sha256: String,
    /// Top-level packages of this wheel that become part of the agent's repository.
    #[serde(default)]
    pub vendor: Vec<String>,
}

impl LockedWheel {
    /// (distribution, version) from the file name (`NAME-VERSION-…​.whl`).
    pub fn requirement(&self) -> Option<(String, String)> {
        let stem = self.file.strip_suffix(".whl")?;
        let mut parts = stem.split('-');
        let name = parts.next()?;
        let version = parts.next()?;
        (!name.is_empty() && !version.is_empty() && parts.count() >= 3)
            .then(|| (name.to_owned(), version.to_owned()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut file = std::fs::File::open(path)?;
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex(&hasher.finalize()))
}

impl Lock {
    pub fn load(path: &Path) -> Result<Lock, VendorError> {
        let text = std::fs::read_to_string(path).map_err(|source| VendorError::Read {
            path: path.to_owned(),
            source,
        })?;
        let lock_err = |reason: String| VendorError::Lock {
            path: path.to_owned(),
            reason,
        };
        let mut lock: Lock = toml::from_str(&text).map_err(|e| lock_err(e.to_string()))?;
        lock.path = path.to_owned();
        lock.digest = hex(&Sha256::digest(text.as_bytes()));
        if lock.wheels.is_empty() {
            return Err(lock_err("field `wheel`: no wheels".into()));
        }
        if lock.platforms.is_empty() {
            return Err(lock_err("field `platforms`: empty".into()));
        }
        for (i, wheel) in lock.wheels.iter().enumerate() {
            if wheel.requirement().is_none() {
                return Err(lock_err(format!(
                    "field `wheel[{i}].file`: {:?} is not a wheel file name (NAME-VERSION-TAGS.whl)",
                    wheel.file
                )));
            }
            let hex_ok = wheel.sha256.len() == 64
                && wheel
                    .sha256
                    .chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
            if !hex_ok {
                return Err(lock_err(format!(
                    "field `wheel[{i}].sha256`: {:?} is not 64 lowercase hex digits",
                    wheel.sha256
                )));
            }
            for package in &wheel.vendor {
                if package.is_empty()
                    || !package
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    return Err(lock_err(format!(
                        "field `wheel[{i}].vendor`: {package:?} is not a top-level package name"
                    )));
                }
            }
        }
        Ok(lock)
    }

    /// The packages that become part of the agent's repository.
    pub fn vendored(&self) -> impl Iterator<Item = &str> {
        self.wheels
            .iter()
            .flat_map(|w| w.vendor.iter().map(String::as_str))
    }

    /// What is missing for `agent_dir` to run, each naming what to do; empty when ready.
    pub fn problems(&self, agent_dir: &Path, agent: &str) -> Vec<String> {
        let fix = format!("run `pathfinder agents vendor --agent {agent}`");
        let mut problems = Vec::new();
        for package in self.vendored() {
            if !agent_dir.join(package).join("__init__.py").is_file() {
                problems.push(format!(
                    "{package}/ (from {}) is not vendored: {fix}",
                    self.path.display()
                ));
            }
        }
        let stamp = agent_dir.join(SITE_DIR).join(STAMP);
        match std::fs::read_to_string(&stamp) {
            Ok(digest) if digest.trim() == self.digest => {}
            Ok(_) => problems.push(format!(
                "{SITE_DIR}/ was built from another lock file than {}: {fix}",
                self.path.display()
            )),
            Err(_) => problems.push(format!(
                "{SITE_DIR}/ (the framework's dependencies) is missing: {fix}"
            )),
        }
        problems
    }
}

/// The lock file named by `agent_dir/agent.toml`'s `[python]` section, read without
/// validating the rest of the manifest (whose sites may live in code not yet vendored).
/// `None` for an agent with no third-party framework.
pub fn lock_of(agent_dir: &Path) -> Result<Option<Lock>, VendorError> {
    #[derive(Deserialize)]
    struct Partial {
        python: Option<PythonDeps>,
    }
    let path = agent_dir.join("agent.toml");
    let text = std::fs::read_to_string(&path).map_err(|source| VendorError::Read {
        path: path.clone(),
        source,
    })?;
    let partial: Partial = toml::from_str(&text).map_err(|e| VendorError::Lock {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    partial
        .python
        .map(|p| Lock::load(&agent_dir.join(p.lock)))
        .transpose()
}

/// What [`vendor`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vendored {
    pub downloaded: usize,
    pub wheels: usize,
    pub packages: Vec<String>,
    pub site: PathBuf,
}

fn run_pip(python: &str, args: &[String]) -> Result<(), VendorError> {
    let output = Command::new(python)
        .args(["-m", "pip"])
        .args(args)
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .output()
        .map_err(|e| VendorError::Pip {
            command: format!("{python} -m pip {}", args.join(" ")),
            status: "did not start".into(),
            stderr: e.to_string(),
        })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(6).collect();
    Err(VendorError::Pip {
        command: format!("{python} -m pip {}", args.join(" ")),
        status: output.status.to_string(),
        stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
    })
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> VendorError + '_ {
    move |e| VendorError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// Fetches (where missing) and checks every wheel of `lock`, unpacks the vendored packages into
/// `agent_dir` and installs the rest into `agent_dir/.site`. Idempotent; a failure leaves the
/// previous `.site` and vendored packages as they were.
pub fn vendor(agent_dir: &Path, lock: &Lock, python: &str) -> Result<Vendored, VendorError> {
    let wheel_dir = agent_dir.join(WHEEL_DIR);
    std::fs::create_dir_all(&wheel_dir).map_err(io_err(&wheel_dir))?;
    let mut downloaded = 0;
    for wheel in &lock.wheels {
        let path = wheel_dir.join(&wheel.file);
        if path.is_file() && sha256_file(&path).map_err(io_err(&path))? == wheel.sha256 {
            continue;
        }
        let (name, version) = wheel
            .requirement()
            .expect("checked when the lock was loaded");
        let staging = tempfile::tempdir_in(&wheel_dir).map_err(io_err(&wheel_dir))?;
        let mut args: Vec<String> = vec![
            "download".into(),
            "--no-deps".into(),
            "--only-binary=:all:".into(),
            "--python-version".into(),
            lock.python.clone(),
            "--implementation".into(),
            "cp".into(),
        ];
        for platform in &lock.platforms {
            args.extend(["--platform".into(), platform.clone()]);
        }
        args.extend([
            "--dest".into(),
            staging.path().to_string_lossy().into_owned(),
            format!("{name}=={version}"),
        ]);
        run_pip(python, &args)?;
        let fetched = staging.path().join(&wheel.file);
        if !fetched.is_file() {
            return Err(VendorError::Io {
                path: fetched,
                reason: format!(
                    "pip download of {name}=={version} did not produce the locked file"
                ),
            });
        }
        let actual = sha256_file(&fetched).map_err(io_err(&fetched))?;
        if actual != wheel.sha256 {
            return Err(VendorError::Hash {
                wheel: wheel.file.clone(),
                expected: wheel.sha256.clone(),
                actual,
            });
        }
        std::fs::rename(&fetched, &path).map_err(io_err(&path))?;
        downloaded += 1;
    }

    // Install everything into a fresh directory beside the old site, then swap.
    let staging = tempfile::Builder::new()
        .prefix(".site-")
        .tempdir_in(agent_dir)
        .map_err(io_err(agent_dir))?;
    let mut args: Vec<String> = vec![
        "install".into(),
        "--no-index".into(),
        "--no-deps".into(),
        "--no-compile".into(),
        "--target".into(),
        staging.path().to_string_lossy().into_owned(),
    ];
    args.extend(
        lock.wheels
            .iter()
            .map(|w| wheel_dir.join(&w.file).to_string_lossy().into_owned()),
    );
    run_pip(python, &args)?;
    let mut packages = Vec::new();
    for package in lock.vendored() {
        let from = staging.path().join(package);
        if !from.join("__init__.py").is_file() {
            return Err(VendorError::Io {
                path: from,
                reason: format!("no package {package} in the locked wheels"),
            });
        }
        remove_caches(&from).map_err(io_err(&from))?;
        let to = agent_dir.join(package);
        if to.exists() {
            std::fs::remove_dir_all(&to).map_err(io_err(&to))?;
        }
        std::fs::rename(&from, &to).map_err(io_err(&to))?;
        packages.push(package.to_owned());
    }
    let bin = staging.path().join("bin");
    if bin.is_dir() {
        // Console scripts of the dependencies; the agents never run them.
        std::fs::remove_dir_all(&bin).map_err(io_err(&bin))?;
    }
    let stamp = staging.path().join(STAMP);
    std::fs::write(&stamp, format!("{}\n", lock.digest)).map_err(io_err(&stamp))?;
    let site = agent_dir.join(SITE_DIR);
    if site.exists() {
        std::fs::remove_dir_all(&site).map_err(io_err(&site))?;
    }
    let staged = staging.keep();
    std::fs::rename(&staged, &site).map_err(io_err(&site))?;
    Ok(Vendored {
        downloaded,
        wheels: lock.wheels.len(),
        packages,
        site,
    })
}

/// Removes `__pycache__` directories under `dir` (bytecode never enters the repository).
fn remove_caches(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            if entry.file_name() == "__pycache__" {
                std::fs::remove_dir_all(entry.path())?;
            } else {
                remove_caches(&entry.path())?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCK: &str = r#"
python = "3.11"
platforms = ["manylinux2014_x86_64"]
[[wheel]]
file = "ag2-0.14.0-py3-none-any.whl"
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
vendor = ["autogen"]
"#;

    #[test]
    fn a_lock_names_its_wheels_and_what_is_vendored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        std::fs::write(&path, LOCK).unwrap();
        let lock = Lock::load(&path).unwrap();
        assert_eq!(lock.vendored().collect::<Vec<_>>(), ["autogen"]);
        assert_eq!(
            lock.wheels[0].requirement(),
            Some(("ag2".into(), "0.14.0".into()))
        );
        let problems = lock.problems(dir.path(), "ag2");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("autogen/"), "{problems:?}");
        assert!(problems[1].contains("pathfinder agents vendor --agent ag2"));
    }

    #[test]
    fn a_bad_lock_names_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        std::fs::write(&path, LOCK.replace("0000000000", "XYZ")).unwrap();
        let err = Lock::load(&path).unwrap_err().to_string();
        assert!(err.contains("wheel[0].sha256"), "{err}");
        std::fs::write(
            &path,
            LOCK.replace("ag2-0.14.0-py3-none-any.whl", "ag2.zip"),
        )
        .unwrap();
        let err = Lock::load(&path).unwrap_err().to_string();
        assert!(err.contains("wheel[0].file"), "{err}");
    }

    #[test]
    fn a_site_from_another_lock_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        std::fs::write(&path, LOCK).unwrap();
        let lock = Lock::load(&path).unwrap();
        std::fs::create_dir_all(dir.path().join("autogen")).unwrap();
        std::fs::write(dir.path().join("autogen/__init__.py"), "").unwrap();
        std::fs::create_dir_all(dir.path().join(SITE_DIR)).unwrap();
        std::fs::write(dir.path().join(SITE_DIR).join(STAMP), "abc\n").unwrap();
        let problems = lock.problems(dir.path(), "ag2");
        assert!(problems[0].contains("another lock file"), "{problems:?}");
        std::fs::write(dir.path().join(SITE_DIR).join(STAMP), &lock.digest).unwrap();
        assert!(lock.problems(dir.path(), "ag2").is_empty());
    }
}
