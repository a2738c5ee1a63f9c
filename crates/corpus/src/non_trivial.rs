//! Non-triviality: does the keyword baseline (`detect`'s `KeywordPolicy`) name the type from
//! the injected trace alone?

use std::path::Path;
use std::time::Duration;

use crate::validate::NonTriviality;

/// Imports `trace` into a scratch store and lets the keyword baseline investigate it.
pub fn keyword_baseline(trace: &Path, deficiency: &str) -> NonTriviality {
    match run(trace) {
        Ok(answer) => NonTriviality {
            keyword_available: true,
            keyword_names_it: Some(
                answer
                    .as_deref()
                    .is_some_and(|a| a.eq_ignore_ascii_case(deficiency)),
            ),
            detail: match &answer {
                Some(a) => format!("the keyword baseline answers {a}"),
                None => "the keyword baseline gave no answer".into(),
            },
            keyword_answer: answer,
        },
        Err(reason) => NonTriviality {
            keyword_available: false,
            keyword_answer: None,
            keyword_names_it: None,
            detail: format!("keyword baseline unavailable: {reason}"),
        },
    }
}

/// The Detector's default limits with generous clocks. Non-triviality is a property of the
/// trace and is part of the corpus digest, so it must not change with machine load: under the
/// interactive 5 s wall-clock limit a starved machine can kill the keyword grep, and the
/// baseline then falls back to its no-match guess.
fn config() -> detect::Config {
    let mut config = detect::Config::default();
    config.sandbox.wall = Duration::from_secs(120);
    config.sandbox.cpu_seconds = 60;
    config.sql.wall = Duration::from_secs(60);
    config
}

fn run(trace: &Path) -> Result<Option<String>, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("scratch directory: {e}"))?;
    let db = dir.path().join("store.sqlite");
    let mut store = traces::Store::open(&db).map_err(|e| e.to_string())?;
    let report = store
        .import_file(trace, traces::Format::Jsonl)
        .map_err(|e| format!("importing {}: {e}", trace.display()))?;
    drop(store);
    let trace_id = report
        .trace_ids
        .first()
        .ok_or_else(|| format!("{}: no trace imported", trace.display()))?
        .clone();
    let detector = detect::Detector::new(&db, config(), false).map_err(|e| e.to_string())?;
    let policy = detect::policies::KeywordPolicy::new()?;
    let transcript = detector
        .investigate(&trace_id, Box::new(policy))
        .map_err(|e| e.to_string())?;
    Ok(match transcript.verdict() {
        Some(detect::Verdict::Deficiency { deficiency_id, .. }) => Some(deficiency_id.clone()),
        _ => None,
    })
}
