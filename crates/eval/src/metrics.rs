//! The paper's figures as pure functions of per-trace cases: detection accuracy (type),
//! localisation accuracy (component; and code location, file and function, where a label names
//! one),
//! average tool calls, per-category accuracy (Table 6 categories from the catalog), the
//! per-type confusion matrix, and for chat logs agent, exact-step and ±k step accuracy. Every
//! figure carries a bootstrap interval. No I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::bootstrap::{self, Bootstrap, Estimate};

pub use detect::Verdict;
pub use traces::Truth;

/// One evaluated trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    pub trace_id: String,
    pub truth: Truth,
    /// The agent (framework) that produced the trace, when its label says (the corpus
    /// generator records it in the label's source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The detector's answer; `None` when the episode ended without a deficiency verdict.
    pub predicted: Option<Verdict>,
    /// The agent of the answered step's spans (filled by the evaluation from the trace), which
    /// agent blame is scored by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_agent: Option<String>,
    /// SQL and bash calls made, subagents' included.
    pub tool_calls: usize,
    /// How the episode ended, for the record.
    pub outcome: String,
}

/// Whether the trace is labelled healthy ([`taxonomy::NONE`]).
pub fn healthy(case: &Case) -> bool {
    case.truth.is_healthy()
}

/// A healthy trace that the detector called deficient (a verdict naming a type).
pub fn false_positive(case: &Case) -> Option<bool> {
    healthy(case).then(|| {
        case.predicted
            .as_ref()
            .and_then(Verdict::deficiency_id)
            .is_some_and(|id| !id.eq_ignore_ascii_case(taxonomy::NONE))
    })
}

/// The predicted type is the labelled type (ids compared case-insensitively).
pub fn detected(case: &Case) -> bool {
    case.predicted
        .as_ref()
        .and_then(Verdict::deficiency_id)
        .is_some_and(|id| id.eq_ignore_ascii_case(case.truth.id()))
}

/// Component localisation: `None` when the label names no component (localisation is then
/// undefined); otherwise whether the predicted component is the labelled one.
pub fn localised(case: &Case) -> Option<bool> {
    let truth_component = case.truth.component.as_deref()?;
    let Some(p) = &case.predicted else {
        return Some(false);
    };
    Some(p.component() == Some(truth_component))
}

/// Code localisation, the level a framework without a component mapping allows: `None` for a
/// healthy trace or one whose label names neither a file nor a function; otherwise whether the
/// answer names the labelled function (the last part of a qualified name: `Tools.read_file`
/// matches `read_file`) and, where both sides name a file, the same file (by path suffix, so
/// `/tmp/run/app/tools.py` matches `app/tools.py`). An answer naming no location misses.
pub fn code_localised(case: &Case) -> Option<bool> {
    if healthy(case) || (case.truth.file.is_none() && case.truth.function.is_none()) {
        return None;
    }
    let Some(p) = &case.predicted else {
        return Some(false);
    };
    let Some(at) = p.location() else {
        return Some(false);
    };
    if at.file.is_none() && at.function.is_none() {
        return Some(false);
    }
    let last = |name: &str| name.rsplit(['.', ':']).next().unwrap_or(name).to_owned();
    let function_ok = match (&case.truth.function, &at.function) {
        (Some(t), Some(q)) => last(t) == last(q),
        (Some(_), None) => false,
        (None, _) => true,
    };
    let file_ok = match (&case.truth.file, &at.file) {
        (Some(t), Some(q)) => same_file(t, q),
        (Some(_), None) => case.truth.function.is_some(),
        (None, _) => true,
    };
    Some(function_ok && file_ok)
}

/// Agent blame: `None` for a healthy trace or one whose label names no agent; otherwise whether
/// the agent of the answered step is the labelled one (compared as [`agent_correct`] does).
pub fn agent_blamed(case: &Case) -> Option<bool> {
    if healthy(case) {
        return None;
    }
    let truth = case.truth.agent.as_deref()?;
    Some(
        case.predicted
            .as_ref()
            .and(case.answered_agent.as_deref())
            .is_some_and(|a| same_agent(a, truth)),
    )
}

/// Step localisation: `None` for a healthy trace or one whose label names no step; otherwise
/// whether the answer named a step within `tolerance` of the labelled one (an answer without a
/// step, or without a verdict, misses).
pub fn step_localised(case: &Case, tolerance: i64) -> Option<bool> {
    if healthy(case) {
        return None;
    }
    let truth = case.truth.step?;
    Some(
        case.predicted
            .as_ref()
            .and_then(Verdict::step)
            .is_some_and(|s| (s - truth).abs() <= tolerance),
    )
}

fn same_file(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim_start_matches("./"), b.trim_start_matches("./"));
    a == b || a.ends_with(&format!("/{b}")) || b.ends_with(&format!("/{a}"))
}

/// The label for a trace with no verdict in the confusion matrix.
pub const NO_VERDICT: &str = "(none)";

/// Rows: labelled type; columns: predicted type or [`NO_VERDICT`]; cells: counts.
pub type Confusion = BTreeMap<String, BTreeMap<String, usize>>;

pub fn confusion(cases: &[Case]) -> Confusion {
    let mut matrix = Confusion::new();
    for case in cases {
        let predicted = case.predicted.as_ref().map_or(NO_VERDICT.to_string(), |p| {
            p.deficiency_id().unwrap_or_default().to_uppercase()
        });
        *matrix
            .entry(case.truth.id().to_uppercase())
            .or_default()
            .entry(predicted)
            .or_default() += 1;
    }
    matrix
}

/// Per-category detection accuracy (one row per category that has cases).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CategoryRow {
    pub category: String,
    /// Distinct labelled types of this category among the cases.
    pub types: usize,
    pub detection: Estimate,
    pub localisation: Option<Estimate>,
}

/// Category name of a labelled type; types outside the catalog get their own row.
pub const UNCATALOGUED: &str = "(not in catalog)";

pub fn per_category(
    cases: &[Case],
    catalog: &taxonomy::Catalog,
    b: &Bootstrap,
) -> Vec<CategoryRow> {
    let mut groups: BTreeMap<String, Vec<&Case>> = BTreeMap::new();
    let order = |name: &str| {
        taxonomy::Category::ALL
            .iter()
            .position(|c| c.as_str() == name)
            .unwrap_or(usize::MAX)
    };
    for case in cases.iter().filter(|c| !healthy(c)) {
        let category = catalog
            .get(case.truth.id())
            .map_or(UNCATALOGUED.to_string(), |d| {
                d.category.as_str().to_string()
            });
        groups.entry(category).or_default().push(case);
    }
    let mut rows: Vec<CategoryRow> = groups
        .into_iter()
        .filter_map(|(category, group)| {
            let types: BTreeSet<String> =
                group.iter().map(|c| c.truth.id().to_uppercase()).collect();
            let hits: Vec<bool> = group.iter().map(|c| detected(c)).collect();
            let loc: Vec<bool> = group.iter().filter_map(|c| localised(c)).collect();
            Some(CategoryRow {
                category,
                types: types.len(),
                detection: bootstrap::proportion(&hits, b)?,
                localisation: bootstrap::proportion(&loc, b),
            })
        })
        .collect();
    rows.sort_by_key(|r| order(&r.category));
    rows
}

/// Detection accuracy per agent that produced the traces (Table 8's rows); empty when no
/// case names its agent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentRow {
    pub agent: String,
    pub detection: Estimate,
}

pub fn per_agent(cases: &[Case], b: &Bootstrap) -> Vec<AgentRow> {
    let mut groups: BTreeMap<&str, Vec<bool>> = BTreeMap::new();
    for case in cases {
        if let Some(agent) = &case.agent {
            groups.entry(agent).or_default().push(detected(case));
        }
    }
    groups
        .into_iter()
        .filter_map(|(agent, hits)| {
            Some(AgentRow {
                agent: agent.to_string(),
                detection: bootstrap::proportion(&hits, b)?,
            })
        })
        .collect()
}

/// Table 5's figures for one detector, plus Table 6 and the confusion matrix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub traces: usize,
    /// Over the deficient traces (labelled with a type, not `none`).
    pub detection: Option<Estimate>,
    /// Healthy traces (labelled `none`) among `traces`.
    pub healthy: usize,
    /// Healthy traces called deficient, over the healthy traces.
    pub false_positive_rate: Option<Estimate>,
    /// Over the traces whose label names a component.
    pub localisation: Option<Estimate>,
    /// Over the deficient traces whose label names a file or a function ([`code_localised`]).
    #[serde(default)]
    pub code_localisation: Option<Estimate>,
    pub tool_calls: Option<Estimate>,
    /// Over the deficient traces whose label names a step: the answer's step is the labelled
    /// one, or within one step of it.
    #[serde(default)]
    pub step_exact: Option<Estimate>,
    #[serde(default)]
    pub step_within_one: Option<Estimate>,
    /// Over deficient traces whose label names an agent: the answered step's agent is it.
    pub agent_blame: Option<Estimate>,
    /// Traces whose episode ended without a verdict.
    pub no_verdict: usize,
    pub per_category: Vec<CategoryRow>,
    pub per_agent: Vec<AgentRow>,
    pub confusion: Confusion,
}

pub fn summarise(cases: &[Case], catalog: &taxonomy::Catalog, b: &Bootstrap) -> Summary {
    let hits: Vec<bool> = cases.iter().filter(|c| !healthy(c)).map(detected).collect();
    let loc: Vec<bool> = cases.iter().filter_map(localised).collect();
    let calls: Vec<f64> = cases.iter().map(|c| c.tool_calls as f64).collect();
    let fp: Vec<bool> = cases.iter().filter_map(false_positive).collect();
    let step =
        |k: i64| -> Vec<bool> { cases.iter().filter_map(|c| step_localised(c, k)).collect() };
    Summary {
        traces: cases.len(),
        detection: bootstrap::proportion(&hits, b),
        healthy: fp.len(),
        false_positive_rate: bootstrap::proportion(&fp, b),
        localisation: bootstrap::proportion(&loc, b),
        code_localisation: bootstrap::proportion(
            &cases.iter().filter_map(code_localised).collect::<Vec<_>>(),
            b,
        ),
        tool_calls: bootstrap::mean(&calls, b),
        step_exact: bootstrap::proportion(&step(0), b),
        step_within_one: bootstrap::proportion(&step(1), b),
        agent_blame: bootstrap::proportion(
            &cases.iter().filter_map(agent_blamed).collect::<Vec<_>>(),
            b,
        ),
        no_verdict: cases.iter().filter(|c| c.predicted.is_none()).count(),
        per_category: per_category(cases, catalog, b),
        per_agent: per_agent(cases, b),
        confusion: confusion(cases),
    }
}

/// Paired difference in detection accuracy, `other − base`, over the traces both runs
/// evaluated (matched by trace id), with a bootstrap interval over those traces. Pairing keeps
/// trace difficulty out of the interval, which is what an ablation's Δ needs.
pub fn detection_difference(base: &[Case], other: &[Case], b: &Bootstrap) -> Option<Estimate> {
    let by_id: BTreeMap<&str, &Case> = base.iter().map(|c| (c.trace_id.as_str(), c)).collect();
    let diffs: Vec<f64> = other
        .iter()
        .filter_map(|o| {
            let base = by_id.get(o.trace_id.as_str())?;
            Some(f64::from(u8::from(detected(o))) - f64::from(u8::from(detected(base))))
        })
        .collect();
    bootstrap::mean(&diffs, b)
}

/// Two detectors on the same traces (matched by id): over the deficient ones, the paired
/// difference in the type named (`other − base`, bootstrap interval over the traces) and the
/// traces only `other` names and only `base` names; over the healthy ones, the paired
/// difference in being called deficient.
pub fn paired_difference(base: &[Case], other: &[Case], b: &Bootstrap) -> PairedDifference {
    let by_id: BTreeMap<&str, &Case> = base.iter().map(|c| (c.trace_id.as_str(), c)).collect();
    let pairs: Vec<(&Case, &Case)> = other
        .iter()
        .filter_map(|o| by_id.get(o.trace_id.as_str()).map(|b| (*b, o)))
        .collect();
    let one = |x: bool| f64::from(u8::from(x));
    let deficient: Vec<(bool, bool)> = pairs
        .iter()
        .filter(|(b, _)| !healthy(b))
        .map(|(b, o)| (detected(b), detected(o)))
        .collect();
    let flagged: Vec<f64> = pairs
        .iter()
        .filter_map(|(b, o)| Some(one(false_positive(o)?) - one(false_positive(b)?)))
        .collect();
    PairedDifference {
        type_difference: bootstrap::mean(
            &deficient
                .iter()
                .map(|(b, o)| one(*o) - one(*b))
                .collect::<Vec<_>>(),
            b,
        ),
        won: deficient.iter().filter(|(b, o)| *o && !*b).count(),
        lost: deficient.iter().filter(|(b, o)| *b && !*o).count(),
        false_positive_difference: bootstrap::mean(&flagged, b),
    }
}

/// What [`paired_difference`] measures.
#[derive(Debug, Clone, Serialize)]
pub struct PairedDifference {
    /// Type named (1) or not (0), `other − base`, over the deficient traces.
    pub type_difference: Option<Estimate>,
    /// Deficient traces only `other` names, and only `base`.
    pub won: usize,
    pub lost: usize,
    /// Called deficient (1) or not (0), `other − base`, over the healthy traces.
    pub false_positive_difference: Option<Estimate>,
}

/// One labelled chat log and the blame a detector gave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlameCase {
    pub trace_id: String,
    /// The file it came from.
    pub source: String,
    /// The label's agent and step.
    pub truth: Truth,
    /// A blame answer; `None` when the detector gave none.
    pub predicted: Option<Verdict>,
}

impl BlameCase {
    /// The blamed (agent, step), if the answer blames.
    pub fn blamed(&self) -> Option<(&str, i64)> {
        let v = self.predicted.as_ref()?;
        Some((v.blamed_agent()?, v.step()?))
    }
}

/// The three external-trace figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlameSummary {
    pub logs: usize,
    /// Over logs labelled with an agent.
    pub agent: Option<Estimate>,
    /// Over logs labelled with a step.
    pub step_exact: Option<Estimate>,
    pub step_within: Option<Estimate>,
    pub tolerance: u64,
}

/// Agent names are compared case-insensitively with `_` for spaces: an answer names the agent
/// in one word (`answer: agent Data_Analyst step 3`).
pub fn agent_correct(case: &BlameCase) -> Option<bool> {
    let truth = case.truth.agent.as_deref()?;
    Some(
        case.blamed()
            .is_some_and(|(agent, _)| same_agent(agent, truth)),
    )
}

/// Agent names compared case-insensitively with `_` for spaces.
pub fn same_agent(a: &str, b: &str) -> bool {
    let norm = |a: &str| a.trim().replace(' ', "_").to_lowercase();
    norm(a) == norm(b)
}

/// Whether the predicted step is within `tolerance` of the labelled one (0 = exact).
pub fn step_within(case: &BlameCase, tolerance: u64) -> Option<bool> {
    let truth = case.truth.step?;
    Some(
        case.blamed()
            .is_some_and(|(_, step)| step.abs_diff(truth) <= tolerance),
    )
}

/// Paired differences of two blame runs over the same logs, `other − base` (matched by trace
/// id), for the agent, the exact step and the step within the tolerance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlameDifference {
    pub base: String,
    pub other: String,
    pub agent: Option<Estimate>,
    pub step_exact: Option<Estimate>,
    pub step_within: Option<Estimate>,
}

pub fn blame_difference(
    (base_name, base): (&str, &[BlameCase]),
    (other_name, other): (&str, &[BlameCase]),
    tolerance: u64,
    b: &Bootstrap,
) -> BlameDifference {
    let by_id: BTreeMap<&str, &BlameCase> = base.iter().map(|c| (c.trace_id.as_str(), c)).collect();
    let diff = |score: &dyn Fn(&BlameCase) -> Option<bool>| {
        let d: Vec<f64> = other
            .iter()
            .filter_map(|o| {
                let (x, y) = (score(by_id.get(o.trace_id.as_str())?)?, score(o)?);
                Some(f64::from(u8::from(y)) - f64::from(u8::from(x)))
            })
            .collect();
        bootstrap::mean(&d, b)
    };
    BlameDifference {
        base: base_name.to_string(),
        other: other_name.to_string(),
        agent: diff(&agent_correct),
        step_exact: diff(&|c| step_within(c, 0)),
        step_within: diff(&|c| step_within(c, tolerance)),
    }
}

pub fn summarise_blame(cases: &[BlameCase], tolerance: u64, b: &Bootstrap) -> BlameSummary {
    let agent: Vec<bool> = cases.iter().filter_map(agent_correct).collect();
    let exact: Vec<bool> = cases.iter().filter_map(|c| step_within(c, 0)).collect();
    let within: Vec<bool> = cases
        .iter()
        .filter_map(|c| step_within(c, tolerance))
        .collect();
    BlameSummary {
        logs: cases.len(),
        agent: bootstrap::proportion(&agent, b),
        step_exact: bootstrap::proportion(&exact, b),
        step_within: bootstrap::proportion(&within, b),
        tolerance,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(
        truth: &str,
        component: Option<&str>,
        predicted: Option<(&str, &str)>,
        calls: usize,
    ) -> Case {
        Case {
            trace_id: format!("t-{truth}-{calls}"),
            truth: Truth {
                component: component.map(str::to_string),
                file: Some("toolcaller/agent.py".into()),
                ..Truth::deficiency(truth)
            },
            predicted: predicted.map(|(id, comp)| answer(id, comp)),
            answered_agent: None,
            tool_calls: calls,
            outcome: String::new(),
            agent: None,
        }
    }

    fn answer(id: &str, component: &str) -> Verdict {
        Verdict::deficiency(id, component, "")
    }

    /// The code location of a case's (deficiency) answer, made empty if it names none.
    fn location(c: &mut Case) -> &mut detect::CodeLocation {
        match c.predicted.as_mut() {
            Some(Verdict::Deficiency { location, .. }) => {
                location.get_or_insert_with(Default::default)
            }
            other => panic!("not a deficiency answer: {other:?}"),
        }
    }

    /// The step of a case's (deficiency) answer.
    fn answered_step(c: &mut Case) -> &mut Option<i64> {
        match c.predicted.as_mut() {
            Some(Verdict::Deficiency { step, .. }) => step,
            other => panic!("not a deficiency answer: {other:?}"),
        }
    }

    fn cases() -> Vec<Case> {
        vec![
            case(
                "P16",
                Some("tools.schema"),
                Some(("P16", "tools.schema")),
                2,
            ),
            case(
                "P16",
                Some("tools.schema"),
                Some(("P18", "tools.schema")),
                4,
            ),
            case(
                "P24",
                Some("parsing.encoding"),
                Some(("p24", "parsing.json_extract")),
                3,
            ),
            case("C1", Some("orchestrator.termination"), None, 5),
            case("C1", None, Some(("C1", "orchestrator.termination")), 1),
        ]
    }

    #[test]
    fn detection_localisation_and_tool_calls_have_known_values() {
        let catalog = taxonomy::Catalog::embedded().unwrap();
        let s = summarise(&cases(), &catalog, &Bootstrap::default());
        assert_eq!(s.traces, 5);
        assert_eq!(s.detection.unwrap().value, 3.0 / 5.0);
        // The last case has no labelled component: 2 of 4 are localised.
        let loc = s.localisation.unwrap();
        assert_eq!((loc.value, loc.n), (0.5, 4));
        assert_eq!(s.tool_calls.unwrap().value, 3.0);
        assert_eq!(s.no_verdict, 1);
        for e in [s.detection.unwrap(), loc, s.tool_calls.unwrap()] {
            assert!(e.lo <= e.value && e.value <= e.hi, "{e:?}");
        }
    }

    #[test]
    fn per_agent_rows_only_for_cases_that_name_their_agent() {
        let mut all = cases();
        assert!(per_agent(&all, &Bootstrap::default()).is_empty());
        all[0].agent = Some("toolcaller".into());
        all[1].agent = Some("toolcaller".into());
        all[2].agent = Some("planner".into());
        let rows = per_agent(&all, &Bootstrap::default());
        let got: Vec<(&str, f64, usize)> = rows
            .iter()
            .map(|r| (r.agent.as_str(), r.detection.value, r.detection.n))
            .collect();
        assert_eq!(got, [("planner", 1.0, 1), ("toolcaller", 0.5, 2)]);
    }

    #[test]
    fn confusion_counts_every_case_once() {
        let m = confusion(&cases());
        assert_eq!(m["P16"]["P16"], 1);
        assert_eq!(m["P16"]["P18"], 1);
        assert_eq!(m["P24"]["P24"], 1);
        assert_eq!(m["C1"][NO_VERDICT], 1);
        assert_eq!(m["C1"]["C1"], 1);
        let total: usize = m.values().flat_map(|row| row.values()).sum();
        assert_eq!(total, 5);
    }

    #[test]
    fn categories_follow_the_catalog_in_table_order() {
        let catalog = taxonomy::Catalog::embedded().unwrap();
        let mut all = cases();
        all.push(case("X9", None, Some(("X9", "x")), 0));
        let rows = per_category(&all, &catalog, &Bootstrap::default());
        let names: Vec<&str> = rows.iter().map(|r| r.category.as_str()).collect();
        let cat = |id: &str| catalog.get(id).unwrap().category.as_str();
        assert_eq!(names.last(), Some(&UNCATALOGUED));
        let p16 = rows.iter().find(|r| r.category == cat("P16")).unwrap();
        assert_eq!(
            (p16.types, p16.detection.value, p16.detection.n),
            (1, 0.5, 2)
        );
        let c1 = rows.iter().find(|r| r.category == cat("C1")).unwrap();
        assert_eq!(c1.detection.value, 0.5);
        let order: Vec<usize> = rows
            .iter()
            .map(|r| {
                taxonomy::Category::ALL
                    .iter()
                    .position(|c| c.as_str() == r.category)
                    .unwrap_or(usize::MAX)
            })
            .collect();
        assert!(order.windows(2).all(|w| w[0] <= w[1]), "{names:?}");
    }

    #[test]
    fn code_location_is_scored_apart_from_the_component() {
        let mut c = case(
            "P16",
            Some("tools.schema"),
            Some(("P16", "tools.schema")),
            0,
        );
        c.truth.file = None;
        assert_eq!(code_localised(&c), None, "the label names no code location");
        c.truth.file = Some("toolcaller/agent.py".into());
        c.truth.function = Some("run_tools".into());
        assert_eq!(code_localised(&c), Some(false), "the answer names none");
        location(&mut c).function = Some("Agent.run_tools".into());
        assert_eq!(
            code_localised(&c),
            Some(true),
            "the function alone, by its last part"
        );
        location(&mut c).file = Some("/tmp/run/toolcaller/agent.py".into());
        assert_eq!(code_localised(&c), Some(true), "file by path suffix");
        location(&mut c).file = Some("other/tools.py".into());
        assert_eq!(code_localised(&c), Some(false), "a wrong file");
        assert_eq!(
            localised(&c),
            Some(true),
            "the component is scored on its own"
        );
        location(&mut c).function = Some("other".into());
        location(&mut c).file = Some("agent.py".into());
        assert_eq!(code_localised(&c), Some(false), "a wrong function");
        c.truth.deficiency_id = Some("none".into());
        assert_eq!(code_localised(&c), None, "healthy traces have no location");
    }

    #[test]
    fn agent_blame_compares_the_answered_steps_agent_with_the_label() {
        let mut c = case(
            "P2",
            Some("llm_client.stream"),
            Some(("P2", "llm_client.stream")),
            3,
        );
        assert_eq!(agent_blamed(&c), None, "the label names no agent");
        c.truth.agent = Some("Corpus Analyst".into());
        assert_eq!(agent_blamed(&c), Some(false), "the answer names no step");
        c.answered_agent = Some("corpus_analyst".into());
        assert_eq!(agent_blamed(&c), Some(true));
        c.answered_agent = Some("Fact Checker".into());
        assert_eq!(agent_blamed(&c), Some(false));
        assert_eq!(agent_blamed(&case("none", None, None, 1)), None);
    }

    #[test]
    fn step_localisation_counts_answers_within_the_tolerance_and_misses_without_a_step() {
        let mut c = case(
            "P2",
            Some("llm_client.stream"),
            Some(("P2", "llm_client.stream")),
            3,
        );
        assert_eq!(step_localised(&c, 1), None, "the label names no step");
        c.truth.step = Some(4);
        assert_eq!(step_localised(&c, 1), Some(false), "the answer names none");
        *answered_step(&mut c) = Some(5);
        assert_eq!(step_localised(&c, 0), Some(false));
        assert_eq!(step_localised(&c, 1), Some(true));
        c.predicted = None;
        assert_eq!(step_localised(&c, 1), Some(false));
        let healthy = case("none", None, None, 1);
        assert_eq!(step_localised(&healthy, 1), None);
        let s = summarise(
            &[c.clone()],
            &taxonomy::Catalog::embedded().unwrap(),
            &Bootstrap::default(),
        );
        assert_eq!(s.step_within_one.unwrap().value, 0.0);
    }

    #[test]
    fn paired_difference_matches_traces_by_id() {
        let base = cases();
        let mut other = cases();
        // Lose the first hit, gain the no-verdict case; one case only in `other`.
        other[0].predicted = None;
        other[3].predicted = Some(answer("C1", "orchestrator.termination"));
        other[1].predicted = other[0].predicted.clone();
        other.push(case("P2", None, None, 0));
        let d = detection_difference(&base, &other, &Bootstrap::default()).unwrap();
        assert_eq!((d.value, d.n), (0.0, 5));
        assert!(d.lo < 0.0 && d.hi > 0.0, "{d:?}");
        other[3].predicted = None;
        let d = detection_difference(&base, &other, &Bootstrap::default()).unwrap();
        assert_eq!(d.value, -0.2);
    }

    #[test]
    fn a_paired_difference_reads_deficient_and_healthy_traces_apart() {
        let healthy = |id: &str, called: Option<&str>| Case {
            trace_id: id.into(),
            ..case("none", None, called.map(|t| (t, "llm_client.request")), 0)
        };
        let mut base = vec![
            Case {
                trace_id: "a".into(),
                ..case("P1", None, Some(("P1", "x")), 0)
            },
            Case {
                trace_id: "b".into(),
                ..case("P2", None, Some(("P9", "x")), 0)
            },
            healthy("h1", Some("P1")),
            healthy("h2", Some("P3")),
            healthy("h3", None),
        ];
        base[4].predicted = Some(answer("none", "none"));
        let mut other = base.clone();
        // Loses a, gains b; takes back both false positives.
        other[0].predicted = Some(answer("C1", "x"));
        other[1].predicted = Some(answer("P2", "x"));
        other[2].predicted = Some(answer("none", "none"));
        other[3].predicted = Some(answer("none", "none"));
        let d = paired_difference(&base, &other, &Bootstrap::default());
        assert_eq!((d.won, d.lost), (1, 1));
        let t = d.type_difference.unwrap();
        assert_eq!((t.value, t.n), (0.0, 2));
        let f = d.false_positive_difference.unwrap();
        assert_eq!(f.n, 3);
        assert!((f.value + 2.0 / 3.0).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn blame_accuracy_with_tolerance() {
        let blame = |agent: Option<&str>, step: Option<i64>, p: Option<(&str, i64)>| BlameCase {
            trace_id: "t".into(),
            source: "f".into(),
            truth: Truth {
                agent: agent.map(str::to_string),
                step,
                ..Truth::default()
            },
            predicted: p.map(|(a, s)| Verdict::Blame {
                agent: a.to_string(),
                step: s,
                evidence: String::new(),
            }),
        };
        let cases = vec![
            blame(Some("A"), Some(3), Some(("A", 3))),
            blame(Some("A"), Some(3), Some(("B", 4))),
            blame(Some("B"), Some(0), Some(("B", 2))),
            blame(Some("C"), Some(5), None),
            blame(None, None, Some(("A", 1))),
        ];
        let s = summarise_blame(&cases, 1, &Bootstrap::default());
        assert_eq!(s.logs, 5);
        assert_eq!((s.agent.unwrap().value, s.agent.unwrap().n), (0.5, 4));
        assert_eq!(s.step_exact.unwrap().value, 0.25);
        assert_eq!(s.step_within.unwrap().value, 0.5);
        let wide = summarise_blame(&cases, 2, &Bootstrap::default());
        assert_eq!(wide.step_within.unwrap().value, 0.75);
    }
}
