//! Whether the corpus's types can be told apart: for every two types planted in the same agent
//! on the same task, do their injected traces differ from each other — not only from the clean
//! run? Two types whose traces match everywhere but in token counts carry labels that no
//! detector can separate on that task.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::features::{FeatureDiff, TraceFeatures};
use crate::validate::manifestation_classes;

/// Two types' traces on one (agent, task).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pair {
    pub agent: String,
    pub task: String,
    pub types: (String, String),
}

/// The confusability table of a corpus.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confusability {
    /// Same-agent, same-task pairs of different types (both validated).
    pub pairs: usize,
    /// Pairs whose traces differ in something other than token counts.
    pub differing: usize,
    /// The pairs that do not differ.
    pub alike: Vec<Pair>,
    /// Type pairs that met on at least one task and never differed on any.
    pub never_apart: Vec<(String, String)>,
}

impl Confusability {
    /// The share of pairs that differ (1 when there are none).
    pub fn share_differing(&self) -> f64 {
        if self.pairs == 0 {
            1.0
        } else {
            self.differing as f64 / self.pairs as f64
        }
    }

    /// `episodes`: (agent, task, type, injected trace features) of every valid episode.
    /// Several episodes of one type on one (agent, task) (different templates) count as
    /// apart from another type when any of them differs from any of the other's.
    pub fn of<'a>(
        episodes: impl IntoIterator<Item = (&'a str, &'a str, &'a str, &'a TraceFeatures)>,
    ) -> Confusability {
        let mut by_task: BTreeMap<(&str, &str), BTreeMap<&str, Vec<&TraceFeatures>>> =
            BTreeMap::new();
        for (agent, task, ty, features) in episodes {
            by_task
                .entry((agent, task))
                .or_default()
                .entry(ty)
                .or_default()
                .push(features);
        }
        let mut out = Confusability::default();
        let mut met: BTreeSet<(String, String)> = BTreeSet::new();
        let mut apart: BTreeSet<(String, String)> = BTreeSet::new();
        for ((agent, task), types) in &by_task {
            let types: Vec<(&&str, &Vec<&TraceFeatures>)> = types.iter().collect();
            for (i, (a, fa)) in types.iter().enumerate() {
                for (b, fb) in &types[i + 1..] {
                    let differ = fa.iter().any(|x| {
                        fb.iter().any(|y| {
                            manifestation_classes(&FeatureDiff::between(x, y))
                                .iter()
                                .any(|c| *c != "tokens")
                        })
                    });
                    let key = (a.to_string(), b.to_string());
                    met.insert(key.clone());
                    out.pairs += 1;
                    if differ {
                        out.differing += 1;
                        apart.insert(key);
                    } else {
                        out.alike.push(Pair {
                            agent: agent.to_string(),
                            task: task.to_string(),
                            types: key,
                        });
                    }
                }
            }
        }
        out.never_apart = met.difference(&apart).cloned().collect();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(tools: &[&str], input_tokens: i64) -> TraceFeatures {
        TraceFeatures {
            tool_calls: tools.iter().map(|t| t.to_string()).collect(),
            input_tokens,
            ..TraceFeatures::default()
        }
    }

    #[test]
    fn pairs_differ_in_behaviour_not_in_token_counts() {
        let search = features(&["search"], 100);
        let longer = features(&["search"], 180);
        let read = features(&["search", "read_file"], 100);
        let table = Confusability::of([
            ("toolcaller", "gaia-001", "C13", &search),
            ("toolcaller", "gaia-001", "C14", &longer),
            ("toolcaller", "gaia-001", "P9", &read),
            ("toolcaller", "gaia-002", "C13", &search),
            ("toolcaller", "gaia-002", "C14", &read),
            ("research", "gaia-001", "C17", &search),
        ]);
        // gaia-001: C13-C14 alike (tokens only), C13-P9 and C14-P9 differ; gaia-002: C13-C14
        // differ. C17 meets no other type.
        assert_eq!((table.pairs, table.differing), (4, 3));
        assert_eq!(table.alike.len(), 1);
        assert_eq!(table.alike[0].types, ("C13".into(), "C14".into()));
        assert!(
            table.never_apart.is_empty(),
            "C13 and C14 differ on gaia-002"
        );
        assert!((table.share_differing() - 0.75).abs() < 1e-12);
    }
}
