//! `agents/NAME/agent.toml`: what an agent is and where its deficiency sites are.
//!
//! Validation checks every site against the component vocabulary and against the code itself
//! (the file exists and defines the named function or `Class.method`), so a manifest cannot
//! silently drift from the agent it describes when the code is refactored.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use taxonomy::Catalog;

/// A manifest that cannot be read or does not match the vocabulary or the code.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
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
    #[error("{path}: invalid manifest ({} problem{}):\n{}", problems.len(), if problems.len() == 1 { "" } else { "s" }, problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        path: PathBuf,
        problems: Vec<String>,
    },
}

/// The task suite an agent plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskSuite {
    Gaia,
    Swe,
}

impl TaskSuite {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskSuite::Gaia => "gaia",
            TaskSuite::Swe => "swe",
        }
    }
}

/// One deficiency site: a component of the vocabulary realised by a function of the agent.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Site {
    pub component: String,
    /// Relative to the agent root, e.g. `toolcaller/llm.py`.
    pub file: String,
    /// `function` or `Class.method`.
    pub function: String,
    pub description: String,
}

/// A parsed `agent.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentManifest {
    pub name: String,
    pub package: String,
    pub description: String,
    pub task_suite: TaskSuite,
    pub framework_style: String,
    #[serde(default, rename = "site")]
    pub sites: Vec<Site>,
    /// Set for an agent built on a third-party framework: its pinned wheels
    /// ([`crate::vendor`]).
    #[serde(default)]
    pub python: Option<crate::vendor::PythonDeps>,
}

impl AgentManifest {
    /// Reads `agent_dir/agent.toml` and validates it against `catalog` and the code.
    pub fn load(agent_dir: &Path, catalog: &Catalog) -> Result<AgentManifest, ManifestError> {
        let path = agent_dir.join("agent.toml");
        let text = std::fs::read_to_string(&path).map_err(|source| ManifestError::Io {
            path: path.clone(),
            source,
        })?;
        let manifest: AgentManifest =
            toml::from_str(&text).map_err(|source| ManifestError::Parse {
                path: path.clone(),
                source,
            })?;
        let problems = manifest.problems(agent_dir, catalog);
        if problems.is_empty() {
            Ok(manifest)
        } else {
            Err(ManifestError::Invalid { path, problems })
        }
    }

    /// Everything wrong with the manifest, each naming the field.
    pub fn problems(&self, agent_dir: &Path, catalog: &Catalog) -> Vec<String> {
        let mut problems = Vec::new();
        let dir_name = agent_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if self.name != dir_name {
            problems.push(format!(
                "field `name`: {:?} differs from the directory name {dir_name:?}",
                self.name
            ));
        }
        if let Some(python) = &self.python {
            match crate::vendor::Lock::load(&agent_dir.join(&python.lock)) {
                Err(e) => problems.push(format!("field `python.lock`: {e}")),
                Ok(lock) => problems.extend(lock.problems(agent_dir, &self.name)),
            }
        }
        let package_ok = !self.package.is_empty()
            && self
                .package
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !package_ok {
            problems.push(format!(
                "field `package`: {:?} is not a Python package name",
                self.package
            ));
        } else if !agent_dir.join(&self.package).join("__main__.py").is_file() {
            problems.push(format!(
                "field `package`: {}/__main__.py does not exist, so `python3 -m {}` cannot run",
                self.package, self.package
            ));
        }
        if self.sites.is_empty() {
            problems.push("field `site`: no deficiency sites".into());
        }
        for (i, site) in self.sites.iter().enumerate() {
            let at = format!("site[{i}]");
            if catalog.component(&site.component).is_none() {
                problems.push(format!(
                    "field `{at}.component`: {:?} is not in the component vocabulary",
                    site.component
                ));
            }
            if site.description.trim().is_empty() {
                problems.push(format!("field `{at}.description`: empty"));
            }
            let rel = Path::new(&site.file);
            if rel.is_absolute() || rel.components().any(|c| c.as_os_str() == "..") {
                problems.push(format!(
                    "field `{at}.file`: {:?} must be relative to the agent root",
                    site.file
                ));
                continue;
            }
            let file = agent_dir.join(rel);
            match std::fs::read_to_string(&file) {
                Err(_) => problems.push(format!("field `{at}.file`: {} does not exist", site.file)),
                Ok(code) => {
                    if !python_definitions(&code).contains(&site.function) {
                        problems.push(format!(
                            "field `{at}.function`: {} defines no {:?}",
                            site.file, site.function
                        ));
                    }
                }
            }
        }
        problems
    }

    /// The component ids the sites cover.
    pub fn covered_components(&self) -> BTreeSet<&str> {
        self.sites.iter().map(|s| s.component.as_str()).collect()
    }
}

/// The qualified names (`f`, `Class`, `Class.method`, `Outer.Inner.m`) that a Python module
/// defines; see [`crate::python::qualified_names`].
pub fn python_definitions(code: &str) -> BTreeSet<String> {
    crate::python::qualified_names(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODE: &str = r#"
import json

class StreamAssembler:
    """Assembles deltas.

    def not_a_method(self): this is in a docstring
    """

    def feed(self, chunk):
        def helper():
            pass
        return helper

    async def close(self):
        pass

def run(argv):
    class Local:
        def hidden(self):
            pass

async def main():
    pass
"#;

    #[test]
    fn finds_functions_and_methods() {
        let defs = python_definitions(CODE);
        for name in [
            "StreamAssembler",
            "StreamAssembler.feed",
            "StreamAssembler.close",
            "run",
            "main",
        ] {
            assert!(defs.contains(name), "{name} in {defs:?}");
        }
        for name in [
            "StreamAssembler.not_a_method",
            "helper",
            "StreamAssembler.feed.helper",
            "Local.hidden",
            "run.Local",
        ] {
            assert!(!defs.contains(name), "{name} in {defs:?}");
        }
    }

    fn agent_dir(manifest: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("demo");
        std::fs::create_dir_all(dir.join("demo")).unwrap();
        std::fs::write(dir.join("demo/__main__.py"), "def main():\n    pass\n").unwrap();
        std::fs::write(dir.join("demo/llm.py"), CODE).unwrap();
        std::fs::write(dir.join("agent.toml"), manifest).unwrap();
        root
    }

    #[test]
    fn valid_manifest_loads() {
        let root = agent_dir(
            r#"name = "demo"
package = "demo"
description = "d"
task_suite = "gaia"
framework_style = "Qwen-Agent"
[[site]]
component = "llm_client.stream"
file = "demo/llm.py"
function = "StreamAssembler.feed"
description = "Assembles deltas."
"#,
        );
        let catalog = Catalog::embedded().unwrap();
        let m = AgentManifest::load(&root.path().join("demo"), &catalog).unwrap();
        assert_eq!(m.task_suite, TaskSuite::Gaia);
        assert!(m.covered_components().contains("llm_client.stream"));
    }

    #[test]
    fn every_problem_is_named() {
        let root = agent_dir(
            r#"name = "other"
package = "demo"
description = "d"
task_suite = "gaia"
framework_style = "Qwen-Agent"
[[site]]
component = "llm_client.streaming"
file = "demo/llm.py"
function = "StreamAssembler.eat"
description = "x"
[[site]]
component = "tools.schema"
file = "demo/missing.py"
function = "f"
description = "x"
"#,
        );
        let catalog = Catalog::embedded().unwrap();
        let err = AgentManifest::load(&root.path().join("demo"), &catalog)
            .unwrap_err()
            .to_string();
        for needle in [
            "field `name`",
            "site[0].component",
            "site[0].function",
            "site[1].file",
        ] {
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let root = agent_dir("name = \"demo\"\npackage = \"demo\"\ndescription = \"d\"\ntask_suite = \"gaia\"\nframework_style = \"x\"\nsuite = 1\n");
        let catalog = Catalog::embedded().unwrap();
        let err = AgentManifest::load(&root.path().join("demo"), &catalog).unwrap_err();
        let text = crate::error_chain(&err);
        assert!(text.contains("unknown field `suite`"), "{text}");
    }
}
