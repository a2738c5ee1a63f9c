//! The deficiency catalog: the 50 failure types (P1–P27 production bugs, C1–C23 design flaws)
//! that the Injector plants and the Detector names, and the closed vocabulary of agent
//! components they can live in.
//!
//! The catalog is data (`deficiencies/catalog/*.toml`, `deficiencies/components.toml`); this
//! crate parses and validates it. Validation collects every problem it finds, each naming the
//! file, the field and the reason, so a broken catalog is fixed in one pass.

mod model;
mod validate;

use std::fmt;
use std::path::{Path, PathBuf};

pub use model::{Category, Component, Deficiency, Family, Manifestation, SourceFramework};

/// The answer and label of a healthy trace: no deficiency. Not a catalog id; detectors may
/// answer it and corpora label their clean runs with it, so that a detector is also judged on
/// the runs a user mostly has, the healthy ones.
pub const NONE: &str = "none";

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded.rs"));
}

/// One thing wrong with a catalog: where it is and why it is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file the problem is in (or the catalog directory, for problems of the whole set).
    pub file: PathBuf,
    /// The field at fault, when one is.
    pub field: Option<String>,
    /// What is wrong, in words.
    pub reason: String,
}

impl Problem {
    pub fn new(file: &Path, field: Option<&str>, reason: impl Into<String>) -> Problem {
        Problem {
            file: file.to_owned(),
            field: field.map(str::to_owned),
            reason: reason.into(),
        }
    }
}

impl std::error::Error for Problem {}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(
                f,
                "{}: field `{}`: {}",
                self.file.display(),
                field,
                self.reason
            ),
            None => write!(f, "{}: {}", self.file.display(), self.reason),
        }
    }
}

/// A catalog that failed to load.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The directory or a file in it could not be read.
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The catalog was read but is not valid; every problem found is listed.
    #[error("invalid deficiency catalog ({} problem{}):\n{}", .0.len(), if .0.len() == 1 { "" } else { "s" }, render_problems(.0))]
    Invalid(Vec<Problem>),
}

fn render_problems(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The validated catalog: all 50 deficiency types, in id order (P1…P27, C1…C23), and the
/// component vocabulary.
#[derive(Debug, Clone)]
pub struct Catalog {
    deficiencies: Vec<Deficiency>,
    components: Vec<Component>,
}

impl Catalog {
    /// Loads and validates the catalog in `dir`, which holds `components.toml` and a
    /// `catalog/` folder with one `<ID>.toml` per type.
    pub fn load(dir: &Path) -> Result<Catalog, CatalogError> {
        let components_path = dir.join("components.toml");
        let components_text = read(&components_path)?;
        let catalog_dir = dir.join("catalog");
        let entries = std::fs::read_dir(&catalog_dir).map_err(|source| CatalogError::Io {
            path: catalog_dir.clone(),
            source,
        })?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| CatalogError::Io {
                path: catalog_dir.clone(),
                source,
            })?;
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = read(&path)?;
                files.push((path, text));
            }
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        validate::catalog(&catalog_dir, (&components_path, &components_text), &files)
            .map_err(CatalogError::Invalid)
    }

    /// The catalog compiled into this binary from the repository's `deficiencies/`.
    pub fn embedded() -> Result<Catalog, CatalogError> {
        let dir = Path::new("<embedded>/deficiencies/catalog");
        let files: Vec<(PathBuf, String)> = embedded::CATALOG_FILES
            .iter()
            .map(|(name, text)| (dir.join(name), (*text).to_owned()))
            .collect();
        let components = Path::new("<embedded>/deficiencies/components.toml");
        validate::catalog(dir, (components, embedded::COMPONENTS_FILE), &files)
            .map_err(CatalogError::Invalid)
    }

    /// All deficiency types, P1…P27 then C1…C23.
    pub fn deficiencies(&self) -> &[Deficiency] {
        &self.deficiencies
    }

    /// The component vocabulary, in file order.
    pub fn components(&self) -> &[Component] {
        &self.components
    }

    /// The type with this id (case-insensitive: `p16` finds P16).
    pub fn get(&self, id: &str) -> Option<&Deficiency> {
        self.deficiencies
            .iter()
            .find(|d| d.id.eq_ignore_ascii_case(id))
    }

    /// The component with this id.
    pub fn component(&self, id: &str) -> Option<&Component> {
        self.components.iter().find(|c| c.id == id)
    }

    /// Types whose category is `category`.
    pub fn in_category(&self, category: Category) -> impl Iterator<Item = &Deficiency> {
        self.deficiencies
            .iter()
            .filter(move |d| d.category == category)
    }
}

fn read(path: &Path) -> Result<String, CatalogError> {
    std::fs::read_to_string(path).map_err(|source| CatalogError::Io {
        path: path.to_owned(),
        source,
    })
}

/// The 50 ids the catalog must define, in canonical order.
pub fn expected_ids() -> Vec<String> {
    (1..=27)
        .map(|n| format!("P{n}"))
        .chain((1..=23).map(|n| format!("C{n}")))
        .collect()
}
