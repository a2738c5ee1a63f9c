//! Markdown and JSON reports. Pure: the caller prints or writes the text.

use serde::Serialize;

use crate::bootstrap::{Bootstrap, Estimate};
use crate::metrics::{self, BlameCase, BlameSummary, Case, Summary, NO_VERDICT};

/// A store evaluation: what was run on what, and its figures.
#[derive(Debug, Clone, Serialize)]
pub struct StoreReport {
    pub store: String,
    /// Only this agent's traces were evaluated (`--holdout-agent`).
    pub holdout_agent: Option<String>,
    /// The split file, or `None` for every labelled trace.
    pub split: Option<String>,
    pub detector: String,
    /// Names of the Detector tools switched off.
    pub ablations: Vec<String>,
    pub bootstrap: Bootstrap,
    pub summary: Summary,
    pub cases: Vec<Case>,
    /// Labels read from a file beside the store (`--labels`) rather than from the store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<LabelsNote>,
}

/// Where a store evaluation's labels came from when not from the store.
#[derive(Debug, Clone, Serialize)]
pub struct LabelsNote {
    pub file: String,
    /// Trace ids the file labels that the store does not hold.
    pub unknown: Vec<String>,
    /// Labels that name a step (scored as step localisation), or an agent (scored as the agent
    /// of the answered step), where the failure shows.
    pub with_step: usize,
    pub with_agent: usize,
}

/// A chat-log evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct ChatlogReport {
    pub directory: String,
    pub detector: String,
    pub bootstrap: Bootstrap,
    pub summary: BlameSummary,
    pub cases: Vec<BlameCase>,
}

fn pct(e: &Option<Estimate>) -> (String, String, String) {
    match e {
        Some(e) => (
            format!("{:.1}%", 100.0 * e.value),
            format!("[{:.1}%, {:.1}%]", 100.0 * e.lo, 100.0 * e.hi),
            e.n.to_string(),
        ),
        None => ("—".into(), "—".into(), "0".into()),
    }
}

fn number(e: &Option<Estimate>) -> (String, String, String) {
    match e {
        Some(e) => (
            format!("{:.2}", e.value),
            format!("[{:.2}, {:.2}]", e.lo, e.hi),
            e.n.to_string(),
        ),
        None => ("—".into(), "—".into(), "0".into()),
    }
}

fn interval_note(b: &Bootstrap) -> String {
    format!(
        "Intervals: {}% percentile bootstrap, {} resamples, seed {}.",
        b.level_percent, b.resamples, b.seed
    )
}

pub fn store_markdown(r: &StoreReport) -> String {
    let s = &r.summary;
    let mut out = format!(
        "# Evaluation of the `{}` detector\n\nStore: `{}`; traces: {} ({}{}); ablations: {}; episodes without a verdict: {}.\n{}\n\n",
        r.detector,
        r.store,
        s.traces,
        r.split
            .as_deref()
            .map_or("every labelled trace".to_string(), |p| format!("split `{p}`")),
        r.holdout_agent
            .as_deref()
            .map_or(String::new(), |a| format!(", only agent `{a}`'s")),
        if r.ablations.is_empty() {
            "none".to_string()
        } else {
            r.ablations.join(", ")
        },
        s.no_verdict,
        interval_note(&r.bootstrap),
    );
    if let Some(l) = &r.labels {
        out.push_str(&format!("Labels: `{}`", l.file));
        if l.unknown.is_empty() {
            out.push_str("; every labelled trace is in the store");
        } else {
            let shown: Vec<&str> = l.unknown.iter().take(20).map(String::as_str).collect();
            out.push_str(&format!(
                "; {} labelled trace(s) not in the store, left out: {}{}",
                l.unknown.len(),
                shown.join(", "),
                if l.unknown.len() > shown.len() {
                    " … (all in the JSON report)"
                } else {
                    ""
                }
            ));
        }
        if l.with_agent > 0 {
            out.push_str(&format!(
                ". {} label(s) name an agent to blame, scored as the agent of the answered step",
                l.with_agent
            ));
        }
        out.push_str(".\n\n");
    }
    out.push_str("## Overall (Table 5)\n\n| Metric | Value | 95% CI | n |\n|---|---|---|---|\n");
    for (name, (v, ci, n)) in [
        ("Detection accuracy (deficient traces)", pct(&s.detection)),
        (
            "False-positive rate (healthy traces called deficient)",
            pct(&s.false_positive_rate),
        ),
        ("Localisation accuracy (component)", pct(&s.localisation)),
        (
            "Code localisation (file and function)",
            pct(&s.code_localisation),
        ),
        (
            "Step localisation, exact (where it first shows)",
            pct(&s.step_exact),
        ),
        ("Step localisation, within ±1", pct(&s.step_within_one)),
        (
            "Agent blamed (the answered step's agent)",
            pct(&s.agent_blame),
        ),
        ("Avg. tool calls", number(&s.tool_calls)),
    ] {
        out.push_str(&format!("| {name} | {v} | {ci} | {n} |\n"));
    }
    out.push_str("\n## Detection by category (Table 6)\n\n| Category | # Types | n | Detection acc. | 95% CI | Localisation acc. |\n|---|---|---|---|---|---|\n");
    for row in &s.per_category {
        let (v, ci, n) = pct(&Some(row.detection));
        let (loc, _, _) = pct(&row.localisation);
        out.push_str(&format!(
            "| {} | {} | {n} | {v} | {ci} | {loc} |\n",
            row.category, row.types
        ));
    }
    if !s.per_agent.is_empty() {
        out.push_str("\n## Detection by agent (Table 8)\n\n| Agent | n | Detection acc. | 95% CI |\n|---|---|---|---|\n");
        for row in &s.per_agent {
            let (v, ci, n) = pct(&Some(row.detection));
            out.push_str(&format!("| {} | {n} | {v} | {ci} |\n", row.agent));
        }
    }
    out.push_str("\n## Confusion summary\n\n| True type | n | Correct | Most frequent wrong answer |\n|---|---|---|---|\n");
    let mut rows: Vec<_> = s.confusion.iter().collect();
    rows.sort_by_key(|(id, _)| type_order(id));
    for (truth, row) in rows {
        let n: usize = row.values().sum();
        let correct = row.get(truth).copied().unwrap_or(0);
        let wrong = row
            .iter()
            .filter(|(p, _)| *p != truth)
            .max_by_key(|(p, c)| (**c, std::cmp::Reverse((*p).clone())))
            .map_or("—".to_string(), |(p, c)| format!("{p} ({c})"));
        out.push_str(&format!("| {truth} | {n} | {correct} | {wrong} |\n"));
    }
    out.push_str(&format!(
        "\n`{NO_VERDICT}` = the episode ended without a verdict. The full matrix is in the JSON report.\n"
    ));
    out
}

pub fn chatlog_markdown(r: &ChatlogReport) -> String {
    let s = &r.summary;
    let how = match r.detector.as_str() {
        "first-error" => "a non-learned heuristic: the first failing turn, a failed code execution blamed on the turn that wrote the code; no tool calls",
        "expert" => "the scripted investigator: an SQL overview and a per-turn table (failures, made-up data, new facts that later turns and the final answer rely on), then one blame",
        _ => "the Detector's tools over each log imported as a trace",
    };
    let mut out = format!(
        "# External traces: labelled chat logs\n\nDirectory: `{}`; logs: {}; detector: `{}` ({how}).\n{}\n\n",
        r.directory,
        s.logs,
        r.detector,
        interval_note(&r.bootstrap)
    );
    out.push_str("| Metric | Value | 95% CI | n |\n|---|---|---|---|\n");
    for (name, (v, ci, n)) in [
        ("Agent-level accuracy".to_string(), pct(&s.agent)),
        ("Step accuracy (exact)".to_string(), pct(&s.step_exact)),
        (
            format!("Step accuracy (±{})", s.tolerance),
            pct(&s.step_within),
        ),
    ] {
        out.push_str(&format!("| {name} | {v} | {ci} | {n} |\n"));
    }
    out.push_str("\n| Log | Labelled | Predicted |\n|---|---|---|\n");
    for c in &r.cases {
        let truth = format!(
            "{} step {}",
            c.truth.agent.as_deref().unwrap_or("?"),
            c.truth.step.map_or("?".to_string(), |s| s.to_string())
        );
        let predicted = c
            .blamed()
            .map_or("(none)".to_string(), |(a, s)| format!("{a} step {s}"));
        out.push_str(&format!("| {} | {truth} | {predicted} |\n", c.source));
    }
    out
}

/// Paired differences between blame detectors on the same logs (points, with intervals).
pub fn blame_differences_markdown(
    diffs: &[crate::metrics::BlameDifference],
    tolerance: u64,
) -> String {
    let mut out = format!(
        "## Paired differences (same logs)\n\n| Detector − baseline | Agent | Step (exact) | Step (±{tolerance}) |\n|---|---|---|---|\n"
    );
    let pts = |e: &Option<Estimate>| match e {
        Some(e) => format!(
            "{:+.1} [{:+.1}, {:+.1}] (n = {})",
            100.0 * e.value,
            100.0 * e.lo,
            100.0 * e.hi,
            e.n
        ),
        None => "—".into(),
    };
    for d in diffs {
        out.push_str(&format!(
            "| {} − {} | {} | {} | {} |\n",
            d.other,
            d.base,
            pts(&d.agent),
            pts(&d.step_exact),
            pts(&d.step_within)
        ));
    }
    out
}

/// Several runs over the same traces (detectors, ablations) side by side: Table 5 when the
/// runs are detectors, Table 7 when they are one detector with switches off. Δ is the paired
/// difference in detection accuracy against the same detector's run with no switch off.
pub fn comparison_markdown(runs: &[StoreReport]) -> String {
    let Some(first) = runs.first() else {
        return String::new();
    };
    let mut out = format!(
        "# Comparison\n\nStore: `{}`; traces: {}. {}\n\n| Detector | Switched off | Detection acc. | 95% CI | Δ detection vs. full | 95% CI | False-positive rate | 95% CI | Localisation acc. | 95% CI | Code location | 95% CI | Avg. tool calls | 95% CI |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        first.store,
        first.summary.traces,
        interval_note(&first.bootstrap)
    );
    for run in runs {
        let s = &run.summary;
        let full = runs
            .iter()
            .find(|r| r.detector == run.detector && r.ablations.is_empty());
        let delta = match full {
            Some(full) if !run.ablations.is_empty() => {
                metrics::detection_difference(&full.cases, &run.cases, &run.bootstrap)
            }
            _ => None,
        };
        let (dv, dci) = match delta {
            Some(d) => (
                format!("{:+.1} pts", 100.0 * d.value),
                format!("[{:+.1}, {:+.1}]", 100.0 * d.lo, 100.0 * d.hi),
            ),
            None => ("—".into(), "—".into()),
        };
        let (det, det_ci, _) = pct(&s.detection);
        let (fpr, fpr_ci, _) = pct(&s.false_positive_rate);
        let (loc, loc_ci, _) = pct(&s.localisation);
        let (code, code_ci, _) = pct(&s.code_localisation);
        let (calls, calls_ci, _) = number(&s.tool_calls);
        let off = if run.ablations.is_empty() {
            "—".to_string()
        } else {
            run.ablations.join(", ")
        };
        out.push_str(&format!(
            "| {} | {off} | {det} | {det_ci} | {dv} | {dci} | {fpr} | {fpr_ci} | {loc} | {loc_ci} | {code} | {code_ci} | {calls} | {calls_ci} |\n",
            run.detector
        ));
    }
    out
}

/// P-types before C-types, each by number (P2 before P11), unknown ids last by name.
fn type_order(id: &str) -> (u8, u32, String) {
    let family = match id.chars().next() {
        Some('P') => 0,
        Some('C') => 1,
        _ => 2,
    };
    let number = id.get(1..).and_then(|n| n.parse().ok()).unwrap_or(u32::MAX);
    (family, number, id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_sort_by_family_then_number() {
        let mut ids = vec!["C1", "P11", "X", "P2", "C12", "C3"];
        ids.sort_by_key(|id| type_order(id));
        assert_eq!(ids, ["P2", "P11", "C1", "C3", "C12", "X"]);
    }
}
