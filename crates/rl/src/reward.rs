//! The rewards of §5.4, as pure functions of the ground truth and what each role did.
//!
//! R_det = α·1[d̂ = d] + β·loc_score(l̂, l) + γ·efficiency(τ)
//! R_inj = r_high if detected after more than k_min calls, r_med if detected sooner, r_low if
//!         not detected; r_invalid for an injection that failed validation.

use serde::{Deserialize, Serialize};

use crate::config::RewardWeights;

pub use detect::Verdict;
pub use traces::Truth;

/// A code site of the agent: what a predicted component can point at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub component: String,
    pub file: String,
    pub function: String,
}

/// One investigation as the rewards see it: the Detector's answer (`None` when the episode
/// ended without one) and the tool calls it took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answered {
    pub verdict: Option<Verdict>,
    pub tool_calls: usize,
}

impl Answered {
    /// The answered taxonomy id, if the answer names one.
    pub fn deficiency_id(&self) -> Option<&str> {
        self.verdict.as_ref().and_then(Verdict::deficiency_id)
    }

    /// Whether the answer names the true type (ids compared exactly, as the vocabularies
    /// spell them).
    pub fn names(&self, truth: &Truth) -> bool {
        truth.deficiency_id.is_some() && self.deficiency_id() == truth.deficiency_id.as_deref()
    }
}

/// Partial localisation credit: the predicted component's sites (from the agent's manifest)
/// include the injected function, or only its file; or the component is the injected one
/// though none of its sites matches; otherwise nothing.
pub fn loc_score(predicted: Option<&str>, truth: &Truth, sites: &[Site], w: &RewardWeights) -> f64 {
    let Some(predicted) = predicted else {
        return 0.0;
    };
    let mine: Vec<&Site> = sites.iter().filter(|s| s.component == predicted).collect();
    let same_file = |s: &&Site| truth.file.as_deref() == Some(s.file.as_str());
    if let Some(function) = &truth.function {
        if mine
            .iter()
            .any(|s| same_file(s) && function_matches(&s.function, function))
        {
            return w.loc_function;
        }
    }
    if mine.iter().any(same_file) {
        return w.loc_file;
    }
    if truth.component.as_deref() == Some(predicted) {
        return w.loc_component;
    }
    0.0
}

/// `Class.method` in a manifest matches `Class.method` or `method` in a location, and back.
fn function_matches(site: &str, located: &str) -> bool {
    site == located
        || site.rsplit('.').next() == Some(located)
        || located.rsplit('.').next() == Some(site)
}

/// 1 for an answer without tool calls, falling linearly to 0 at `max_calls`.
pub fn efficiency(tool_calls: usize, w: &RewardWeights) -> f64 {
    1.0 - (tool_calls.min(w.max_calls) as f64 / w.max_calls as f64)
}

/// Equation (1); with `efficiency_needs_detection` the γ term, and with
/// `localisation_needs_detection` the β term, only for a correct type.
pub fn detector_reward(d: &Answered, truth: &Truth, sites: &[Site], w: &RewardWeights) -> f64 {
    let correct = d.names(truth);
    let efficient = if w.efficiency_needs_detection && !correct {
        0.0
    } else {
        efficiency(d.tool_calls, w)
    };
    let located = if w.localisation_needs_detection && !correct {
        0.0
    } else {
        loc_score(
            d.verdict.as_ref().and_then(Verdict::component),
            truth,
            sites,
            w,
        )
    };
    w.alpha * f64::from(u8::from(correct)) + w.beta * located + w.gamma * efficient
}

/// Equation (2); `None` detection means the injection failed validation.
pub fn injector_reward(d: Option<&Answered>, truth: &Truth, w: &RewardWeights) -> f64 {
    match d {
        None => w.r_invalid,
        Some(d) if d.names(truth) => {
            if d.tool_calls > w.k_min {
                w.r_high
            } else {
                w.r_med
            }
        }
        Some(_) => w.r_low,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn truth() -> Truth {
        Truth {
            component: Some("tools.schema".into()),
            file: Some("pkg/tools.py".into()),
            function: Some("Registry.resolve_ref".into()),
            ..Truth::deficiency("P16")
        }
    }

    /// An answer naming `id` at `component` after `tool_calls` calls.
    fn answer_at(id: &str, component: &str, tool_calls: usize) -> Answered {
        Answered {
            verdict: Some(Verdict::deficiency(id, component, "")),
            tool_calls,
        }
    }

    /// An answer naming `id` in the injected component after `tool_calls` calls.
    fn answer(id: &str, tool_calls: usize) -> Answered {
        answer_at(id, "tools.schema", tool_calls)
    }

    fn sites() -> Vec<Site> {
        let s = |c: &str, f: &str, fun: &str| Site {
            component: c.into(),
            file: f.into(),
            function: fun.into(),
        };
        vec![
            s("tools.schema", "pkg/tools.py", "Registry.resolve_ref"),
            s("tools.registry", "pkg/tools.py", "Registry.register"),
            s("llm_client.stream", "pkg/client.py", "stream"),
            s("memory.store", "pkg/memory.py", "put"),
        ]
    }

    #[test]
    fn localisation_credit_is_function_then_file_then_component() {
        let w = RewardWeights::default();
        let t = truth();
        assert_eq!(loc_score(Some("tools.schema"), &t, &sites(), &w), 1.0);
        assert_eq!(loc_score(Some("tools.registry"), &t, &sites(), &w), 0.6);
        assert_eq!(loc_score(Some("llm_client.stream"), &t, &sites(), &w), 0.0);
        assert_eq!(loc_score(None, &t, &sites(), &w), 0.0);
        // The injected component, though the manifest has no site of it in that file.
        let mut other = t.clone();
        other.component = Some("memory.store".into());
        other.file = Some("pkg/elsewhere.py".into());
        assert_eq!(loc_score(Some("memory.store"), &other, &sites(), &w), 0.3);
        // A method located by its bare name still matches its manifest site.
        let mut bare = t.clone();
        bare.function = Some("resolve_ref".into());
        assert_eq!(loc_score(Some("tools.schema"), &bare, &sites(), &w), 1.0);
    }

    #[test]
    fn detector_reward_adds_the_three_terms() {
        let w = RewardWeights::default();
        let d = answer("P16", 5);
        let r = detector_reward(&d, &truth(), &sites(), &w);
        assert!((r - (1.0 + 0.5 * 1.0 + 0.2 * 0.5)).abs() < 1e-12, "{r}");
        let wrong = answer_at("P1", "none", 20);
        assert_eq!(detector_reward(&wrong, &truth(), &sites(), &w), 0.0);
        assert_eq!(efficiency(0, &w), 1.0);
    }

    #[test]
    fn gated_efficiency_counts_only_for_a_correct_type() {
        let w = RewardWeights {
            efficiency_needs_detection: true,
            ..RewardWeights::default()
        };
        // A wrong type keeps its localisation credit but earns nothing for stopping early.
        let wrong = detector_reward(&answer("P1", 1), &truth(), &sites(), &w);
        assert!((wrong - 0.5 * 1.0).abs() < 1e-12, "{wrong}");
        let right = detector_reward(&answer("P16", 1), &truth(), &sites(), &w);
        assert!((right - (1.0 + 0.5 + 0.2 * 0.9)).abs() < 1e-12, "{right}");
        let ungated = RewardWeights::default();
        let wrong = detector_reward(&answer("P1", 1), &truth(), &sites(), &ungated);
        assert!((wrong - (0.5 + 0.2 * 0.9)).abs() < 1e-12, "{wrong}");
    }

    #[test]
    fn gated_localisation_counts_only_for_a_correct_type() {
        let w = RewardWeights {
            localisation_needs_detection: true,
            ..RewardWeights::default()
        };
        // The component is exactly right, the type is not: no β term.
        let wrong = detector_reward(&answer("P1", 10), &truth(), &sites(), &w);
        assert_eq!(wrong, 0.0);
        let right = detector_reward(&answer("P16", 10), &truth(), &sites(), &w);
        assert!((right - (1.0 + 0.5 * 1.0)).abs() < 1e-12, "{right}");
        let both = RewardWeights {
            efficiency_needs_detection: true,
            ..w
        };
        assert_eq!(
            detector_reward(&answer("P1", 1), &truth(), &sites(), &both),
            0.0
        );
    }

    #[test]
    fn injector_reward_follows_equation_two() {
        let w = RewardWeights::default();
        let t = truth();
        let det = |id: &str, calls| answer_at(id, "none", calls);
        assert_eq!(injector_reward(Some(&det("P16", 3)), &t, &w), w.r_high);
        assert_eq!(injector_reward(Some(&det("P16", 2)), &t, &w), w.r_med);
        assert_eq!(injector_reward(Some(&det("C3", 9)), &t, &w), w.r_low);
        assert_eq!(injector_reward(None, &t, &w), w.r_invalid);
        let silent = Answered {
            verdict: None,
            tool_calls: 4,
        };
        assert_eq!(injector_reward(Some(&silent), &t, &w), w.r_low);
    }
}
