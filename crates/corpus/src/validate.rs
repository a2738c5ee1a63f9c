//! Consistency validation (the paper's §5.3): each check of one injected episode, with its
//! result and why.

use serde::{Deserialize, Serialize};
use taxonomy::Manifestation;

use crate::features::{FeatureDiff, TraceFeatures};

/// One check and its result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub passed: bool,
    pub detail: String,
}

impl Check {
    pub fn pass(detail: impl Into<String>) -> Check {
        Check {
            passed: true,
            detail: detail.into(),
        }
    }
    pub fn fail(detail: impl Into<String>) -> Check {
        Check {
            passed: false,
            detail: detail.into(),
        }
    }
}

/// Whether the keyword baseline alone names the type (recorded, not a gate: it feeds the
/// Injector's reward).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NonTriviality {
    /// `false` when the baseline could not be run; `detail` says why.
    pub keyword_available: bool,
    /// The type the baseline answered, if it answered.
    pub keyword_answer: Option<String>,
    pub keyword_names_it: Option<bool>,
    pub detail: String,
}

/// Every check of one episode. `valid` is the conjunction of the gating checks (applies,
/// runs, traces, manifests); non-triviality is recorded beside them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Validation {
    pub applies: Check,
    pub runs: Option<Check>,
    pub traces: Option<Check>,
    pub manifests: Option<Check>,
    pub feature_diff: Option<FeatureDiff>,
    pub non_trivial: Option<NonTriviality>,
    pub valid: bool,
    /// How the injected run differs from the clean one ([`manifestation_classes`]).
    #[serde(default)]
    pub classes: Vec<String>,
}

impl Validation {
    /// The injection did not apply: nothing else could be checked.
    pub fn not_applied(reason: String) -> Validation {
        Validation {
            applies: Check::fail(reason),
            runs: None,
            traces: None,
            manifests: None,
            feature_diff: None,
            non_trivial: None,
            valid: false,
            classes: Vec::new(),
        }
    }

    /// The first failed check's name, for reports.
    pub fn failure(&self) -> Option<&'static str> {
        if !self.applies.passed {
            return Some("applies");
        }
        for (name, check) in [
            ("runs", &self.runs),
            ("traces", &self.traces),
            ("manifests", &self.manifests),
        ] {
            if !check.as_ref().is_some_and(|c| c.passed) {
                return Some(name);
            }
        }
        None
    }
}

/// What one run left behind, as validation needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFacts {
    /// `exited with code N`, `was killed by signal N`, `timed out` (agents' ProcessEnd).
    pub end: String,
    pub exit_ok: bool,
    pub timed_out: bool,
    pub success: bool,
    /// Spans in the trace and contract problems found in it.
    pub spans: usize,
    pub trace_problems: Vec<String>,
    pub features: TraceFeatures,
    /// What the sandbox had to stop, one clause each (`runner::Containment::describe`).
    pub contained: Vec<String>,
    /// How long the agent ran, in milliseconds (the outcome's `duration_ms`).
    pub duration_ms: u64,
}

/// The kinds of difference between a clean and an injected run: `errors` (new error
/// spans), `tool_calls` (which tools, in what order), `arguments` (what they were called
/// with), `outputs` (answer, outcome, finish reasons), `structure` (span names, model calls,
/// turns), `requests` (model parameters sent) and `tokens` (token counts). A run that differs
/// in `tokens` alone did the same thing with a different amount of text.
pub fn manifestation_classes(diff: &FeatureDiff) -> Vec<&'static str> {
    let mut out = Vec::new();
    if !diff.errors.is_empty() {
        out.push("errors");
    }
    if diff.tool_calls_changed {
        out.push("tool_calls");
    }
    if diff.tool_arguments_changed {
        out.push("arguments");
    }
    if diff.answer_changed || diff.outcome.0 != diff.outcome.1 || diff.finish_reasons_changed {
        out.push("outputs");
    }
    if !diff.span_names.is_empty()
        || diff.llm_calls.0 != diff.llm_calls.1
        || diff.turns.0 != diff.turns.1
    {
        out.push("structure");
    }
    if diff.requests_changed {
        out.push("requests");
    }
    if diff.input_tokens.0 != diff.input_tokens.1 || diff.output_tokens.0 != diff.output_tokens.1 {
        out.push("tokens");
    }
    out
}

/// Whether only token counts differ.
pub fn token_only(classes: &[impl AsRef<str>]) -> bool {
    classes.len() == 1 && classes[0].as_ref() == "tokens"
}

/// Judges an applied injection from its run and the clean run of the same task and seed.
/// `counts_are_signature`: the type is a token-counting bug, whose signature may be the count
/// alone; any other silent type must change what the agent or the model does.
pub fn judge(
    manifestation: Manifestation,
    counts_are_signature: bool,
    clean: &RunFacts,
    injected: &RunFacts,
    applied_detail: String,
) -> Validation {
    // "Immediate" crash: the agent died before its first model call.
    let runs = if clean.timed_out {
        // Nothing to compare with: a clean run cut off by the clock is not the task's baseline.
        Check::fail(format!(
            "the clean run of this task and seed {}, so there is no baseline to compare with",
            clean.end
        ))
    } else if manifestation == Manifestation::Crash {
        Check::pass(format!("crash-inducing type; the agent {}", injected.end))
    } else if !injected.exit_ok && injected.features.llm_calls == 0 && !injected.timed_out {
        Check::fail(format!(
            "the agent {} before its first model call",
            injected.end
        ))
    } else {
        Check::pass(format!(
            "the agent {} after {} model calls",
            injected.end, injected.features.llm_calls
        ))
    };
    let root_missing = injected
        .trace_problems
        .iter()
        .any(|p| p.contains("no root span"));
    let traces = if injected.spans == 0 {
        Check::fail(format!("no spans: {}", injected.trace_problems.join("; ")))
    } else if root_missing {
        Check::fail("the trace has no root span `agent.run`")
    } else {
        Check::pass(format!(
            "{} spans, {} contract problems",
            injected.spans,
            injected.trace_problems.len()
        ))
    };
    let diff = FeatureDiff::between(&clean.features, &injected.features);
    let differing = diff.differing();
    let classes = manifestation_classes(&diff);
    let manifests = match manifestation {
        Manifestation::Crash => {
            if !injected.exit_ok
                || injected.features.outcome == "crashed"
                || !diff.errors.is_empty()
            {
                Check::pass(format!(
                    "crash: the agent {}, outcome {}, new errors {:?}",
                    injected.end,
                    injected.features.outcome,
                    diff.errors.keys().collect::<Vec<_>>()
                ))
            } else {
                Check::fail(format!(
                    "crash-inducing type, but the agent {} with outcome {} and no new errors",
                    injected.end, injected.features.outcome
                ))
            }
        }
        Manifestation::ExplicitError => {
            if !diff.errors.is_empty()
                || injected.features.outcome == "crashed" && clean.features.outcome != "crashed"
            {
                Check::pass(format!(
                    "explicit error: new errors {:?}, outcome {} → {}",
                    diff.errors, clean.features.outcome, injected.features.outcome
                ))
            } else {
                Check::fail(format!(
                    "explicit-error type, but no new error spans (differing: {})",
                    if differing.is_empty() {
                        "nothing".to_owned()
                    } else {
                        differing.join(", ")
                    }
                ))
            }
        }
        Manifestation::Silent => {
            if differing.is_empty() {
                Check::fail("the trace matches the clean run on every compared feature")
            } else if token_only(&classes) && !counts_are_signature {
                Check::fail(format!(
                    "only token counts differ (input {} → {}, output {} → {}): the run did the same thing with more or less text, and this type must change what the agent or the model does",
                    diff.input_tokens.0, diff.input_tokens.1, diff.output_tokens.0, diff.output_tokens.1
                ))
            } else {
                Check::pass(format!("differs in {}", differing.join(", ")))
            }
        }
    };
    let valid = runs.passed && traces.passed && manifests.passed;
    Validation {
        applies: Check::pass(applied_detail),
        runs: Some(runs),
        traces: Some(traces),
        manifests: Some(manifests),
        feature_diff: Some(diff),
        non_trivial: None,
        valid,
        classes: classes.into_iter().map(str::to_owned).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(outcome: &str, llm_calls: usize, exit_ok: bool) -> RunFacts {
        RunFacts {
            end: if exit_ok {
                "exited with code 0"
            } else {
                "exited with code 1"
            }
            .into(),
            exit_ok,
            timed_out: false,
            success: exit_ok,
            spans: 3,
            trace_problems: vec![],
            features: TraceFeatures {
                spans: 3,
                llm_calls,
                outcome: outcome.into(),
                ..TraceFeatures::default()
            },
            contained: vec![],
            duration_ms: 0,
        }
    }

    #[test]
    fn checks_follow_the_manifestation() {
        let clean = facts("completed", 2, true);
        let same = judge(Manifestation::Silent, false, &clean, &clean, "ok".into());
        assert!(!same.valid);
        assert_eq!(same.failure(), Some("manifests"));

        let changed = judge(
            Manifestation::Silent,
            false,
            &clean,
            &facts("failed", 2, true),
            "ok".into(),
        );
        assert!(changed.valid, "{changed:?}");

        let early_crash = facts("crashed", 0, false);
        let v = judge(
            Manifestation::ExplicitError,
            false,
            &clean,
            &early_crash,
            "ok".into(),
        );
        assert_eq!(v.failure(), Some("runs"));
        let v = judge(
            Manifestation::Crash,
            false,
            &clean,
            &early_crash,
            "ok".into(),
        );
        assert!(v.valid, "{v:?}");

        let mut cut_off = facts("completed", 1, false);
        cut_off.timed_out = true;
        cut_off.end = "ran past its time limit".into();
        let changed = facts("failed", 2, true);
        let v = judge(
            Manifestation::Silent,
            false,
            &cut_off,
            &changed,
            "ok".into(),
        );
        assert_eq!(v.failure(), Some("runs"));
        assert!(v.runs.unwrap().detail.contains("no baseline"));

        let mut longer = clean.clone();
        longer.features.input_tokens += 40;
        let v = judge(Manifestation::Silent, false, &clean, &longer, "ok".into());
        assert_eq!(v.failure(), Some("manifests"));
        assert_eq!(v.classes, ["tokens"]);
        assert!(v.manifests.unwrap().detail.contains("only token counts"));
        let v = judge(Manifestation::Silent, true, &clean, &longer, "ok".into());
        assert!(v.valid, "a token-counting bug shows in the count: {v:?}");
        let mut answered = longer.clone();
        answered.features.answer = Some("unknown".into());
        let v = judge(Manifestation::Silent, false, &clean, &answered, "ok".into());
        assert!(v.valid);
        assert_eq!(v.classes, ["outputs", "tokens"]);

        let mut no_spans = facts("missing", 1, true);
        no_spans.spans = 0;
        let v = judge(Manifestation::Silent, false, &clean, &no_spans, "ok".into());
        assert_eq!(v.failure(), Some("traces"));
        assert_eq!(
            Validation::not_applied("x".into()).failure(),
            Some("applies")
        );
    }
}
