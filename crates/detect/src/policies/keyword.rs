//! The keyword baseline: grep the trace for each type's error-signature phrases
//! (`keywords.toml`) and answer the type with the most hits, at its first component. One
//! search turn (`bash`, or `sql` when the shell is disabled), then the answer.

use std::collections::BTreeMap;

use regex::{Regex, RegexBuilder};

use crate::investigation::{Policy, View};
use crate::policies::quote;

const KEYWORDS: &str = include_str!("keywords.toml");

pub struct KeywordPolicy {
    /// (type id, its patterns) in catalog file order.
    signatures: Vec<(String, Vec<Regex>)>,
    union: String,
}

impl KeywordPolicy {
    pub fn new() -> Result<KeywordPolicy, String> {
        let table: BTreeMap<String, Vec<String>> =
            toml::from_str(KEYWORDS).map_err(|e| format!("policies/keywords.toml: {e}"))?;
        let mut signatures = Vec::new();
        let mut all = Vec::new();
        for id in taxonomy::expected_ids() {
            let patterns = table.get(&id).cloned().unwrap_or_default();
            let mut compiled = Vec::new();
            for p in &patterns {
                let re = RegexBuilder::new(p)
                    .case_insensitive(true)
                    .build()
                    .map_err(|e| format!("policies/keywords.toml: {id}: pattern `{p}`: {e}"))?;
                compiled.push(re);
                all.push(p.clone());
            }
            signatures.push((id, compiled));
        }
        all.sort();
        all.dedup();
        Ok(KeywordPolicy {
            signatures,
            union: all.join("|"),
        })
    }

    /// Whether `text` shows one of `id`'s error-signature phrases. The trainer uses it to find
    /// the turn at which a failed investigation had the evidence in view.
    pub fn signature_in(&self, id: &str, text: &str) -> bool {
        self.signatures
            .iter()
            .find(|(t, _)| t == id)
            .is_some_and(|(_, res)| res.iter().any(|re| re.is_match(text)))
    }

    /// Scores each type by the hits of its patterns in `(count, matched text)` pairs.
    fn score(&self, hits: &[(u64, String)]) -> Vec<(String, u64, Vec<String>)> {
        let mut scores = Vec::new();
        for (id, patterns) in &self.signatures {
            let mut total = 0;
            let mut seen = Vec::new();
            for (n, text) in hits {
                if patterns.iter().any(|p| p.is_match(text)) {
                    total += n;
                    seen.push(format!("{text} ×{n}"));
                }
            }
            if total > 0 {
                scores.push((id.clone(), total, seen));
            }
        }
        // Most hits first; among equals, more distinct phrases, then catalog order.
        scores.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.len().cmp(&a.2.len())));
        scores
    }

    fn hits_from_grep(observation: &str) -> Vec<(u64, String)> {
        observation
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let (n, text) = l.split_once(' ')?;
                Some((n.parse().ok()?, text.trim().to_string()))
            })
            .collect()
    }

    fn hits_from_text(&self, observation: &str) -> Vec<(u64, String)> {
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        for (_, patterns) in &self.signatures {
            for p in patterns {
                for m in p.find_iter(observation) {
                    *counts.entry(m.as_str().to_string()).or_default() += 1;
                }
            }
        }
        counts.into_iter().map(|(t, n)| (n, t)).collect()
    }
}

impl Policy for KeywordPolicy {
    fn name(&self) -> String {
        "keyword".into()
    }

    fn act(&mut self, view: &View<'_>) -> Result<String, String> {
        let shell = view.system_prompt.contains("\nbash: ");
        match view.turns.len() {
            0 if shell => Ok(format!(
                "Count the error-signature phrases of every deficiency type in the spans.\nbash: grep -o -i -E {} spans.jsonl | sort | uniq -c | sort -rn",
                shell_quote(&self.union)
            )),
            0 => Ok(format!(
                "Read the error text of the spans and match the signature phrases.\nsql: SELECT name, error_type, error_message, status_message, output FROM spans WHERE trace_id = {} AND (is_error = 1 OR kind = 'llm') ORDER BY seq",
                quote(view.trace_id)
            )),
            _ => {
                let first = &view.turns[0].observation.text;
                let hits = if shell { Self::hits_from_grep(first) } else { self.hits_from_text(first) };
                let scores = self.score(&hits);
                let Some((id, n, seen)) = scores.first() else {
                    return Ok("No signature phrase matched: nothing points to a deficiency.\nanswer: none | no keyword matched".into());
                };
                let component = view
                    .system_prompt
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{id}: ")))
                    .and_then(|l| l.rsplit_once('[').map(|(_, c)| c.trim_end_matches(']').split(", ").next().unwrap_or("").to_string()))
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(|| "orchestrator.loop".to_string());
                Ok(format!("answer: {id} {component} | {n} keyword hits: {}", seen.join(", ")))
            }
        }
    }

    fn subagent(&self, _task: &str) -> Result<Box<dyn Policy>, String> {
        Err("the keyword baseline does not delegate".into())
    }
}

/// Single-quotes a word for the pipeline parser (`'` becomes `'\''`).
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_count_hits_per_type() {
        let k = KeywordPolicy::new().unwrap();
        let hits = KeywordPolicy::hits_from_grep(
            "      3 RecursionError\n      1 maximum recursion depth\n      2 No such file\n",
        );
        let scores = k.score(&hits);
        assert_eq!(scores[0].0, "P16");
        assert_eq!(scores[0].1, 4);
    }

    #[test]
    fn a_status_code_is_not_found_inside_random_ids() {
        let k = KeywordPolicy::new().unwrap();
        assert!(!k.signature_in("C5", r#"{"span_id": "a4290c1f", "trace_id": "0f429e"}"#));
        assert!(k.signature_in("C5", "HTTP 429: Rate limit reached"));
        assert!(k.signature_in("C5", r#"{"status": 429}"#));
    }

    #[test]
    fn the_union_pattern_passes_the_pipeline_parser() {
        let k = KeywordPolicy::new().unwrap();
        let text = format!(
            "grep -o -i -E {} spans.jsonl | sort | uniq -c | sort -rn",
            shell_quote(&k.union)
        );
        let p = crate::shell::parse(&text).unwrap();
        assert_eq!(p.stages[0].args[3], k.union);
    }
}
