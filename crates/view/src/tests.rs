use std::time::{Duration, Instant};

use detect::{Action, Actor, Observation, Outcome, Status, Transcript, TurnRecord, Verdict};
use serde_json::json;
use traces::{Label, Span, SpanKind, StatusCode};

use super::*;

const TRACE: &str = "0123456789abcdef0123456789abcdef";

fn span(id: &str, parent: Option<&str>, name: &str, kind: SpanKind) -> Span {
    let mut s = Span::new(TRACE, id, name, kind);
    s.parent_span_id = parent.map(str::to_string);
    s.start_time_ns = Some(1_000_000_000);
    s.end_time_ns = Some(1_012_300_000);
    s
}

/// agent.run → planner (llm) + two tool calls; the second fails in tools/schema.py and carries
/// an attribute with markup in it.
fn small_trace() -> Vec<Span> {
    let mut root = span("r", None, "agent.run", SpanKind::Agent);
    root.agent_name = Some("researcher".into());
    let mut llm = span("a", Some("r"), "llm.chat", SpanKind::Llm);
    llm.input_tokens = Some(120);
    llm.output_tokens = Some(30);
    llm.input = Some("what is the table's size?".into());
    let mut ok_tool = span("b", Some("r"), "execute_tool search", SpanKind::Tool);
    ok_tool.status = StatusCode::Error;
    ok_tool.error_type = Some("ValueError".into());
    ok_tool.code_filepath = Some("research/tools/registry.py".into());
    let mut bad = span("c", Some("r"), "execute_tool table_lookup", SpanKind::Tool);
    bad.status = StatusCode::Error;
    bad.error_type = Some("SchemaError".into());
    bad.code_filepath = Some("research/tools/schema.py".into());
    bad.code_function = Some("validate".into());
    bad.output = Some("x".repeat(FOLD_CHARS * 3));
    bad.attributes.insert(
        "evil".into(),
        json!("<script>alert('x')</script> & \"quoted\""),
    );
    vec![root, llm, ok_tool, bad]
}

fn transcript(verdict: Verdict) -> Transcript {
    let turn = |index: usize, action: Action, obs: &str| TurnRecord {
        index,
        started_unix_ns: 0,
        acted_unix_ns: 1_000,
        ended_unix_ns: 2_000_000,
        text: action.render(),
        thought: format!("thinking about step {index}"),
        action: Some(action),
        observation: Observation::new(obs, Status::Ok),
        action_tokens: 10,
        observation_tokens: 20,
        subagents: Vec::new(),
    };
    Transcript {
        episode_id: "e".repeat(32),
        investigated_trace: TRACE.into(),
        role: Actor::Main,
        task: None,
        policy: "expert".into(),
        system_prompt: "You investigate traces.".into(),
        started_unix_ns: 0,
        ended_unix_ns: 5_000_000,
        prompt_tokens: 100,
        total_tokens: 160,
        turns: vec![
            turn(
                0,
                Action::Sql {
                    query: "SELECT name FROM spans WHERE is_error = 1".into(),
                },
                "name\nexecute_tool <table_lookup>",
            ),
            turn(
                1,
                Action::Answer {
                    text: verdict.render().trim_start_matches("answer: ").into(),
                },
                "",
            ),
        ],
        outcome: Outcome::Answered { verdict },
    }
}

fn p16() -> Verdict {
    Verdict::Deficiency {
        deficiency_id: "P16".into(),
        component: "tools.schema".into(),
        step: None,
        location: None,
        evidence: "table_lookup fails <validate> twice".into(),
    }
}

fn catalog() -> Catalog {
    Catalog::embedded().unwrap()
}

/// No network: no URL, and no `src=`/`href=` that leaves the page.
fn assert_self_contained(html: &str) {
    assert!(!html.contains("http://"), "http:// in the page");
    assert!(!html.contains("https://"), "https:// in the page");
    assert!(!html.contains("src="), "a src= attribute in the page");
    for (i, _) in html.match_indices("href=\"") {
        let target = &html[i + 6..];
        let target = &target[..target.find('"').unwrap()];
        assert!(
            target.starts_with('#') || !(target.contains(':') || target.starts_with("//")),
            "external href {target}"
        );
    }
}

#[test]
fn detect_page_shows_tree_transcript_verdict_and_blamed_span() {
    let spans = small_trace();
    let catalog = catalog();
    let answers = [Answer::from_transcript("expert", transcript(p16()))];
    let html = trace_page(&TracePage {
        trace_id: TRACE,
        spans: &spans,
        answers: &answers,
        catalog: &catalog,
        label: None,
        index_href: None,
    });
    // The tree: every span, nested, with kind, agent, duration, tokens and status.
    for name in ["agent.run", "llm.chat", "execute_tool search"] {
        assert!(html.contains(name), "{name}");
    }
    assert!(html.contains("researcher"));
    assert!(html.contains("12.3 ms"));
    assert!(html.contains("120→30 tok"));
    assert!(html.contains("<li class=\"span err\" id=\"span-b\">"));
    // The transcript, turn by turn.
    assert!(html.contains("SELECT name FROM spans WHERE is_error = 1"));
    assert!(html.contains("execute_tool &lt;table_lookup&gt;"));
    assert!(html.contains("thinking about step 0"));
    // The verdict with its catalog entry.
    let d = catalog.get("P16").unwrap();
    assert!(html.contains(&escape(&d.name)), "catalog name");
    assert!(html.contains(&escape(&d.mechanism)), "catalog description");
    assert!(html.contains("<code>tools.schema</code>"));
    assert!(html.contains("table_lookup fails &lt;validate&gt; twice"));
    // The blamed span: the error span in tools/schema.py, not the first error span.
    assert_eq!(blamed_span(&spans, &p16()), Some(3));
    assert!(html.contains("<li class=\"span err blamed\" id=\"span-c\">"));
    assert!(html.contains("blamed by expert"));
    assert!(html.contains("<a href=\"#span-c\">"));
    // The long output is in the data island (the page's script folds it when shown), not in
    // the markup.
    let island = html
        .split("<script type=\"application/json\" id=\"span-fields\">")
        .nth(1);
    assert!(island.unwrap().contains(&"x".repeat(FOLD_CHARS * 3)));
    assert_eq!(html.matches(&"x".repeat(FOLD_CHARS * 3)).count(), 1);
    // No ground truth on a detect page.
    assert!(!html.contains("Ground truth"));
    assert_self_contained(&html);
}

#[test]
fn attribute_values_are_escaped() {
    let spans = small_trace();
    let catalog = catalog();
    let html = trace_page(&TracePage {
        trace_id: "<b>id</b>",
        spans: &spans,
        answers: &[],
        catalog: &catalog,
        label: None,
        index_href: None,
    });
    assert!(
        !html.contains("<script>alert"),
        "raw script from an attribute"
    );
    // In the data island, as inert JSON escapes.
    assert!(html.contains(r#"\u003cscript\u003ealert('x')\u003c/script\u003e \u0026 \"quoted\""#));
    assert!(!html.contains("<b>id</b>"));
    // The only script elements are the page's own: its data island and its script.
    assert_eq!(html.matches("<script").count(), 2);
    assert_eq!(html.matches("</script>").count(), 2);
}

#[test]
fn evaluation_page_marks_verdicts_against_the_label_side_by_side() {
    let spans = small_trace();
    let catalog = catalog();
    let mut label = Label::new(TRACE);
    label.truth.deficiency_id = Some("P16".into());
    label.truth.component = Some("tools.schema".into());
    label.truth.file = Some("research/tools/schema.py".into());
    let wrong = Verdict::Deficiency {
        deficiency_id: "C3".into(),
        component: "tools.output".into(),
        step: None,
        location: None,
        evidence: "guess".into(),
    };
    let answers = [
        Answer::from_transcript("expert", transcript(p16())),
        Answer::from_transcript("keyword", transcript(wrong.clone())),
        Answer {
            detector: "zero-shot".into(),
            verdict: None,
            outcome: "turn limit reached".into(),
            transcript: None,
        },
    ];
    let html = trace_page(&TracePage {
        trace_id: TRACE,
        spans: &spans,
        answers: &answers,
        catalog: &catalog,
        label: Some(&label),
        index_href: Some("../index.html"),
    });
    assert!(html.contains("Ground truth"));
    assert!(html.contains("href=\"../index.html\""));
    assert!(html.contains("✓ right") && html.contains("✗ wrong"));
    assert!(html.contains("no verdict: turn limit reached"));
    assert!(html.contains("leaves no transcript"));
    // Each detector's blame on the span it picks: keyword's `tools.output` shares only
    // `tools` with both error spans, so the earlier one.
    assert!(html.contains("<li class=\"span err blamed\" id=\"span-b\">"));
    assert!(html.contains("blamed by keyword") && html.contains("blamed by expert"));
    assert_self_contained(&html);

    let rows: Vec<IndexRow> = answers
        .iter()
        .map(|a| IndexRow {
            trace_id: TRACE.into(),
            href: format!("traces/{TRACE}.html"),
            detector: a.detector.clone(),
            verdict: a.verdict.clone(),
            label: Some(label.clone()),
        })
        .collect();
    let index = index_page("Evaluation", &rows, &catalog);
    assert!(index.contains("table class=\"index sortable\""));
    assert!(index.contains("<code>expert</code>: type right on 1 of 1"));
    assert!(index.contains("<code>keyword</code>: type right on 0 of 1"));
    assert_eq!(index.matches("<tr><td><a href=\"traces/").count(), 3);
    assert_self_contained(&index);
}

#[test]
fn blame_verdicts_pick_the_agents_step() {
    let mut spans = small_trace();
    spans[1].step = Some(2);
    spans[1].agent_name = Some("coder".into());
    spans[2].step = Some(2);
    let v = Verdict::Blame {
        agent: "coder".into(),
        step: 2,
        evidence: String::new(),
    };
    assert_eq!(blamed_span(&spans, &v), Some(1));
    // Without error spans, a deficiency verdict blames none.
    let healthy: Vec<Span> = small_trace()
        .into_iter()
        .map(|mut s| {
            s.status = StatusCode::Ok;
            s.error_type = None;
            s
        })
        .collect();
    assert_eq!(blamed_span(&healthy, &p16()), None);
}

#[test]
fn parent_cycles_and_orphans_still_render_every_span_once() {
    let mut spans = small_trace();
    spans.push(span("x", Some("y"), "cycle.x", SpanKind::Other));
    spans.push(span("y", Some("x"), "cycle.y", SpanKind::Other));
    spans.push(span("o", Some("missing"), "orphan", SpanKind::Other));
    let catalog = catalog();
    let html = trace_page(&TracePage {
        trace_id: TRACE,
        spans: &spans,
        answers: &[],
        catalog: &catalog,
        label: None,
        index_href: None,
    });
    for name in ["cycle.x", "cycle.y", "orphan"] {
        assert_eq!(html.matches(&format!(">{name}<")).count(), 1, "{name}");
    }
    assert_eq!(
        html.matches("<details class=\"span\"").count(),
        html.matches("</details></li>").count()
    );
}

/// 10,000 spans: a root, 9 children, each with a chain and fan-out below; rendered quickly,
/// every span present, depth ≥ 2 closed, depth < 2 open.
#[test]
fn ten_thousand_spans_render_fast_and_fold_below_two_levels() {
    let n = 10_000;
    let mut spans = Vec::with_capacity(n);
    spans.push(span("s0", None, "root", SpanKind::Agent));
    for i in 1..n {
        // Parents: 1..=9 under the root; then each span under span (i - 1) / 3 + ... a
        // bounded-fan-out tree, plus a long chain at the end.
        let parent = if i < 10 {
            0
        } else if i < n - 500 {
            i / 10
        } else {
            i - 1
        };
        let mut s = span(
            &format!("s{i}"),
            Some(&format!("s{parent}")),
            &format!("op{i}"),
            SpanKind::Tool,
        );
        s.input = Some(format!("input {i}"));
        s.attributes.insert("k".into(), json!(i));
        if i % 997 == 0 {
            s.status = StatusCode::Error;
        }
        spans.push(s);
    }
    let catalog = catalog();
    let answers = [Answer::from_transcript("expert", transcript(p16()))];
    let started = Instant::now();
    let html = trace_page(&TracePage {
        trace_id: TRACE,
        spans: &spans,
        answers: &answers,
        catalog: &catalog,
        label: None,
        index_href: None,
    });
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "10,000 spans took {took:?} (debug build)"
    );
    assert_eq!(html.matches("<details class=\"span\"").count(), n);
    assert_eq!(html.matches("data-depth=\"0\" open>").count(), 1);
    assert_eq!(html.matches("data-depth=\"1\" open>").count(), 9);
    let blamed = blamed_span(&spans, &p16()).unwrap();
    assert!(spans[blamed].is_error());
    // Closed below the first two levels, except the path down to the blamed span.
    let (mut open_deep, mut closed_deep) = (0, 0);
    for (i, _) in html.match_indices("data-depth=\"") {
        let rest = &html[i + 12..];
        let end = rest.find('"').unwrap();
        let depth: usize = rest[..end].parse().unwrap();
        let open = rest[end + 1..].starts_with(" open>");
        match (depth >= OPEN_DEPTH, open) {
            (true, true) => open_deep += 1,
            (true, false) => closed_deep += 1,
            (false, open) => assert!(open, "a node at depth {depth} is closed"),
        }
    }
    assert_eq!(
        open_deep, 2,
        "only the blamed span and its parent open below depth 2"
    );
    assert_eq!(closed_deep, n - 10 - 2);
    assert!(html.contains("blamed by expert"));
}

/// A flat trace (a root with 1,000 children): the first `CHILDREN_SHOWN` children are listed,
/// the rest folded in chunks of as many, and the chunk holding the blamed span starts open.
#[test]
fn many_siblings_fold_in_chunks_and_the_blamed_one_stays_in_view() {
    let n = 1_000;
    let mut spans = vec![span("s0", None, "root", SpanKind::Agent)];
    for i in 1..=n {
        let mut s = span(&format!("s{i}"), Some("s0"), "execute_tool", SpanKind::Tool);
        if i == 555 {
            s.status = StatusCode::Error;
            s.error_type = Some("SchemaError".into());
            s.code_filepath = Some("research/tools/schema.py".into());
        }
        spans.push(s);
    }
    let catalog = catalog();
    let answers = [Answer::from_transcript("expert", transcript(p16()))];
    let html = trace_page(&TracePage {
        trace_id: TRACE,
        spans: &spans,
        answers: &answers,
        catalog: &catalog,
        label: None,
        index_href: None,
    });
    assert_eq!(html.matches("<details class=\"span\"").count(), n + 1);
    let chunks = (n - tree::CHILDREN_SHOWN).div_ceil(tree::CHILDREN_SHOWN);
    assert_eq!(html.matches("<li class=\"more\">").count(), chunks);
    assert!(html.contains("<summary>spans 101–200 of 1000</summary>"));
    assert!(html.contains("<summary>spans 901–1000 of 1000</summary>"));
    // Span 555 is the 555th child: chunk 501–600, the only open one.
    assert_eq!(html.matches("<li class=\"more\"><details open>").count(), 1);
    let open_at = html.find("<li class=\"more\"><details open>").unwrap();
    assert!(html[open_at..]
        .starts_with("<li class=\"more\"><details open><summary>spans 501–600 of 1000</summary>"));
    assert_eq!(
        html.matches("<details").count(),
        html.matches("</details>").count()
    );
}
