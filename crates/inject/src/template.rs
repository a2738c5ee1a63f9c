//! Injection templates: `deficiencies/templates/AGENT/ID-VARIANT.toml` (format in
//! `deficiencies/templates/README.md`).
//!
//! Loading checks everything that can be checked without the agent's code: the file name,
//! the catalog id, the component, the strategy's fields. Checks against the code (the `find`
//! text occurs once inside `function`, the result still parses) happen when the template is
//! applied, in [`crate::engine`], and name the template file and field the same way.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use taxonomy::{Catalog, Problem};

/// How a template plants its deficiency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// A pattern written for the type, changing behaviour at the site.
    Template,
    /// Deletes defensive code and adds nothing.
    Removal,
    /// Reverts a fix commit of the agent's history.
    History,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Template => "template",
            Strategy::Removal => "removal",
            Strategy::History => "history",
        }
    }
}

/// One textual edit of a template.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    /// Relative to the agent root.
    pub file: String,
    /// `function` or `Class.method`: where the edit lands (ground truth).
    pub function: String,
    pub find: String,
    pub replace: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateFile {
    deficiency: String,
    agent: String,
    variant: String,
    strategy: Strategy,
    component: String,
    description: String,
    #[serde(default)]
    tasks: Vec<String>,
    #[serde(default, rename = "edit")]
    edits: Vec<Edit>,
    revert: Option<String>,
    #[serde(default)]
    expect_syntax_error: bool,
}

/// A loaded, statically valid template.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Template {
    /// Where it was read from (named in every error).
    pub path: PathBuf,
    /// The catalog id, canonical spelling (`P1`).
    pub deficiency: String,
    pub agent: String,
    pub variant: String,
    pub strategy: Strategy,
    pub component: String,
    pub description: String,
    pub tasks: Vec<String>,
    pub edits: Vec<Edit>,
    /// For `history`: the first line of the fix commit's message.
    pub revert: Option<String>,
    pub expect_syntax_error: bool,
}

impl Template {
    /// `ID-VARIANT`, the template's name and its branch suffix.
    pub fn key(&self) -> String {
        format!("{}-{}", self.deficiency, self.variant)
    }

    /// Whether the template's first edit lands at `file:function` (`--site`).
    pub fn is_at_site(&self, file: &str, function: &str) -> bool {
        self.edits
            .iter()
            .any(|e| e.file == file && e.function == function)
    }
}

fn is_kebab(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('-')
        && !s.ends_with('-')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Parses and checks one template file against the catalog (not against the code).
pub fn load(path: &Path, catalog: &Catalog) -> Result<Template, Problem> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Problem::new(path, None, format!("cannot read: {e}")))?;
    parse(path, &text, catalog)
}

/// [`load`] on text already read; `path` is used for the name checks and in errors.
pub fn parse(path: &Path, text: &str, catalog: &Catalog) -> Result<Template, Problem> {
    let file: TemplateFile = toml::from_str(text).map_err(|e| {
        // toml's message names the key and the line; keep it on one line.
        let msg = e.to_string().replace('\n', " ");
        Problem::new(path, None, format!("not a valid template: {msg}"))
    })?;
    let bad = |field: &str, reason: String| Problem::new(path, Some(field), reason);
    let deficiency = catalog
        .get(&file.deficiency)
        .ok_or_else(|| {
            bad(
                "deficiency",
                format!("{:?} is not a catalog id (P1–P27, C1–C23)", file.deficiency),
            )
        })?
        .clone();
    if !is_kebab(&file.variant) {
        return Err(bad(
            "variant",
            format!("{:?} is not a short kebab-case name", file.variant),
        ));
    }
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    let expected_stem = format!("{}-{}", deficiency.id, file.variant);
    if stem.as_deref() != Some(expected_stem.as_str()) {
        return Err(bad(
            "variant",
            format!("the file must be named {expected_stem}.toml (deficiency-variant)"),
        ));
    }
    let parent = path
        .parent()
        .and_then(|p| p.file_name())
        .map(|s| s.to_string_lossy().into_owned());
    if parent.as_deref() != Some(file.agent.as_str()) {
        return Err(bad(
            "agent",
            format!(
                "{:?} does not match the directory the template is in ({})",
                file.agent,
                parent.unwrap_or_default()
            ),
        ));
    }
    if !deficiency.components.iter().any(|c| c == &file.component) {
        return Err(bad(
            "component",
            format!(
                "{:?} is not one of {}'s components ({})",
                file.component,
                deficiency.id,
                deficiency.components.join(", ")
            ),
        ));
    }
    if file.expect_syntax_error && deficiency.manifestation != taxonomy::Manifestation::Crash {
        return Err(bad(
            "expect_syntax_error",
            format!(
                "only crash-manifesting types may leave code that does not parse; {} is {}",
                deficiency.id, deficiency.manifestation
            ),
        ));
    }
    if file.description.trim().is_empty() {
        return Err(bad("description", "empty".into()));
    }
    match file.strategy {
        Strategy::History => {
            if !file.edits.is_empty() {
                return Err(bad(
                    "edit",
                    "a history template reverts a commit and has no [[edit]]".into(),
                ));
            }
            match &file.revert {
                Some(s) if !s.trim().is_empty() => {}
                _ => {
                    return Err(bad(
                        "revert",
                        "a history template names the fix commit's subject in `revert`".into(),
                    ))
                }
            }
        }
        Strategy::Template | Strategy::Removal => {
            if file.revert.is_some() {
                return Err(bad(
                    "revert",
                    format!(
                        "only history templates revert; this one is {}",
                        file.strategy.as_str()
                    ),
                ));
            }
            if file.edits.is_empty() {
                return Err(bad("edit", "at least one [[edit]] is required".into()));
            }
        }
    }
    for (i, edit) in file.edits.iter().enumerate() {
        let field = |name: &str| format!("edit[{i}].{name}");
        if let Some(reason) = bad_relative_path(&edit.file) {
            return Err(bad(&field("file"), reason));
        }
        if edit.function.trim().is_empty() {
            return Err(bad(&field("function"), "empty".into()));
        }
        if edit.find.is_empty() {
            return Err(bad(&field("find"), "empty".into()));
        }
        if edit.find == edit.replace {
            return Err(bad(
                &field("replace"),
                "equals `find`: the edit changes nothing".into(),
            ));
        }
        if file.strategy == Strategy::Removal && !only_deletes(&edit.find, &edit.replace) {
            return Err(bad(
                &field("replace"),
                "a removal may only delete code from `find` (re-indenting the rest is allowed), not add or change any".into(),
            ));
        }
    }
    Ok(Template {
        path: path.to_owned(),
        deficiency: deficiency.id.clone(),
        agent: file.agent,
        variant: file.variant,
        strategy: file.strategy,
        component: file.component,
        description: file.description,
        tasks: file.tasks,
        edits: file.edits,
        revert: file.revert,
        expect_syntax_error: file.expect_syntax_error,
    })
}

/// Why a path relative to the agent root is not acceptable, if it is not.
pub fn bad_relative_path(path: &str) -> Option<String> {
    let p = Path::new(path);
    if path.is_empty() {
        return Some("empty path".into());
    }
    if p.is_absolute() {
        return Some(format!(
            "{path:?} is absolute; paths are relative to the agent root"
        ));
    }
    if p.components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Some(format!(
            "{path:?} leaves the agent root or is not normalised (`..`, `.`)"
        ));
    }
    let first = p
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    if first == ".git" || first == "history" || path == "agent.toml" {
        return Some(format!(
            "{path:?} is not part of the agent's code (.git, history/ and agent.toml are off limits)"
        ));
    }
    None
}

/// Whether `replace`'s tokens (word runs and single other characters, whitespace ignored) are
/// a subsequence of `find`'s: the edit only deletes — lines, a check, a `list(...)` copy — and
/// may re-indent what is left, but adds or changes nothing.
fn only_deletes(find: &str, replace: &str) -> bool {
    let mut kept = tokens(find).into_iter();
    tokens(replace)
        .into_iter()
        .all(|token| kept.any(|f| f == token))
}

fn tokens(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    for (i, c) in text.char_indices() {
        let word = c.is_alphanumeric() || c == '_';
        if word {
            start.get_or_insert(i);
            continue;
        }
        if let Some(s) = start.take() {
            out.push(&text[s..i]);
        }
        if !c.is_whitespace() {
            out.push(&text[i..i + c.len_utf8()]);
        }
    }
    if let Some(s) = start {
        out.push(&text[s..]);
    }
    out
}

/// Every template under `dir` (`dir/AGENT/*.toml`), sorted by agent then file name. Every
/// problem found is returned, not just the first.
pub fn load_dir(dir: &Path, catalog: &Catalog) -> Result<Vec<Template>, Vec<Problem>> {
    let mut templates = Vec::new();
    let mut problems = Vec::new();
    let mut agent_dirs: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect(),
        Err(e) => {
            return Err(vec![Problem::new(
                dir,
                None,
                format!("cannot read the templates directory: {e}"),
            )])
        }
    };
    agent_dirs.sort();
    for agent_dir in agent_dirs {
        let mut files: Vec<PathBuf> = match std::fs::read_dir(&agent_dir) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect(),
            Err(e) => {
                problems.push(Problem::new(&agent_dir, None, format!("cannot read: {e}")));
                continue;
            }
        };
        files.sort();
        for file in files {
            match load(&file, catalog) {
                Ok(t) => templates.push(t),
                Err(p) => problems.push(p),
            }
        }
    }
    if problems.is_empty() {
        Ok(templates)
    } else {
        Err(problems)
    }
}

/// The templates of one type for one agent (`dir/AGENT/ID-*.toml`), sorted by variant. Only
/// those files are read, so a broken template elsewhere does not block this choice.
pub fn load_for(
    dir: &Path,
    agent: &str,
    deficiency: &str,
    catalog: &Catalog,
) -> Result<Vec<Template>, Problem> {
    let id = catalog
        .get(deficiency)
        .map(|d| d.id.clone())
        .ok_or_else(|| {
            Problem::new(
                dir,
                None,
                format!("{deficiency:?} is not a catalog id (P1–P27, C1–C23)"),
            )
        })?;
    let agent_dir = dir.join(agent);
    let entries = match std::fs::read_dir(&agent_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Problem::new(&agent_dir, None, format!("cannot read: {e}"))),
    };
    let prefix = format!("{id}-");
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "toml")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect();
    files.sort();
    files.iter().map(|f| load(f, catalog)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
deficiency = "P1"
agent = "demo"
variant = "usage-from-buffer"
strategy = "template"
component = "llm_client.stream"
description = "Counts tokens early."
tasks = ["gaia-001"]

[[edit]]
file = "demo/llm.py"
function = "Stream.feed"
find = "a\n"
replace = "b\n"
"#;

    fn parse_at(name: &str, text: &str) -> Result<Template, Problem> {
        let catalog = Catalog::embedded().unwrap();
        parse(&Path::new("t/demo").join(name), text, &catalog)
    }

    #[test]
    fn parses_a_good_template() {
        let t = parse_at("P1-usage-from-buffer.toml", GOOD).unwrap();
        assert_eq!(t.key(), "P1-usage-from-buffer");
        assert!(t.is_at_site("demo/llm.py", "Stream.feed"));
    }

    #[test]
    fn problems_name_the_file_and_field() {
        let cases = [
            ("P1-other.toml", GOOD.to_owned(), "variant"),
            (
                "P1-usage-from-buffer.toml",
                GOOD.replace("\"P1\"", "\"P99\""),
                "deficiency",
            ),
            (
                "P1-usage-from-buffer.toml",
                GOOD.replace("llm_client.stream", "memory.store"),
                "component",
            ),
            (
                "P1-usage-from-buffer.toml",
                GOOD.replace("agent = \"demo\"", "agent = \"swe\""),
                "agent",
            ),
            (
                "P1-usage-from-buffer.toml",
                GOOD.replace("replace = \"b\\n\"", "replace = \"a\\n\""),
                "edit[0].replace",
            ),
            (
                "P1-usage-from-buffer.toml",
                GOOD.replace("demo/llm.py", "../llm.py"),
                "edit[0].file",
            ),
            (
                "P1-usage-from-buffer.toml",
                GOOD.replace("\"template\"", "\"history\""),
                "edit",
            ),
            (
                "P1-usage-from-buffer.toml",
                GOOD.replace("\"template\"", "\"removal\""),
                "edit[0].replace",
            ),
            (
                "P1-usage-from-buffer.toml",
                GOOD.replace("tasks =", "expect_syntax_error = true\ntasks ="),
                "expect_syntax_error",
            ),
        ];
        for (name, text, field) in cases {
            let err = parse_at(name, &text).unwrap_err();
            assert_eq!(err.field.as_deref(), Some(field), "{err}");
            assert!(err.to_string().contains(name), "{err}");
        }
        let err = parse_at("P1-usage-from-buffer.toml", "deficiency = 1").unwrap_err();
        assert!(err.to_string().contains("not a valid template"), "{err}");
    }

    #[test]
    fn removal_only_deletes() {
        assert!(only_deletes("if x:\n    y()\nz()\n", "y()\nz()\n"));
        assert!(only_deletes("a\nb\n", ""));
        assert!(!only_deletes("a\nb\n", "a\nc\n"));
        assert!(!only_deletes("a\nb\n", "b\na\n"));
        assert!(only_deletes(
            "for k, v in list(d.items()):\n",
            "for k, v in d.items():\n"
        ));
        assert!(!only_deletes("x = count(a)\n", "x = count(b)\n"));
    }
}
