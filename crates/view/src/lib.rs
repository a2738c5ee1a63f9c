//! Self-contained HTML views of investigated traces (`pathfinder detect --html`,
//! `pathfinder eval --out`).
//!
//! [`trace_page`] shows one trace as a collapsible span tree, each detector's investigation
//! turn by turn, each verdict with its catalog entry, the span it blames highlighted, and, on
//! evaluation pages, the ground truth with every verdict marked right or wrong.
//! [`index_page`] lists an evaluation's traces and verdicts in a table sortable by column.
//!
//! Invariants: pure functions of their arguments (no I/O); every value taken from a trace,
//! transcript, label or catalog is HTML-escaped; a page names no external resource (all CSS
//! and script inline, and a Content-Security-Policy that forbids loading anything); rendering
//! is linear in the number of spans, and the tree is folded below its first two levels and past
//! the first [`CHILDREN_SHOWN`] children of a span (in chunks of as many; the path to a blamed
//! span stays open).

mod html;
mod investigation;
mod tree;

use std::fmt::Write as _;

use detect::{Transcript, Verdict};
use taxonomy::Catalog;
use traces::{Label, Span};

pub use html::{escape, slug, FOLD_CHARS};
pub use tree::{CHILDREN_SHOWN, OPEN_DEPTH};

use html::escape_into;

/// One detector's answer on a trace.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The detector's name as the user gave it (with its ablations, if any).
    pub detector: String,
    /// `None` when the episode ended without one.
    pub verdict: Option<Verdict>,
    /// How the episode ended, in words.
    pub outcome: String,
    /// The whole investigation, when the detector leaves one.
    pub transcript: Option<Transcript>,
}

impl Answer {
    /// The answer a transcript holds.
    pub fn from_transcript(detector: impl Into<String>, transcript: Transcript) -> Answer {
        Answer {
            detector: detector.into(),
            verdict: transcript.verdict().cloned(),
            outcome: transcript.outcome.describe(),
            transcript: Some(transcript),
        }
    }
}

/// What [`trace_page`] shows.
#[derive(Debug, Clone, Copy)]
pub struct TracePage<'a> {
    pub trace_id: &'a str,
    /// The trace's spans, in store (`seq`) order.
    pub spans: &'a [Span],
    /// One per detector, shown side by side.
    pub answers: &'a [Answer],
    pub catalog: &'a Catalog,
    /// Ground truth (evaluation pages only): each verdict is marked right or wrong against it.
    pub label: Option<&'a Label>,
    /// A relative link back to the evaluation's index, if any.
    pub index_href: Option<&'a str>,
}

/// The span a verdict blames, as an index into `spans`, for highlighting:
///
/// - a deficiency verdict: of the error spans (status ERROR or an error type), the one whose
///   code location (file path and function) and name contain the most words of the component
///   id (split at `.` and `_`, words of three or more letters: `tools.schema` matches
///   `research/tools/schema.py`), the earliest on a tie; when no error span contains any, the
///   first error span; with no error span, none, since a healthy-looking trace names no span
///   by itself;
/// - a blame verdict (chat logs): the first span of that agent at that step, else the first
///   span at that step.
pub fn blamed_span(spans: &[Span], verdict: &Verdict) -> Option<usize> {
    match verdict {
        Verdict::Deficiency { component, .. } => {
            let words: Vec<String> = component
                .split(['.', '_', '/'])
                .filter(|w| w.len() >= 3)
                .map(str::to_ascii_lowercase)
                .collect();
            let mut best: Option<(usize, usize)> = None;
            let mut first_error = None;
            for (i, s) in spans.iter().enumerate().filter(|(_, s)| s.is_error()) {
                first_error.get_or_insert(i);
                let hay = format!(
                    "{} {} {}",
                    s.code_filepath.as_deref().unwrap_or(""),
                    s.code_function.as_deref().unwrap_or(""),
                    s.name
                )
                .to_ascii_lowercase();
                let score = words.iter().filter(|w| hay.contains(w.as_str())).count();
                if score > 0 && best.is_none_or(|(b, _)| score > b) {
                    best = Some((score, i));
                }
            }
            best.map(|(_, i)| i).or(first_error)
        }
        Verdict::Blame { agent, step, .. } => spans
            .iter()
            .position(|s| s.step == Some(*step) && s.agent_name.as_deref() == Some(agent))
            .or_else(|| spans.iter().position(|s| s.step == Some(*step))),
    }
}

/// Whether a verdict names the labelled type (`None` without a type label).
pub fn type_right(verdict: Option<&Verdict>, label: &Label) -> Option<bool> {
    let truth = label.truth.deficiency_id.as_deref()?;
    Some(match verdict {
        Some(Verdict::Deficiency { deficiency_id, .. }) => {
            deficiency_id.eq_ignore_ascii_case(truth)
        }
        _ => false,
    })
}

/// Whether a verdict names the labelled component (`None` without a component label).
pub fn component_right(verdict: Option<&Verdict>, label: &Label) -> Option<bool> {
    let truth = label.truth.component.as_deref()?;
    Some(match verdict {
        Some(Verdict::Deficiency { component, .. }) => component == truth,
        _ => false,
    })
}

fn mark(out: &mut String, right: Option<bool>) {
    match right {
        Some(true) => out.push_str(" <span class=\"right\">✓ right</span>"),
        Some(false) => out.push_str(" <span class=\"wrong\">✗ wrong</span>"),
        None => {}
    }
}

/// A type id with its catalog name (`none` reads as healthy).
fn type_line(out: &mut String, id: &str, catalog: &Catalog) {
    out.push_str("<code>");
    escape_into(out, id);
    out.push_str("</code> ");
    if id.eq_ignore_ascii_case(taxonomy::NONE) {
        out.push_str("healthy (no deficiency)");
    } else if let Some(d) = catalog.get(id) {
        out.push_str("<strong>");
        escape_into(out, &d.name);
        out.push_str("</strong> <span class=\"meta\">");
        escape_into(out, d.category.as_str());
        out.push_str("</span>");
    } else {
        out.push_str("<em>not in the catalog</em>");
    }
}

fn component_line(out: &mut String, id: &str, catalog: &Catalog) {
    out.push_str("<code>");
    escape_into(out, id);
    out.push_str("</code>");
    if let Some(c) = catalog.component(id) {
        out.push_str(" <span class=\"meta\">");
        escape_into(out, &c.description);
        out.push_str("</span>");
    }
}

/// One trace's page: verdicts (and ground truth), the span tree, the investigations.
pub fn trace_page(page: &TracePage) -> String {
    let TracePage {
        trace_id,
        spans,
        answers,
        catalog,
        label,
        index_href,
    } = *page;
    let mut blamed_by: Vec<Vec<String>> = vec![Vec::new(); spans.len()];
    let blamed: Vec<Option<usize>> = answers
        .iter()
        .map(|a| a.verdict.as_ref().and_then(|v| blamed_span(spans, v)))
        .collect();
    for (a, b) in answers.iter().zip(&blamed) {
        if let Some(i) = b {
            blamed_by[*i].push(a.detector.clone());
        }
    }
    let mut body = String::with_capacity(spans.len() * 1024 + 4096);
    if let Some(href) = index_href {
        body.push_str("<p><a href=\"");
        escape_into(&mut body, href);
        body.push_str("\">← all traces</a></p>");
    }
    body.push_str("<h1>Trace <code>");
    escape_into(&mut body, trace_id);
    body.push_str("</code></h1>");
    let errors = spans.iter().filter(|s| s.is_error()).count();
    let _ = write!(
        body,
        "<p class=\"meta\">{} spans · {errors} with errors</p>",
        spans.len()
    );

    body.push_str("<h2>Verdict</h2>");
    if let Some(l) = label {
        body.push_str("<div class=\"card truth\"><h3>Ground truth</h3><p>");
        match &l.truth.deficiency_id {
            Some(id) => type_line(&mut body, id, catalog),
            None => body.push_str("<em>no type labelled</em>"),
        }
        body.push_str("</p>");
        if let Some(c) = &l.truth.component {
            body.push_str("<p>component ");
            component_line(&mut body, c, catalog);
            body.push_str("</p>");
        }
        if l.truth.file.is_some() || l.truth.function.is_some() {
            body.push_str("<p>at <code>");
            escape_into(&mut body, l.truth.file.as_deref().unwrap_or("?"));
            if let Some(f) = &l.truth.function {
                body.push(' ');
                escape_into(&mut body, f);
            }
            body.push_str("</code></p>");
        }
        if let Some(step) = l.truth.step {
            let _ = write!(body, "<p>first shows at step {step}");
            if let Some(agent) = &l.truth.agent {
                body.push_str(" (agent <code>");
                escape_into(&mut body, agent);
                body.push_str("</code>)");
            }
            body.push_str("</p>");
        }
        body.push_str("</div>");
    }
    body.push_str("<div class=\"grid\">");
    for (a, b) in answers.iter().zip(&blamed) {
        verdict_card(&mut body, a, *b, spans, catalog, label);
    }
    if answers.is_empty() {
        body.push_str("<p><em>no detector ran on this trace</em></p>");
    }
    body.push_str("</div>");

    body.push_str("<h2>Span tree</h2><p class=\"controls\">");
    body.push_str("<button type=\"button\" data-tree=\"open\">expand all</button>");
    body.push_str("<button type=\"button\" data-tree=\"close\">collapse all</button></p>");
    tree::render(&mut body, spans, &blamed_by);

    body.push_str("<h2>Investigation</h2><div class=\"grid\">");
    for a in answers {
        body.push_str("<div class=\"card\"><h3>");
        escape_into(&mut body, &a.detector);
        body.push_str("</h3>");
        match &a.transcript {
            Some(t) => investigation::render(&mut body, t),
            None => {
                body.push_str("<p><em>this detector leaves no transcript; outcome:</em> ");
                escape_into(&mut body, &a.outcome);
                body.push_str("</p>");
            }
        }
        body.push_str("</div>");
    }
    body.push_str("</div>");
    html::page(&format!("Trace {trace_id}"), &body)
}

fn verdict_card(
    out: &mut String,
    a: &Answer,
    blamed: Option<usize>,
    spans: &[Span],
    catalog: &Catalog,
    label: Option<&Label>,
) {
    out.push_str("<div class=\"card verdict\"><h3>");
    escape_into(out, &a.detector);
    out.push_str("</h3>");
    match &a.verdict {
        Some(Verdict::Deficiency {
            deficiency_id,
            component,
            step,
            location,
            evidence,
        }) => {
            out.push_str("<p>type ");
            type_line(out, deficiency_id, catalog);
            mark(out, label.and_then(|l| type_right(a.verdict.as_ref(), l)));
            out.push_str("</p>");
            if let Some(d) = catalog.get(deficiency_id) {
                out.push_str("<p class=\"meta\">");
                escape_into(out, &d.mechanism);
                out.push_str("</p>");
            }
            out.push_str("<p>component ");
            component_line(out, component, catalog);
            mark(
                out,
                label.and_then(|l| component_right(a.verdict.as_ref(), l)),
            );
            out.push_str("</p>");
            if let Some(step) = step {
                let _ = write!(out, "<p>first shows at step {step}");
                if let Some(truth) = label.and_then(|l| l.truth.step) {
                    mark(out, Some((step - truth).abs() <= 1));
                }
                out.push_str("</p>");
            }
            if let Some(location) = location {
                out.push_str("<p>in the code at ");
                escape_into(out, &location.render());
                out.push_str("</p>");
            }
            if !evidence.is_empty() {
                out.push_str("<p>evidence</p>");
                html::value_into(out, evidence);
            }
        }
        Some(Verdict::Blame {
            agent,
            step,
            evidence,
        }) => {
            out.push_str("<p>blames agent <code>");
            escape_into(out, agent);
            let _ = write!(out, "</code> at step {step}</p>");
            if !evidence.is_empty() {
                out.push_str("<p>evidence</p>");
                html::value_into(out, evidence);
            }
        }
        None => {
            out.push_str("<p class=\"wrong\">no verdict: ");
            escape_into(out, &a.outcome);
            out.push_str("</p>");
            mark(out, label.and_then(|l| type_right(None, l)));
        }
    }
    if let Some(i) = blamed {
        let s = &spans[i];
        let _ = write!(out, "<p>blamed span <a href=\"#{}\">", tree::anchor(s));
        escape_into(out, &s.name);
        out.push_str("</a></p>");
    } else if a.verdict.is_some() {
        out.push_str("<p class=\"meta\">no span of the trace could be identified</p>");
    }
    out.push_str("</div>");
}

/// A page that reloads itself every `seconds` (a live list of verdicts).
pub fn refreshing(page: &str, seconds: u32) -> String {
    match page.find("<head>\n") {
        Some(i) => {
            let at = i + "<head>\n".len();
            format!(
                "{}<meta http-equiv=\"refresh\" content=\"{seconds}\">\n{}",
                &page[..at],
                &page[at..]
            )
        }
        None => page.to_string(),
    }
}

/// One row of the evaluation index: a detector's answer on a trace.
#[derive(Debug, Clone)]
pub struct IndexRow {
    pub trace_id: String,
    /// The trace's page, relative to the index.
    pub href: String,
    pub detector: String,
    pub verdict: Option<Verdict>,
    pub label: Option<Label>,
}

/// The evaluation's index: one row per trace and detector, sortable by any column (click its
/// heading), with each detector's count of right types above.
pub fn index_page(title: &str, rows: &[IndexRow], catalog: &Catalog) -> String {
    let mut body = String::with_capacity(rows.len() * 512 + 2048);
    body.push_str("<h1>");
    escape_into(&mut body, title);
    body.push_str("</h1>");
    let mut tallies: Vec<(String, usize, usize)> = Vec::new();
    for r in rows {
        let right = r
            .label
            .as_ref()
            .and_then(|l| type_right(r.verdict.as_ref(), l));
        let pos = match tallies.iter().position(|t| t.0 == r.detector) {
            Some(p) => p,
            None => {
                tallies.push((r.detector.clone(), 0, 0));
                tallies.len() - 1
            }
        };
        if let Some(right) = right {
            tallies[pos].1 += usize::from(right);
            tallies[pos].2 += 1;
        }
    }
    body.push_str("<ul>");
    for (d, right, of) in &tallies {
        body.push_str("<li><code>");
        escape_into(&mut body, d);
        let _ = write!(
            body,
            "</code>: type right on {right} of {of} labelled traces</li>"
        );
    }
    body.push_str("</ul><p class=\"meta\">Click a column heading to sort.</p>");
    body.push_str(
        "<table class=\"index sortable\"><thead><tr><th>trace</th><th>detector</th>\
         <th>verdict type</th><th>verdict component</th><th>true type</th>\
         <th>true component</th><th>type</th><th>component</th></tr></thead><tbody>",
    );
    for r in rows {
        body.push_str("<tr><td><a href=\"");
        escape_into(&mut body, &r.href);
        body.push_str("\"><code>");
        escape_into(&mut body, &r.trace_id);
        body.push_str("</code></a></td><td>");
        escape_into(&mut body, &r.detector);
        body.push_str("</td>");
        let (vt, vc) = match &r.verdict {
            Some(Verdict::Deficiency {
                deficiency_id,
                component,
                ..
            }) => (deficiency_id.clone(), component.clone()),
            Some(Verdict::Blame { agent, step, .. }) => {
                (format!("{agent} step {step}"), String::new())
            }
            None => ("(no verdict)".into(), String::new()),
        };
        cell_type(&mut body, &vt, catalog);
        cell(&mut body, &vc);
        let lt = r.label.as_ref().and_then(|l| l.truth.deficiency_id.clone());
        let lc = r.label.as_ref().and_then(|l| l.truth.component.clone());
        cell_type(&mut body, lt.as_deref().unwrap_or(""), catalog);
        cell(&mut body, lc.as_deref().unwrap_or(""));
        for right in [
            r.label
                .as_ref()
                .and_then(|l| type_right(r.verdict.as_ref(), l)),
            r.label
                .as_ref()
                .and_then(|l| component_right(r.verdict.as_ref(), l)),
        ] {
            body.push_str(match right {
                Some(true) => "<td class=\"right\" data-sort=\"1\">✓</td>",
                Some(false) => "<td class=\"wrong\" data-sort=\"0\">✗</td>",
                None => "<td data-sort=\"\">–</td>",
            });
        }
        body.push_str("</tr>\n");
    }
    body.push_str("</tbody></table>");
    html::page(title, &body)
}

fn cell(out: &mut String, text: &str) {
    out.push_str("<td>");
    escape_into(out, text);
    out.push_str("</td>");
}

/// A type id with its catalog name as a tooltip; sorts by the id.
fn cell_type(out: &mut String, id: &str, catalog: &Catalog) {
    out.push_str("<td data-sort=\"");
    escape_into(out, id);
    out.push('"');
    if let Some(d) = catalog.get(id) {
        out.push_str(" title=\"");
        escape_into(out, &d.name);
        out.push('"');
    }
    out.push('>');
    escape_into(out, id);
    out.push_str("</td>");
}

#[cfg(test)]
mod tests;
