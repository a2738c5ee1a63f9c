//! Joining shards (`corpus generate --shard I/N`, each in its own directory, perhaps on its own
//! machine) into one corpus: the episodes and clean runs of every part are copied into OUT with
//! the whole plan, then the corpus is published from all manifests exactly as a whole run
//! publishes it — so the merged corpus, its splits and its digest are those of the unsharded
//! run of the same plan.
//!
//! Checked before anything is copied: every directory is a shard of the same plan (options,
//! templates, episodes), the parts are 1..N of one N, each exactly once, and every episode of
//! every part has its manifest (an incomplete shard is named, to be resumed). A merge that is
//! interrupted is resumed by running it again: an episode directory or clean run already in
//! OUT is complete (each is copied under a temporary name and renamed), and the store and the
//! exports are rebuilt.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::error::{io, CorpusError};
use crate::injection::{episode_dir_name, manifest_path, read_manifest, Manifest};
use crate::planning::{Plan, Shard};
use crate::publish::{publish, Report};

/// A shard directory read back: its plan (with its part) and its part's positions in the plan.
struct ShardDir {
    dir: PathBuf,
    shard: Shard,
    part: Vec<usize>,
}

fn read_plan(dir: &Path) -> Result<Plan, CorpusError> {
    let path = dir.join("plan.json");
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    serde_json::from_str(&text).map_err(|e| CorpusError::Plan(format!("{}: {e}", path.display())))
}

/// Merges the shard directories `shards` into `out` and publishes the corpus there.
/// `on_episode(done, total)` hears of each episode copied or found already in `out`.
pub fn merge(
    shards: &[PathBuf],
    out: &Path,
    mut on_episode: impl FnMut(usize, usize),
) -> Result<Report, CorpusError> {
    let (whole, parts) = check_shards(shards)?;
    let out = &std::path::absolute(out).map_err(io(out))?;
    std::fs::create_dir_all(out).map_err(io(out))?;
    whole.claim(out, || {
        format!(
            "{} holds another corpus than these shards' plan; merge into a new --out",
            out.display()
        )
    })?;

    let total = whole.episodes.len();
    let mut done = 0;
    for part in &parts {
        let mut clean: BTreeSet<(&str, &str)> = BTreeSet::new();
        for &i in &part.part {
            let ep = &whole.episodes[i];
            clean.insert((&ep.agent, &ep.task));
            if !manifest_path(out, &ep.id).exists() {
                let name = episode_dir_name(&ep.id);
                copy_complete(
                    &part.dir.join("episodes").join(&name),
                    &out.join("episodes").join(&name),
                )?;
            }
            done += 1;
            on_episode(done, total);
        }
        for (agent, task) in clean {
            let runs = Path::new("clean").join(agent).join("runs").join(task);
            if !out.join(&runs).join("outcome.json").exists() {
                copy_complete(&part.dir.join(&runs), &out.join(&runs))?;
            }
            let repo = Path::new("clean").join(agent).join("repo");
            if !out.join(&repo).join(".git").exists() && part.dir.join(&repo).exists() {
                copy_complete(&part.dir.join(&repo), &out.join(&repo))?;
            }
        }
    }

    let manifests: Vec<Manifest> = whole
        .episodes
        .iter()
        .map(|ep| read_manifest(&manifest_path(out, &ep.id)))
        .collect::<Result<_, _>>()?;
    publish(out, &whole, &manifests)
}

/// Reads and checks the shards: one plan, parts 1..N each once, every part complete. Returns
/// the whole plan (the shards' options without the shard) and the parts in index order.
fn check_shards(shards: &[PathBuf]) -> Result<(Plan, Vec<ShardDir>), CorpusError> {
    let mut whole: Option<(PathBuf, Plan)> = None;
    let mut parts: Vec<ShardDir> = Vec::new();
    for dir in shards {
        let plan = read_plan(dir)?;
        let Some(shard) = plan.options.shard else {
            return Err(CorpusError::Plan(format!(
                "{} is no shard (its plan.json names no --shard); only the parts of a sharded generation merge",
                dir.display()
            )));
        };
        let mut this = plan.clone();
        this.options.shard = None;
        match &whole {
            None => whole = Some((dir.clone(), this)),
            Some((first, w)) => {
                if serde_json::to_value(w).expect("serialises")
                    != serde_json::to_value(&this).expect("serialises")
                {
                    return Err(CorpusError::Plan(format!(
                        "{} and {} are shards of different plans (options, templates or episodes differ)",
                        first.display(),
                        dir.display()
                    )));
                }
            }
        }
        if let Some(p) = parts.iter().find(|p| p.shard.count != shard.count) {
            return Err(CorpusError::Plan(format!(
                "{} is shard {shard} but {} is shard {}: every part must come from one --shard I/N split",
                dir.display(),
                p.dir.display(),
                p.shard
            )));
        }
        if let Some(p) = parts.iter().find(|p| p.shard.index == shard.index) {
            return Err(CorpusError::Plan(format!(
                "{} and {} are both shard {shard}",
                p.dir.display(),
                dir.display()
            )));
        }
        let part = shard.select(&plan.episodes);
        let missing = part
            .iter()
            .filter(|&&i| !manifest_path(dir, &plan.episodes[i].id).exists())
            .count();
        if missing > 0 {
            return Err(CorpusError::Plan(format!(
                "{} (shard {shard}) is incomplete: {missing} of its {} episodes have no manifest; run its `corpus generate … --shard {shard}` again to finish it",
                dir.display(),
                part.len()
            )));
        }
        parts.push(ShardDir {
            dir: dir.clone(),
            shard,
            part,
        });
    }
    let Some((_, whole)) = whole else {
        return Err(CorpusError::Plan("no shard directories to merge".into()));
    };
    let count = parts[0].shard.count;
    let missing: Vec<String> = (1..=count)
        .filter(|i| !parts.iter().any(|p| p.shard.index == *i))
        .map(|i| format!("{i}/{count}"))
        .collect();
    if !missing.is_empty() {
        return Err(CorpusError::Plan(format!(
            "shards {} are missing: a merge needs every part",
            missing.join(", ")
        )));
    }
    parts.sort_by_key(|p| p.shard.index);
    Ok((whole, parts))
}

/// Copies the directory `src` to `dst` under a temporary name, then renames it: `dst` exists
/// only complete. Files are hard-linked where the filesystem allows (shards and the merged
/// corpus on one disk), copied otherwise; symbolic links are recreated.
fn copy_complete(src: &Path, dst: &Path) -> Result<(), CorpusError> {
    if !src.is_dir() {
        return Err(CorpusError::Plan(format!(
            "{} is missing from its shard",
            src.display()
        )));
    }
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let staging = dst.with_file_name(format!(".{name}.partial"));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io(&staging))?;
    }
    if dst.exists() {
        std::fs::remove_dir_all(dst).map_err(io(dst))?;
    }
    copy_tree(src, &staging)?;
    std::fs::rename(&staging, dst).map_err(io(dst))
}

fn copy_tree(src: &Path, dst: &Path) -> Result<(), CorpusError> {
    std::fs::create_dir_all(dst).map_err(io(dst))?;
    for entry in std::fs::read_dir(src).map_err(io(src))? {
        let entry = entry.map_err(io(src))?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let kind = entry.file_type().map_err(io(&from))?;
        if kind.is_dir() {
            copy_tree(&from, &to)?;
        } else if kind.is_symlink() {
            let target = std::fs::read_link(&from).map_err(io(&from))?;
            std::os::unix::fs::symlink(&target, &to).map_err(io(&to))?;
        } else if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).map_err(io(&to))?;
        }
    }
    Ok(())
}
