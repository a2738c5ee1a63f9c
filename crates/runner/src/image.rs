//! The agent base image: built offline with debootstrap from the archive this machine's apt
//! uses, imported into the local engine through bollard, cached under a tag that is the hash
//! of its inputs (see [`ImageRecipe::input_hash`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use bollard::query_parameters::CreateImageOptions;
use bollard::Docker;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::AsyncReadExt;

use crate::apt::{self, AptError};
use crate::recipe::ImageRecipe;

/// Directories the runner mounts into; created in the image because its root is read-only.
pub const MOUNT_POINTS: &[&str] = &[
    "agent",
    "corpus",
    "episode",
    "run/pathfinder",
    "opt/pathfinder/audit",
];

/// Where the audit hook lives in the image (first on the agents' `PYTHONPATH`).
pub const AUDIT_DIR: &str = "/opt/pathfinder/audit";

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    Apt(#[from] AptError),
    #[error("building the base image needs debootstrap (apt-get install debootstrap): {0}")]
    NoDebootstrap(String),
    #[error("building the base image needs root (debootstrap creates device nodes and chowns files); run `pathfinder run` once as root, or build the image elsewhere and `docker load` it as {image}")]
    NotRoot { image: String },
    #[error(
        "debootstrap {suite} from {uri} failed ({status}); last output:\n{tail}\n(full log: {log})"
    )]
    Debootstrap {
        suite: String,
        uri: String,
        status: String,
        tail: String,
        log: PathBuf,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("packing the root filesystem with tar failed: {0}")]
    Tar(String),
    #[error("the engine refused to import {image}: {source}")]
    Import {
        image: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("the engine: {0}")]
    Engine(#[from] bollard::errors::Error),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_owned(),
        source,
    }
}

/// How [`ensure_image`] obtained the image.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageSource {
    Cached,
    Built { mirror: String, seconds: f64 },
}

/// Returns `name:hash` for `recipe`, building and importing the image first if the engine does
/// not have it. Builds are serialised across processes with a lock file, so concurrent
/// callers build once.
pub async fn ensure_image(
    docker: &Docker,
    recipe: &ImageRecipe,
    apt_root: &Path,
    on_status: &(dyn Fn(&str) + Sync),
) -> Result<(String, ImageSource), ImageError> {
    let image = recipe.image_ref();
    if docker.inspect_image(&image).await.is_ok() {
        return Ok((image, ImageSource::Cached));
    }
    let lock_path =
        std::env::temp_dir().join(format!("pathfinder-image-{}.lock", recipe.input_hash()));
    let _lock = FileLock::acquire(&lock_path)
        .await
        .map_err(io_err(&lock_path))?;
    // Someone else may have built it while we waited for the lock.
    if docker.inspect_image(&image).await.is_ok() {
        return Ok((image, ImageSource::Cached));
    }
    let started = Instant::now();
    let mirror = apt::mirror_for(apt_root, &recipe.suite)?;
    on_status(&format!(
        "building image {image}: debootstrap {} {} from {} (configured in {}); takes about a minute, once",
        recipe.variant, recipe.suite, mirror.uri, mirror.origin
    ));
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(ImageError::NotRoot { image });
    }
    let debootstrap = which("debootstrap").ok_or_else(|| {
        ImageError::NoDebootstrap("no `debootstrap` on PATH or in /usr/sbin".into())
    })?;
    let work = tempfile::Builder::new()
        .prefix("pf-rootfs-")
        .tempdir()
        .map_err(io_err(&std::env::temp_dir()))?;
    let rootfs = work.path().join("rootfs");
    let log = work.path().join("debootstrap.log");
    bootstrap(&debootstrap, recipe, &mirror.uri, &rootfs, &log).await?;
    finish_rootfs(&rootfs)?;
    on_status(&format!("importing {image} into the engine"));
    import(docker, recipe, &rootfs).await?;
    docker.inspect_image(&image).await?;
    Ok((
        image,
        ImageSource::Built {
            mirror: mirror.uri,
            seconds: started.elapsed().as_secs_f64(),
        },
    ))
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

async fn bootstrap(
    debootstrap: &Path,
    recipe: &ImageRecipe,
    uri: &str,
    rootfs: &Path,
    log: &Path,
) -> Result<(), ImageError> {
    let log_file = std::fs::File::create(log).map_err(io_err(log))?;
    let log_err = log_file.try_clone().map_err(io_err(log))?;
    let mut cmd = tokio::process::Command::new(debootstrap);
    cmd.arg(format!("--variant={}", recipe.variant))
        .arg(format!("--components={}", recipe.components.join(",")))
        .arg(format!("--include={}", recipe.packages.join(",")))
        .arg(&recipe.suite)
        .arg(rootfs)
        .arg(uri)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err)
        .kill_on_drop(true);
    let status = cmd
        .status()
        .await
        .map_err(|e| ImageError::NoDebootstrap(format!("{}: {e}", debootstrap.display())))?;
    if status.success() {
        return Ok(());
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(15)..].join("\n");
    // Keep the log: the temporary directory goes away with the error.
    let kept = std::env::temp_dir().join(format!(
        "pathfinder-debootstrap-{}.log",
        recipe.input_hash()
    ));
    let _ = std::fs::copy(log, &kept);
    Err(ImageError::Debootstrap {
        suite: recipe.suite.clone(),
        uri: uri.to_owned(),
        status: status.to_string(),
        tail,
        log: kept,
    })
}

/// Mount points, the audit hook, and no package caches.
pub fn finish_rootfs(rootfs: &Path) -> Result<(), ImageError> {
    for dir in MOUNT_POINTS {
        let p = rootfs.join(dir);
        std::fs::create_dir_all(&p).map_err(io_err(&p))?;
    }
    let hook = rootfs
        .join(AUDIT_DIR.trim_start_matches('/'))
        .join("sitecustomize.py");
    std::fs::write(&hook, crate::audit::SITECUSTOMIZE).map_err(io_err(&hook))?;
    for cache in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        let dir = rootfs.join(cache);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.filter_map(Result::ok) {
                let p = entry.path();
                if p.is_file() {
                    std::fs::remove_file(&p).map_err(io_err(&p))?;
                }
            }
        }
    }
    Ok(())
}

/// Streams `tar -c` of the root filesystem into the engine's image import (`docker import`).
async fn import(docker: &Docker, recipe: &ImageRecipe, rootfs: &Path) -> Result<(), ImageError> {
    let mut tar = tokio::process::Command::new("tar")
        .arg("--numeric-owner")
        .arg("--exclude=./dev/*")
        .arg("-C")
        .arg(rootfs)
        .args(["-cf", "-", "."])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ImageError::Tar(format!("cannot start tar: {e}")))?;
    let stdout = tar.stdout.take().expect("piped stdout");
    let body = futures_util::stream::unfold(stdout, |mut out| async move {
        let mut buf = vec![0u8; 1 << 20];
        match out.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), out))
            }
            Err(e) => Some((Err(e), out)),
        }
    });
    let image = recipe.image_ref();
    let options = CreateImageOptions {
        from_src: Some("-".into()),
        repo: Some(recipe.name.clone()),
        tag: Some(recipe.input_hash()),
        message: Some(format!(
            "pathfinder base image from {}",
            recipe.path.display()
        )),
        changes: vec![
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            "ENV LANG=C.UTF-8".into(),
            format!("LABEL pathfinder.recipe-hash={}", recipe.input_hash()),
            "WORKDIR /".into(),
        ],
        ..Default::default()
    };
    let mut progress =
        docker.create_image(Some(options), Some(bollard::body_try_stream(body)), None);
    let mut failure = None;
    while let Some(item) = progress.next().await {
        if let Err(e) = item {
            failure = Some(e);
            break;
        }
    }
    let output = tar
        .wait_with_output()
        .await
        .map_err(|e| ImageError::Tar(e.to_string()))?;
    if let Some(source) = failure {
        return Err(ImageError::Import { image, source });
    }
    if !output.status.success() {
        return Err(ImageError::Tar(format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

/// An exclusive `flock` on a file, released on drop.
struct FileLock {
    file: std::fs::File,
}

impl FileLock {
    async fn acquire(path: &Path) -> std::io::Result<FileLock> {
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || {
            use std::os::fd::AsRawFd;
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)?;
            // SAFETY: flock on a descriptor we own; blocks until the lock is ours.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(FileLock { file })
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: unlocking a descriptor we own.
        unsafe {
            libc::flock(self.file.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rootfs_gets_mount_points_and_the_hook() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("var/cache/apt/archives")).unwrap();
        std::fs::write(root.join("var/cache/apt/archives/x.deb"), b"x").unwrap();
        finish_rootfs(root).unwrap();
        for d in MOUNT_POINTS {
            assert!(root.join(d).is_dir(), "{d}");
        }
        assert!(!root.join("var/cache/apt/archives/x.deb").exists());
        let hook =
            std::fs::read_to_string(root.join("opt/pathfinder/audit/sitecustomize.py")).unwrap();
        assert_eq!(hook, crate::audit::SITECUSTOMIZE);
    }
}
