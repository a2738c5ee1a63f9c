//! Where an injected run first departs from the clean run of the same task: the label that
//! tells a detector *where* a deficiency shows, not only which one it is.
//!
//! Both traces are read back from a trace store in `seq` order (the store's one ordering of a
//! trace's spans) and compared span by span on what a run does — the span's name and kind, its
//! status and error type, the tool it calls and the arguments, and the request it sends a model
//! (`gen_ai.request.*`). The first span that differs is the departure. A span with children
//! (a run, a step, a conversation) is compared without its status and error at first: it fails
//! because a child failed, and the child is where the failure shows. When one trace is a prefix
//! of the other, the departure is the first span past the shorter one (or the injected run's
//! last span, when it stopped early); then a container's own failure; then the first span
//! whose token counts differ (a token-counting bug shows nowhere else). Identical runs have no
//! departure.

use serde::{Deserialize, Serialize};
use traces::Span;

/// The first span of an injected run that differs from the clean run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Departure {
    /// The span's position in the injected trace (`seq`, from 0).
    pub seq: usize,
    pub span: String,
    /// The agent step it belongs to (its own `step`, else the nearest earlier span's).
    pub step: Option<i64>,
    /// The agent it belongs to (likewise).
    pub agent: Option<String>,
    /// What differed: `behaviour`, `tokens` or `length`.
    pub by: String,
}

/// What a span does, as compared between the two runs; `outcome` adds its status and error.
fn behaviour(s: &Span, outcome: bool) -> impl PartialEq + '_ {
    let requests: Vec<(&String, &serde_json::Value)> = s
        .attributes
        .iter()
        .filter(|(k, _)| k.starts_with("gen_ai.request."))
        .collect();
    (
        (&s.name, s.kind),
        outcome.then_some((s.status, &s.error_type)),
        (&s.tool_name, &s.tool_arguments),
        requests,
    )
}

/// The spans of a trace that are some other span's parent.
fn parents(spans: &[Span]) -> std::collections::HashSet<&str> {
    spans
        .iter()
        .filter_map(|s| s.parent_span_id.as_deref())
        .collect()
}

/// The first departure of `injected` from `clean`, both in `seq` order.
pub fn first_departure(clean: &[Span], injected: &[Span]) -> Option<Departure> {
    let paired = clean.iter().zip(injected);
    let (clean_parents, injected_parents) = (parents(clean), parents(injected));
    // Containers (a parent on either side) are compared without their outcome at first.
    let leaf = |c: &Span, j: &Span| {
        !clean_parents.contains(c.span_id.as_str())
            && !injected_parents.contains(j.span_id.as_str())
    };
    let at = |seq: usize, by: &str| -> Option<Departure> {
        let seq = seq.min(injected.len().checked_sub(1)?);
        let span = &injected[seq];
        let before = injected[..=seq].iter().rev();
        Some(Departure {
            seq,
            span: span.name.clone(),
            step: before.clone().find_map(|s| s.step),
            agent: before.clone().find_map(|s| s.agent_name.clone()),
            by: by.to_owned(),
        })
    };
    if let Some(i) = paired
        .clone()
        .position(|(c, j)| behaviour(c, leaf(c, j)) != behaviour(j, leaf(c, j)))
    {
        return at(i, "behaviour");
    }
    if clean.len() != injected.len() {
        return at(clean.len().min(injected.len()), "length");
    }
    if let Some(i) = paired
        .clone()
        .position(|(c, j)| behaviour(c, true) != behaviour(j, true))
    {
        return at(i, "behaviour");
    }
    paired
        .clone()
        .position(|(c, j)| (c.input_tokens, c.output_tokens) != (j.input_tokens, j.output_tokens))
        .and_then(|i| at(i, "tokens"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use traces::{SpanKind, StatusCode};

    fn span(name: &str, step: i64, tool: Option<&str>, args: &str) -> Span {
        let mut s: Span = serde_json::from_value(serde_json::json!({
            "trace_id": "t", "span_id": format!("{name}{step}"), "name": name, "kind": "chain",
        }))
        .unwrap();
        s.kind = if tool.is_some() {
            SpanKind::Tool
        } else {
            SpanKind::Llm
        };
        s.step = Some(step);
        s.agent_name = Some("solver".into());
        s.tool_name = tool.map(str::to_owned);
        s.tool_arguments = Some(args.to_owned());
        s.input_tokens = Some(100 * step);
        s
    }

    fn run() -> Vec<Span> {
        vec![
            span("llm.chat", 0, None, ""),
            span("tool.execute", 0, Some("search"), "{\"q\": \"a\"}"),
            span("llm.chat", 1, None, ""),
            span("tool.execute", 1, Some("read"), "{\"path\": \"x\"}"),
            span("llm.chat", 2, None, ""),
        ]
    }

    #[test]
    fn the_first_span_that_acts_differently_is_the_departure() {
        let clean = run();
        assert_eq!(first_departure(&clean, &clean), None);
        // Other arguments to the second tool call.
        let mut injected = run();
        injected[3].tool_arguments = Some("{\"path\": \"y\"}".into());
        // A later difference does not move it.
        injected[4].status = StatusCode::Error;
        let d = first_departure(&clean, &injected).unwrap();
        assert_eq!(
            (d.seq, d.span.as_str(), d.step, d.by.as_str()),
            (3, "tool.execute", Some(1), "behaviour")
        );
        assert_eq!(d.agent.as_deref(), Some("solver"));
        // A request parameter counts as behaviour.
        let mut injected = run();
        injected[2]
            .attributes
            .insert("gen_ai.request.temperature".into(), 7.into());
        assert_eq!(first_departure(&clean, &injected).unwrap().seq, 2);
    }

    #[test]
    fn a_failing_child_is_the_departure_not_the_run_that_fails_with_it() {
        let mut clean = run();
        let mut root = span("agent.run", 0, None, "");
        root.span_id = "root".into();
        clean.insert(0, root);
        for s in &mut clean[1..] {
            s.parent_span_id = Some("root".into());
        }
        let mut injected = clean.clone();
        injected[0].status = StatusCode::Error;
        injected[4].status = StatusCode::Error;
        let d = first_departure(&clean, &injected).unwrap();
        assert_eq!((d.seq, d.span.as_str()), (4, "tool.execute"));
        // Only the run failed (no child did): then the run is where it shows.
        let mut injected = clean.clone();
        injected[0].status = StatusCode::Error;
        let d = first_departure(&clean, &injected).unwrap();
        assert_eq!((d.seq, d.span.as_str()), (0, "agent.run"));
    }

    #[test]
    fn tokens_and_lengths_are_departures_only_where_nothing_else_differs() {
        let clean = run();
        let mut injected = run();
        injected[4].input_tokens = Some(9999);
        let d = first_departure(&clean, &injected).unwrap();
        assert_eq!((d.seq, d.by.as_str()), (4, "tokens"));
        // The injected run stopped after its second step's tool call.
        let short = &run()[..4];
        let d = first_departure(&clean, short).unwrap();
        assert_eq!((d.seq, d.step, d.by.as_str()), (3, Some(1), "length"));
        // It went on past the clean run's end.
        let mut long = run();
        long.push(span("llm.chat", 3, None, ""));
        let d = first_departure(&clean, &long).unwrap();
        assert_eq!((d.seq, d.step, d.by.as_str()), (5, Some(3), "length"));
        // A span without a step takes the nearest earlier one's.
        let mut injected = run();
        injected[3].step = None;
        injected[3].tool_arguments = None;
        assert_eq!(first_departure(&clean, &injected).unwrap().step, Some(1));
        assert!(first_departure(&clean, &[]).is_none());
    }
}
