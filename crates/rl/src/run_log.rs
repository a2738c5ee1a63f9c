//! `RUN/metrics.jsonl` (one line per step) and `RUN/eval.jsonl` (one line per held-out
//! evaluation). `pathfinder report` and `pathfinder eval --run` read them; the field names are
//! that contract.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Result, RlError};

/// One training step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    pub step: u64,
    /// `sft` or `ppo`.
    pub phase: String,
    pub unix_ms: u64,
    pub reward_injector: Option<f64>,
    pub reward_detector: Option<f64>,
    pub reward_joint: Option<f64>,
    /// Over this step's investigations.
    pub detection_accuracy: Option<f64>,
    pub localisation_accuracy: Option<f64>,
    pub injection_unique_types: Option<usize>,
    /// Shannon entropy (nats) of this step's chosen types.
    pub injection_entropy: Option<f64>,
    /// Mean tool calls per investigation.
    pub query_depth: Option<f64>,
    /// KL to the base model (adapters off) per trained token, before the update: over the
    /// step's PPO batches, or (warm start) the Detector's on the demonstrations.
    pub kl: Option<f64>,
    pub clip_fraction: Option<f64>,
    pub value_loss: Option<f64>,
    pub policy_loss: Option<f64>,
    pub entropy: Option<f64>,
    /// Supervised warm start: mean negative log-likelihood of the demonstrations.
    pub sft_loss: Option<f64>,
    pub episodes_per_min: Option<f64>,
    pub tokens_per_s: Option<f64>,
    pub valid_injections: Option<usize>,
    /// The Detector's investigations (`detector.samples_per_trace` per valid injection).
    pub investigations: Option<usize>,
    pub episodes: Option<usize>,
    pub higher_order: Option<usize>,
    /// Mean reward of the higher-order (review) examples.
    pub reward_review: Option<f64>,
    pub seconds: Option<f64>,
    /// The decision head's fit (warm start, `phase` "sft-head"): the epoch, and the answer's
    /// mean NLL and top-1/top-5 accuracy on the train split and on the validation split.
    pub epoch: Option<usize>,
    pub answer_nll: Option<f64>,
    pub answer_top1: Option<f64>,
    pub answer_top5: Option<f64>,
    pub val_answer_nll: Option<f64>,
    pub val_answer_top1: Option<f64>,
    pub val_answer_top5: Option<f64>,
    /// PPO on the decision head: KL(π ‖ π_warm-start) over the answer distribution, and
    /// whether the batch carried no advantage (and so took no step).
    pub head_kl: Option<f64>,
    pub skipped_update: Option<bool>,
    /// The head's higher-order review: the failures it holds, the share of them it named
    /// before and after the review, and the train split's top-1 after it.
    pub review_failures: Option<usize>,
    pub review_top1_before: Option<f64>,
    pub review_top1_after: Option<f64>,
    pub review_train_top1_after: Option<f64>,
    /// The operating point (`none`'s shift, nats) when this step set it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub none_shift: Option<f64>,
    /// Healthy traces (clean runs) investigated in this step, and the share of them the
    /// greedy answer called deficient.
    #[serde(default)]
    pub healthy_investigated: Option<usize>,
    #[serde(default)]
    pub healthy_false_positive_rate: Option<f64>,
    /// Where a PPO step's wall clock went, by phase (`propose`, `episodes` — the agents' runs
    /// and the investigations beside them —, `score`, `update_injector`, `update_detector`,
    /// `update_head`), in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_seconds: Option<std::collections::BTreeMap<String, f64>>,
    /// The blame head's PPO step (`[blame]`): its batch's mean reward and share of exact
    /// steps (sampled turns), KL(π ‖ π_warm-start) before the update, entropy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blame_reward: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blame_exact: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blame_kl: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blame_entropy: Option<f64>,
}

/// The blame head on a set of labelled logs (`eval-blame.jsonl`): greedy choices, shares of
/// the logs. `split`: `train`, `held-out` (the evaluation split's logs) or `left-out` (the
/// frameworks left out of training); the warm start's fit also logs its loss (`nll`) on
/// `train`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlameEval {
    pub step: u64,
    /// `sft` (the warm-started head) or `ppo`.
    pub policy: String,
    pub split: String,
    pub logs: usize,
    /// Absent on the fit's lines, which log the labelled turn's loss and top-1 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<f64>,
    pub exact: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within_one: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nll: Option<f64>,
}

/// One held-out evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalMetrics {
    pub step: u64,
    pub split: String,
    pub detection_accuracy: f64,
    pub localisation_accuracy: f64,
    pub avg_tool_calls: f64,
    pub n: usize,
    /// `sft` (the warm-started policy before any PPO step), `ppo`, or `base`.
    pub policy: String,
    /// Healthy traces called deficient, over the split's healthy traces (absent: none there).
    #[serde(default)]
    pub false_positive_rate: Option<f64>,
}

/// One held-out case of an evaluation (`eval-cases.jsonl`): what the Detector answered on each
/// trace, so a run's accuracy can be read trace by trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalCase {
    pub step: u64,
    /// As in [`EvalMetrics::policy`].
    pub policy: String,
    #[serde(flatten)]
    pub case: eval::metrics::Case,
}

/// The held-out evaluations ([`EvalMetrics`]; their cases in `eval-cases.jsonl`).
pub const EVAL_FILE: &str = "eval.jsonl";
/// The evaluations on the frameworks left out of training (`[eval] leave_out`; their cases in
/// `eval-left-out-cases.jsonl`).
pub const LEFT_OUT_FILE: &str = "eval-left-out.jsonl";

/// The blame head's evaluations ([`BlameEval`]).
pub const BLAME_FILE: &str = "eval-blame.jsonl";

/// The run's line-per-event logs, kept in every checkpoint and cut back on `--resume`.
pub const RUN_LOGS: [&str; 6] = [
    "metrics.jsonl",
    EVAL_FILE,
    "eval-cases.jsonl",
    LEFT_OUT_FILE,
    "eval-left-out-cases.jsonl",
    BLAME_FILE,
];

/// Appends one JSON line and flushes it to disk.
pub fn append<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    append_all(path, std::iter::once(value))
}

/// Appends one JSON line per value, all in one write and one flush.
pub fn append_all<'a, T: Serialize + 'a>(
    path: &Path,
    values: impl IntoIterator<Item = &'a T>,
) -> Result<()> {
    let mut text = String::new();
    for value in values {
        text.push_str(&serde_json::to_string(value).expect("metrics serialise"));
        text.push('\n');
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| RlError::io(path, e))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_data())
        .map_err(|e| RlError::io(path, e))
}

/// Reads a metrics file written by [`append`]; a line that is not a `T` is named by number.
/// A missing file reads as no lines (a run that has not logged yet).
pub fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).map_err(|e| RlError::io(path, e))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| RlError::Checkpoint {
                path: path.to_owned(),
                reason: format!("line {}: {e}", i + 1),
            })
        })
        .collect()
}

/// Keeps only the lines whose `step` is at most `step` (a resumed run drops what the
/// interrupted one logged after its last checkpoint). Written to a temporary file and renamed.
pub fn truncate_after(path: &Path, step: u64) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let text = std::fs::read_to_string(path).map_err(|e| RlError::io(path, e))?;
    let mut kept = String::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| RlError::Checkpoint {
            path: path.to_owned(),
            reason: format!("line {}: not JSON: {e}", i + 1),
        })?;
        if v.get("step")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
            <= step
        {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    let tmp = path.with_extension("jsonl.partial");
    std::fs::write(&tmp, kept).map_err(|e| RlError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| RlError::io(path, e))
}

/// Shannon entropy (nats) of the empirical distribution of `items`.
pub fn entropy_of<T: Ord>(items: &[T]) -> f64 {
    let mut counts = std::collections::BTreeMap::new();
    for i in items {
        *counts.entry(i).or_insert(0usize) += 1;
    }
    let n = items.len() as f64;
    counts
        .values()
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.ln()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_of_uniform_and_constant() {
        assert!((entropy_of(&["a", "b", "c", "d"]) - 4f64.ln()).abs() < 1e-12);
        assert_eq!(entropy_of(&["a", "a"]), 0.0);
    }

    #[test]
    fn truncation_keeps_early_steps_and_names_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("metrics.jsonl");
        for step in 0..4u64 {
            append(
                &p,
                &StepMetrics {
                    step,
                    ..Default::default()
                },
            )
            .unwrap();
        }
        truncate_after(&p, 1).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), 2);
        std::fs::write(&p, "{\"step\": 0}\nnot json\n").unwrap();
        let e = truncate_after(&p, 1).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
    }
}
