//! Image recipes (`infra/*.toml`): what goes into an image, and the hash that names it.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Bumped whenever the build procedure in [`crate::image`] changes what it produces from the
/// same recipe (post-processing of the root filesystem, the audit hook, image config), so that
/// cached images built by an older runner are not reused.
pub const BUILD_PROCEDURE_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    #[error("{path}: cannot read the image recipe: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: field `{field}`: {reason}")]
    Field {
        path: PathBuf,
        field: &'static str,
        reason: String,
    },
}

/// A base-image recipe: a debootstrap invocation.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRecipe {
    /// Image repository name; the tag is [`ImageRecipe::input_hash`].
    pub name: String,
    pub suite: String,
    pub variant: String,
    pub components: Vec<String>,
    pub packages: Vec<String>,
    /// The recipe file's text (part of the hash: comments do not matter, but any edit
    /// rebuilding the image is the safe direction).
    #[serde(skip)]
    pub source_text: String,
    #[serde(skip)]
    pub path: PathBuf,
}

fn is_token(s: &str, extra: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || extra.contains(c))
}

impl ImageRecipe {
    pub fn load(path: &Path) -> Result<ImageRecipe, RecipeError> {
        let text = std::fs::read_to_string(path).map_err(|source| RecipeError::Read {
            path: path.to_owned(),
            source,
        })?;
        ImageRecipe::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<ImageRecipe, RecipeError> {
        let mut recipe: ImageRecipe = toml::from_str(text).map_err(|e| RecipeError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        recipe.source_text = text.to_owned();
        recipe.path = path.to_owned();
        recipe.validate()?;
        Ok(recipe)
    }

    fn validate(&self) -> Result<(), RecipeError> {
        let field = |field: &'static str, reason: String| RecipeError::Field {
            path: self.path.clone(),
            field,
            reason,
        };
        // Docker repository names: lowercase alphanumerics and separators.
        if !is_token(&self.name, "-_./") {
            return Err(field(
                "name",
                format!(
                    "{:?} is not a valid image name (lowercase letters, digits, - _ . /)",
                    self.name
                ),
            ));
        }
        if !is_token(&self.suite, "-") {
            return Err(field(
                "suite",
                format!("{:?} is not a Debian suite name", self.suite),
            ));
        }
        if !matches!(self.variant.as_str(), "minbase" | "buildd" | "fakechroot") {
            return Err(field(
                "variant",
                format!(
                    "{:?} is not a debootstrap variant (minbase, buildd, fakechroot)",
                    self.variant
                ),
            ));
        }
        if self.components.is_empty() {
            return Err(field(
                "components",
                "must name at least one component".into(),
            ));
        }
        for c in &self.components {
            if !is_token(c, "-") {
                return Err(field(
                    "components",
                    format!("{c:?} is not a component name"),
                ));
            }
        }
        if !self.packages.iter().any(|p| p == "python3") {
            return Err(field(
                "packages",
                "must include python3 (the agents are Python programs)".into(),
            ));
        }
        for p in &self.packages {
            if !is_token(p, "+-.") {
                return Err(field(
                    "packages",
                    format!("{p:?} is not a Debian package name"),
                ));
            }
        }
        Ok(())
    }

    /// Hash of everything the image is built from: the recipe text, the build procedure
    /// version and the audit hook baked into the image. 16 hex digits, used as the tag.
    pub fn input_hash(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"pathfinder-image\0");
        h.update(BUILD_PROCEDURE_VERSION.to_le_bytes());
        h.update(self.source_text.as_bytes());
        h.update(b"\0");
        h.update(crate::audit::SITECUSTOMIZE.as_bytes());
        let digest = h.finalize();
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// `name:hash`.
    pub fn image_ref(&self) -> String {
        format!("{}:{}", self.name, self.input_hash())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "pathfinder-agent-base"
suite = "bookworm"
variant = "minbase"
components = ["main"]
packages = ["python3"]
"#;

    #[test]
    fn parses_and_hashes_stably() {
        let a = ImageRecipe::parse(Path::new("r.toml"), GOOD).unwrap();
        let b = ImageRecipe::parse(Path::new("other.toml"), GOOD).unwrap();
        assert_eq!(a.input_hash(), b.input_hash());
        assert_eq!(a.input_hash().len(), 16);
        let changed = GOOD.replace("[\"python3\"]", "[\"python3\", \"git\"]");
        let c = ImageRecipe::parse(Path::new("r.toml"), &changed).unwrap();
        assert_ne!(a.input_hash(), c.input_hash());
        assert!(a.image_ref().starts_with("pathfinder-agent-base:"));
    }

    #[test]
    fn bad_fields_are_named() {
        let e =
            ImageRecipe::parse(Path::new("r.toml"), &GOOD.replace("minbase", "huge")).unwrap_err();
        assert!(e.to_string().contains("r.toml: field `variant`"), "{e}");
        let e = ImageRecipe::parse(Path::new("r.toml"), &GOOD.replace("\"python3\"", "\"vim\""))
            .unwrap_err();
        assert!(e.to_string().contains("field `packages`"), "{e}");
        let e = ImageRecipe::parse(
            Path::new("r.toml"),
            &GOOD.replace("\"pathfinder-agent-base\"", "\"Bad Name\""),
        )
        .unwrap_err();
        assert!(e.to_string().contains("field `name`"), "{e}");
        let e = ImageRecipe::parse(Path::new("r.toml"), "name = 3").unwrap_err();
        assert!(e.to_string().starts_with("r.toml: "), "{e}");
        let e =
            ImageRecipe::parse(Path::new("r.toml"), &format!("{GOOD}\nextra = 1\n")).unwrap_err();
        assert!(e.to_string().contains("extra"), "{e}");
    }
}
