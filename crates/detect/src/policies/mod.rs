//! Non-learned policies: [`KeywordPolicy`] (the paper's keyword-heuristics baseline) and
//! [`ExpertPolicy`] (a scripted investigator whose transcripts are warm-start demonstrations).
//! Both play the ordinary protocol: they see only observations of real tool calls.

pub mod blame;
mod expert;
mod keyword;

pub use expert::ExpertPolicy;
pub use keyword::KeywordPolicy;

use crate::investigation::Policy;

/// Policies by name, for the CLI.
pub fn by_name(name: &str) -> Result<Box<dyn Policy>, String> {
    match name {
        "keyword" => Ok(Box::new(KeywordPolicy::new()?)),
        "expert" => Ok(Box::new(ExpertPolicy::new())),
        other => Err(format!(
            "unknown policy `{other}`; expected keyword or expert"
        )),
    }
}

/// Reads a one-row table observation (every value one word) into (column, value) pairs.
pub(crate) fn one_row(observation: &str) -> Vec<(String, String)> {
    let mut lines = observation.lines();
    let (Some(header), Some(values)) = (lines.next(), lines.next()) else {
        return Vec::new();
    };
    if values.starts_with('(') {
        return Vec::new();
    }
    header
        .split_whitespace()
        .zip(values.split_whitespace())
        .map(|(h, v)| (h.to_string(), v.to_string()))
        .collect()
}

/// A SQL string literal.
pub(crate) fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}
