//! Applying an injection to a materialised agent repository, through git2 only.
//!
//! Every injection — a template, a removal, a history revert or a free-form diff — ends the
//! same way: a new tree is computed from HEAD's, committed by a fixed signature on the branch
//! `inject/KEY` (so the same injection gives the same commit id), checked out, and described by
//! the unified diff between the two trees and the ground-truth [`Location`].

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use git2::build::{CheckoutBuilder, TreeUpdateBuilder};
use git2::{
    ApplyOptions, Commit, Diff, DiffFormat, DiffOptions, FileMode, Oid, Patch, Repository,
    Signature, Time, Tree,
};
use serde::Serialize;

use crate::python;
use crate::template::{bad_relative_path, Strategy, Template};
use taxonomy::Problem;

/// The author and committer of injection commits.
const INJECTOR: (&str, &str) = ("Pathfinder Injector", "injector@example.org");
/// Injection commits are dated this long after their base, so ids are reproducible.
const COMMIT_DELAY_SECONDS: i64 = 3600;

#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// The template does not fit the code (or is invalid); names the file and field.
    #[error("{0}")]
    Template(Problem),
    /// A free-form diff was rejected; the reason says which file or hunk.
    #[error("diff rejected: {0}")]
    Rejected(String),
    #[error("git: {context}")]
    Git {
        context: String,
        #[source]
        source: git2::Error,
    },
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run {python:?} to check that the edited code still parses")]
    Python {
        python: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Output { path: PathBuf, reason: String },
    #[error(transparent)]
    Workspace(Box<agents::workspace::WorkspaceError>),
    #[error(transparent)]
    History(Box<agents::history::HistoryError>),
}

fn git(context: impl Into<String>) -> impl FnOnce(git2::Error) -> InjectError {
    let context = context.into();
    move |source| InjectError::Git { context, source }
}

/// Knobs of the engine.
#[derive(Debug, Clone)]
pub struct Options {
    /// The interpreter used for the syntax check (`python3`).
    pub python: String,
    /// The interpreter process, started on first use and shared by clones of these options.
    checker: Arc<Mutex<Option<python::SyntaxChecker>>>,
}

impl Options {
    pub fn new(python: impl Into<String>) -> Options {
        Options {
            python: python.into(),
            checker: Arc::default(),
        }
    }

    fn syntax_error(&self, filename: &str, code: &str) -> Result<Option<String>, InjectError> {
        let err = |source| InjectError::Python {
            python: self.python.clone(),
            source,
        };
        let mut guard = self.checker.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(python::SyntaxChecker::start(&self.python).map_err(err)?);
        }
        let result = guard.as_mut().expect("started").check(filename, code);
        if result.is_err() {
            // A dead checker is restarted next time.
            *guard = None;
        }
        result.map_err(err)
    }
}

impl Default for Options {
    fn default() -> Options {
        Options::new("python3")
    }
}

/// Where the deficiency lives: the ground truth the Detector is scored against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Location {
    /// Relative to the agent root.
    pub file: String,
    /// `function` or `Class.method`; `None` when the change is outside any function.
    pub function: Option<String>,
    /// Lines of the changed code after the injection (1-based, inclusive). A pure deletion
    /// is located at the line that now stands where the deleted code was.
    pub line_start: usize,
    pub line_end: usize,
    /// The component id; `None` for a free-form diff outside the agent's declared sites.
    pub component: Option<String>,
}

/// One applied injection.
#[derive(Debug, Clone, Serialize)]
pub struct Injection {
    /// `ID-VARIANT` for a template, `ID-freeform-HASH` / `freeform-HASH` for a diff.
    pub key: String,
    pub deficiency: Option<String>,
    /// `template`, `removal`, `history` or `freeform`.
    pub strategy: String,
    pub branch: String,
    pub base_commit: String,
    pub commit: String,
    /// The unified diff between the base and the injected tree.
    #[serde(skip)]
    pub diff: String,
    /// The primary location (the first edit).
    pub location: Location,
    /// Every changed place, the primary one first.
    pub edits: Vec<Location>,
    /// Syntax errors in changed Python files (allowed only where the template expects them;
    /// recorded for free-form diffs).
    pub syntax_errors: Vec<String>,
}

fn head_commit(repo: &Repository) -> Result<Commit<'_>, InjectError> {
    repo.head()
        .and_then(|h| h.peel_to_commit())
        .map_err(git("the repository has no HEAD commit"))
}

fn blob_text(repo: &Repository, tree: &Tree<'_>, file: &str) -> Option<(String, FileMode)> {
    let entry = tree.get_path(Path::new(file)).ok()?;
    let mode = match entry.filemode() {
        0o100755 => FileMode::BlobExecutable,
        _ => FileMode::Blob,
    };
    let blob = entry.to_object(repo).ok()?.peel_to_blob().ok()?;
    Some((String::from_utf8(blob.content().to_vec()).ok()?, mode))
}

fn line_count(text: &str) -> usize {
    if text.is_empty() {
        0
    } else {
        text.matches('\n').count() + usize::from(!text.ends_with('\n'))
    }
}

/// Applies `template` to the repository at HEAD and commits it on `inject/ID-VARIANT`.
pub fn apply_template(
    repo: &Repository,
    template: &Template,
    options: &Options,
) -> Result<Injection, InjectError> {
    let base = head_commit(repo)?;
    let base_tree = base.tree().map_err(git("HEAD's tree"))?;
    let problem = |field: &str, reason: String| {
        InjectError::Template(Problem::new(&template.path, Some(field), reason))
    };
    let (new_tree, mut edits) = match template.strategy {
        Strategy::History => {
            let subject = template.revert.as_deref().unwrap_or_default().trim();
            let tree = revert_fix(repo, &base, subject).map_err(|reason| match reason {
                RevertFailure::Problem(r) => problem("revert", r),
                RevertFailure::Git(e) => e,
            })?;
            let edits = changed_locations(repo, &base_tree, &repo.find_tree(tree).unwrap())?;
            (tree, edits)
        }
        Strategy::Template | Strategy::Removal => edit_tree(repo, &base_tree, template)?,
    };
    let new_tree_obj = repo.find_tree(new_tree).map_err(git("the new tree"))?;
    if new_tree == base_tree.id() {
        return Err(problem("edit", "the injection changes nothing".into()));
    }
    if edits.is_empty() {
        return Err(problem("revert", "the revert changes no file".into()));
    }
    for e in &mut edits {
        e.component = Some(template.component.clone());
    }
    let syntax_errors = syntax_errors(repo, &new_tree_obj, &edits, options)?;
    if !syntax_errors.is_empty() && !template.expect_syntax_error {
        let field = if template.strategy == Strategy::History {
            "revert"
        } else {
            "edit"
        };
        return Err(problem(
            field,
            format!(
                "the edited code no longer parses: {}",
                syntax_errors.join("; ")
            ),
        ));
    }
    let key = template.key();
    finish(
        repo,
        &base,
        new_tree,
        &key,
        Some(template.deficiency.clone()),
        template.strategy.as_str(),
        edits,
        syntax_errors,
    )
}

enum RevertFailure {
    Problem(String),
    Git(InjectError),
}

/// The tree of HEAD with the fix commit whose subject is `subject` reverted.
fn revert_fix(repo: &Repository, head: &Commit<'_>, subject: &str) -> Result<Oid, RevertFailure> {
    let mut walk = repo
        .revwalk()
        .map_err(|e| RevertFailure::Git(git("revwalk")(e)))?;
    walk.push(head.id())
        .map_err(|e| RevertFailure::Git(git("revwalk")(e)))?;
    let mut subjects = Vec::new();
    let mut fix = None;
    for oid in walk {
        let oid = oid.map_err(|e| RevertFailure::Git(git("revwalk")(e)))?;
        let commit = repo
            .find_commit(oid)
            .map_err(|e| RevertFailure::Git(git("find commit")(e)))?;
        let s = commit
            .summary()
            .ok()
            .flatten()
            .unwrap_or_default()
            .trim()
            .to_owned();
        if s == subject && commit.parent_count() == 1 {
            fix = Some(commit);
            break;
        }
        subjects.push(s);
    }
    let fix = fix.ok_or_else(|| {
        RevertFailure::Problem(format!(
            "no commit in the agent's history has the subject {subject:?} (subjects: {})",
            subjects
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let mut index = repo
        .revert_commit(&fix, head, 0, None)
        .map_err(|e| RevertFailure::Git(git(format!("reverting {}", fix.id()))(e)))?;
    if index.has_conflicts() {
        let files: Vec<String> = index
            .conflicts()
            .map(|c| {
                c.filter_map(Result::ok)
                    .filter_map(|c| c.our.or(c.their).or(c.ancestor))
                    .map(|e| String::from_utf8_lossy(&e.path).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        return Err(RevertFailure::Problem(format!(
            "reverting {} conflicts with later changes in {}",
            fix.id(),
            files.join(", ")
        )));
    }
    index
        .write_tree_to(repo)
        .map_err(|e| RevertFailure::Git(git("writing the reverted tree")(e)))
}

/// Applies the template's edits to the base tree; returns the new tree and each edit's place.
fn edit_tree(
    repo: &Repository,
    base_tree: &Tree<'_>,
    template: &Template,
) -> Result<(Oid, Vec<Location>), InjectError> {
    let problem = |field: String, reason: String| {
        InjectError::Template(Problem::new(&template.path, Some(&field), reason))
    };
    let mut files: BTreeMap<String, (String, FileMode)> = BTreeMap::new();
    let mut edits: Vec<Location> = Vec::new();
    for (i, edit) in template.edits.iter().enumerate() {
        let field = |name: &str| format!("edit[{i}].{name}");
        if !files.contains_key(&edit.file) {
            let content = blob_text(repo, base_tree, &edit.file).ok_or_else(|| {
                problem(
                    field("file"),
                    format!(
                        "{:?} is not a text file of the {} repository",
                        edit.file, template.agent
                    ),
                )
            })?;
            files.insert(edit.file.clone(), content);
        }
        let (content, _) = files.get_mut(&edit.file).expect("inserted");
        let positions: Vec<usize> = content.match_indices(&edit.find).map(|(p, _)| p).collect();
        let pos = match positions.as_slice() {
            [p] => *p,
            [] => {
                return Err(problem(
                    field("find"),
                    format!(
                        "does not occur in {} (matching is exact, whitespace included)",
                        edit.file
                    ),
                ))
            }
            many => {
                let lines: Vec<String> = many
                    .iter()
                    .map(|p| (content[..*p].matches('\n').count() + 1).to_string())
                    .collect();
                return Err(problem(
                    field("find"),
                    format!(
                        "occurs {} times in {} (at lines {}); it must occur exactly once",
                        many.len(),
                        edit.file,
                        lines.join(", ")
                    ),
                ));
            }
        };
        let start = content[..pos].matches('\n').count() + 1;
        let find_end = start + line_count(&edit.find).max(1) - 1;
        let def = python::find(content, &edit.function).ok_or_else(|| {
            problem(
                field("function"),
                format!("{} defines no function {:?}", edit.file, edit.function),
            )
        })?;
        if start < def.start || find_end > def.end {
            return Err(problem(
                field("find"),
                format!(
                    "occurs at lines {start}–{find_end} of {}, outside {} (lines {}–{})",
                    edit.file, edit.function, def.start, def.end
                ),
            ));
        }
        content.replace_range(pos..pos + edit.find.len(), &edit.replace);
        let replaced = line_count(&edit.replace);
        let end = if replaced == 0 {
            start
        } else {
            start + replaced - 1
        };
        // Earlier edits below this one in the same file move by the change in length.
        let shift = replaced as isize - line_count(&edit.find) as isize;
        for e in edits.iter_mut().filter(|e| e.file == edit.file) {
            if e.line_start > find_end {
                e.line_start = (e.line_start as isize + shift) as usize;
                e.line_end = (e.line_end as isize + shift) as usize;
            }
        }
        edits.push(Location {
            file: edit.file.clone(),
            function: Some(edit.function.clone()),
            line_start: start,
            line_end: end,
            component: None,
        });
    }
    let mut builder = TreeUpdateBuilder::new();
    for (file, (content, mode)) in &files {
        let blob = repo
            .blob(content.as_bytes())
            .map_err(git(format!("writing {file}")))?;
        builder.upsert(file.as_str(), blob, *mode);
    }
    let tree = builder
        .create_updated(repo, base_tree)
        .map_err(git("building the injected tree"))?;
    Ok((tree, edits))
}

/// The changed places between two trees, one per changed file (first changed line to last,
/// on the new side), with the enclosing function.
fn changed_locations(
    repo: &Repository,
    old: &Tree<'_>,
    new: &Tree<'_>,
) -> Result<Vec<Location>, InjectError> {
    let diff = repo
        .diff_tree_to_tree(Some(old), Some(new), None)
        .map_err(git("diffing the trees"))?;
    let mut out = Vec::new();
    for idx in 0..diff.deltas().len() {
        let Some(patch) = Patch::from_diff(&diff, idx).map_err(git("reading the diff"))? else {
            continue;
        };
        let delta = patch.delta();
        let Some(path) = delta
            .new_file()
            .path()
            .or(delta.old_file().path())
            .map(|p| p.to_string_lossy().into_owned())
        else {
            continue;
        };
        let mut range: Option<(usize, usize)> = None;
        for h in 0..patch.num_hunks() {
            let (hunk, lines) = patch.hunk(h).map_err(git("reading a hunk"))?;
            let mut next_new = hunk.new_start() as usize;
            for l in 0..lines {
                let line = patch
                    .line_in_hunk(h, l)
                    .map_err(git("reading a hunk line"))?;
                let at = match line.origin() {
                    '+' => {
                        let n = line.new_lineno().unwrap_or(next_new as u32) as usize;
                        next_new = n + 1;
                        Some(n)
                    }
                    '-' => Some(next_new.max(1)),
                    ' ' => {
                        next_new = line.new_lineno().map_or(next_new, |n| n as usize + 1);
                        None
                    }
                    _ => None,
                };
                if let Some(n) = at {
                    range = Some(match range {
                        None => (n, n),
                        Some((a, b)) => (a.min(n), b.max(n)),
                    });
                }
            }
        }
        let Some((start, end)) = range else { continue };
        let function = blob_text(repo, new, &path)
            .filter(|_| path.ends_with(".py"))
            .and_then(|(code, _)| python::enclosing(&code, start))
            .map(|d| d.name);
        out.push(Location {
            file: path,
            function,
            line_start: start,
            line_end: end,
            component: None,
        });
    }
    Ok(out)
}

fn syntax_errors(
    repo: &Repository,
    tree: &Tree<'_>,
    edits: &[Location],
    options: &Options,
) -> Result<Vec<String>, InjectError> {
    let mut seen = std::collections::BTreeSet::new();
    let mut errors = Vec::new();
    for e in edits {
        if !e.file.ends_with(".py") || !seen.insert(e.file.clone()) {
            continue;
        }
        let Some((code, _)) = blob_text(repo, tree, &e.file) else {
            continue; // deleted
        };
        if let Some(msg) = options.syntax_error(&e.file, &code)? {
            errors.push(format!("{}: {msg}", e.file));
        }
    }
    Ok(errors)
}

/// Commits `tree` on `inject/KEY`, checks it out, and describes the change.
#[allow(clippy::too_many_arguments)]
fn finish(
    repo: &Repository,
    base: &Commit<'_>,
    tree: Oid,
    key: &str,
    deficiency: Option<String>,
    strategy: &str,
    edits: Vec<Location>,
    syntax_errors: Vec<String>,
) -> Result<Injection, InjectError> {
    let branch = format!("inject/{key}");
    let refname = format!("refs/heads/{branch}");
    if repo.find_reference(&refname).is_ok() {
        return Err(InjectError::Output {
            path: repo.path().to_owned(),
            reason: format!("branch {branch} already exists"),
        });
    }
    let time = Time::new(base.time().seconds() + COMMIT_DELAY_SECONDS, 0);
    let sig = Signature::new(INJECTOR.0, INJECTOR.1, &time).map_err(git("signature"))?;
    let tree_obj = repo.find_tree(tree).map_err(git("the injected tree"))?;
    let commit = repo
        .commit(
            Some(&refname),
            &sig,
            &sig,
            &format!("{key}\n"),
            &tree_obj,
            &[base],
        )
        .map_err(git(format!("committing on {branch}")))?;
    repo.set_head(&refname)
        .map_err(git(format!("switching to {branch}")))?;
    repo.checkout_head(Some(CheckoutBuilder::new().force()))
        .map_err(git(format!("checking out {branch}")))?;
    let diff = unified_diff(repo, &base.tree().map_err(git("base tree"))?, &tree_obj)?;
    let location = edits.first().cloned().ok_or_else(|| InjectError::Output {
        path: repo.path().to_owned(),
        reason: "the injection has no location".into(),
    })?;
    Ok(Injection {
        key: key.to_owned(),
        deficiency,
        strategy: strategy.to_owned(),
        branch,
        base_commit: base.id().to_string(),
        commit: commit.to_string(),
        diff,
        location,
        edits,
        syntax_errors,
    })
}

/// The `git diff`-format text between two trees.
pub fn unified_diff(
    repo: &Repository,
    old: &Tree<'_>,
    new: &Tree<'_>,
) -> Result<String, InjectError> {
    let diff = repo
        .diff_tree_to_tree(
            Some(old),
            Some(new),
            Some(DiffOptions::new().context_lines(3)),
        )
        .map_err(git("diffing the trees"))?;
    let mut text = Vec::new();
    diff.print(DiffFormat::Patch, |_, _, line| {
        if matches!(line.origin(), '+' | '-' | ' ') {
            text.push(line.origin() as u8);
        }
        text.extend_from_slice(line.content());
        true
    })
    .map_err(git("printing the diff"))?;
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// Applies a free-form unified diff (paths relative to the agent root, `a/` `b/` prefixes) at
/// HEAD and commits it on `inject/KEY`, where KEY is `ID-freeform-HASH` (or `freeform-HASH`
/// without a type) and HASH abbreviates the diff's content. Rejects a diff that is empty,
/// does not parse, touches anything outside the agent's code, does not apply (naming the file
/// and hunk) or changes nothing. `component` is taken from the agent's site when the change
/// lands in one.
pub fn apply_diff(
    repo: &Repository,
    diff_text: &str,
    deficiency: Option<&str>,
    sites: &[agents::Site],
    options: &Options,
) -> Result<Injection, InjectError> {
    let reject = |r: String| InjectError::Rejected(r);
    if diff_text.trim().is_empty() {
        return Err(reject("the diff is empty".into()));
    }
    // Abbreviated blob ids on `index` lines need not match; the hunks' context must.
    let cleaned: String = diff_text
        .split_inclusive('\n')
        .filter(|l| !l.starts_with("index "))
        .collect();
    let diff = Diff::from_buffer(cleaned.as_bytes())
        .map_err(|e| reject(format!("not a unified diff: {}", e.message())))?;
    if diff.deltas().len() == 0 {
        return Err(reject(
            "the diff is empty (no `diff --git` / `---` `+++` file headers with hunks)".into(),
        ));
    }
    for delta in diff.deltas() {
        for path in [delta.old_file().path(), delta.new_file().path()]
            .into_iter()
            .flatten()
        {
            let p = path.to_string_lossy();
            if let Some(reason) = bad_relative_path(&p) {
                return Err(reject(format!(
                    "touches a file outside the agent: {reason}"
                )));
            }
        }
    }
    let base = head_commit(repo)?;
    let base_tree = base.tree().map_err(git("HEAD's tree"))?;
    // libgit2 reports each delta and hunk before applying it, so the last one reported when
    // the application fails is the one that does not apply.
    let current: RefCell<(String, Option<String>, usize)> = RefCell::new((String::new(), None, 0));
    let mut opts = ApplyOptions::new();
    opts.delta_callback(|d| {
        if let Some(d) = d {
            let path = d
                .new_file()
                .path()
                .or(d.old_file().path())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            *current.borrow_mut() = (path, None, 0);
        }
        true
    });
    opts.hunk_callback(|h| {
        if let Some(h) = h {
            let mut c = current.borrow_mut();
            c.2 += 1;
            c.1 = Some(String::from_utf8_lossy(h.header()).trim().to_owned());
        }
        true
    });
    let applied = repo.apply_to_tree(&base_tree, &diff, Some(&mut opts));
    drop(opts);
    let mut index = match applied {
        Ok(index) => index,
        Err(e) => {
            let (file, hunk, n) = current.into_inner();
            let exists = base_tree.get_path(Path::new(&file)).is_ok();
            let place = match hunk {
                _ if !exists && !file.is_empty() => {
                    format!("{file}: no such file in the agent's repository")
                }
                Some(h) => format!("{file}: hunk {n} ({h}) does not match the code"),
                None => format!("{file}: does not apply"),
            };
            return Err(reject(format!("does not apply: {place} ({})", e.message())));
        }
    };
    let tree = index
        .write_tree_to(repo)
        .map_err(git("writing the patched tree"))?;
    if tree == base_tree.id() {
        return Err(reject("the diff changes nothing".into()));
    }
    let tree_obj = repo.find_tree(tree).map_err(git("the patched tree"))?;
    let mut edits = changed_locations(repo, &base_tree, &tree_obj)?;
    for e in &mut edits {
        e.component = sites
            .iter()
            .find(|s| Some(&s.function) == e.function.as_ref() && s.file == e.file)
            .map(|s| s.component.clone());
    }
    let syntax_errors = syntax_errors(repo, &tree_obj, &edits, options)?;
    let hash = &tree.to_string()[..10];
    let key = match deficiency {
        Some(id) => format!("{id}-freeform-{hash}"),
        None => format!("freeform-{hash}"),
    };
    finish(
        repo,
        &base,
        tree,
        &key,
        deficiency.map(str::to_owned),
        "freeform",
        edits,
        syntax_errors,
    )
}
