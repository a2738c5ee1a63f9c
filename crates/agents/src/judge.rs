//! Judging a run: did the agent solve its task?
//!
//! GAIA answers are compared after normalisation in the spirit of GAIA's own scorer: numbers
//! numerically (thousands separators, currency and percent signs ignored, relative tolerance
//! 1e-6 for float formatting), strings case- and whitespace-insensitively without surrounding
//! quotes or a final full stop, lists element-wise. SWE tasks pass when the task's
//! `test_command` exits 0 in the edited repository.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::answers::{normalise_text, parse_number};
use crate::process::{self, ProcessEnd};
use crate::tasks::{AnswerType, GaiaTask, SweTask};

/// The verdict and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Judgement {
    pub success: bool,
    pub reason: String,
}

/// Relative tolerance of numeric answers (absorbs float formatting such as 0.30000000000000004).
const NUMBER_TOLERANCE: f64 = 1e-6;

fn same_number(got: &str, expected: &str) -> bool {
    match (parse_number(got), parse_number(expected)) {
        (Some(g), Some(e)) => (g - e).abs() <= NUMBER_TOLERANCE * e.abs().max(1.0),
        _ => false,
    }
}

fn same_element(got: &str, expected: &str) -> bool {
    if parse_number(expected).is_some() && parse_number(got).is_some() {
        return same_number(got, expected);
    }
    normalise_text(got) == normalise_text(expected)
}

/// Whether `got` answers a GAIA task whose expected answer is `task.answer`.
pub fn gaia_answer_matches(task: &GaiaTask, got: &str) -> bool {
    match task.answer_type {
        AnswerType::Number => same_number(got, &task.answer),
        AnswerType::Exact => {
            if normalise_text(got) == normalise_text(&task.answer) {
                return true;
            }
            let split =
                |s: &str| -> Vec<String> { s.split([',', ';']).map(str::to_owned).collect() };
            let (g, e) = (split(got), split(&task.answer));
            e.len() > 1 && g.len() == e.len() && g.iter().zip(&e).all(|(g, e)| same_element(g, e))
        }
    }
}

/// Judges a GAIA answer.
pub fn judge_gaia(task: &GaiaTask, answer: &str) -> Judgement {
    if gaia_answer_matches(task, answer) {
        Judgement {
            success: true,
            reason: format!("answer {answer:?} matches {:?}", task.answer),
        }
    } else {
        Judgement {
            success: false,
            reason: format!(
                "answer {answer:?} does not match the expected {:?} ({})",
                task.answer,
                match task.answer_type {
                    AnswerType::Number => "numeric comparison",
                    AnswerType::Exact => "normalised text comparison",
                }
            ),
        }
    }
}

/// Runs the task's `test_command` (via `sh -c`) in `repo`; output goes to `log`.
pub fn judge_swe(task: &SweTask, repo: &Path, timeout: Duration, log: &Path) -> Judgement {
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(&task.test_command)
        .current_dir(repo)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    match process::run_with_timeout(cmd, timeout, log, log) {
        Err(e) => Judgement {
            success: false,
            reason: format!("cannot run the test command {:?}: {e}", task.test_command),
        },
        Ok(end) => {
            let tail = process::tail(log, 400);
            match end.end {
                ProcessEnd::Exited(0) => Judgement {
                    success: true,
                    reason: format!("`{}` passed", task.test_command),
                },
                other => Judgement {
                    success: false,
                    reason: format!("`{}` {}: {tail}", task.test_command, other.describe()),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(answer: &str, t: AnswerType) -> GaiaTask {
        GaiaTask {
            id: "gaia-x".into(),
            question: "q".into(),
            answer: answer.into(),
            answer_type: t,
            tools: vec![],
        }
    }

    #[test]
    fn numbers_compare_numerically() {
        let t = task("14560", AnswerType::Number);
        for ok in ["14560", "14,560", " 14560.0 ", "14560.", "\"14560\""] {
            assert!(gaia_answer_matches(&t, ok), "{ok}");
        }
        for bad in ["14561", "about 14560", "", "fourteen thousand"] {
            assert!(!gaia_answer_matches(&t, bad), "{bad}");
        }
        let f = task("0.3", AnswerType::Number);
        assert!(gaia_answer_matches(&f, "0.30000000000000004"));
        assert!(!gaia_answer_matches(&f, "0.31"));
        assert!(gaia_answer_matches(
            &task("12.5%", AnswerType::Number),
            "12.5"
        ));
        assert!(gaia_answer_matches(
            &task("$1,200", AnswerType::Number),
            "1200"
        ));
    }

    #[test]
    fn text_compares_normalised() {
        let t = task("Marta Quell", AnswerType::Exact);
        for ok in [
            "Marta Quell",
            "marta  quell",
            "'Marta Quell'.",
            "**Marta Quell**",
        ] {
            assert!(gaia_answer_matches(&t, ok), "{ok}");
        }
        assert!(!gaia_answer_matches(&t, "Marta"));
        assert!(!gaia_answer_matches(&t, "The harbourmaster is Marta Quell"));
    }

    #[test]
    fn lists_compare_element_wise() {
        let t = task("Aster 2, Borealis Mini", AnswerType::Exact);
        assert!(gaia_answer_matches(&t, "aster 2,borealis mini"));
        assert!(!gaia_answer_matches(&t, "Borealis Mini, Aster 2"));
        let n = task("3, 4.5", AnswerType::Exact);
        assert!(gaia_answer_matches(&n, "3.0; 4.50"));
    }
}
