//! Turns a parsed batch into validated traces with their derived columns. Pure: no I/O.
//!
//! Checks and repairs, per trace (documented in SCHEMA.md):
//! - string values over [`ImportOptions::max_value_bytes`] are clipped and marked (warning);
//! - a span id seen twice: an exact duplicate is dropped (warning), a different span with the
//!   same id is an error;
//! - a parent id that names no span of the trace: the span becomes a root and the missing id is
//!   kept in attribute `pathfinder.import.missing_parent_span_id` (warning);
//! - a parent cycle (including a span that is its own parent) is an error.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::conventions::value_text;
use crate::error::{Error, Result};
use crate::import::{Batch, Format, ImportOptions, Located, TraceMeta};
use crate::redact::prefix_at_boundary;
use crate::span::{Span, SpanKind, StatusCode};

/// The attribute that keeps a parent id which named no span of its trace.
pub const MISSING_PARENT_ATTRIBUTE: &str = "pathfinder.import.missing_parent_span_id";

/// One row of the `traces` table.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceRow {
    pub trace_id: String,
    pub source_format: Format,
    pub source: String,
    pub framework: Option<String>,
    pub task: Option<String>,
    pub status: StatusCode,
    pub outcome: Option<String>,
    pub has_error: bool,
    pub error_count: i64,
    pub span_count: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub total_tokens: i64,
    pub started_ns: Option<i64>,
    pub ended_ns: Option<i64>,
    pub latency_ns: Option<i64>,
    pub max_step: Option<i64>,
    pub root_span_id: Option<String>,
    pub attributes: Map<String, Value>,
}

/// One row of the `trace_tools` rollup: a tool's calls within one trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRollup {
    pub tool_name: String,
    pub calls: i64,
    pub errors: i64,
    pub total_duration_ns: i64,
    /// The longest run of consecutive tool calls (in `seq` order, other tools interrupt a run,
    /// LLM and agent spans do not) that all called this tool.
    pub max_consecutive: i64,
}

/// A span with the columns derived from its trace.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacedSpan {
    pub span: Span,
    /// 0-based position in the trace ordered by start time, then input order.
    pub seq: i64,
    /// 0 for roots, parent's depth + 1 otherwise.
    pub depth: i64,
    /// The attributes as compact JSON text when the importer kept them unparsed
    /// (`span.attributes` is then empty); see [`Located::raw_attributes`].
    pub raw_attributes: Option<String>,
}

/// A validated trace ready to insert.
#[derive(Debug, Clone, PartialEq)]
pub struct AssembledTrace {
    pub row: TraceRow,
    /// In `seq` order.
    pub spans: Vec<PlacedSpan>,
    pub tools: Vec<ToolRollup>,
}

/// Validates, repairs and derives. Returns the traces in first-seen order and the warnings
/// (the batch's own first).
pub fn assemble(
    batch: Batch,
    source: &str,
    format: Format,
    options: &ImportOptions,
) -> Result<(Vec<AssembledTrace>, Vec<String>)> {
    let Batch {
        spans,
        mut meta,
        warnings: mut all_warnings,
        ..
    } = batch;
    let mut order: Vec<String> = Vec::new();
    let mut groups: HashMap<String, Vec<Located>> = HashMap::new();
    for mut located in spans {
        clip_span(&mut located, options.max_value_bytes, &mut all_warnings)?;
        let id = located.span.trace_id.clone();
        groups
            .entry(id.clone())
            .or_insert_with(|| {
                order.push(id);
                Vec::new()
            })
            .push(located);
    }
    let mut traces = Vec::with_capacity(order.len());
    for trace_id in order {
        let group = groups.remove(&trace_id).expect("grouped above");
        let trace_meta = meta.remove(&trace_id).unwrap_or_default();
        traces.push(assemble_trace(
            &trace_id,
            group,
            trace_meta,
            source,
            format,
            &mut all_warnings,
        )?);
    }
    Ok((traces, all_warnings))
}

fn assemble_trace(
    trace_id: &str,
    group: Vec<Located>,
    meta: TraceMeta,
    source: &str,
    format: Format,
    warnings: &mut Vec<String>,
) -> Result<AssembledTrace> {
    // Duplicate span ids.
    let mut first_seen: HashMap<String, usize> = HashMap::with_capacity(group.len());
    let mut kept: Vec<Located> = Vec::with_capacity(group.len());
    for mut located in group {
        match first_seen.get(&located.span.span_id) {
            Some(&i) if same_span(&mut kept[i], &mut located)? => warnings.push(format!(
                "{}: dropped an exact duplicate of span {} (first at {})",
                located.origin, located.span.span_id, kept[i].origin
            )),
            Some(&i) => {
                return Err(Error::malformed(
                    source,
                    &located.origin,
                    format!(
                    "duplicate span id {} in trace {trace_id} (first at {}) with different content",
                    located.span.span_id, kept[i].origin
                ),
                ))
            }
            None => {
                first_seen.insert(located.span.span_id.clone(), kept.len());
                kept.push(located);
            }
        }
    }
    let index = first_seen;

    // Missing parents become roots; self-parents are cycles.
    for located in &mut kept {
        let Some(parent) = located.span.parent_span_id.clone() else {
            // Roots' attributes name the trace's framework, task and outcome.
            located.hydrate()?;
            continue;
        };
        let span = &mut located.span;
        if parent == span.span_id {
            return Err(Error::malformed(
                source,
                &located.origin,
                format!("parent cycle in trace {trace_id}: span {parent} is its own parent"),
            ));
        }
        if !index.contains_key(&parent) {
            located.hydrate()?;
            let span = &mut located.span;
            warnings.push(format!(
                "{}: span {} names parent {parent}, which is not in trace {trace_id}; imported as a root",
                located.origin, span.span_id
            ));
            span.attributes
                .insert(MISSING_PARENT_ATTRIBUTE.into(), Value::String(parent));
            span.parent_span_id = None;
        }
    }

    let depths = depths(trace_id, &kept, &index, source)?;

    // seq: start time, then input order (spans without times keep their input order, last).
    let mut by_time: Vec<usize> = (0..kept.len()).collect();
    by_time.sort_by_key(|&i| (kept[i].span.start_time_ns.unwrap_or(i64::MAX), i));

    let mut spans: Vec<PlacedSpan> = Vec::with_capacity(kept.len());
    let mut slots: Vec<Option<Located>> = kept.into_iter().map(Some).collect();
    for (seq, &i) in by_time.iter().enumerate() {
        let located = slots[i].take().expect("each index once");
        spans.push(PlacedSpan {
            span: located.span,
            seq: seq as i64,
            depth: depths[i],
            raw_attributes: located.raw_attributes,
        });
    }

    let row = summarize(trace_id, &spans, meta, source, format);
    let tools = tool_rollups(&spans);
    Ok(AssembledTrace { row, spans, tools })
}

/// Depth of every span, walking parent chains iteratively (no recursion, so a 100,000-deep
/// chain is fine) and failing on a cycle with its members named.
fn depths(
    trace_id: &str,
    spans: &[Located],
    index: &HashMap<String, usize>,
    source: &str,
) -> Result<Vec<i64>> {
    const UNSEEN: i64 = -1;
    const ON_PATH: i64 = -2;
    let mut depth = vec![UNSEEN; spans.len()];
    let mut path: Vec<usize> = Vec::new();
    for start in 0..spans.len() {
        let mut current = start;
        // Walk up until a span of known depth or a root.
        let base = loop {
            if depth[current] >= 0 {
                break depth[current];
            }
            if depth[current] == ON_PATH {
                let from = path
                    .iter()
                    .position(|&p| p == current)
                    .expect("on the path");
                let cycle: Vec<&str> = path[from..]
                    .iter()
                    .chain(std::iter::once(&current))
                    .map(|&i| spans[i].span.span_id.as_str())
                    .collect();
                return Err(Error::malformed(
                    source,
                    &spans[current].origin,
                    format!("parent cycle in trace {trace_id}: {}", cycle.join(" → ")),
                ));
            }
            depth[current] = ON_PATH;
            path.push(current);
            match spans[current].span.parent_span_id.as_ref() {
                Some(parent) => current = index[parent],
                None => break -1,
            }
        };
        let mut d = base;
        while let Some(i) = path.pop() {
            d += 1;
            depth[i] = d;
        }
    }
    Ok(depth)
}

fn summarize(
    trace_id: &str,
    spans: &[PlacedSpan],
    meta: TraceMeta,
    source: &str,
    format: Format,
) -> TraceRow {
    let roots: Vec<&Span> = spans
        .iter()
        .filter(|p| p.span.parent_span_id.is_none())
        .map(|p| &p.span)
        .collect();
    // The root that stands for the run: an agent root if any, else the earliest.
    let root = roots
        .iter()
        .find(|s| s.kind == SpanKind::Agent)
        .or_else(|| roots.first())
        .copied();
    let status = if roots.len() == 1 {
        roots[0].status
    } else if roots.iter().any(|s| s.status == StatusCode::Error) {
        StatusCode::Error
    } else if !roots.is_empty() && roots.iter().all(|s| s.status == StatusCode::Ok) {
        StatusCode::Ok
    } else {
        StatusCode::Unset
    };
    let root_attr = |key: &str| {
        root.and_then(|r| r.attributes.get(key))
            .and_then(value_text)
    };
    // Agent spans may repeat their LLM calls' usage; count LLM spans only when they report any.
    let llm_tokens = spans.iter().any(|p| {
        p.span.kind == SpanKind::Llm
            && (p.span.input_tokens.is_some() || p.span.output_tokens.is_some())
    });
    let counted = spans
        .iter()
        .filter(|p| !llm_tokens || p.span.kind == SpanKind::Llm);
    let (input_tokens, output_tokens) = counted.fold((0i64, 0i64), |(i, o), p| {
        (
            i.saturating_add(p.span.input_tokens.unwrap_or(0)),
            o.saturating_add(p.span.output_tokens.unwrap_or(0)),
        )
    });
    let started_ns = spans.iter().filter_map(|p| p.span.start_time_ns).min();
    let ended_ns = spans
        .iter()
        .filter_map(|p| p.span.end_time_ns.or(p.span.start_time_ns))
        .max();
    let error_count = spans.iter().filter(|p| p.span.is_error()).count() as i64;
    TraceRow {
        trace_id: trace_id.to_string(),
        source_format: format,
        source: source.to_string(),
        framework: root_attr("pathfinder.framework").or(meta.framework),
        task: root_attr("pathfinder.task_id").or(meta.task),
        status,
        outcome: root_attr("pathfinder.outcome"),
        has_error: error_count > 0,
        error_count,
        span_count: spans.len() as i64,
        input_tokens,
        output_tokens,
        total_tokens: input_tokens.saturating_add(output_tokens),
        started_ns,
        ended_ns,
        latency_ns: match (started_ns, ended_ns) {
            (Some(s), Some(e)) => Some(e.saturating_sub(s)),
            _ => None,
        },
        max_step: spans.iter().filter_map(|p| p.span.step).max(),
        root_span_id: root.map(|r| r.span_id.clone()),
        attributes: meta.attributes,
    }
}

fn tool_rollups(spans: &[PlacedSpan]) -> Vec<ToolRollup> {
    let mut rollups: Vec<ToolRollup> = Vec::new();
    let mut position: HashMap<&str, usize> = HashMap::new();
    let mut run: Option<(&str, i64)> = None;
    for placed in spans {
        let Some(tool) = placed.span.tool_name.as_deref() else {
            continue;
        };
        let i = *position.entry(tool).or_insert_with(|| {
            rollups.push(ToolRollup {
                tool_name: tool.to_string(),
                calls: 0,
                errors: 0,
                total_duration_ns: 0,
                max_consecutive: 0,
            });
            rollups.len() - 1
        });
        let length = match run {
            Some((name, n)) if name == tool => n + 1,
            _ => 1,
        };
        run = Some((tool, length));
        let r = &mut rollups[i];
        r.calls += 1;
        r.errors += i64::from(placed.span.is_error());
        r.total_duration_ns = r
            .total_duration_ns
            .saturating_add(placed.span.duration_ns().unwrap_or(0).max(0));
        r.max_consecutive = r.max_consecutive.max(length);
    }
    rollups
}

/// Whether two spans with the same id are the same span (an exporter's retry). Unparsed
/// attributes are compared as text first and parsed only when the texts differ.
fn same_span(first: &mut Located, second: &mut Located) -> Result<bool> {
    if first.span != second.span {
        return Ok(false);
    }
    if first.raw_attributes == second.raw_attributes {
        return Ok(true);
    }
    first.hydrate()?;
    second.hydrate()?;
    Ok(first.span == second.span)
}

/// Clips every over-long string of a span, noting each clipped field in a warning.
fn clip_span(located: &mut Located, limit: usize, warnings: &mut Vec<String>) -> Result<()> {
    // No string inside unparsed attributes can be longer than their text.
    if located
        .raw_attributes
        .as_ref()
        .is_some_and(|t| t.len() > limit)
    {
        located.hydrate()?;
    }
    let mut clipped: Vec<String> = Vec::new();
    let span = &mut located.span;
    if clip_string(&mut span.name, limit) {
        clipped.push("name".to_string());
    }
    for (name, field) in [
        ("input", &mut span.input),
        ("output", &mut span.output),
        ("tool_arguments", &mut span.tool_arguments),
        ("status_message", &mut span.status_message),
        ("error_message", &mut span.error_message),
    ] {
        if let Some(text) = field.as_mut() {
            if clip_string(text, limit) {
                clipped.push(name.to_string());
            }
        }
    }
    for (key, value) in span.attributes.iter_mut() {
        if clip_value(value, limit) {
            clipped.push(format!("attribute `{key}`"));
        }
    }
    for (i, event) in span.events.iter_mut().enumerate() {
        if clip_value(event, limit) {
            clipped.push(format!("event {i}"));
        }
    }
    if !clipped.is_empty() {
        warnings.push(format!(
            "{}: clipped to {limit} bytes: {}",
            located.origin,
            clipped.join(", ")
        ));
    }
    Ok(())
}

/// Clips the strings inside a JSON value; true if any was clipped. Depth is bounded by the
/// JSON parser's nesting limit.
fn clip_value(value: &mut Value, limit: usize) -> bool {
    match value {
        Value::String(s) => clip_string(s, limit),
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |any, v| clip_value(v, limit) | any),
        Value::Object(map) => map
            .values_mut()
            .fold(false, |any, v| clip_value(v, limit) | any),
        _ => false,
    }
}

fn clip_string(text: &mut String, limit: usize) -> bool {
    if text.len() <= limit {
        return false;
    }
    let dropped = text.len() - prefix_at_boundary(text, limit).len();
    let keep = text.len() - dropped;
    text.truncate(keep);
    text.push_str(&format!("…[clipped {dropped} bytes]"));
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn located(id: &str, parent: Option<&str>, start: i64) -> Located {
        let mut span = Span::new("t1", id, format!("s{id}"), SpanKind::Tool);
        span.parent_span_id = parent.map(str::to_string);
        span.start_time_ns = Some(start);
        span.end_time_ns = Some(start + 10);
        span.tool_name = Some(if id == "c" { "calc" } else { "search" }.to_string());
        Located::new(span, format!("span {id}"))
    }

    fn run(spans: Vec<Located>) -> Result<(Vec<AssembledTrace>, Vec<String>)> {
        let batch = Batch {
            spans,
            ..Batch::default()
        };
        assemble(batch, "src", Format::Spans, &ImportOptions::default())
    }

    #[test]
    fn derives_depth_seq_and_rollups() {
        let (traces, warnings) = run(vec![
            located("b", Some("a"), 20),
            located("a", None, 0),
            located("c", Some("b"), 30),
            located("d", Some("a"), 40),
        ])
        .unwrap();
        assert!(warnings.is_empty());
        let t = &traces[0];
        let order: Vec<(&str, i64, i64)> = t
            .spans
            .iter()
            .map(|p| (p.span.span_id.as_str(), p.seq, p.depth))
            .collect();
        assert_eq!(
            order,
            vec![("a", 0, 0), ("b", 1, 1), ("c", 2, 2), ("d", 3, 1)]
        );
        assert_eq!(
            (t.row.started_ns, t.row.ended_ns, t.row.latency_ns),
            (Some(0), Some(50), Some(50))
        );
        let search = t.tools.iter().find(|r| r.tool_name == "search").unwrap();
        assert_eq!((search.calls, search.max_consecutive), (3, 2));
    }

    #[test]
    fn cycles_are_errors_naming_members() {
        let err = run(vec![located("a", Some("b"), 0), located("b", Some("a"), 1)])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("parent cycle in trace t1") && err.contains("a → b → a"),
            "{err}"
        );
        let err = run(vec![located("a", Some("a"), 0)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("its own parent"), "{err}");
    }

    #[test]
    fn deep_chains_do_not_recurse() {
        let n = 100_000;
        let spans = (0..n)
            .map(|i| {
                located(
                    &i.to_string(),
                    (i > 0).then(|| (i - 1).to_string()).as_deref(),
                    i,
                )
            })
            .collect();
        let (traces, _) = run(spans).unwrap();
        assert_eq!(traces[0].spans.last().unwrap().depth, n - 1);
    }

    #[test]
    fn missing_parents_and_duplicates_are_repaired_or_refused() {
        let (traces, warnings) = run(vec![
            located("a", Some("zz"), 0),
            located("a", Some("zz"), 0),
        ])
        .unwrap();
        assert_eq!(traces[0].spans.len(), 1);
        assert_eq!(
            traces[0].spans[0].span.attributes[MISSING_PARENT_ATTRIBUTE],
            "zz"
        );
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        let mut other = located("a", None, 5);
        other.origin = "span a'".into();
        let err = run(vec![located("a", None, 0), other])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("duplicate span id a") && err.contains("span a'"),
            "{err}"
        );
    }

    #[test]
    fn long_values_are_clipped_on_char_boundaries() {
        let mut s = located("a", None, 0);
        s.span
            .attributes
            .insert("big".into(), Value::String("é".repeat(10)));
        let batch = Batch {
            spans: vec![s],
            ..Batch::default()
        };
        let (traces, warnings) = assemble(
            batch,
            "src",
            Format::Spans,
            &ImportOptions { max_value_bytes: 5 },
        )
        .unwrap();
        assert_eq!(
            traces[0].spans[0].span.attributes["big"],
            "éé…[clipped 16 bytes]"
        );
        assert!(warnings[0].contains("attribute `big`"), "{warnings:?}");
    }
}
