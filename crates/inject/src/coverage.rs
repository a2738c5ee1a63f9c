//! Coverage: which (type, agent) cells the templates on disk fill, and whether each template
//! really applies to its agent.

use std::collections::BTreeMap;
use std::path::Path;

use agents::Workspace;
use git2::build::CheckoutBuilder;
use git2::Repository;
use serde::Serialize;
use taxonomy::Catalog;

use crate::engine::{self, InjectError, Options};
use crate::template::Template;

/// Template counts per (type, agent).
#[derive(Debug, Clone, Serialize)]
pub struct Coverage {
    /// Catalog ids, in catalog order.
    pub types: Vec<String>,
    pub agents: Vec<String>,
    /// `counts[type][agent]`.
    pub counts: BTreeMap<String, BTreeMap<String, usize>>,
}

impl Coverage {
    pub fn new(catalog: &Catalog, agents: &[String], templates: &[Template]) -> Coverage {
        let types: Vec<String> = catalog
            .deficiencies()
            .iter()
            .map(|d| d.id.clone())
            .collect();
        let mut counts: BTreeMap<String, BTreeMap<String, usize>> = types
            .iter()
            .map(|t| (t.clone(), agents.iter().map(|a| (a.clone(), 0)).collect()))
            .collect();
        for t in templates {
            if let Some(row) = counts.get_mut(&t.deficiency) {
                *row.entry(t.agent.clone()).or_insert(0) += 1;
            }
        }
        Coverage {
            types,
            agents: agents.to_vec(),
            counts,
        }
    }

    pub fn count(&self, ty: &str, agent: &str) -> usize {
        self.counts
            .get(ty)
            .and_then(|r| r.get(agent))
            .copied()
            .unwrap_or(0)
    }

    /// The (type, agent) cells without a template, in catalog order.
    pub fn empty_cells(&self) -> Vec<(String, String)> {
        self.types
            .iter()
            .flat_map(|t| {
                self.agents
                    .iter()
                    .filter(|a| self.count(t, a) == 0)
                    .map(move |a| (t.clone(), a.clone()))
            })
            .collect()
    }

    pub fn filled_cells(&self) -> usize {
        self.types.len() * self.agents.len() - self.empty_cells().len()
    }

    /// The table: one row per type, one column per agent, `✓N` or `·`.
    pub fn render(&self) -> String {
        let width = self
            .agents
            .iter()
            .map(|a| a.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let mut out = format!("{:<5}", "type");
        for a in &self.agents {
            out.push_str(&format!(" {a:>width$}"));
        }
        out.push('\n');
        for t in &self.types {
            out.push_str(&format!("{t:<5}"));
            for a in &self.agents {
                let cell = match self.count(t, a) {
                    0 => "·".to_owned(),
                    n => format!("✓{n}"),
                };
                out.push_str(&format!(" {cell:>width$}"));
            }
            out.push('\n');
        }
        out
    }
}

/// The outcome of applying one template in [`check_templates`].
#[derive(Debug)]
pub struct Checked {
    pub key: String,
    pub agent: String,
    pub result: Result<engine::Injection, InjectError>,
}

/// Applies every template to a fresh materialisation of its agent (one per agent, under
/// `scratch`, which must be empty or absent), returning each result. A template that does not
/// apply is reported, not fatal; an agent that cannot be loaded fails all its templates.
pub fn check_templates(
    workspace: &Workspace,
    catalog: &Catalog,
    templates: &[Template],
    scratch: &Path,
    options: &Options,
) -> Vec<Checked> {
    let mut by_agent: BTreeMap<&str, Vec<&Template>> = BTreeMap::new();
    for t in templates {
        by_agent.entry(t.agent.as_str()).or_default().push(t);
    }
    let mut out = Vec::new();
    for (name, ts) in by_agent {
        let prepared = (|| {
            let agent = workspace
                .agent(name, catalog)
                .map_err(|e| InjectError::Workspace(Box::new(e)))?;
            let dir = scratch.join(name);
            let m = agents::history::materialize(&agent.name, &agent.dir, &agent.series, &dir)
                .map_err(|e| InjectError::History(Box::new(e)))?;
            let repo = Repository::open(&dir).map_err(|source| InjectError::Git {
                context: format!("opening {}", dir.display()),
                source,
            })?;
            Ok::<_, InjectError>((repo, m.head))
        })();
        match prepared {
            Err(e) => {
                let msg = e.to_string();
                for t in ts {
                    out.push(Checked {
                        key: t.key(),
                        agent: name.to_owned(),
                        result: Err(InjectError::Output {
                            path: t.path.clone(),
                            reason: format!("agent unavailable: {msg}"),
                        }),
                    });
                }
            }
            Ok((repo, base)) => {
                for t in ts {
                    let result = engine::apply_template(&repo, t, options);
                    // Back to the clean base for the next template.
                    let reset = repo
                        .set_head_detached(base)
                        .and_then(|_| repo.checkout_head(Some(CheckoutBuilder::new().force())));
                    let result = match (result, reset) {
                        (r, Ok(())) => r,
                        (_, Err(source)) => Err(InjectError::Git {
                            context: "returning to the base commit".into(),
                            source,
                        }),
                    };
                    out.push(Checked {
                        key: t.key(),
                        agent: name.to_owned(),
                        result,
                    });
                }
            }
        }
    }
    out
}
