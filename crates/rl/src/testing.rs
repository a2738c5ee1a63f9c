//! Fixtures for tests of the trainer, here and in the crates above it.

use std::collections::BTreeMap;
use std::path::Path;

use crate::{Result, RlError};

/// A small labelled corpus in `dir` (the layout `corpus generate` writes, without episodes):
/// the detector's synthetic scenarios three times over in `store.sqlite`, two repeats of each
/// in the train split, the third in val (even scenarios) or test (odd ones).
pub fn synthetic_corpus(dir: &Path) -> Result<()> {
    let splits_dir = dir.join("splits");
    std::fs::create_dir_all(&splits_dir).map_err(|e| RlError::io(&splits_dir, e))?;
    let labels = detect::synthetic::build_store(&dir.join("store.sqlite"), 3)
        .map_err(|e| RlError::Environment(e.to_string()))?;
    let mut splits: BTreeMap<&str, String> = BTreeMap::new();
    for (i, (trace_id, _)) in labels.iter().enumerate() {
        let (scenario, repeat) = (i / 3, i % 3);
        let split = match (repeat, scenario % 2) {
            (0 | 1, _) => "train",
            (_, 0) => "val",
            _ => "test",
        };
        splits
            .entry(split)
            .or_default()
            .push_str(&format!("{{\"trace_id\": \"{trace_id}\"}}\n"));
    }
    for (split, text) in splits {
        let path = splits_dir.join(format!("{split}.jsonl"));
        std::fs::write(&path, text).map_err(|e| RlError::io(&path, e))?;
    }
    let records = dir.join("corpus.jsonl");
    std::fs::write(&records, "").map_err(|e| RlError::io(&records, e))
}
