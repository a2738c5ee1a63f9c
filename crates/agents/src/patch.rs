//! Reversing unified diffs.
//!
//! libgit2 applies a diff only forwards, and the agent histories are stored as forward patches,
//! so the initial tree is reached by applying each patch's *reverse*, which is computed here
//! on the text: file headers and hunk ranges swap sides, `-` and `+` lines swap, and within
//! each change block the (new) removals are put before the (new) additions as `git diff`
//! writes them. `\ No newline at end of file` markers travel with their line.

/// A patch that cannot be reversed; `line` is 1-based.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct PatchError {
    pub line: usize,
    pub reason: String,
}

/// The reverse of a `git diff`-format patch: applying it undoes the original.
pub fn reverse(patch: &str) -> Result<String, PatchError> {
    let lines: Vec<&str> = split_keep_newlines(patch);
    let mut out = String::with_capacity(patch.len());
    let mut i = 0;
    // Remaining old/new line counts of the hunk being copied; zero outside hunks.
    let mut in_hunk = (0usize, 0usize);
    while i < lines.len() {
        let line = lines[i];
        let number = i + 1;
        let body = line.trim_end_matches(['\n', '\r']);
        if in_hunk != (0, 0) {
            // Collect one change block (a run of -, + and their markers) or copy one context line.
            if body.starts_with('-') || body.starts_with('+') {
                let mut removed = Vec::new();
                let mut added = Vec::new();
                while i < lines.len() {
                    let l = lines[i];
                    let b = l.trim_end_matches(['\n', '\r']);
                    let group = if b.starts_with('-') {
                        in_hunk.0 = in_hunk.0.checked_sub(1).ok_or_else(|| PatchError {
                            line: i + 1,
                            reason: "more '-' lines than the hunk header counts".into(),
                        })?;
                        &mut added
                    } else if b.starts_with('+') {
                        in_hunk.1 = in_hunk.1.checked_sub(1).ok_or_else(|| PatchError {
                            line: i + 1,
                            reason: "more '+' lines than the hunk header counts".into(),
                        })?;
                        &mut removed
                    } else {
                        break;
                    };
                    let mut text = String::new();
                    text.push(if b.starts_with('-') { '+' } else { '-' });
                    text.push_str(&l[1..]);
                    i += 1;
                    if i < lines.len() && lines[i].starts_with('\\') {
                        text.push_str(lines[i]);
                        i += 1;
                    }
                    group.push(text);
                }
                for t in removed.iter().chain(added.iter()) {
                    out.push_str(t);
                }
                continue;
            }
            if body.starts_with(' ') || body.is_empty() {
                in_hunk.0 = in_hunk.0.saturating_sub(1);
                in_hunk.1 = in_hunk.1.saturating_sub(1);
                out.push_str(line);
                i += 1;
                if i < lines.len() && lines[i].starts_with('\\') {
                    out.push_str(lines[i]);
                    i += 1;
                }
                continue;
            }
            return Err(PatchError {
                line: number,
                reason: format!(
                    "hunk ended early: {} old and {} new lines still expected",
                    in_hunk.0, in_hunk.1
                ),
            });
        }
        let eol = &line[body.len()..];
        if let Some(rest) = body.strip_prefix("diff --git ") {
            let (a, b) = split_diff_git_paths(rest).ok_or_else(|| PatchError {
                line: number,
                reason: format!("cannot read the paths of {body:?}"),
            })?;
            out.push_str(&format!("diff --git a/{b} b/{a}{eol}"));
        } else if let Some(mode) = body.strip_prefix("new file mode ") {
            out.push_str(&format!("deleted file mode {mode}{eol}"));
        } else if let Some(mode) = body.strip_prefix("deleted file mode ") {
            out.push_str(&format!("new file mode {mode}{eol}"));
        } else if let Some(mode) = body.strip_prefix("old mode ") {
            out.push_str(&format!("new mode {mode}{eol}"));
        } else if let Some(mode) = body.strip_prefix("new mode ") {
            out.push_str(&format!("old mode {mode}{eol}"));
        } else if let Some(path) = body.strip_prefix("rename from ") {
            out.push_str(&format!("rename to {path}{eol}"));
        } else if let Some(path) = body.strip_prefix("rename to ") {
            out.push_str(&format!("rename from {path}{eol}"));
        } else if let Some(rest) = body.strip_prefix("index ") {
            let (ids, mode) = rest
                .split_once(' ')
                .map_or((rest, None), |(i, m)| (i, Some(m)));
            let (old, new) = ids.split_once("..").ok_or_else(|| PatchError {
                line: number,
                reason: format!("malformed index line {body:?}"),
            })?;
            match mode {
                Some(m) => out.push_str(&format!("index {new}..{old} {m}{eol}")),
                None => out.push_str(&format!("index {new}..{old}{eol}")),
            }
        } else if let Some(old) = body.strip_prefix("--- ") {
            let next = lines.get(i + 1).map(|l| l.trim_end_matches(['\n', '\r']));
            let Some((plus, new)) = next.and_then(|n| Some((n, n.strip_prefix("+++ ")?))) else {
                return Err(PatchError {
                    line: number,
                    reason: "'---' line not followed by a '+++' line".into(),
                });
            };
            let eol2 = &lines[i + 1][plus.len()..];
            out.push_str(&format!("--- {}{eol}", swap_prefix(new, "b/", "a/")));
            out.push_str(&format!("+++ {}{eol2}", swap_prefix(old, "a/", "b/")));
            i += 2;
            continue;
        } else if body.starts_with("@@ ") {
            let (old, new, tail) = parse_hunk_header(body).ok_or_else(|| PatchError {
                line: number,
                reason: format!("malformed hunk header {body:?}"),
            })?;
            in_hunk = (range_len(old), range_len(new));
            out.push_str(&format!("@@ -{new} +{old} @@{tail}{eol}"));
            if in_hunk == (0, 0) {
                return Err(PatchError {
                    line: number,
                    reason: "empty hunk".into(),
                });
            }
        } else if body.starts_with("GIT binary patch") || body.starts_with("Binary files ") {
            return Err(PatchError {
                line: number,
                reason: "binary patches cannot be reversed".into(),
            });
        } else if body.starts_with("copy from ") || body.starts_with("copy to ") {
            return Err(PatchError {
                line: number,
                reason: "copy patches cannot be reversed".into(),
            });
        } else {
            // similarity index, commit message preamble, blank separators: unchanged.
            out.push_str(line);
        }
        i += 1;
    }
    if in_hunk != (0, 0) {
        return Err(PatchError {
            line: lines.len(),
            reason: format!(
                "patch ends inside a hunk: {} old and {} new lines still expected",
                in_hunk.0, in_hunk.1
            ),
        });
    }
    Ok(out)
}

fn split_keep_newlines(text: &str) -> Vec<&str> {
    text.split_inclusive('\n').collect()
}

fn swap_prefix(path: &str, from: &str, to: &str) -> String {
    match path.strip_prefix(from) {
        Some(rest) => format!("{to}{rest}"),
        None => path.to_owned(), // /dev/null
    }
}

/// `a/X b/Y` → (X, Y). Paths with spaces are split at the ` b/` that makes both sides equal
/// when they are, as git does for unquoted paths.
fn split_diff_git_paths(rest: &str) -> Option<(String, String)> {
    if rest.starts_with('"') {
        return None;
    }
    let rest = rest.strip_prefix("a/")?;
    let candidates: Vec<usize> = rest.match_indices(" b/").map(|(i, _)| i).collect();
    let pick = candidates
        .iter()
        .copied()
        .find(|&i| rest[..i] == rest[i + 3..])
        .or_else(|| candidates.first().copied())?;
    Some((rest[..pick].to_owned(), rest[pick + 3..].to_owned()))
}

/// `@@ -A +B @@tail` → ("A", "B", "tail").
fn parse_hunk_header(line: &str) -> Option<(&str, &str, &str)> {
    let rest = line.strip_prefix("@@ -")?;
    let (old, rest) = rest.split_once(" +")?;
    let (new, tail) = rest.split_once(" @@")?;
    let valid = |r: &str| {
        r.split(',').count() <= 2
            && r.split(',')
                .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    (valid(old) && valid(new)).then_some((old, new, tail))
}

/// The line count of a hunk range `start[,count]` (count defaults to 1).
fn range_len(range: &str) -> usize {
    range
        .split_once(',')
        .map_or(1, |(_, n)| n.parse().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORWARD: &str = "\
diff --git a/pkg/tools.py b/pkg/tools.py
index 1111111..2222222 100644
--- a/pkg/tools.py
+++ b/pkg/tools.py
@@ -1,4 +1,5 @@
 def run(args):
-    return call(args)
+    validate(args)
+    return call(args)
 
 x = 1
@@ -10,2 +11,2 @@ class Tool:
-    a = 1
+    a = 2
     b = 3
";

    #[test]
    fn reverses_modify_hunks() {
        let rev = reverse(FORWARD).unwrap();
        let expected = "\
diff --git a/pkg/tools.py b/pkg/tools.py
index 2222222..1111111 100644
--- a/pkg/tools.py
+++ b/pkg/tools.py
@@ -1,5 +1,4 @@
 def run(args):
-    validate(args)
-    return call(args)
+    return call(args)
 
 x = 1
@@ -11,2 +10,2 @@ class Tool:
-    a = 2
+    a = 1
     b = 3
";
        assert_eq!(rev, expected);
    }

    #[test]
    fn reversing_twice_is_identity_for_git_output() {
        let rev = reverse(FORWARD).unwrap();
        assert_eq!(reverse(&rev).unwrap(), FORWARD);
    }

    #[test]
    fn new_file_becomes_deleted_file() {
        let fwd = "\
diff --git a/NOTES.md b/NOTES.md
new file mode 100644
index 0000000..3b18e51
--- /dev/null
+++ b/NOTES.md
@@ -0,0 +1,2 @@
+hello
+world
\\ No newline at end of file
";
        let rev = reverse(fwd).unwrap();
        let expected = "\
diff --git a/NOTES.md b/NOTES.md
deleted file mode 100644
index 3b18e51..0000000
--- a/NOTES.md
+++ /dev/null
@@ -1,2 +0,0 @@
-hello
-world
\\ No newline at end of file
";
        assert_eq!(rev, expected);
    }

    #[test]
    fn missing_newline_marker_travels_with_its_line() {
        let fwd = "\
diff --git a/f b/f
--- a/f
+++ b/f
@@ -1 +1 @@
-old
\\ No newline at end of file
+new
";
        let rev = reverse(fwd).unwrap();
        assert!(
            rev.ends_with("@@ -1 +1 @@\n-new\n+old\n\\ No newline at end of file\n"),
            "{rev}"
        );
    }

    #[test]
    fn malformed_patches_name_the_line() {
        let short = "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n-x\n+y\n";
        let err = reverse(short).unwrap_err();
        assert!(err.reason.contains("inside a hunk"), "{err}");
        let bad = "--- a/f\n+++ b/f\n@@ -x +1 @@\n";
        assert_eq!(reverse(bad).unwrap_err().line, 3);
        let bin = "diff --git a/f b/f\nGIT binary patch\n";
        assert_eq!(reverse(bin).unwrap_err().line, 2);
    }
}
