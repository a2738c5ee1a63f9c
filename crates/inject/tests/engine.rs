//! The engine against the real agents, with the fixture templates in tests/fixtures/.

use std::path::{Path, PathBuf};

use agents::Workspace;
use git2::Repository;
use inject::{
    check_templates, inject_diff, inject_template, load_agent, template, Coverage, InjectError,
    Options, Strategy, Template,
};
use taxonomy::Catalog;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn workspace() -> Workspace {
    Workspace::open(&root().join("agents")).unwrap()
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates")
}

fn fixture(name: &str) -> Template {
    let catalog = Catalog::embedded().unwrap();
    template::load(&fixtures().join("toolcaller").join(name), &catalog).unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

fn lines(text: &str, start: usize, end: usize) -> String {
    text.lines()
        .skip(start - 1)
        .take(end + 1 - start)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn fixtures_load() {
    let catalog = Catalog::embedded().unwrap();
    let all = inject::load_dir(&fixtures(), &catalog).unwrap();
    let keys: Vec<String> = all.iter().map(Template::key).collect();
    assert_eq!(
        keys,
        [
            "P19-no-items-check",
            "P2-keep-last-fragment",
            "P24-strict-corpus-decoding"
        ]
    );
    let cov = Coverage::new(&catalog, &["toolcaller".into(), "swe".into()], &all);
    assert_eq!(cov.count("P2", "toolcaller"), 1);
    assert_eq!(cov.count("P2", "swe"), 0);
    assert_eq!(cov.filled_cells(), 3);
    assert_eq!(cov.empty_cells().len(), 100 - 3);
    assert!(cov.render().contains("P2 "));
}

#[test]
fn template_injection_writes_the_artifact() {
    let catalog = Catalog::embedded().unwrap();
    let agent = load_agent(&workspace(), "toolcaller", &catalog).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bug");
    let t = fixture("P2-keep-last-fragment.toml");
    let art = inject_template(&agent, &t, &catalog, &out, &Options::default()).unwrap();

    assert_eq!(read(&out.join("deficiency_type")), "P2\n");
    let sig = read(&out.join("trace_signature"));
    assert_eq!(
        sig.trim(),
        catalog.get("P2").unwrap().trace_signature.trim()
    );
    let diff = read(&out.join("deficiency_inject.diff"));
    assert!(diff.starts_with("diff --git a/toolcaller/llm.py b/toolcaller/llm.py"));
    assert!(
        diff.contains("-                    slot[\"arguments\"].append(function[\"arguments\"])")
    );
    assert!(diff.contains("+                    slot[\"arguments\"] = [function[\"arguments\"]]"));

    let loc: inject::Location = serde_json::from_str(&read(&out.join("location.json"))).unwrap();
    assert_eq!(loc.file, "toolcaller/llm.py");
    assert_eq!(loc.function.as_deref(), Some("StreamAssembler.feed"));
    assert_eq!(loc.component.as_deref(), Some("llm_client.stream"));
    assert_eq!(loc.line_end - loc.line_start, 1);
    // The range is where `replace` now stands in the checked-out file.
    let code = read(&out.join("repo/toolcaller/llm.py"));
    assert_eq!(
        lines(&code, loc.line_start, loc.line_end) + "\n",
        t.edits[0].replace
    );

    let repo = Repository::open(out.join("repo")).unwrap();
    let head = repo.head().unwrap();
    assert_eq!(head.shorthand().ok(), Some("inject/P2-keep-last-fragment"));
    assert_eq!(
        head.peel_to_commit().unwrap().id().to_string(),
        art.injection.commit
    );
    assert_eq!(
        repo.statuses(None).unwrap().len(),
        0,
        "the work tree is clean"
    );
    // The same injection twice gives the same commit.
    let again = inject_template(
        &agent,
        &t,
        &catalog,
        &tmp.path().join("bug2"),
        &Options::default(),
    )
    .unwrap();
    assert_eq!(again.injection.commit, art.injection.commit);
    // An occupied output is refused.
    let err = inject_template(&agent, &t, &catalog, &out, &Options::default()).unwrap_err();
    assert!(err.to_string().contains("not empty"), "{err}");
}

#[test]
fn removal_and_history_injections_locate_their_change() {
    let catalog = Catalog::embedded().unwrap();
    let agent = load_agent(&workspace(), "toolcaller", &catalog).unwrap();
    let tmp = tempfile::tempdir().unwrap();

    let removal = fixture("P19-no-items-check.toml");
    assert_eq!(removal.strategy, Strategy::Removal);
    let art = inject_template(
        &agent,
        &removal,
        &catalog,
        &tmp.path().join("r"),
        &Options::default(),
    )
    .unwrap();
    assert!(art
        .injection
        .diff
        .lines()
        .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
        .all(|l| l.trim() == "+"));
    assert_eq!(art.injection.location.function.as_deref(), Some("validate"));
    assert_eq!(
        art.injection.location.line_start,
        art.injection.location.line_end
    );

    let history = fixture("P24-strict-corpus-decoding.toml");
    let art = inject_template(
        &agent,
        &history,
        &catalog,
        &tmp.path().join("h"),
        &Options::default(),
    )
    .unwrap();
    let loc = &art.injection.location;
    assert_eq!(loc.file, "toolcaller/tools/corpus.py");
    assert_eq!(loc.function.as_deref(), Some("read_text"));
    assert_eq!(loc.component.as_deref(), Some("parsing.encoding"));
    let code = read(&tmp.path().join("h/repo/toolcaller/tools/corpus.py"));
    assert!(lines(&code, loc.line_start, loc.line_end).contains("encoding=\"utf-8\""));
    assert!(art
        .injection
        .diff
        .contains("-    return path.read_bytes().decode"));
    assert_eq!(art.injection.strategy, "history");
}

/// Writes a variant of the P2 fixture with `edit` applied to its text, in a toolcaller dir.
fn broken(tmp: &Path, name: &str, edit: impl Fn(String) -> String) -> Template {
    let text = edit(read(
        &fixtures().join("toolcaller/P2-keep-last-fragment.toml"),
    ));
    let dir = tmp.join("templates/toolcaller");
    std::fs::create_dir_all(&dir).unwrap();
    let text = text.replace("keep-last-fragment", name);
    let path = dir.join(format!("P2-{name}.toml"));
    std::fs::write(&path, text).unwrap();
    template::load(&path, &Catalog::embedded().unwrap()).unwrap()
}

/// Rewrites a template's text.
type Rewrite = Box<dyn Fn(String) -> String>;

#[test]
fn templates_that_do_not_fit_the_code_name_file_and_field() {
    let catalog = Catalog::embedded().unwrap();
    let agent = load_agent(&workspace(), "toolcaller", &catalog).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Rewrite, &str, &str)> = vec![
        (
            "absent",
            Box::new(|t| t.replace(".append(function", ".extend(function")),
            "edit[0].find",
            "does not occur",
        ),
        (
            "wrong-function",
            Box::new(|t| t.replace("StreamAssembler.feed", "StreamAssembler.result")),
            "edit[0].find",
            "outside StreamAssembler.result",
        ),
        (
            "no-function",
            Box::new(|t| t.replace("StreamAssembler.feed", "StreamAssembler.eat")),
            "edit[0].function",
            "defines no function",
        ),
        (
            "missing-file",
            Box::new(|t| t.replace("toolcaller/llm.py", "toolcaller/nope.py")),
            "edit[0].file",
            "is not a text file",
        ),
        (
            "syntax",
            Box::new(|t| t.replace("= [function[\"arguments\"]]", "= [function[\"arguments\"]")),
            "edit",
            "no longer parses",
        ),
        (
            "twice",
            Box::new(|t| {
                let start = t.find("find = '''").unwrap();
                let end = t.find("replace = '''").unwrap();
                format!("{}find = \"if function.get(\"\n{}", &t[..start], &t[end..])
            }),
            "edit[0].find",
            "occurs 2 times",
        ),
    ];
    for (name, edit, field, reason) in cases {
        let t = broken(tmp.path(), name, edit);
        let out = tmp.path().join(format!("out-{name}"));
        let err = inject_template(&agent, &t, &catalog, &out, &Options::default()).unwrap_err();
        let InjectError::Template(p) = &err else {
            panic!("{name}: {err}")
        };
        assert_eq!(p.field.as_deref(), Some(field), "{name}: {err}");
        assert!(p.file.ends_with(format!("P2-{name}.toml")), "{name}: {err}");
        assert!(err.to_string().contains(reason), "{name}: {err}");
        assert!(!out.exists(), "{name}: nothing half-written");
    }
    // History: an unknown subject.
    let dir = tmp.path().join("templates/toolcaller");
    let path = dir.join("P24-unknown.toml");
    std::fs::write(
        &path,
        read(&fixtures().join("toolcaller/P24-strict-corpus-decoding.toml"))
            .replace("strict-corpus-decoding", "unknown")
            .replace("Decode corpus files", "Decode nothing"),
    )
    .unwrap();
    let t = template::load(&path, &catalog).unwrap();
    let err = inject_template(
        &agent,
        &t,
        &catalog,
        &tmp.path().join("h"),
        &Options::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("P24-unknown.toml: field `revert`"), "{err}");
    assert!(err.contains("Decode nothing"), "{err}");
}

#[test]
fn free_form_diffs_apply_or_are_rejected_with_reasons() {
    let catalog = Catalog::embedded().unwrap();
    let agent = load_agent(&workspace(), "toolcaller", &catalog).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    // A diff made by the engine from a template applies as a free-form diff, to the same tree.
    let from_template = inject_template(
        &agent,
        &fixture("P2-keep-last-fragment.toml"),
        &catalog,
        &tmp.path().join("t"),
        &Options::default(),
    )
    .unwrap();
    let art = inject_diff(
        &agent,
        &from_template.injection.diff,
        Some("P2"),
        &catalog,
        &tmp.path().join("f"),
        &Options::default(),
    )
    .unwrap();
    assert_eq!(art.injection.location.file, "toolcaller/llm.py");
    assert_eq!(
        art.injection.location.function.as_deref(),
        Some("StreamAssembler.feed")
    );
    // The template's range also holds the unchanged `if` line of its `find`; the diff's range
    // is only the changed line.
    let (t, f) = (&from_template.injection.location, &art.injection.location);
    assert_eq!((f.line_start, f.line_end), (t.line_start + 1, t.line_end));
    assert_eq!(
        art.injection.location.component.as_deref(),
        Some("llm_client.stream"),
        "the site's component"
    );
    assert!(art.injection.key.starts_with("P2-freeform-"));
    assert_eq!(read(&tmp.path().join("f/deficiency_type")), "P2\n");

    let good = from_template.injection.diff.clone();
    let rejected = |name: &str, text: &str| -> String {
        let out = tmp.path().join(name);
        let err = inject_diff(&agent, text, None, &catalog, &out, &Options::default())
            .unwrap_err()
            .to_string();
        assert!(!out.exists(), "{name}: nothing half-written");
        err
    };
    assert!(rejected("empty", "  \n").contains("empty"));
    let err = rejected("prose", "please make the agent worse\n");
    assert!(
        err.contains("empty") || err.contains("not a unified diff"),
        "{err}"
    );
    let manifest = good.replace("toolcaller/llm.py", "agent.toml");
    assert!(rejected("manifest", &manifest).contains("outside the agent"));
    let history = good.replace("toolcaller/llm.py", "history/series.toml");
    assert!(rejected("history", &history).contains("outside the agent"));
    let escape = good.replace("a/toolcaller/llm.py", "a/../etc/passwd");
    assert!(rejected("escape", &escape).contains("outside the agent"));
    let missing = good.replace("toolcaller/llm.py", "toolcaller/nope.py");
    let err = rejected("missing", &missing);
    assert!(err.contains("toolcaller/nope.py: no such file"), "{err}");
    let stale = good.replace("slot[\"arguments\"].append", "slot[\"args\"].append");
    let err = rejected("stale", &stale);
    assert!(err.contains("toolcaller/llm.py: hunk 1 (@@"), "{err}");
}

#[test]
fn fixture_templates_all_check() {
    let catalog = Catalog::embedded().unwrap();
    let all = inject::load_dir(&fixtures(), &catalog).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let checked = check_templates(
        &workspace(),
        &catalog,
        &all,
        tmp.path(),
        &Options::default(),
    );
    assert_eq!(checked.len(), 3);
    for c in checked {
        assert!(c.result.is_ok(), "{}: {}", c.key, c.result.unwrap_err());
    }
}

/// The coverage check of the real template set: every template in deficiencies/templates/
/// loads and applies cleanly to its agent.
#[test]
fn every_real_template_applies() {
    let catalog = Catalog::embedded().unwrap();
    let dir = root().join("deficiencies/templates");
    let all = match inject::load_dir(&dir, &catalog) {
        Ok(all) => all,
        Err(problems) => panic!(
            "{}",
            problems
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        ),
    };
    let tmp = tempfile::tempdir().unwrap();
    let failures: Vec<String> = check_templates(
        &workspace(),
        &catalog,
        &all,
        tmp.path(),
        &Options::default(),
    )
    .into_iter()
    .filter_map(|c| {
        c.result
            .err()
            .map(|e| format!("{}/{}: {e}", c.agent, c.key))
    })
    .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
