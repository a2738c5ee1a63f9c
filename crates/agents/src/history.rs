//! An agent's fix history (`history/series.toml` and its patches) and its materialisation as
//! a git repository.
//!
//! The repository is built with git2 only: the final tree is read from `agents/NAME/` (less
//! `agent.toml` and `history/`), the patches are reverse-applied from last to first to reach
//! the initial tree, which is committed as "Initial import of NAME", and each patch is then
//! applied forward and committed with its own message, author and date. The final HEAD tree is
//! checked to equal the final tree, so a patch series that does not describe the code is an
//! error rather than a repository that silently differs from the agent.

use std::path::{Path, PathBuf};

use git2::{Diff, IndexAddOption, Oid, Repository, RepositoryInitOptions, Signature, Time};
use serde::Deserialize;
use taxonomy::Catalog;

use crate::patch;

/// The signature of the initial-import commit.
const IMPORT_AUTHOR: (&str, &str) = ("Pathfinder", "pathfinder@example.org");
/// The initial import is dated this long before the first fix (one week).
const IMPORT_LEAD_SECONDS: i64 = 7 * 24 * 3600;
/// The initial import's date when there is no fix: 2026-01-01T00:00:00Z.
const DEFAULT_IMPORT_TIME: i64 = 1_767_225_600;

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("{path}: cannot read")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{path}: field `{field}`: {reason}")]
    Field {
        path: PathBuf,
        field: String,
        reason: String,
    },
    #[error("{path}: cannot reverse")]
    Reverse {
        path: PathBuf,
        #[source]
        source: patch::PatchError,
    },
    #[error("{path}: does not apply {direction} to the tree of the previous step")]
    Apply {
        path: PathBuf,
        direction: &'static str,
        #[source]
        source: git2::Error,
    },
    #[error("{out}: {reason}")]
    Output { out: PathBuf, reason: String },
    #[error("git")]
    Git(#[from] git2::Error),
    #[error("after replaying {series}, HEAD's tree {head} differs from the agent's final tree {expected}: a patch does not match the code")]
    Mismatch {
        series: PathBuf,
        head: Oid,
        expected: Oid,
    },
}

/// One fix commit of `series.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixCommit {
    pub patch: String,
    pub message: String,
    /// `Name <email>`.
    pub author: String,
    /// RFC 3339, e.g. `2026-03-02T10:00:00Z`.
    pub date: String,
    /// The component the fix hardens.
    pub component: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SeriesFile {
    #[serde(default, rename = "commit")]
    commits: Vec<FixCommit>,
}

/// A validated patch series with each patch's text.
#[derive(Debug, Clone)]
pub struct Series {
    pub path: PathBuf,
    pub commits: Vec<(FixCommit, String)>,
}

impl Series {
    /// Loads `history_dir/series.toml` and the patches it lists; a missing `history/` is an
    /// empty series.
    pub fn load(history_dir: &Path, catalog: &Catalog) -> Result<Series, HistoryError> {
        let path = history_dir.join("series.toml");
        if !history_dir.exists() {
            return Ok(Series {
                path,
                commits: Vec::new(),
            });
        }
        let text = std::fs::read_to_string(&path).map_err(|source| HistoryError::Io {
            path: path.clone(),
            source,
        })?;
        let file: SeriesFile = toml::from_str(&text).map_err(|source| HistoryError::Parse {
            path: path.clone(),
            source,
        })?;
        let mut commits = Vec::new();
        for (i, commit) in file.commits.into_iter().enumerate() {
            let field = |name: &str| format!("commit[{i}].{name}");
            let bad = |name: &str, reason: String| HistoryError::Field {
                path: path.clone(),
                field: field(name),
                reason,
            };
            parse_rfc3339(&commit.date).map_err(|r| bad("date", r))?;
            parse_author(&commit.author).map_err(|r| bad("author", r))?;
            if commit.message.trim().is_empty() {
                return Err(bad("message", "empty".into()));
            }
            if catalog.component(&commit.component).is_none() {
                return Err(bad(
                    "component",
                    format!("{:?} is not in the component vocabulary", commit.component),
                ));
            }
            if commit.patch.contains('/') || commit.patch.starts_with('.') {
                return Err(bad("patch", "must be a file name inside history/".into()));
            }
            let patch_path = history_dir.join(&commit.patch);
            let text = std::fs::read_to_string(&patch_path).map_err(|source| HistoryError::Io {
                path: patch_path.clone(),
                source,
            })?;
            commits.push((commit, text));
        }
        Ok(Series { path, commits })
    }
}

/// `Name <email>` → (name, email).
pub fn parse_author(author: &str) -> Result<(String, String), String> {
    let (name, rest) = author
        .split_once('<')
        .ok_or_else(|| format!("{author:?} is not `Name <email>`"))?;
    let email = rest
        .strip_suffix('>')
        .ok_or_else(|| format!("{author:?} is not `Name <email>`"))?;
    let name = name.trim();
    if name.is_empty() || !email.contains('@') {
        return Err(format!("{author:?} is not `Name <email>`"));
    }
    Ok((name.to_owned(), email.to_owned()))
}

/// `YYYY-MM-DDTHH:MM:SS(Z|±HH:MM)` → (seconds since the epoch, offset in minutes).
pub fn parse_rfc3339(text: &str) -> Result<(i64, i32), String> {
    let bad = || format!("{text:?} is not an RFC 3339 date like 2026-03-02T10:00:00Z");
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        text.get(r)
            .filter(|s| s.bytes().all(|c| c.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(bad());
    }
    let mut rest = &text[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        rest = &frac[digits..];
    }
    let offset_minutes: i32 = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6
            && (rest.starts_with('+') || rest.starts_with('-'))
            && &rest[3..4] == ":" =>
        {
            let h: i32 = rest[1..3].parse().map_err(|_| bad())?;
            let m: i32 = rest[4..6].parse().map_err(|_| bad())?;
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            sign * (h * 60 + m)
        }
        _ => return Err(bad()),
    };
    let days = days_from_civil(year, month, day);
    let local = days * 86_400 + hour * 3600 + minute * 60 + second;
    Ok((local - i64::from(offset_minutes) * 60, offset_minutes))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// What [`materialize`] built.
#[derive(Debug, Clone)]
pub struct Materialized {
    pub repo_dir: PathBuf,
    /// The "Initial import" commit.
    pub initial_commit: Oid,
    /// The fix commits, oldest first, with their messages.
    pub fix_commits: Vec<(Oid, String)>,
    pub head: Oid,
    /// The tree of HEAD (equal to the agent's final tree).
    pub head_tree: Oid,
}

/// Entries of the agent directory that are not part of its repository.
fn excluded(rel: &Path) -> bool {
    let name = rel
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    // A vendored agent's lock file, downloaded wheels and installed dependencies
    // (`crate::vendor`) stay outside its repository too.
    let top_level_meta = rel.components().count() == 1
        && (name == "agent.toml"
            || name == "history"
            || name.starts_with('.')
            || name.ends_with(".lock"));
    top_level_meta
        || name == "__pycache__"
        || name == ".git"
        || name == ".pytest_cache"
        || name.ends_with(".pyc")
}

/// Copies the agent's final tree (less manifest, history and caches) into `out`.
pub fn copy_final_tree(agent_dir: &Path, out: &Path) -> Result<usize, HistoryError> {
    fn walk(
        src_root: &Path,
        rel: &Path,
        out: &Path,
        count: &mut usize,
    ) -> Result<(), HistoryError> {
        let dir = src_root.join(rel);
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|source| HistoryError::Io {
                path: dir.clone(),
                source,
            })?
            .collect::<Result<_, _>>()
            .map_err(|source| HistoryError::Io {
                path: dir.clone(),
                source,
            })?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let rel_child = rel.join(entry.file_name());
            if excluded(&rel_child) {
                continue;
            }
            let src = src_root.join(&rel_child);
            let dst = out.join(&rel_child);
            let kind = entry.file_type().map_err(|source| HistoryError::Io {
                path: src.clone(),
                source,
            })?;
            if kind.is_dir() {
                std::fs::create_dir_all(&dst).map_err(|source| HistoryError::Io {
                    path: dst.clone(),
                    source,
                })?;
                walk(src_root, &rel_child, out, count)?;
            } else if kind.is_file() {
                std::fs::copy(&src, &dst).map_err(|source| HistoryError::Io {
                    path: dst.clone(),
                    source,
                })?;
                *count += 1;
            }
        }
        Ok(())
    }
    let mut count = 0;
    walk(agent_dir, Path::new(""), out, &mut count)?;
    Ok(count)
}

/// Materialises the repository of the agent in `agent_dir` (named `name`) into `out`, which
/// must not exist or be an empty directory.
pub fn materialize(
    name: &str,
    agent_dir: &Path,
    series: &Series,
    out: &Path,
) -> Result<Materialized, HistoryError> {
    let out_err = |reason: String| HistoryError::Output {
        out: out.to_owned(),
        reason,
    };
    if out.exists() {
        let mut entries = std::fs::read_dir(out).map_err(|e| out_err(e.to_string()))?;
        if entries.next().is_some() {
            return Err(out_err("exists and is not empty".into()));
        }
    }
    std::fs::create_dir_all(out).map_err(|e| out_err(e.to_string()))?;
    copy_final_tree(agent_dir, out)?;

    let mut opts = RepositoryInitOptions::new();
    opts.initial_head("main");
    let repo = Repository::init_opts(out, &opts)?;
    let final_tree = {
        let mut index = repo.index()?;
        index.add_all(["*"].iter(), IndexAddOption::DEFAULT, None)?;
        index.write()?;
        index.write_tree()?
    };

    // Walk backwards from the final tree to the initial one.
    let mut tree_id = final_tree;
    for (commit, text) in series.commits.iter().rev() {
        let patch_path = series.path.with_file_name(&commit.patch);
        let reversed = patch::reverse(text).map_err(|source| HistoryError::Reverse {
            path: patch_path.clone(),
            source,
        })?;
        tree_id = apply(&repo, tree_id, &reversed, &patch_path, "in reverse")?;
    }

    let first_time = series
        .commits
        .first()
        .map(|(c, _)| parse_rfc3339(&c.date).map(|(t, _)| t - IMPORT_LEAD_SECONDS))
        .transpose()
        .map_err(&out_err)?
        .unwrap_or(DEFAULT_IMPORT_TIME);
    let import_sig = Signature::new(IMPORT_AUTHOR.0, IMPORT_AUTHOR.1, &Time::new(first_time, 0))?;
    let initial_tree = repo.find_tree(tree_id)?;
    let initial_commit = repo.commit(
        Some("HEAD"),
        &import_sig,
        &import_sig,
        &format!("Initial import of {name}\n"),
        &initial_tree,
        &[],
    )?;

    let mut parent = initial_commit;
    let mut fix_commits = Vec::new();
    for (commit, text) in &series.commits {
        let patch_path = series.path.with_file_name(&commit.patch);
        tree_id = apply(&repo, tree_id, text, &patch_path, "forward")?;
        let (author_name, email) = parse_author(&commit.author).map_err(&out_err)?;
        let (time, offset) = parse_rfc3339(&commit.date).map_err(&out_err)?;
        let sig = Signature::new(&author_name, &email, &Time::new(time, offset))?;
        let tree = repo.find_tree(tree_id)?;
        let parent_commit = repo.find_commit(parent)?;
        let message = format!(
            "{}\n\nComponent: {}\n",
            commit.message.trim(),
            commit.component
        );
        parent = repo.commit(Some("HEAD"), &sig, &sig, &message, &tree, &[&parent_commit])?;
        fix_commits.push((parent, commit.message.clone()));
    }
    if tree_id != final_tree {
        return Err(HistoryError::Mismatch {
            series: series.path.clone(),
            head: tree_id,
            expected: final_tree,
        });
    }
    // The index already holds the final tree; make it match HEAD exactly.
    let mut index = repo.index()?;
    index.read_tree(&repo.find_tree(final_tree)?)?;
    index.write()?;
    Ok(Materialized {
        repo_dir: out.to_owned(),
        initial_commit,
        fix_commits,
        head: parent,
        head_tree: final_tree,
    })
}

fn apply(
    repo: &Repository,
    tree: Oid,
    patch_text: &str,
    patch_path: &Path,
    direction: &'static str,
) -> Result<Oid, HistoryError> {
    let wrap = |source: git2::Error| HistoryError::Apply {
        path: patch_path.to_owned(),
        direction,
        source,
    };
    // Blob ids on `index` lines are only abbreviations of what the patch was made from; the
    // hunks' context is what must match, so the lines are dropped before applying.
    let text: String = patch_text
        .split_inclusive('\n')
        .filter(|l| !l.starts_with("index "))
        .collect();
    let diff = Diff::from_buffer(text.as_bytes()).map_err(wrap)?;
    let tree = repo.find_tree(tree)?;
    let mut index = repo.apply_to_tree(&tree, &diff, None).map_err(wrap)?;
    Ok(index.write_tree_to(repo)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dates() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z").unwrap(), (0, 0));
        assert_eq!(
            parse_rfc3339("2026-03-02T10:00:00Z").unwrap().0,
            1_772_445_600
        );
        assert_eq!(
            parse_rfc3339("2026-03-02T12:00:00+02:00").unwrap(),
            (1_772_445_600, 120)
        );
        assert_eq!(
            parse_rfc3339("2026-01-01T00:00:00.123Z").unwrap().0,
            DEFAULT_IMPORT_TIME
        );
        for bad in [
            "2026-03-02",
            "2026-13-02T10:00:00Z",
            "2026-03-02T10:00:00",
            "yesterday",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_authors() {
        assert_eq!(
            parse_author("Ada Developer <ada@example.org>").unwrap(),
            ("Ada Developer".into(), "ada@example.org".into())
        );
        assert!(parse_author("Ada").is_err());
        assert!(parse_author("<ada@example.org>").is_err());
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// A two-fix agent whose patches were produced by `git diff`.
    fn demo_agent(root: &Path) -> PathBuf {
        let dir = root.join("demo");
        write(&dir.join("agent.toml"), "ignored by materialisation");
        write(&dir.join("demo/__main__.py"), "print('hi')\n");
        write(
            &dir.join("demo/tools.py"),
            "def run(args):\n    validate(args)\n    return call(args)\n\n\ndef call(args):\n    return args\n",
        );
        write(&dir.join("demo/__pycache__/tools.cpython-311.pyc"), "junk");
        write(
            &dir.join("history/0001-validate.patch"),
            "diff --git a/demo/tools.py b/demo/tools.py\nindex 1..2 100644\n--- a/demo/tools.py\n+++ b/demo/tools.py\n@@ -1,2 +1,3 @@\n def run(args):\n+    validate(args)\n     return call(args)\n",
        );
        write(
            &dir.join("history/0002-notes.patch"),
            "diff --git a/NOTES.md b/NOTES.md\nnew file mode 100644\nindex 0000000..1\n--- /dev/null\n+++ b/NOTES.md\n@@ -0,0 +1 @@\n+Validated.\n",
        );
        write(&dir.join("NOTES.md"), "Validated.\n");
        write(
            &dir.join("history/series.toml"),
            r#"
[[commit]]
patch = "0001-validate.patch"
message = "Validate arguments"
author = "Ada Developer <ada@example.org>"
date = "2026-03-02T10:00:00Z"
component = "tools.validation"

[[commit]]
patch = "0002-notes.patch"
message = "Add notes"
author = "Bo Coder <bo@example.org>"
date = "2026-03-05T09:30:00+01:00"
component = "prompt.system"
"#,
        );
        dir
    }

    #[test]
    fn materializes_history_with_git2() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = demo_agent(tmp.path());
        let catalog = Catalog::embedded().unwrap();
        let series = Series::load(&dir.join("history"), &catalog).unwrap();
        let out = tmp.path().join("repo");
        let m = materialize("demo", &dir, &series, &out).unwrap();
        assert_eq!(m.fix_commits.len(), 2);
        let repo = Repository::open(&out).unwrap();
        let head = repo.head().unwrap().peel_to_commit().unwrap();
        assert_eq!(head.tree_id(), m.head_tree);
        assert_eq!(head.author().name().unwrap(), "Bo Coder");
        assert_eq!(
            head.parent(0).unwrap().summary().unwrap(),
            Some("Validate arguments")
        );
        let initial = repo.find_commit(m.initial_commit).unwrap();
        assert_eq!(initial.summary().unwrap(), Some("Initial import of demo"));
        let init_tree = initial.tree().unwrap();
        assert!(init_tree.get_path(Path::new("NOTES.md")).is_err());
        let blob = init_tree
            .get_path(Path::new("demo/tools.py"))
            .unwrap()
            .to_object(&repo)
            .unwrap()
            .peel_to_blob()
            .unwrap();
        assert!(!String::from_utf8_lossy(blob.content()).contains("validate"));
        // Manifest, history and caches are not part of the repository.
        let head_tree = head.tree().unwrap();
        for absent in ["agent.toml", "history", "demo/__pycache__"] {
            assert!(head_tree.get_path(Path::new(absent)).is_err(), "{absent}");
        }
        assert!(!out.join("agent.toml").exists());
        // The work tree is clean.
        let statuses = repo.statuses(None).unwrap();
        assert_eq!(statuses.len(), 0);
        // Refuses a non-empty output.
        assert!(matches!(
            materialize("demo", &dir, &series, &out),
            Err(HistoryError::Output { .. })
        ));
    }

    #[test]
    fn a_patch_that_does_not_match_the_code_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = demo_agent(tmp.path());
        // The code no longer holds the line the first fix added.
        write(
            &dir.join("demo/tools.py"),
            "def run(args):\n    return call(args)\n",
        );
        let catalog = Catalog::embedded().unwrap();
        let series = Series::load(&dir.join("history"), &catalog).unwrap();
        let err = materialize("demo", &dir, &series, &tmp.path().join("repo")).unwrap_err();
        assert!(matches!(err, HistoryError::Apply { .. }), "{err}");
        assert!(err.to_string().contains("0001-validate.patch"), "{err}");
    }

    #[test]
    fn series_fields_are_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = demo_agent(tmp.path());
        let series = dir.join("history/series.toml");
        let text = std::fs::read_to_string(&series).unwrap();
        std::fs::write(&series, text.replace("tools.validation", "tools.validate")).unwrap();
        let catalog = Catalog::embedded().unwrap();
        let err = Series::load(&dir.join("history"), &catalog)
            .unwrap_err()
            .to_string();
        assert!(err.contains("commit[0].component"), "{err}");
    }
}
