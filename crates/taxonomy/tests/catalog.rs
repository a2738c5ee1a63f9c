//! Loads the repository's catalog and broken copies of it; every broken copy must fail with a
//! message that names the file, the field and the reason.

use std::fs;
use std::path::{Path, PathBuf};

use taxonomy::{Catalog, CatalogError, Category, Family, Manifestation};

fn repo_catalog() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deficiencies")
}

/// Copies the real catalog into a temporary directory so a test can break it.
fn scratch_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("catalog")).unwrap();
    fs::copy(
        repo_catalog().join("components.toml"),
        dir.path().join("components.toml"),
    )
    .unwrap();
    for entry in fs::read_dir(repo_catalog().join("catalog")).unwrap() {
        let path = entry.unwrap().path();
        fs::copy(
            &path,
            dir.path().join("catalog").join(path.file_name().unwrap()),
        )
        .unwrap();
    }
    dir
}

fn problems(dir: &Path) -> String {
    match Catalog::load(dir) {
        Ok(_) => panic!("a broken catalog loaded"),
        Err(err @ CatalogError::Invalid(_)) => err.to_string(),
        Err(other) => panic!("expected a validation error, got {other}"),
    }
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = fs::read_to_string(path).unwrap();
    assert!(
        text.contains(from),
        "{} does not contain {from:?}",
        path.display()
    );
    fs::write(path, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn repository_catalog_has_all_fifty_types() {
    let catalog = Catalog::load(&repo_catalog()).unwrap();
    let ids: Vec<&str> = catalog
        .deficiencies()
        .iter()
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(ids, taxonomy::expected_ids());
    for d in catalog.deficiencies() {
        assert!(!d.name.is_empty() && !d.mechanism.is_empty() && !d.trace_signature.is_empty());
        assert!(!d.components.is_empty(), "{} has no components", d.id);
        assert_eq!(d.category.family(), d.family, "{}", d.id);
        assert_eq!(
            d.source_framework.is_some(),
            d.family == Family::Production,
            "{}",
            d.id
        );
    }
    assert_eq!(catalog.in_category(Category::ToolSchema).count(), 5);
    assert_eq!(catalog.get("p16").unwrap().id, "P16");
}

#[test]
fn embedded_catalog_matches_the_repository() {
    let embedded = Catalog::embedded().unwrap();
    let on_disk = Catalog::load(&repo_catalog()).unwrap();
    assert_eq!(embedded.deficiencies(), on_disk.deficiencies());
    assert_eq!(embedded.components(), on_disk.components());
}

#[test]
fn every_manifestation_class_is_used() {
    let catalog = Catalog::embedded().unwrap();
    for m in Manifestation::ALL {
        assert!(
            catalog.deficiencies().iter().any(|d| d.manifestation == *m),
            "no {m} type"
        );
    }
}

#[test]
fn duplicated_id_is_rejected() {
    let dir = scratch_copy();
    let copy = dir.path().join("catalog/P3-copy.toml");
    fs::copy(dir.path().join("catalog/P3.toml"), &copy).unwrap();
    let message = problems(dir.path());
    assert!(
        message.contains("field `id`: duplicate id `P3`: already defined in"),
        "{message}"
    );
    assert!(message.contains("P3-copy.toml"), "{message}");
}

#[test]
fn missing_type_is_rejected() {
    let dir = scratch_copy();
    fs::remove_file(dir.path().join("catalog/C7.toml")).unwrap();
    let message = problems(dir.path());
    assert!(message.contains("missing deficiency type: C7"), "{message}");
}

#[test]
fn unknown_category_is_rejected() {
    let dir = scratch_copy();
    let file = dir.path().join("catalog/P5.toml");
    let text = fs::read_to_string(&file).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("category"))
        .unwrap()
        .to_owned();
    edit(&file, &line, "category = \"Vibes & Feelings\"");
    let message = problems(dir.path());
    assert!(
        message.contains("P5.toml: field `category`: unknown category `Vibes & Feelings`"),
        "{message}"
    );
}

#[test]
fn category_of_the_other_family_is_rejected() {
    let dir = scratch_copy();
    let file = dir.path().join("catalog/P1.toml");
    edit(
        &file,
        "Streaming & Response Handling",
        "Evaluation & Termination",
    );
    let message = problems(dir.path());
    assert!(
        message.contains(
            "P1.toml: field `category`: `Evaluation & Termination` is a conceptual category"
        ),
        "{message}"
    );
}

#[test]
fn empty_and_missing_fields_are_rejected() {
    let dir = scratch_copy();
    let file = dir.path().join("catalog/P1.toml");
    edit(
        &file,
        "name = \"Token count computed from partial stream buffer\"",
        "name = \"  \"",
    );
    let text = fs::read_to_string(&file).unwrap();
    let start = text.find("trace_signature").unwrap();
    fs::write(&file, &text[..start]).unwrap();
    let message = problems(dir.path());
    assert!(
        message.contains("P1.toml: field `name`: is empty"),
        "{message}"
    );
    assert!(
        message.contains("P1.toml: field `trace_signature`: missing"),
        "{message}"
    );
    // The broken type is reported once, for its file, not again as missing.
    assert!(!message.contains("missing deficiency type"), "{message}");
}

#[test]
fn unknown_component_is_rejected() {
    let dir = scratch_copy();
    let file = dir.path().join("catalog/P1.toml");
    edit(&file, "\"llm_client.stream\"", "\"llm_client.teleport\"");
    let message = problems(dir.path());
    assert!(
        message.contains("P1.toml: field `components`: unknown component `llm_client.teleport`"),
        "{message}"
    );
}

#[test]
fn source_framework_rules_are_enforced() {
    let dir = scratch_copy();
    edit(
        &dir.path().join("catalog/P1.toml"),
        "source_framework = \"SWE-agent\"\n",
        "",
    );
    let c1 = dir.path().join("catalog/C1.toml");
    let text = fs::read_to_string(&c1).unwrap();
    fs::write(&c1, format!("source_framework = \"CAMEL\"\n{text}")).unwrap();
    let message = problems(dir.path());
    assert!(
        message
            .contains("P1.toml: field `source_framework`: missing (required for production types)"),
        "{message}"
    );
    assert!(
        message.contains("C1.toml: field `source_framework`: not allowed on conceptual types"),
        "{message}"
    );
}

#[test]
fn file_name_must_match_id_and_toml_errors_name_the_file() {
    let dir = scratch_copy();
    fs::rename(
        dir.path().join("catalog/P2.toml"),
        dir.path().join("catalog/P02.toml"),
    )
    .unwrap();
    fs::write(
        dir.path().join("catalog/C2.toml"),
        "id = \"C2\"\nname = [unclosed\n",
    )
    .unwrap();
    let message = problems(dir.path());
    assert!(
        message.contains("P02.toml: field `id`: `P2` does not match the file name `P02.toml`"),
        "{message}"
    );
    assert!(message.contains("C2.toml: invalid TOML"), "{message}");
}

#[test]
fn unknown_field_is_rejected() {
    let dir = scratch_copy();
    let file = dir.path().join("catalog/C4.toml");
    let text = fs::read_to_string(&file).unwrap();
    fs::write(&file, format!("severity = \"high\"\n{text}")).unwrap();
    let message = problems(dir.path());
    assert!(
        message.contains("C4.toml: field `severity`: unknown field"),
        "{message}"
    );
}

#[test]
fn unreadable_directory_is_an_io_error() {
    let err = Catalog::load(Path::new("/nonexistent/pathfinder/catalog")).unwrap_err();
    assert!(matches!(err, CatalogError::Io { .. }));
    assert!(err
        .to_string()
        .contains("/nonexistent/pathfinder/catalog/components.toml"));
}
