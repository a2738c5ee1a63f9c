//! A learned blamer for multi-agent chat logs: one whole choice among a log's acting turns,
//! made by a conditional-logit head over each turn's measurements.
//!
//! The Detector measures a log as the expert does (the overview, then the per-turn table of
//! [`detect::policies::blame`]); every acting turn `i` then gets a feature vector `x_i`
//! ([`turn_features`]: the turn's own measurements, its place in the log, its neighbours, which
//! turn each of the expert's rules and the first-error heuristic would pick), and the head
//! scores it
//!
//! ```text
//! p(i | log) = exp(w · z_i) / Σ_j exp(w · z_j),   z_i = (x_i − μ) / σ
//! ```
//!
//! with μ, σ the training turns' per-feature mean and spread. The blamed agent is the chosen
//! turn's. No feature names an agent or a framework: a log is read by what its turns do, so the
//! same head applies to any multi-agent framework's logs. The head is fitted on labels the
//! corpus gives for free (the first turn where an injected run departs from its clean twin,
//! and the agent whose turn that is) and then trained by PPO on a blame reward (`rl::blame`).

use std::path::Path;

use detect::policies::blame::{self, Turn};
use detect::{Policy, View};
use serde::{Deserialize, Serialize};

/// What each feature is, in order (saved with the head so that a head fitted on another
/// feature set is refused rather than misread).
pub const FEATURES: &[&str] = &[
    "tool",
    "failed_execution",
    "failure_words",
    "made_up",
    "ln_novel",
    "ln_relied",
    "ln_carried",
    "repeats",
    "position",
    "opening",
    "last",
    "ln_index",
    "first_failed_execution",
    "author_of_first_failed_execution",
    "first_failure_words",
    "first_made_up_relied",
    "author_of_first_repeat",
    "first_relied_carried",
    "expert_choice",
    "first_error_choice",
    "next_failed_execution",
    "next_failure_words",
    "failure_before",
    "ln_failures_before",
    "novel_share",
    "agents_first_turn",
    "agents_failing_share",
    "before_first_failure",
    "just_before_first_failure",
    "offset_from_first_failure",
];

/// The file a checkpoint keeps its blame head in.
pub const FILE: &str = "blame-head.json";

/// The acting turns of a log (the task giver's turns are not candidates).
pub fn acting(turns: &[Turn]) -> Vec<&Turn> {
    turns
        .iter()
        .filter(|t| !blame::task_giver(&t.agent))
        .collect()
}

/// The first-error heuristic on the measured table: the first failing acting turn (a failed
/// execution blamed on the turn that wrote its code), else the first non-execution turn. An
/// index into `acting`.
fn first_error(acting: &[&Turn]) -> Option<usize> {
    let author = |i: usize| (0..i).rev().find(|&j| !acting[j].tool);
    if let Some(i) = acting.iter().position(|t| t.failed > 0) {
        if acting[i].tool {
            if let Some(a) = author(i) {
                return Some(a);
            }
        }
        return Some(i);
    }
    acting.iter().position(|t| !t.tool)
}

/// Every acting turn's features (rows in the order of [`acting`], each [`FEATURES`] long).
pub fn turn_features(turns: &[Turn]) -> Vec<Vec<f32>> {
    let acting = acting(turns);
    let n = acting.len();
    if n == 0 {
        return Vec::new();
    }
    let ln = |x: f64| (1.0 + x).ln() as f32;
    let flag = |b: bool| f32::from(u8::from(b));
    let author = |i: usize| (0..i).rev().find(|&j| !acting[j].tool);
    let opening = acting.iter().position(|t| !t.tool);
    let later = |i: usize| !acting[i].tool && Some(i) != opening;
    let first = |pred: &dyn Fn(usize) -> bool| (0..n).find(|&i| pred(i));
    let first_failed_exec = first(&|i| acting[i].tool && acting[i].failed == 2);
    let first_words = first(&|i| !acting[i].tool && acting[i].failed > 0 && later(i));
    let first_made_up = first(&|i| later(i) && acting[i].made_up && acting[i].relied > 0);
    let first_repeat = first(&|i| acting[i].tool && acting[i].repeats);
    let first_carried = first(&|i| later(i) && acting[i].relied > 0 && acting[i].carried > 0);
    let first_failure = first(&|i| acting[i].failed > 0);
    let expert = blame::blame(turns).map(|(_, step, _)| step);
    let first_error = first_error(&acting);
    let max_novel = acting.iter().map(|t| t.novel).max().unwrap_or(0).max(1) as f32;
    (0..n)
        .map(|i| {
            let t = acting[i];
            let next = acting.get(i + 1);
            let failures_before = acting[..i].iter().filter(|p| p.failed > 0).count();
            let agents_turns: Vec<&&Turn> = acting.iter().filter(|p| p.agent == t.agent).collect();
            let agents_failing = agents_turns.iter().filter(|p| p.failed > 0).count();
            let x = vec![
                flag(t.tool),
                flag(t.failed == 2),
                flag(t.failed == 1),
                flag(t.made_up),
                ln(t.novel as f64),
                ln(t.relied as f64),
                ln(t.carried as f64),
                flag(t.repeats),
                if n > 1 {
                    i as f32 / (n - 1) as f32
                } else {
                    0.0
                },
                flag(Some(i) == opening),
                flag(i + 1 == n),
                ln(i as f64),
                flag(Some(i) == first_failed_exec),
                flag(first_failed_exec.and_then(author) == Some(i)),
                flag(Some(i) == first_words),
                flag(Some(i) == first_made_up),
                flag(first_repeat.and_then(author) == Some(i)),
                flag(Some(i) == first_carried),
                flag(expert == Some(t.step)),
                flag(first_error == Some(i)),
                flag(next.is_some_and(|p| p.failed == 2)),
                flag(next.is_some_and(|p| p.failed == 1)),
                flag(failures_before > 0),
                ln(failures_before as f64),
                t.novel as f32 / max_novel,
                flag(agents_turns.first().is_some_and(|p| p.step == t.step)),
                agents_failing as f32 / agents_turns.len() as f32,
                flag(first_failure.is_none_or(|f| i < f)),
                flag(first_failure.is_some_and(|f| f == i + 1)),
                first_failure.map_or(0.0, |f| (i as f32 - f as f32) / n as f32),
            ];
            debug_assert_eq!(x.len(), FEATURES.len());
            x
        })
        .collect()
}

/// Why a blame head could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BlameHeadError {
    #[error("reading the blame head {path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("the blame head {path} is not valid JSON for a blame head: {cause}")]
    Json {
        path: String,
        cause: serde_json::Error,
    },
    #[error("the blame head {path} was fitted on other features ({found} of them, expected the {expected} of this version: {names})")]
    Features {
        path: String,
        found: usize,
        expected: usize,
        names: String,
    },
}

/// The head: per-feature standardisation and one weight per feature.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlameHead {
    pub features: Vec<String>,
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    pub weight: Vec<f32>,
}

impl BlameHead {
    /// A head that scores every turn alike (weights zero), standardising by `mean`, `std`.
    pub fn untrained(mean: Vec<f32>, std: Vec<f32>) -> BlameHead {
        BlameHead {
            features: FEATURES.iter().map(|s| s.to_string()).collect(),
            weight: vec![0.0; mean.len()],
            mean,
            std,
        }
    }

    /// Standardisation fitted on `rows` (every candidate turn of the training logs); a
    /// feature that never varies gets spread 1.
    pub fn standardised_on(rows: &[&[f32]]) -> BlameHead {
        let d = FEATURES.len();
        let n = rows.len().max(1) as f64;
        let mut mean = vec![0f64; d];
        for r in rows {
            r.iter()
                .zip(&mut mean)
                .for_each(|(x, m)| *m += *x as f64 / n);
        }
        let mut var = vec![0f64; d];
        for r in rows {
            r.iter()
                .zip(&mean)
                .zip(&mut var)
                .for_each(|((x, m), v)| *v += (*x as f64 - m).powi(2) / n);
        }
        let std = var
            .iter()
            .map(|v| {
                if v.sqrt() < 1e-6 {
                    1.0
                } else {
                    v.sqrt() as f32
                }
            })
            .collect();
        BlameHead::untrained(mean.iter().map(|m| *m as f32).collect(), std)
    }

    /// A turn's standardised features.
    pub fn z(&self, x: &[f32]) -> Vec<f32> {
        x.iter()
            .zip(self.mean.iter().zip(&self.std))
            .map(|(x, (m, s))| (x - m) / s)
            .collect()
    }

    /// Log-probabilities of choosing each row of `rows` (one log's acting turns).
    pub fn log_probs(&self, rows: &[Vec<f32>]) -> Vec<f32> {
        let mut logits: Vec<f32> = rows
            .iter()
            .map(|x| self.z(x).iter().zip(&self.weight).map(|(z, w)| z * w).sum())
            .collect();
        linear::log_softmax(&mut logits);
        logits
    }

    /// The most probable acting turn of `turns` (the first of equals), `None` for a log with
    /// no acting turn.
    pub fn choose<'a>(&self, turns: &'a [Turn]) -> Option<&'a Turn> {
        let lp = self.log_probs(&turn_features(turns));
        let best = (!lp.is_empty()).then(|| linear::argmax(&lp))?;
        acting(turns).get(best).copied()
    }

    /// Reads a head saved by [`BlameHead::save`].
    pub fn load(path: &Path) -> Result<BlameHead, BlameHeadError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|cause| BlameHeadError::Io {
            path: shown.clone(),
            cause,
        })?;
        let head: BlameHead =
            serde_json::from_str(&text).map_err(|cause| BlameHeadError::Json {
                path: shown.clone(),
                cause,
            })?;
        let d = FEATURES.len();
        if head.features != FEATURES
            || head.mean.len() != d
            || head.std.len() != d
            || head.weight.len() != d
        {
            return Err(BlameHeadError::Features {
                path: shown,
                found: head.features.len(),
                expected: d,
                names: FEATURES.join(", "),
            });
        }
        Ok(head)
    }

    /// Writes the head as JSON through a temporary file renamed into place.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)
    }
}

/// The learned blamer as a Detector policy: the blame measurements, then the head's choice,
/// answered as `agent NAME step N`.
pub struct LearnedBlame {
    head: BlameHead,
    name: String,
    made: usize,
}

impl LearnedBlame {
    pub fn new(head: BlameHead, name: impl Into<String>) -> LearnedBlame {
        LearnedBlame {
            head,
            name: name.into(),
            made: 0,
        }
    }
}

impl Policy for LearnedBlame {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn act(&mut self, view: &View<'_>) -> Result<String, String> {
        if !view.chatlog {
            return Err(format!(
                "{} blames chat logs; this trace is not one",
                self.name
            ));
        }
        if view.turns_left > 1 {
            if let Some(call) = blame::measurement(view, self.made) {
                self.made += 1;
                return Ok(call);
            }
        }
        let turns = blame::measured(view.turns);
        Ok(match self.head.choose(&turns) {
            Some(t) => format!(
                "answer: agent {} step {} | the learned blame head's choice among {} acting turns",
                t.agent,
                t.step,
                acting(&turns).len()
            ),
            None => "answer: none | no acting turn was measured".into(),
        })
    }

    fn subagent(&self, _task: &str) -> Result<Box<dyn Policy>, String> {
        Err(format!("{} does not delegate", self.name))
    }
}

/// A checkpoint's Detector on any trace: multi-agent chat logs go to the learned blamer, every
/// other trace to `other` (the decision head's policy).
pub struct WithBlame {
    blame: LearnedBlame,
    other: Box<dyn Policy>,
}

impl WithBlame {
    pub fn new(blame: LearnedBlame, other: Box<dyn Policy>) -> WithBlame {
        WithBlame { blame, other }
    }
}

impl Policy for WithBlame {
    fn name(&self) -> String {
        self.other.name()
    }

    fn act(&mut self, view: &View<'_>) -> Result<String, String> {
        if view.chatlog {
            self.blame.act(view)
        } else {
            self.other.act(view)
        }
    }

    fn subagent(&self, task: &str) -> Result<Box<dyn Policy>, String> {
        self.other.subagent(task)
    }

    fn count_tokens(&self, text: &str) -> usize {
        self.other.count_tokens(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(step: i64, agent: &str, tool: bool, failed: u8) -> Turn {
        Turn::measured_as(step, agent, tool, failed)
    }

    fn log() -> Vec<Turn> {
        vec![
            turn(0, "human", false, 0),
            turn(1, "Planner", false, 0),
            turn(2, "Coder", false, 0),
            turn(3, "Coder", true, 2),
            turn(4, "Checker", false, 1),
        ]
    }

    #[test]
    fn features_describe_acting_turns_only_and_name_the_heuristics_choices() {
        let rows = turn_features(&log());
        assert_eq!(rows.len(), 4, "the human's turn is not a candidate");
        assert!(rows.iter().all(|r| r.len() == FEATURES.len()));
        let at = |name: &str| FEATURES.iter().position(|f| *f == name).unwrap();
        // The failed execution at step 3 was written by step 2 (acting index 1).
        assert_eq!(rows[1][at("author_of_first_failed_execution")], 1.0);
        assert_eq!(rows[1][at("expert_choice")], 1.0);
        assert_eq!(rows[1][at("first_error_choice")], 1.0);
        assert_eq!(rows[1][at("next_failed_execution")], 1.0);
        assert_eq!(rows[1][at("just_before_first_failure")], 1.0);
        assert_eq!(rows[2][at("first_failed_execution")], 1.0);
        assert_eq!(rows[3][at("failure_before")], 1.0);
        assert!(turn_features(&[turn(0, "human", false, 0)]).is_empty());
    }

    #[test]
    fn the_head_chooses_the_turn_its_weights_favour_and_round_trips() {
        let turns = log();
        let rows = turn_features(&turns);
        let refs: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
        let mut head = BlameHead::standardised_on(&refs);
        // Untrained: every turn alike, the first wins ties.
        assert_eq!(head.choose(&turns).unwrap().step, 1);
        let lp = head.log_probs(&rows);
        assert!((lp.iter().map(|l| l.exp()).sum::<f32>() - 1.0).abs() < 1e-5);
        let last = FEATURES.iter().position(|f| *f == "last").unwrap();
        head.weight[last] = 3.0;
        assert_eq!(head.choose(&turns).unwrap().step, 4);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        head.save(&path).unwrap();
        assert_eq!(BlameHead::load(&path).unwrap(), head);
        // A head of another feature set is refused, naming the file.
        let mut other = head.clone();
        other.features.pop();
        other.save(&path).unwrap();
        let err = BlameHead::load(&path).unwrap_err().to_string();
        assert!(
            err.contains(FILE) && err.contains("other features"),
            "{err}"
        );
        std::fs::write(&path, "{").unwrap();
        assert!(BlameHead::load(&path)
            .unwrap_err()
            .to_string()
            .contains("not valid JSON"));
    }
}
