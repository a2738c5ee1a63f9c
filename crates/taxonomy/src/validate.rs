//! Turns catalog files into a [`Catalog`], collecting every problem on the way.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use crate::model::{Category, Component, Deficiency, Family, Manifestation, SourceFramework};
use crate::{expected_ids, Catalog, Problem};

const DEFICIENCY_FIELDS: &[&str] = &[
    "id",
    "name",
    "category",
    "family",
    "source_framework",
    "manifestation",
    "components",
    "mechanism",
    "trace_signature",
];

/// Validates a whole catalog: the component vocabulary and every type file.
pub(crate) fn catalog(
    catalog_dir: &Path,
    components: (&Path, &str),
    files: &[(PathBuf, String)],
) -> Result<Catalog, Vec<Problem>> {
    let mut problems = Vec::new();
    let components = component_vocabulary(components.0, components.1, &mut problems);
    let known: HashSet<&str> = components.iter().map(|c| c.id.as_str()).collect();

    // Ids are checked for duplicates even in files that have other problems.
    let mut first_file: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut by_id: BTreeMap<String, Deficiency> = BTreeMap::new();
    for (path, text) in files {
        let (id, def) = deficiency(path, text, &known, &mut problems);
        let Some(id) = id else { continue };
        if let Some(first) = first_file.get(&id) {
            problems.push(Problem {
                file: path.clone(),
                field: Some("id".into()),
                reason: format!(
                    "duplicate id `{id}`: already defined in {}",
                    first.display()
                ),
            });
            continue;
        }
        first_file.insert(id.clone(), path.clone());
        if let Some(def) = def {
            by_id.insert(id, def);
        }
    }

    let expected = expected_ids();
    let missing: Vec<&str> = expected
        .iter()
        .filter(|id| !first_file.contains_key(id.as_str()))
        .map(String::as_str)
        .collect();
    // A type whose file failed to parse is reported for that file, not again as missing.
    let failed_files: HashSet<PathBuf> = problems.iter().map(|p| p.file.clone()).collect();
    let missing: Vec<&str> = missing
        .into_iter()
        .filter(|id| !failed_files.contains(&catalog_dir.join(format!("{id}.toml"))))
        .collect();
    if !missing.is_empty() {
        problems.push(Problem {
            file: catalog_dir.to_owned(),
            field: None,
            reason: format!(
                "missing deficiency type{}: {} (the catalog must define exactly P1–P27 and C1–C23)",
                if missing.len() == 1 { "" } else { "s" },
                missing.join(", ")
            ),
        });
    }

    if !problems.is_empty() {
        return Err(problems);
    }
    let mut deficiencies: Vec<Deficiency> = by_id.into_values().collect();
    deficiencies.sort_by_key(|d| (d.family != Family::Production, d.number()));
    Ok(Catalog {
        deficiencies,
        components,
    })
}

fn component_vocabulary(path: &Path, text: &str, problems: &mut Vec<Problem>) -> Vec<Component> {
    let problem = |field: Option<String>, reason: String| Problem {
        file: path.to_owned(),
        field,
        reason,
    };
    let table: toml::Table = match toml::from_str(text) {
        Ok(t) => t,
        Err(e) => {
            problems.push(problem(
                None,
                format!("invalid TOML: {}", one_line(&e.to_string())),
            ));
            return Vec::new();
        }
    };
    let Some(list) = table.get("component").and_then(|v| v.as_array()) else {
        problems.push(problem(
            Some("component".into()),
            "missing: expected a list of [[component]] tables".into(),
        ));
        return Vec::new();
    };
    let mut out: Vec<Component> = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let field = |name: &str| Some(format!("component[{i}].{name}"));
        let get = |name: &str| item.get(name).and_then(|v| v.as_str()).map(str::trim);
        let id = get("id").unwrap_or_default();
        let description = get("description").unwrap_or_default();
        if id.is_empty() {
            problems.push(problem(field("id"), "missing or empty".into()));
            continue;
        }
        if !is_component_id(id) {
            problems.push(problem(
                field("id"),
                format!("`{id}` is not of the form `area.part` (lowercase letters, digits, `_`)"),
            ));
        }
        if description.is_empty() {
            problems.push(problem(field("description"), "missing or empty".into()));
        }
        if out.iter().any(|c| c.id == id) {
            problems.push(problem(
                field("id"),
                format!("duplicate component id `{id}`"),
            ));
            continue;
        }
        out.push(Component {
            id: id.to_owned(),
            description: description.to_owned(),
        });
    }
    out
}

fn is_component_id(id: &str) -> bool {
    let mut parts = id.split('.');
    let ok = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    matches!((parts.next(), parts.next(), parts.next()), (Some(a), Some(b), None) if ok(a) && ok(b))
}

fn deficiency(
    path: &Path,
    text: &str,
    known_components: &HashSet<&str>,
    problems: &mut Vec<Problem>,
) -> (Option<String>, Option<Deficiency>) {
    let before = problems.len();
    let mut report = |field: &str, reason: String| {
        problems.push(Problem {
            file: path.to_owned(),
            field: (!field.is_empty()).then(|| field.to_owned()),
            reason,
        })
    };
    let table: toml::Table = match toml::from_str(text) {
        Ok(t) => t,
        Err(e) => {
            report("", format!("invalid TOML: {}", one_line(&e.to_string())));
            return (None, None);
        }
    };
    for key in table.keys() {
        if !DEFICIENCY_FIELDS.contains(&key.as_str()) {
            report(
                key,
                format!(
                    "unknown field; expected one of: {}",
                    DEFICIENCY_FIELDS.join(", ")
                ),
            );
        }
    }
    let text_field = |name: &str, report: &mut dyn FnMut(&str, String)| -> Option<String> {
        match table.get(name) {
            None => {
                report(name, "missing".into());
                None
            }
            Some(toml::Value::String(s)) if s.trim().is_empty() => {
                report(name, "is empty".into());
                None
            }
            Some(toml::Value::String(s)) => Some(s.trim().to_owned()),
            Some(other) => {
                report(
                    name,
                    format!("expected a string, found {}", other.type_str()),
                );
                None
            }
        }
    };

    let id = text_field("id", &mut report);
    let name = text_field("name", &mut report);
    let category_text = text_field("category", &mut report);
    let family_text = text_field("family", &mut report);
    let manifestation_text = text_field("manifestation", &mut report);
    let mechanism = text_field("mechanism", &mut report);
    let trace_signature = text_field("trace_signature", &mut report);

    if let Some(id) = &id {
        if !expected_ids().contains(id) {
            report(
                "id",
                format!("`{id}` is not a catalog id (expected P1–P27 or C1–C23)"),
            );
        } else if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
            if stem != id {
                report(
                    "id",
                    format!("`{id}` does not match the file name `{stem}.toml`"),
                );
            }
        }
    }

    let category = category_text.as_deref().and_then(|c| {
        let parsed = Category::ALL.iter().copied().find(|k| k.as_str() == c);
        if parsed.is_none() {
            let all: Vec<&str> = Category::ALL.iter().map(|k| k.as_str()).collect();
            report(
                "category",
                format!(
                    "unknown category `{c}`; expected one of: {}",
                    all.join("; ")
                ),
            );
        }
        parsed
    });

    let family = family_text.as_deref().and_then(|f| {
        let parsed = Family::ALL.iter().copied().find(|k| k.as_str() == f);
        if parsed.is_none() {
            report(
                "family",
                format!("unknown family `{f}`; expected `production` or `conceptual`"),
            );
        }
        parsed
    });

    if let (Some(family), Some(id)) = (family, &id) {
        if !id.starts_with(family.prefix()) {
            report(
                "family",
                format!(
                    "`{}` does not fit id `{id}` ({}-types are {})",
                    family.as_str(),
                    &id[..1],
                    if id.starts_with('P') {
                        "production"
                    } else {
                        "conceptual"
                    }
                ),
            );
        }
    }
    if let (Some(family), Some(category)) = (family, category) {
        if category.family() != family {
            report(
                "category",
                format!(
                    "`{category}` is a {} category, but the type is {}",
                    category.family().as_str(),
                    family.as_str()
                ),
            );
        }
    }

    let manifestation = manifestation_text.as_deref().and_then(|m| {
        let parsed = Manifestation::ALL.iter().copied().find(|k| k.as_str() == m);
        if parsed.is_none() {
            report(
                "manifestation",
                format!("unknown manifestation `{m}`; expected crash, explicit_error or silent"),
            );
        }
        parsed
    });

    let source_framework = match (table.get("source_framework"), family) {
        (None, Some(Family::Production)) => {
            report(
                "source_framework",
                "missing (required for production types)".into(),
            );
            None
        }
        (Some(_), Some(Family::Conceptual)) => {
            report("source_framework", "not allowed on conceptual types".into());
            None
        }
        (Some(toml::Value::String(s)), _) => {
            let parsed = SourceFramework::ALL
                .iter()
                .copied()
                .find(|k| k.as_str() == s.trim());
            if parsed.is_none() {
                let all: Vec<&str> = SourceFramework::ALL.iter().map(|k| k.as_str()).collect();
                report(
                    "source_framework",
                    format!(
                        "unknown framework `{s}`; expected one of: {}",
                        all.join(", ")
                    ),
                );
            }
            parsed
        }
        (Some(other), _) => {
            report(
                "source_framework",
                format!("expected a string, found {}", other.type_str()),
            );
            None
        }
        (None, _) => None,
    };

    let components = match table.get("components") {
        None => {
            report("components", "missing".into());
            Vec::new()
        }
        Some(toml::Value::Array(items)) => {
            if items.is_empty() {
                report("components", "is empty: name at least one component".into());
            }
            let mut out: Vec<String> = Vec::new();
            for item in items {
                match item.as_str() {
                    Some(c) if known_components.contains(c) => {
                        if out.iter().any(|o| o == c) {
                            report("components", format!("`{c}` is listed twice"));
                        } else {
                            out.push(c.to_owned());
                        }
                    }
                    Some(c) => report(
                        "components",
                        format!("unknown component `{c}` (not defined in components.toml)"),
                    ),
                    None => report(
                        "components",
                        format!("expected strings, found {}", item.type_str()),
                    ),
                }
            }
            out
        }
        Some(other) => {
            report(
                "components",
                format!("expected a list of strings, found {}", other.type_str()),
            );
            Vec::new()
        }
    };

    let valid = problems.len() == before;
    let def = (|| {
        Some(Deficiency {
            id: id.clone()?,
            name: name?,
            category: category?,
            family: family?,
            source_framework,
            manifestation: manifestation?,
            components,
            mechanism: one_paragraph(&mechanism?),
            trace_signature: one_paragraph(&trace_signature?),
        })
    })();
    (id, if valid { def } else { None })
}

/// Joins a multi-line TOML string into one paragraph.
fn one_paragraph(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn component_ids_are_two_lowercase_parts() {
        assert!(is_component_id("llm_client.stream"));
        assert!(is_component_id("tools.schema"));
        assert!(!is_component_id("tools"));
        assert!(!is_component_id("tools.schema.extra"));
        assert!(!is_component_id("Tools.schema"));
        assert!(!is_component_id("tools."));
    }

    #[test]
    fn multi_line_strings_become_one_paragraph() {
        assert_eq!(one_paragraph("  a \\\n  b\n\nc  "), "a \\ b c");
        assert_eq!(one_paragraph("one\ntwo"), "one two");
    }

    #[test]
    fn a_vocabulary_without_components_is_reported() {
        let mut problems = Vec::new();
        let out = component_vocabulary(Path::new("c.toml"), "title = 'x'", &mut problems);
        assert!(out.is_empty());
        assert_eq!(
            problems[0].to_string(),
            "c.toml: field `component`: missing: expected a list of [[component]] tables"
        );
    }
}
